/*
 * MPI calls shared by the tools' MPI parts (pipebench/mpi.c, pipeserve/mpi.c), made on libmbpipe-mpi's
 * communication thread through mbp_mpi_exec(). Header-only; included only where configure found MPI.
 *
 * Waits poll with short sleeps: a rank waiting for its peers must not spin a core that another rank's
 * stages need (Open MPI's blocking calls busy-poll).
 */
#ifndef MBP_UTIL_MPIUTIL_H
#define MBP_UTIL_MPIUTIL_H

#include <unistd.h>

#include <mpi.h>

static inline void mbt_mpi_wait_req(MPI_Request *rq)
{
	int flag = 0;
	while (MPI_Test(rq, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS && !flag)
		usleep(100);
}

/* For mbp_mpi_exec(): every rank's int at arg becomes the largest of them (collective). A set-up that
 * failed on one rank (its file, its memory) then stops every rank before the collective start. */
static inline int mbt_mpi_agree_max(void *arg)
{
	int mine = *(int *)arg;
	MPI_Request rq;
	MPI_Iallreduce(&mine, arg, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &rq);
	mbt_mpi_wait_req(&rq);
	return 0;
}

#endif
