/*
 * bench_mlp_train: what training an MLP costs with the layer functions of include/mbpipe/model_train.h,
 * on one thread: each layer's forward (F), input-gradient (B_in) and weight-gradient (B_w) time at a
 * micro-batch size (the relative costs a zero-bubble schedule is built on), the end-of-step work of each
 * layer (U: its squared gradient norm, AdamW with its packed or padded copy written, the gradient zeroed,
 * as a trainer's stage runs them once a step), and the sequential training
 * step (F, loss, B over M micro-batches, then AdamW) in samples per second with OpenBLAS on one thread
 * (seq1) and on every allowed CPU (seqmt): the baselines a pipelined trainer is measured against.
 *
 * With --roofline it measures instead the limit a training step can reach on this machine: every sgemm a
 * step makes (per layer and micro-batch: F = x W^T, B_in = dz W except layer 0, B_w = dz^T x, the calls
 * and shapes of lib/model/mlp.c), each timed alone with one BLAS thread (the best of --reps), first on one
 * core, then on every allowed CPU at once (one pinned thread per CPU running the same products, as the
 * stages of a pipeline do: they share the caches and memory). The 2-core limit of a step is the sum of its
 * products' times at the concurrent rate divided by the CPUs: no bubble, no hand-off, nothing but sgemm.
 *
 * With --padded the weights' rows are laid out as the library's stages read them (a row of a multiple of
 * 1024 floats padded by 16: lib/model/mlp_internal.h), else packed, as a caller's contiguous matrices.
 *
 *   bench_mlp_train [--layers 784,1024,1024,1024,10] [--mb 32] [--batch 256] [--steps 10] [--reps 20]
 *                   [--roofline [--padded]]
 *
 * Random inputs and labels (no data set needed). Prints a table and one grep-able summary line
 * ("bench_mlp_train:" or "bench_mlp_train_roofline:"); exits 1 if a loss is not finite or a call fails.
 */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbpipe.h>

#include "bench_blas.h"
#include "bench_util.h"

#define MAXL 64

struct cfg {
	uint32_t w[MAXL + 1];
	unsigned L;
	uint32_t mb, batch;
	unsigned steps, reps;
	bool roofline, padded;
};

static int usage(void)
{
	fprintf(stderr, "usage: bench_mlp_train [--layers W0,W1,...] [--mb ROWS] [--batch ROWS] [--steps N] "
			"[--reps N] [--roofline [--padded]]\n");
	return 2;
}

static int parse(int argc, char **argv, struct cfg *c)
{
	const char *layers = "784,1024,1024,1024,10";
	*c = (struct cfg){.mb = 32, .batch = 256, .steps = 10, .reps = 20};
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--roofline") || !strcmp(argv[i], "--padded")) {
			c->roofline |= argv[i][2] == 'r';
			c->padded |= argv[i][2] == 'p';
			continue;
		}
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

/* ---- the roofline: the step's sgemm calls alone ---- */

enum { P_F = BENCH_FWD, P_BIN = BENCH_DX, P_BW = BENCH_DW, P_KINDS = BENCH_OPS };
static const char *const prod_name[P_KINDS] = {"F", "B_in", "B_w"};

/* The row stride of a layer's weights: `in`, or padded as the library's stages read them. */
static int weight_ld(uint32_t in, bool padded)
{
	return (int)(padded && in % 1024 == 0 ? in + 16 : in);
}

struct roof_thread {
	const struct cfg *c;
	int cpu; /* -1: not pinned */
	pthread_barrier_t *bar;
	double best_ns[MAXL][P_KINDS];
};

/* The best of c->reps calls of every product of every layer (after one warm-up call each); with a barrier,
 * every thread starts each product's calls together, so the cores share the caches and memory as a
 * pipeline's stages do. */
