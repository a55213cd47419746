/*
 * bench_pipeline: what the C driver (bench_pipeline.c) and the oneTBB runner (bench_pipeline_tbb.cc)
 * share: the per-stage step that every implementation runs, the meter, and one run's result.
 *
 * Every implementation moves items that are sequence numbers 0 .. n-1: stage 0 reads in[i], every stage
 * checks that it sees the numbers in order (each exactly once) and does the calibrated work, the last stage
 * writes out[i]. The driver checks out[] afterwards. The work loop lives in bench_pipeline.c alone, so all
 * sides run the same machine code.
 */
#ifndef BENCH_PIPELINE_H
#define BENCH_PIPELINE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BP_MAX_STAGES 8

/* The calibrated busy work: `iters` dependent multiply-adds; returns a value that must be used. */
uint64_t bp_work(uint64_t iters, uint64_t x);

/* One stage's state, written by that stage's thread only (its own cache lines). */
struct bp_stage {
	uint64_t expect; /* next sequence number this stage must see */
	uint64_t errors; /* out-of-order, duplicate or missing numbers */
	uint64_t sink;	 /* keeps the work's result alive */
	uint64_t iters;	 /* work per item */
	char pad[32];
} __attribute__((aligned(64)));

/* The body of every stage of every implementation. */
static inline void bp_step(struct bp_stage *st, uint64_t seq)
{
	if (seq != st->expect)
		st->errors++;
	st->expect = seq + 1;
	st->sink += bp_work(st->iters, seq);
}

/* One run of one implementation. */
struct bp_run {
	uint64_t items;	  /* n */
	uint64_t wall_ns; /* measured window */
	uint64_t cpu_ns;  /* user + sys of the whole process (getrusage RUSAGE_SELF) over the window */
	uint64_t errors;  /* broken invariants found by the implementation itself */
	double others;	  /* CPUs kept busy by other processes during the window (from /proc/stat) */
};

/* The problem handed to a runner: S stages, n items, in[] and out[] of n numbers. */
struct bp_task {
	unsigned S;
	uint64_t n;
	const uint64_t *in;
	uint64_t *out;
	struct bp_stage *st; /* S entries, reset by the driver */
	unsigned tokens;     /* oneTBB max_number_of_live_tokens */
};

struct bp_meter {
	uint64_t wall0, cpu0, sys_busy0;
};
void bp_meter_start(struct bp_meter *m);
void bp_meter_stop(const struct bp_meter *m, struct bp_run *r);

/* oneTBB parallel_pipeline with serial_in_order filters (bench_pipeline_tbb.cc). 0 or -1. */
int bp_run_tbb(const struct bp_task *t, struct bp_run *r);

#ifdef __cplusplus
}
#endif
#endif
