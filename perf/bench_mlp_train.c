/*
 * bench_mlp_train: what training an MLP costs with the layer functions of include/mbpipe/model_train.h,
 * on one thread: each layer's forward (F), input-gradient (B_in) and weight-gradient (B_w) time at a
 * micro-batch size (the relative costs a zero-bubble schedule is built on), and the sequential training
 * step (F, loss, B over M micro-batches, then AdamW) in samples per second with OpenBLAS on one thread
 * (seq1) and on every allowed CPU (seqmt): the baselines a pipelined trainer is measured against.
 *
 *   bench_mlp_train [--layers 784,1024,1024,1024,10] [--mb 32] [--batch 256] [--steps 10] [--reps 20]
 *
 * Random inputs and labels (no data set needed). Prints a table and one grep-able summary line; exits 1
 * if a loss is not finite or a call fails.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbpipe.h>

#include "bench_util.h"

#define MAXL 64

struct cfg {
	uint32_t w[MAXL + 1];
	unsigned L;
	uint32_t mb, batch;
	unsigned steps, reps;
};

static int usage(void)
{
	fprintf(stderr, "usage: bench_mlp_train [--layers W0,W1,...] [--mb ROWS] [--batch ROWS] [--steps N] "
			"[--reps N]\n");
	return 2;
}

static int parse(int argc, char **argv, struct cfg *c)
{
	const char *layers = "784,1024,1024,1024,10";
	*c = (struct cfg){.mb = 32, .batch = 256, .steps = 10, .reps = 20};
	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			return -1;
		const char *k = argv[i], *v = argv[++i];
		char *end;
		unsigned long x = strtoul(v, &end, 10);
		if (!strcmp(k, "--layers"))
			layers = v;
		else if (*end || x == 0 || x > 1u << 20)
			return -1;
		else if (!strcmp(k, "--mb"))
			c->mb = (uint32_t)x;
		else if (!strcmp(k, "--batch"))
			c->batch = (uint32_t)x;
		else if (!strcmp(k, "--steps"))
			c->steps = (unsigned)x;
		else if (!strcmp(k, "--reps"))
			c->reps = (unsigned)x;
		else
			return -1;
	}
	const char *p = layers;
	for (c->L = 0; *p; c->L++) {
		char *end;
		unsigned long x = strtoul(p, &end, 10);
		if (c->L > MAXL || end == p || x == 0 || x > MBP_MODEL_MAX_WIDTH || (*end && *end != ','))
			return -1;
		c->w[c->L] = (uint32_t)x;
		p = *end ? end + 1 : end;
	}
	if (c->L < 2 || c->batch % c->mb)
		return -1;
	c->L--; /* widths -> layers */
	return 0;
}

static float *rnd(size_t n, uint64_t s)
{
	float *x = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005u + 1442695040888963407u;
		x[i] = (float)((double)(s >> 40) / (double)(1u << 24));
	}
	return x;
}

/* One training step of one stage over every layer: M micro-batches (F, loss, B), then the update. */
static int step(mbp_mlp_stage *st, const struct cfg *c, const float *x, const int32_t *y, float *out,
		float *stash, double *loss)
{
	uint32_t inw = c->w[0], outw = c->w[c->L];
	*loss = 0;
	for (uint32_t j = 0; j < c->batch / c->mb; j++) {
		const float *xj = x + (size_t)j * c->mb * inw;
		double l;
		int rc = mbp_mlp_stage_forward(st, xj, out, c->mb, stash);
		rc =
		    rc ? rc : mbp_loss_xent(out, y + (size_t)j * c->mb, c->mb, outw, c->batch, out, &l, NULL);
		rc = rc ? rc : mbp_mlp_stage_backward(st, stash, xj, out, NULL, c->mb);
		if (rc)
			return rc;
		*loss += l;
	}
	int rc = mbp_mlp_stage_update(st, 1.0f);
	return rc ? rc : mbp_mlp_stage_zero_grad(st);
}

