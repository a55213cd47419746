/*
 * The activity log of both engines: per stage, the begin and end of what it computed, in bounded memory
 * (the first `cap` events; later ones are not kept), and one writer of the Chrome trace JSON file that
 * Perfetto and chrome://tracing open (trace.c). An event has an operation kind: a pipeline stage's
 * micro-batch (MBP__TRACE_MB, with its job, sequence number and status), or a training operation (an
 * mbp_op_kind: F, B, B_in, W, with its micro-batch). Not installed.
 *
 *   operation            | thread
 *   add, clear           | the stage's thread (the log's single writer)
 *   count, write         | any thread (count's acquire sees every event below it complete)
 */
#ifndef MBP__TRACE_H
#define MBP__TRACE_H

#include <mbpipe.h>

#include "common.h"

/* The pipeline's kind, after the trainer's (mbp_op_kind: MBP_OP_F .. MBP_OP_W). */
enum { MBP__TRACE_MB = 8 };

struct mbp__trace_ev {
	uint64_t t0, t1; /* the engine's clock (mbp__clock_ns) */
	uint64_t job;	 /* the pipeline's job id; 0: a single micro-batch, or a training operation */
	uint32_t mb;	 /* the micro-batch: its sequence number in its job, or the trainer's */
	int32_t status;	 /* the pipeline's status of it (0 for the trainer) */
	uint8_t kind;	 /* MBP__TRACE_MB or an mbp_op_kind */
};

/* One stage's log. */
struct mbp__trace {
	struct mbp__trace_ev *ev; /* NULL: tracing off */
	uint32_t cap;
	_Atomic uint32_t n; /* events kept, published with release */
};

/* A log of `cap` events (0: off, nothing allocated). 0 or -ENOMEM. Pair with mbp__trace_free(). */
int mbp__trace_init(struct mbp__trace *tr, uint32_t cap);
void mbp__trace_free(struct mbp__trace *tr);

/* Keep `e` unless the log is off or full. The writer only. */
static inline void mbp__trace_add(struct mbp__trace *tr, const struct mbp__trace_ev *e)
{
	/* relaxed: only this thread writes n */
	uint32_t n = atomic_load_explicit(&tr->n, memory_order_relaxed);
	if (!tr->ev || n >= tr->cap)
		return;
	tr->ev[n] = *e;
	/* release; partner: the acquire load in mbp__trace_count(): the event above is complete */
	atomic_store_explicit(&tr->n, n + 1, memory_order_release);
}

/* Start the log again (the trainer, at each step). The writer only. */
static inline void mbp__trace_clear(struct mbp__trace *tr)
{
	/* relaxed: only this thread writes n; the readers read the log between steps, after the trainer's
	 * step-end handshake */
	atomic_store_explicit(&tr->n, 0, memory_order_relaxed);
}

/* Events kept: every one below the count is complete. */
static inline uint32_t mbp__trace_count(const struct mbp__trace *tr)
{
	/* acquire; partner: the release store in mbp__trace_add() */
	return tr->ev ? atomic_load_explicit(&((struct mbp__trace *)tr)->n, memory_order_acquire) : 0;
}

/* One row of the file: a stage, its name (the caller's bytes, escaped as JSON), its CPU, its log. */
struct mbp__trace_track {
	const char *name;
	int cpu;
	const struct mbp__trace *tr;
};

/*
 * Write `n` tracks as a Chrome trace JSON file at `path`, by rename (<mbpipe/file.h>): "X" complete events,
 * one row per track labelled "<i> <name> (cpu <cpu>)", times in microseconds from `base_ns`. A pipeline's
 * event is named "job <job> mb <mb>" with its job, seq, stage and status as args; a training operation
 * "<kind><mb>" (F3, B_in3) with its kind as category and its micro-batch and stage as args.
 * @return 0, or the error of mbp_file_new() / mbp_file_commit().
 */
int mbp__trace_write(const char *path, const struct mbp__trace_track *tracks, unsigned n, uint64_t base_ns);

#endif