static void *roof_run(void *arg)
{
	struct roof_thread *rt = arg;
	const struct cfg *c = rt->c;
	if (rt->cpu >= 0)
		bench_pin(rt->cpu);
	uint32_t wmax = 0;
	for (unsigned i = 0; i <= c->L; i++)
		wmax = c->w[i] > wmax ? c->w[i] : wmax;
	size_t rw = (size_t)c->mb * wmax, ww = (size_t)wmax * (wmax + 16);
	float *x = rnd(rw, 1), *w = rnd(ww, 2), *y = rnd(rw, 3), *dz = rnd(rw, 4), *dx = rnd(rw, 5),
	      *dw = rnd(ww, 6);
	for (unsigned i = 0; i < c->L; i++)
		for (int k = 0; k < P_KINDS; k++) {
			rt->best_ns[i][k] = 0;
			if (k == P_BIN && i == 0)
				continue; /* layer 0 has no input gradient to compute */
			if (rt->bar)
				pthread_barrier_wait(rt->bar);
			const struct bench_layer l = {.rows = c->mb,
						      .in = c->w[i],
						      .out = c->w[i + 1],
						      .ldw = weight_ld(c->w[i], c->padded),
						      .x = x,
						      .dz = dz,
						      .w = w,
						      .y = y,
						      .dx = dx,
						      .dw = dw};
			double best = 1e300;
			for (unsigned r = 0; r <= c->reps; r++) {
				uint64_t t0 = mbt_now_ns();
				bench_layer_product((enum bench_op)k, &l);
				double t = (double)(mbt_now_ns() - t0);
				if (r && t < best) /* call 0 warms up */
					best = t;
			}
			rt->best_ns[i][k] = best;
		}
	free(x), free(w), free(y), free(dz), free(dx), free(dw);
	return NULL;
}

