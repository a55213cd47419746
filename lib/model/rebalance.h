/*
 * Internal: rebalancing of the model's stages while they run (rebalance.c; the public side is in
 * <mbpipe/model.h>, "Rebalancing"). stages.c calls four things: mbp__rb_admit on stage 0 for every
 * micro-batch (the window it is admitted in, with the plan of that window, after a look when a window
 * fills), mbp__rb_range for the layers a stage computes under a plan, mbp__rb_run to compute them with
 * each layer timed in the micro-batch's window, and mbp__rb_done as the micro-batch leaves the pipeline
 * (stage 0's done hook). Not installed.
 */
#ifndef MBP__REBALANCE_H
#define MBP__REBALANCE_H

#include <stdint.h>

#include "model_internal.h"

/* A plan, immutable once made; every plan lives until the stages object is destroyed. */
struct mbp__rb_plan {
	uint64_t id;
	unsigned first[MBP_MAX_STAGES + 1];
	struct mbp__rb_plan *older;
};

/* A window: the micro-batches stage 0 admitted one after the other under one plan, `window` of them
 * (fewer for the newest), and their counters. A micro-batch carries its window (mb->carry_plan). Made
 * and reused by stage 0 only (under its admit lock), and reused only once every micro-batch of it has
 * left the pipeline: while one is in flight, its window is neither written by stage 0 nor reused. */
struct mbp__rb_win {
	const struct mbp__rb_plan *plan; /* the plan of each micro-batch of the window */
	uint64_t n;			 /* the window's number: 0, 1, ... in the order admitted */
	uint64_t admitted;		 /* its micro-batches, set when full: `window` (or a multiple) */
	struct mbp__rb_win *next;	 /* the list the window is on: looked at, or free */
	struct mbp__rb_win *made;	 /* every window made, for mbp__rb_destroy */
	struct mbp__rb_acc *acc;	 /* the rows of counters, a row per thread (rebalance.c) */
};

struct mbp__rb;

/* A rebalancer for the stages of m starting at `plan` (checked by the caller), stage s made with
 * threads[s] replicas (at least the plan's), or NULL on -ENOMEM. Until attached (below) every thread
 * is counted active and a move keeps the counts. */
struct mbp__rb *mbp__rb_new(mbp_model *m, const mbp_model_plan *plan, const mbp_model_rebalance *o,
			    const unsigned *threads);
void mbp__rb_destroy(struct mbp__rb *rb);

/* The threads stage s is made with under options o (NULL: off): the plan's replicas, or o->replicas
 * where more. */
unsigned mbp__rb_threads(const mbp_model_plan *plan, const mbp_model_rebalance *o, unsigned s);

/* The stages run on p (mbp_model_stages_add, before start): the plan's replicas become the active ones
 * (mbp_pipeline_replicas_set), and moves may change them where a stage has threads to spare. 0 or the
 * error of mbp_pipeline_replicas_set. */
int mbp__rb_attach(struct mbp__rb *rb, mbp_pipeline *p);

/* Stage 0, for each micro-batch: count it into the window being filled (opening the next one, after a
 * look at the windows done so far, when it is full) and return that window, whose plan is the one the
 * micro-batch is computed with. Stage 0's threads only (its replicas in turn, under a lock); never NULL. */
const struct mbp__rb_win *mbp__rb_admit(struct mbp__rb *rb);

/* Stage `stage` under plan p: layers [*a, *b). */
static inline void mbp__rb_range(const struct mbp__rb_plan *p, unsigned stage, unsigned *a, unsigned *b)
{
	*a = p->first[stage];
	*b = p->first[stage + 1];
}

/* Layers [a, b) on in's rows, as mbp__layers_run computes them (same calls, same bits), each timed and
 * counted in window w (in's) for replica `replica` of `stage` (only that replica's thread calls it with
 * those indices). */
void mbp__rb_run(struct mbp__rb *rb, const struct mbp__rb_win *w, unsigned stage, unsigned replica,
		 const struct mbp__version *v, unsigned a, unsigned b, const mbp_mb *in, float *y, float *s0,
		 float *s1);

/* A micro-batch of window w leaves the pipeline, completed or failed: stage 0's done hook, on the thread
 * that completes it (a replica of the last stage). After this, the thread touches w no more. */
void mbp__rb_done(struct mbp__rb *rb, const struct mbp__rb_win *w);

int mbp__rb_stats(struct mbp__rb *rb, mbp_model_rebalance_stats *out);

#endif
