/*
 * pipeserve under mpirun (mpi.c, built when configure found MPI; called only under mpirun): the model's
 * stages run on several ranks through libmbpipe-mpi. Rank 0 serves HTTP and feeds the pipeline across the
 * ranks through ps_mpi_engine(); the other ranks run their stages in ps_mpi_serve() until rank 0 ends the
 * run.
 */
#ifndef PIPESERVE_MPI_H
#define PIPESERVE_MPI_H

#include <mbpipe.h>

#include "server.h"

/* Initialise MPI (libmbpipe-mpi's communication thread) and fill s->rank, s->ranks. @return 0 or -errno. */
int ps_mpi_init(int *argc, char ***argv, ps_server *s);
/* Load this rank's part of the model file `path` into s->model, s->plan (s->cfg.stages stages in all, one
 * per rank by default). @return 0, PS_EUSAGE (a file that is no model, more stages than layers, fewer
 * layers or stages than ranks: said by rank 0), or the load's error, logged. */
int ps_mpi_load(ps_server *s, const char *path);
/* Every rank's `status` becomes the largest (collective). */
int ps_mpi_agree(int status);
/* Rank 0: the engine the batcher feeds (rank 0's end of the pipeline across the ranks). */
const ps_engine *ps_mpi_engine(void);
/* Ranks other than 0: run this rank's stages until rank 0 ends the run. @return 0, or an error (logged). */
int ps_mpi_serve(ps_server *s, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n);
void ps_mpi_finalize(void);

#endif
