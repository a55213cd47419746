/*
 * The synthetic training workload of the trainer's benchmarks (bench_train, bench_mpi_train): stages whose
 * F, B_in and B_w are calibrated busy loops (util/burn.h, the loop pipebench uses too), so
 * that a cost is work, not a sleep. Call calibrate() once, then give each stage a struct syn.
 */
#ifndef MBP_BENCH_SYN_H
#define MBP_BENCH_SYN_H

#include <stdint.h>

#include <mbpipe.h>

#include "util/burn.h"
#include "bench_util.h"

static double iters_per_us;

static void calibrate(void)
{
	iters_per_us = burn_calibrate();
}

struct syn {
	double f_us, bin_us, bw_us;
	uint64_t sink;
};

static int spin(struct syn *s, double us)
{
	s->sink = burn((uint64_t)(us * iters_per_us), s->sink);
	return 0;
}
static int syn_f(void *ctx, const mbp_train_io *io)
{
	(void)io;
	return spin(ctx, ((struct syn *)ctx)->f_us);
}
static int syn_bin(void *ctx, const mbp_train_io *io)
{
	(void)io;
	return spin(ctx, ((struct syn *)ctx)->bin_us);
}
static int syn_bw(void *ctx, const mbp_train_io *io)
{
	(void)io;
	return spin(ctx, ((struct syn *)ctx)->bw_us);
}
static int syn_update(void *ctx, const mbp_train_update *u)
{
	(void)ctx;
	(void)u;
	return 0;
}
static void syn_discard(void *ctx)
{
	(void)ctx;
}
static int syn_loss(void *arg, const mbp_train_io *io, double *loss)
{
	(void)arg;
	(void)io;
	*loss = 0;
	return 0;
}

/* A stage of the synthetic workload (rows of 4 bytes; no parameters, no gradient norm). */
static inline mbp_train_stage_desc syn_desc(struct syn *s)
{
	return (mbp_train_stage_desc){.ctx = s,
				      .out_row_bytes = 4,
				      .forward = syn_f,
				      .backward_in = syn_bin,
				      .backward_w = syn_bw,
				      .update = syn_update,
				      .discard = syn_discard};
}

#endif