static int roofline(const struct cfg *c, int ncpus)
{
	openblas_set_num_threads(1);
	static struct roof_thread alone, both[CPU_SETSIZE];
	alone = (struct roof_thread){.c = c, .cpu = -1};
	roof_run(&alone);
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, (unsigned)ncpus);
	pthread_t tid[CPU_SETSIZE];
	cpu_set_t set;
	sched_getaffinity(0, sizeof(set), &set);
	for (int t = 0, cpu = 0; t < ncpus; t++, cpu++) {
		while (!CPU_ISSET(cpu, &set))
			cpu++;
		both[t] = (struct roof_thread){.c = c, .cpu = cpu, .bar = &bar};
		if (pthread_create(&tid[t], NULL, roof_run, &both[t]))
			return 1;
	}
	for (int t = 0; t < ncpus; t++)
		pthread_join(tid[t], NULL);
	pthread_barrier_destroy(&bar);

	/* Per layer and product: GFLOP/s alone and at once (the mean of the threads' times). */
	const double M = (double)c->batch / c->mb;
	double flops = 0, t1 = 0, tn = 0, kflops[P_KINDS] = {0}, kt1[P_KINDS] = {0}, ktn[P_KINDS] = {0};
	printf("%5s %11s %6s %12s %12s %10s\n", "layer", "shape", "op", "GFLOP/s_1", "GFLOP/s_all", "us_all");
	for (unsigned i = 0; i < c->L; i++)
		for (int k = 0; k < P_KINDS; k++) {
			if (k == P_BIN && i == 0)
				continue;
			double f = 2.0 * c->mb * c->w[i] * c->w[i + 1], a = alone.best_ns[i][k], n = 0;
			for (int t = 0; t < ncpus; t++)
				n += both[t].best_ns[i][k] / ncpus;
			char shape[32];
			snprintf(shape, sizeof(shape), "%ux%u", c->w[i], c->w[i + 1]);
			printf("%5u %11s %6s %12.1f %12.1f %10.1f\n", i, shape, prod_name[k], f / a, f / n,
			       n / 1e3);
			flops += M * f, t1 += M * a, tn += M * n;
			kflops[k] += f, kt1[k] += a, ktn[k] += n;
		}
	/* The limit: every product of the step at the concurrent rate, the work shared evenly by the CPUs. */
	double limit1 = c->batch / (t1 * 1e-9), limit = c->batch / (tn * 1e-9 / ncpus);
	printf("a step (%u x %u rows): %.3f GFLOP in %.2f ms of sgemm on one core alone, %.2f ms at the "
	       "rate of all %d at once: limit %.0f samples/s on one core, %.0f on %d\n",
	       (unsigned)M, c->mb, flops * 1e-9, t1 * 1e-6, tn * 1e-6, ncpus, limit1, limit, ncpus);
	printf("bench_mlp_train_roofline: cpus=%d layers=%u mb=%u batch=%u gflop_step=%.4f gflops_1=%.1f "
	       "gflops_all=%.1f f_gflops=%.1f bin_gflops=%.1f bw_gflops=%.1f limit_sps_1cpu=%.0f "
	       "limit_sps=%.0f layout=%s kernel=%s\n",
	       ncpus, c->L, c->mb, c->batch, flops * 1e-9, flops / t1, flops / tn, kflops[P_F] / ktn[P_F],
	       kflops[P_BIN] / ktn[P_BIN], kflops[P_BW] / ktn[P_BW], limit1, limit,
	       c->padded ? "padded" : "packed", openblas_get_corename());
	return 0;
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
	if (c.roofline) {
		mbp_mlp_destroy(n);
		return roofline(&c, ncpus);
	}

	/* Per layer: the fastest of `reps` runs of each operation, one BLAS thread. */
	printf("%5s %11s %9s %9s %9s %7s %7s %9s\n", "layer", "shape", "F_us", "B_in_us", "B_w_us", "Bin/F",
	       "Bw/F", "U_us");
	double sum[4] = {0};
	for (unsigned i = 0; i < c.L; i++) {
		mbp_mlp_stage *st;
		if (mbp_mlp_stage_new(&st, n, i, i + 1, c.mb))
			return 1;
		float *x = rnd((size_t)c.mb * c.w[i], i), *out = rnd((size_t)c.mb * c.w[i + 1], 7 + i),
		      *dout = rnd((size_t)c.mb * c.w[i + 1], 9 + i), *din = rnd((size_t)c.mb * c.w[i], 3),
		      *stash = rnd(c.mb * mbp_mlp_stage_stash_floats(st), 5);
		double best[4] = {1e30, 1e30, 1e30, 1e30};
		for (unsigned r = 0; r <= c.reps; r++) {
			uint64_t t0 = mbt_now_ns();
			bad |= mbp_mlp_stage_forward(st, x, out, c.mb, stash) != 0;
			uint64_t t1 = mbt_now_ns();
			bad |= mbp_mlp_stage_backward_in(st, stash, x, dout, i ? din : NULL, c.mb) != 0;
			uint64_t t2 = mbt_now_ns();
			bad |= mbp_mlp_stage_backward_w(st, stash, x, c.mb) != 0;
			uint64_t t3 = mbt_now_ns();
			/* the end of a step: what pipetrain's stages run (tools/shared/stages.c), whole */
			double sq;
			bad |= mbp_mlp_stage_grad_sqnorm(st, &sq) != 0;
			bad |= mbp_mlp_stage_update(st, 1.0f) != 0;
			bad |= mbp_mlp_stage_zero_grad(st) != 0;
			uint64_t t4 = mbt_now_ns();
			double t[4] = {(double)(t1 - t0), (double)(t2 - t1), (double)(t3 - t2),
				       (double)(t4 - t3)};
			for (int k = 0; r && k < 4; k++) /* run 0 warms up */
				best[k] = fmin(best[k], t[k] / 1e3);
		}
		char shape[32];
		snprintf(shape, sizeof(shape), "%ux%u", c.w[i], c.w[i + 1]);
		printf("%5u %11s %9.1f %9.1f %9.1f %7.2f %7.2f %9.1f\n", i, shape, best[0], best[1], best[2],
		       best[1] / best[0], best[2] / best[0], best[3]);
		for (int k = 0; k < 4; k++)
			sum[k] += best[k];
		mbp_mlp_stage_zero_grad(st);
		mbp_mlp_stage_destroy(st);
		free(x), free(out), free(dout), free(din), free(stash);
	}
	printf("%5s %11s %9.1f %9.1f %9.1f %7.2f %7.2f %9.1f\n", "all", "", sum[0], sum[1], sum[2],
	       sum[1] / sum[0], sum[2] / sum[0], sum[3]);

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
	       "seq1_sps=%.0f seqmt_sps=%.0f u_us=%.1f\n",
	       ncpus, c.L, c.mb, c.batch, sum[0], sum[1], sum[2], seq1, seqmt, sum[3]);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
	free(x), free(out), free(stash), free(y);
	if (bad) {
		printf("bench_mlp_train: FAILED: a call failed or a loss was not finite\n");
		return 1;
	}
	return 0;
}
