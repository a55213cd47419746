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
	size_t n;		 /* operations in the step */
	mbp_sched_op *order;	 /* the global order, n entries */
	mbp_sched_op *stage_ops; /* stage lists, stage s at [stage_off[s], stage_off[s + 1]) */
	size_t stage_off[MBP_MAX_STAGES + 1];
	unsigned stash_peak[MBP_MAX_STAGES];
	unsigned held_peak[MBP_MAX_STAGES];
};

/* The thread that runs stage s of S on T threads: consecutive stages share one, as in the forward engine. */
static inline unsigned mbp__stage_thread(unsigned s, unsigned S, unsigned T)
{
	return (unsigned)((uint64_t)s * T / S);
}

/* Each thread's operations in global order: thread t's at ops[off[t] .. off[t + 1]) (ops has n entries,
 * off threads + 1). 0 or -EINVAL. */
int mbp__schedule_thread_lists(const mbp_schedule *sc, unsigned threads, mbp_sched_op *ops, size_t *off);
/* The same for the `count` stages from `first` on (a part of the pipeline), numbered from 0 in the lists. */
int mbp__schedule_part_lists(const mbp_schedule *sc, unsigned first, unsigned count, unsigned threads,
			     mbp_sched_op *ops, size_t *off);

#endif
