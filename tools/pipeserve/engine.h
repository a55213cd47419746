/*
 * The engine behind the batcher (engine.c): the mbpipe options it runs with (MBPIPE_OPTS, then --engine,
 * then what the model fixes), this process's stage descriptors, the start of the pipeline with the batcher
 * in front of it (a local pipeline, or under mpirun rank 0's end of the pipeline across the ranks), and
 * where its stages' threads run.
 */
#ifndef PIPESERVE_ENGINE_H
#define PIPESERVE_ENGINE_H

#include <mbpipe.h>

#include "server.h"

/*
 * The engine options and this process's stage descriptors (`d` holds MBP_MAX_STAGES), from s->cfg and
 * s->stages. Stages are pinned by the placement plan in one process and left unpinned under mpirun (ranks
 * on one machine would pin theirs onto the same CPUs). @return 0 or -errno (logged).
 */
int ps_engine_opts(ps_server *s, mbp_opts *o, mbp_stage_desc *d, unsigned *n);

/* Start the pipeline and the batcher in front of it: s->batcher (ps_batcher_destroy undoes it).
 * @return 0 or -errno (said). */
int ps_engine_start(ps_server *s);

/* The worker threads of the pipeline of `nst` stages: the threads made, each stage's replicas summed
 * (with --rebalance-replicas those a move may turn on too; under mpirun, every rank's stages), which
 * sizes the micro-batches in flight by default (2 per thread). */
unsigned ps_engine_threads(const ps_server *s, unsigned nst);

/* Log one line per stage: the thread that runs it, and its CPU or why it has none; and one more per
 * replicated stage with each replica's CPU ("stage 1 (layer 3) x2 -> CPUs 1,2"). */
void ps_engine_log_placement(ps_server *s);

#endif
