/*
 * The schedule object's layout and what the trainer needs of it beyond the public API. Not installed.
 */
#ifndef MBP__SCHEDULE_H
#define MBP__SCHEDULE_H

#include <mbpipe.h>

#include "common.h"

struct mbp_schedule {
	mbp_sched_kind kind;
	unsigned stages, mbs;
	mbp_sched_place place;
	unsigned threads;		    /* 0: the block placement, any thread count */
	uint16_t thread_of[MBP_MAX_STAGES]; /* per stage, where threads > 0 */
	size_t n;			    /* operations in the step */
	mbp_sched_op *order;		    /* the global order, n entries */
	mbp_sched_op *stage_ops;	    /* stage lists, stage s at [stage_off[s], stage_off[s + 1]) */
	size_t stage_off[MBP_MAX_STAGES + 1];
	unsigned stash_peak[MBP_MAX_STAGES];
	unsigned held_peak[MBP_MAX_STAGES];
};

/* The thread that runs stage s of S on T threads: consecutive stages share one, as in the forward engine. */
static inline unsigned mbp__stage_thread(unsigned s, unsigned S, unsigned T)
{
	return (unsigned)((uint64_t)s * T / S);
}

/* The thread of stage s (global) of the schedule on T threads (T: the schedule's own where it has one). */
static inline unsigned mbp__sched_thread(const struct mbp_schedule *sc, unsigned s, unsigned T)
{
	return sc->threads ? sc->thread_of[s] : mbp__stage_thread(s, sc->stages, T);
}

/* Where a list of a schedule breaks a rule (mbp_schedule_read_csv names it): list (thread) and position
 * (SIZE_MAX: the operation is missing), the operation, and what is wrong (a static string). */
struct mbp__sched_fault {
	unsigned list;
	size_t pos;
	mbp_sched_op op;
	bool has_op;
	const char *what;
};

/* Each thread's operations in global order: thread t's at ops[off[t] .. off[t + 1]) (ops has n entries,
 * off threads + 1). 0 or -EINVAL. */
int mbp__schedule_thread_lists(const mbp_schedule *sc, unsigned threads, mbp_sched_op *ops, size_t *off);
/* The same for the `count` stages from `first` on (a part of the pipeline), numbered from 0 in the lists. */
int mbp__schedule_part_lists(const mbp_schedule *sc, unsigned first, unsigned count, unsigned threads,
			     mbp_sched_op *ops, size_t *off);
/* The same for any `count` stages (global[k] ascending, numbered k in the lists), local stage k on thread
 * thread[k] of `threads` (a part of a placed schedule across ranks); with replicas (`reps`, per local
 * stage, 0 meaning 1; NULL: none) micro-batch j of stage k on thread thread[k] + j mod reps[k], its
 * replicas' threads consecutive. Arguments checked by the caller. */
void mbp__schedule_local_lists(const mbp_schedule *sc, const uint16_t *global, const uint16_t *thread,
			       const unsigned *reps, unsigned count, unsigned threads, mbp_sched_op *ops,
			       size_t *off);

/* Room to play a schedule on a number of threads (mbp_schedule_simulate's), made once so that a caller
 * that plays it at every step (the trainer's bubble_predicted) allocates nothing there. */
struct mbp__sched_scratch {
	void *mem; /* one block holding the arrays below */
	size_t n, nm;
	unsigned threads;
	double *ends, *clock;
	size_t *next;
	mbp_sched_op *ops;
	uint32_t *pos;
};

/* Room for playing `sc` on up to `threads` threads: 0 or -ENOMEM. Pair with mbp__sched_scratch_free()
 * (which also takes one whose making failed). */
int mbp__sched_scratch_new(struct mbp__sched_scratch *x, const mbp_schedule *sc, unsigned threads);
void mbp__sched_scratch_free(struct mbp__sched_scratch *x);

/* mbp_schedule_simulate() in the room `x` made for `sc` (threads 0: one per stage, as there): the same
 * results and errors, no allocation. */
int mbp__schedule_simulate_in(const mbp_schedule *sc, const mbp_op_costs *costs, unsigned threads,
			      mbp_sched_sim *out, double *start, struct mbp__sched_scratch *x);

/* Replicas (train.h, "Replicas"): a replica is a copy of a thread of the schedule, `stages` stages on
 * `threads` threads, stage s on thread_of[s] (threads 0: the block placement with one stage a thread, as
 * replicas run it). Thread t runs on as many threads (lists) as the most replicas of its stages; replica
 * k of stage s on copy k of its thread, list base[s] + k, and micro-batch j of stage s on its replica j
 * mod reps[s] (reps[s] 0 means 1). *lists: their count. 0, or -EINVAL (no stages, more than
 * MBP_TRAIN_MAX_REPLICAS of a stage or MBP_MAX_STAGES lists). */
int mbp__replica_bases(unsigned stages, unsigned threads, const uint16_t *thread_of, const unsigned *reps,
		       uint16_t *base, unsigned *lists);
/* Each list's operations in global order at ops[off[u] .. off[u + 1]) (the bases above); *units: the
 * lists' count. 0, or -EINVAL as mbp__replica_bases. */
int mbp__schedule_replica_lists(const mbp_schedule *sc, const unsigned *reps, mbp_sched_op *ops, size_t *off,
				unsigned *units);
/* mbp_schedule_simulate_replicas() in a room made for `sc` on at least the units' count of threads. */
int mbp__schedule_simulate_rep_in(const mbp_schedule *sc, const mbp_op_costs *costs, const unsigned *reps,
				  mbp_sched_sim *out, double *start, struct mbp__sched_scratch *x);

/* A part of the pipeline as the trainer runs it, for mbp__schedule_buffer_peak(): the `count` stages from
 * `first` on, on `threads` threads whose lists are mbp__schedule_part_lists()'s (`ops`, `off`), and per
 * local stage whether it keeps a stash buffer per micro-batch. */
struct mbp__sched_part {
	unsigned first, count, threads;
	const mbp_sched_op *ops;
	const size_t *off;
	const bool *stash;
};

/*
 * The most pool buffers a part's threads can hold at once during a step of this schedule, over every
 * timing: per stage a stash per micro-batch held (from its forward's start to its last backward's end;
 * at the global last stage also the loss's output gradient), per link between two stages the forward's
 * output (from the forward's end, in the ring then as the next stage's input, to the next stage's last
 * backward's end) and the input gradient (from the backward's end, in the ring then as the previous
 * stage's output gradient, to the previous stage's last backward's end), and per running operation the
 * buffer it is filling. Links to a remote neighbour count as far as the neighbour's side of them (its
 * operations' ends). Exact for the threads' lists, the remote neighbours free to run as far as this part
 * lets them; not counted: the agent's own buffers and the pool caches. 0 or -ENOMEM.
 */
int mbp__schedule_buffer_peak(const mbp_schedule *sc, const struct mbp__sched_part *part, uint64_t *peak);

#endif
