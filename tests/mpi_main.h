/*
 * Shared main() for the Check programs run under mpirun (test_mpi.c, test_mpi_train.c): each file defines
 * `static int rank, size;` and `static Suite *suite(void)` and includes this header last. Check runs
 * without fork (forking an MPI process is not supported); rank 0 prints, the others run silent.
 */
#ifndef MBP_MPI_MAIN_H
#define MBP_MPI_MAIN_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

int main(int argc, char **argv)
{
	if (mbp_mpi_init(&argc, &argv) != 0) {
		fprintf(stderr, "%s: MPI did not start\n", argv[0]);
		return 1;
	}
	rank = mbp_mpi_rank();
	size = mbp_mpi_size();
	if (size < 2) {
		fprintf(stderr, "%s: run under mpirun -np 2 or more\n", argv[0]);
		mbp_mpi_finalize();
		return 2;
	}
	SRunner *sr = srunner_create(suite());
	srunner_set_fork_status(sr, CK_NOFORK);
	if (rank != 0)
		srunner_set_log(sr, NULL);
	srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
	int failed = srunner_ntests_failed(sr);
	if (failed)
		fprintf(stderr, "%s: rank %d: %d failed\n", argv[0], rank, failed);
	srunner_free(sr);
	mbp_mpi_finalize();
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

#endif