int main(int argc, char **argv)
{
	struct cfg c;
	if (parse(argc, argv, &c))
		return usage();
	cpu_set_t set;
	int ncpus = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
	mbp_model_spec sp = {.layers = c.L, .widths = c.w, .act = MBP_ACT_RELU, .seed = 1};
	mbp_mlp *n;
	if (mbp_mlp_new_random(&n, &sp, NULL))
		return 1;
	int bad = 0;
	printf("bench_mlp_train: %d CPUs allowed; MLP", ncpus);
	for (unsigned i = 0; i <= c.L; i++)
		printf("%s%u", i ? "-" : " ", c.w[i]);
	printf(" ReLU, micro-batch %u rows, batch %u, AdamW\n%s\n", c.mb, c.batch, mbp_blas_info());
	if (mbp_blas_warning())
		printf("warning: %s\n", mbp_blas_warning());

	/* Per layer: the fastest of `reps` runs of each operation, one BLAS thread. */
	printf("%5s %11s %9s %9s %9s %7s %7s\n", "layer", "shape", "F_us", "B_in_us", "B_w_us", "Bin/F",
	       "Bw/F");
	double sum[3] = {0};
	for (unsigned i = 0; i < c.L; i++) {
		mbp_mlp_stage *st;
		if (mbp_mlp_stage_new(&st, n, i, i + 1, c.mb))
			return 1;
		float *x = rnd((size_t)c.mb * c.w[i], i), *out = rnd((size_t)c.mb * c.w[i + 1], 7 + i),
		      *dout = rnd((size_t)c.mb * c.w[i + 1], 9 + i), *din = rnd((size_t)c.mb * c.w[i], 3),
		      *stash = rnd(c.mb * mbp_mlp_stage_stash_floats(st), 5);
		double best[3] = {1e30, 1e30, 1e30};
		for (unsigned r = 0; r <= c.reps; r++) {
			uint64_t t0 = mbt_now_ns();
			bad |= mbp_mlp_stage_forward(st, x, out, c.mb, stash) != 0;
			uint64_t t1 = mbt_now_ns();
			bad |= mbp_mlp_stage_backward_in(st, stash, x, dout, i ? din : NULL, c.mb) != 0;
			uint64_t t2 = mbt_now_ns();
			bad |= mbp_mlp_stage_backward_w(st, stash, x, c.mb) != 0;
			uint64_t t3 = mbt_now_ns();
			double t[3] = {(double)(t1 - t0), (double)(t2 - t1), (double)(t3 - t2)};
			for (int k = 0; r && k < 3; k++) /* run 0 warms up */
				best[k] = fmin(best[k], t[k] / 1e3);
		}
		char shape[32];
		snprintf(shape, sizeof(shape), "%ux%u", c.w[i], c.w[i + 1]);
		printf("%5u %11s %9.1f %9.1f %9.1f %7.2f %7.2f\n", i, shape, best[0], best[1], best[2],
		       best[1] / best[0], best[2] / best[0]);
		for (int k = 0; k < 3; k++)
			sum[k] += best[k];
		mbp_mlp_stage_zero_grad(st);
		mbp_mlp_stage_destroy(st);
		free(x), free(out), free(dout), free(din), free(stash);
	}
	printf("%5s %11s %9.1f %9.1f %9.1f %7.2f %7.2f\n", "all", "", sum[0], sum[1], sum[2], sum[1] / sum[0],
	       sum[2] / sum[0]);

	/* Sequential steps, alternating one and all BLAS threads (the same code, the same model). */
	mbp_mlp_stage *st;
	if (mbp_mlp_stage_new(&st, n, 0, c.L, c.mb))
		return 1;
	float *x = rnd((size_t)c.batch * c.w[0], 11), *out = rnd((size_t)c.mb * c.w[c.L], 12);
	float *stash = rnd(c.mb * mbp_mlp_stage_stash_floats(st), 13);
	int32_t *y = malloc(c.batch * sizeof(int32_t));
	for (uint32_t r = 0; r < c.batch; r++)
		y[r] = (int32_t)(r * 7 % c.w[c.L]);
	double rate[2][BENCH_MEDIAN_MAX], loss = 0;
	unsigned steps = c.steps < BENCH_MEDIAN_MAX ? c.steps : BENCH_MEDIAN_MAX;
	for (unsigned s = 0; s <= steps && !bad; s++)
		for (int mt = 0; mt < 2 && !bad; mt++) {
			openblas_set_num_threads(mt ? ncpus : 1);
			uint64_t t0 = mbt_now_ns();
			bad |= step(st, &c, x, y, out, stash, &loss) != 0 || !isfinite(loss);
			uint64_t t1 = mbt_now_ns();
			if (s) /* step 0 of each warms up */
				rate[mt][s - 1] = c.batch / ((double)(t1 - t0) / 1e9);
		}
	openblas_set_num_threads(1);
	double seq1 = bench_median(rate[0], steps), seqmt = bench_median(rate[1], steps);
	printf("sequential step (F, loss, B per micro-batch, then AdamW), median of %u: seq1 %.0f samples/s, "
	       "seqmt (%d BLAS threads) %.0f samples/s, last loss %.4f\n",
	       steps, seq1, ncpus, seqmt, loss / c.batch);
	printf("bench_mlp_train: cpus=%d layers=%u mb=%u batch=%u f_us=%.1f bin_us=%.1f bw_us=%.1f "
	       "seq1_sps=%.0f seqmt_sps=%.0f \n",
	       ncpus, c.L, c.mb, c.batch, sum[0], sum[1], sum[2], seq1, seqmt);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
	free(x), free(out), free(stash), free(y);
	if (bad) {
		printf("bench_mlp_train: FAILED: a call failed or a loss was not finite\n");
		return 1;
	}
	return 0;
}
