/*
 * The products of a dense layer as the library calls OpenBLAS for them, and the rate OpenBLAS reaches at
 * one of them on pinned threads: shared by the benchmarks that measure the machine's limit (bench_roofline,
 * bench_mlp's roof2, bench_mlp_train --roofline). Needs cblas.h (OPENBLAS_CFLAGS). Not part of the library.
 *
 * A layer of `in` inputs and `out` outputs at `rows` rows (flops 2 rows in out each):
 *
 *   BENCH_FWD  y = x W^T     rows x out   cblas_sgemm(NoTrans, Trans), beta 1 (onto the bias: layers.c);
 *                                         cblas_sgemv for one row, as layers.c
 *   BENCH_DX   dx = dz W     rows x in    cblas_sgemm(NoTrans, NoTrans), beta 0 (mlp.c's input gradient)
 *   BENCH_DW   dW += dz^T x  out x in     cblas_sgemm(Trans, NoTrans), beta 1 (mlp.c's weight gradient)
 *
 * With `packed` set (fwd only), y = x W^T + b runs on the library's packed kernel (lib/model/dense.c)
 * over W packed once per copy, as a version's layers are: what a stage computes under MBP_KERNEL=packed.
 */
#ifndef MBP_BENCH_BLAS_H
#define MBP_BENCH_BLAS_H

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cblas.h>

#include "bench_util.h"
#include "model/model_internal.h" /* the packed kernel */

enum bench_op { BENCH_FWD, BENCH_DX, BENCH_DW, BENCH_OPS };

/* A layer's operands; `ldw` is W's row stride (in, or padded as the library's stages lay it out). */
struct bench_layer {
	uint32_t rows, in, out;
	int ldw;
	const float *x, *dz;
	float *w, *y, *dx, *dw;
	const float *wp; /* W and a bias packed for the packed kernel (fwd), or NULL: OpenBLAS */
};

/* One product, the call the library makes (same transposes, same beta). */
static inline void bench_layer_product(enum bench_op op, const struct bench_layer *l)
{
	const int r = (int)l->rows, in = (int)l->in, out = (int)l->out;
	if (op == BENCH_FWD && l->wp) {
		const struct mbp__layer ly = {.in = l->in, .out = l->out};
		const struct mbp__weights w = {.w = l->w, .b = l->y, .wp = l->wp};
		mbp__dense_packed(&ly, &w, l->x, l->y, l->rows, false);
	} else if (op == BENCH_FWD && r == 1)
		cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, l->w, l->ldw, l->x, 1, 1.0f, l->y, 1);
	else if (op == BENCH_FWD)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, out, in, 1.0f, l->x, in, l->w, l->ldw,
			    1.0f, l->y, out);
	else if (op == BENCH_DX)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, r, in, out, 1.0f, l->dz, out, l->w,
			    l->ldw, 0.0f, l->dx, in);
	else
		cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, r, 1.0f, l->dz, out, l->x, in,
			    1.0f, l->dw, in);
}

/* n floats in [0, scale), 64-byte aligned, from a seed; NULL when out of memory. Pair with free(). */
static inline float *bench_random_floats(size_t n, uint64_t seed, float scale)
{
	float *p = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
	for (size_t i = 0; p && i < n; i++) {
		seed = seed * 6364136223846793005u + 1442695040888963407u;
		p[i] = scale * (float)((double)(seed >> 40) / (double)(1u << 24));
	}
	return p;
}

/* ---- the rate of one product on pinned threads, each on its own operands ---- */

#define BENCH_MAX_COPIES 64

struct bench_rate_thread {
	enum bench_op op;
	struct bench_layer l;
	float *big[BENCH_MAX_COPIES]; /* W (fwd, dx) or dW (dw), cycled */
	float *pk[BENCH_MAX_COPIES];  /* with packed: each W packed (fwd) */
	bool packed;
	unsigned copies, iters;
	int cpu;
	pthread_barrier_t *start;
	bool oom;
};

static inline void bench_rate_thread_free(struct bench_rate_thread *t)
{
	for (unsigned k = 0; k < t->copies; k++) {
		free(t->big[k]), t->big[k] = NULL;
		free(t->pk[k]), t->pk[k] = NULL;
	}
	free((void *)t->l.x);
	free((void *)t->l.dz);
	free(t->l.y);
	free(t->l.dx);
	t->l.x = t->l.dz = t->l.y = t->l.dx = NULL;
}

static inline void bench_rate_step(struct bench_rate_thread *t, unsigned i)
{
	if (t->op == BENCH_DW)
		t->l.dw = t->big[i % t->copies];
	else
		t->l.w = t->big[i % t->copies];
	t->l.wp = t->packed && t->op == BENCH_FWD ? t->pk[i % t->copies] : NULL;
	bench_layer_product(t->op, &t->l);
}

/* Allocates t's operands for t->op at t->l's shape, t->copies big ones, from a seed; false when out of
 * memory (what was allocated is then freed too). */
static inline bool bench_rate_thread_alloc(struct bench_rate_thread *t, uint64_t seed)
{
	const uint32_t r = t->l.rows, in = t->l.in, out = t->l.out;
	t->l.ldw = (int)in;
	t->l.x = bench_random_floats((size_t)r * in, seed + 1, 1.0f);
	t->l.dz = bench_random_floats((size_t)r * out, seed + 2, 1.0f);
	t->l.y = bench_random_floats((size_t)r * out, seed + 3, 1.0f);
	t->l.dx = bench_random_floats((size_t)r * in, seed + 4, 1.0f);
	bool ok = t->l.x && t->l.dz && t->l.y && t->l.dx;
	for (unsigned k = 0; k < t->copies; k++)
		ok &= (t->big[k] = bench_random_floats((size_t)in * out, seed + 10 + k, 0.03f)) != NULL;
	for (unsigned k = 0; ok && t->packed && t->op == BENCH_FWD && k < t->copies; k++) {
		ok &= (t->pk[k] = mbp__scratch_alloc(mbp__dense_packed_floats(in, out))) != NULL;
		if (ok) /* any bias: the product's cost does not depend on it */
			mbp__dense_pack(in, out, t->big[k], in, t->l.y, t->pk[k]);
	}
	if (!ok)
		bench_rate_thread_free(t);
	return ok;
}

static inline void *bench_rate_main(void *p)
{
	struct bench_rate_thread *t = p;
	bench_pin(t->cpu);
	t->oom = !bench_rate_thread_alloc(t, 1000 * (uint64_t)t->cpu);
	for (unsigned k = 0; !t->oom && k < t->copies; k++)
		bench_rate_step(t, k); /* warm: the kernel's buffers, the pages */
	pthread_barrier_wait(t->start);
	for (unsigned i = 0; !t->oom && i < t->iters; i++)
		bench_rate_step(t, i);
	return NULL;
}

/* Seconds one product of t takes (t allocated), roughly: to size a measurement. */
static inline double bench_rate_one_s(struct bench_rate_thread *t)
{
	bench_rate_step(t, 0);
	uint64_t t0 = mbt_now_ns();
	bench_rate_step(t, 0);
	return fmax((double)(mbt_now_ns() - t0) * 1e-9, 1e-7);
}

/*
 * GFLOP/s of `op` at rows x in -> out with one OpenBLAS thread on each of n pinned threads (cpus[0..n),
 * n <= 64) at once, summed: the limit of n pipeline stages that compute nothing but this product. Each
 * thread cycles through its own `copies` big operands (W, or dW for dw): a stage's layers, which stay in
 * the caches or not as a stage's do. Each runs for about `seconds`, sized from one product timed on the
 * calling thread. Sets OpenBLAS to one thread. Returns 0 when out of memory or threads.
 */
static inline double bench_pinned_rate_k(enum bench_op op, bool packed, uint32_t rows, uint32_t in,
					 uint32_t out, const int *cpus, unsigned n, unsigned copies,
					 double seconds)
{
	openblas_set_num_threads(1);
	if (n < 1 || n > 64 || copies < 1 || copies > BENCH_MAX_COPIES)
		return 0;
	struct bench_rate_thread t[64];
	pthread_t tid[64];
	pthread_barrier_t start;
	/* the size of a measurement: one product, timed on the calling thread (once warm) */
	struct bench_rate_thread probe = {
	    .op = op, .l = {.rows = rows, .in = in, .out = out}, .copies = 1, .packed = packed};
	if (!bench_rate_thread_alloc(&probe, 1))
		return 0;
	unsigned iters = (unsigned)fmax(4, seconds / bench_rate_one_s(&probe));
	bench_rate_thread_free(&probe);

	if (pthread_barrier_init(&start, NULL, n + 1))
		return 0;
	unsigned started = 0;
	for (; started < n; started++) {
		t[started] = (struct bench_rate_thread){.op = op,
							.l = {.rows = rows, .in = in, .out = out},
							.copies = copies,
							.packed = packed,
							.iters = iters,
							.cpu = cpus[started],
							.start = &start};
		if (pthread_create(&tid[started], NULL, bench_rate_main, &t[started]))
			break;
	}
	if (started < n) { /* the barrier waits for n + 1: the started threads would never pass it */
		fprintf(stderr, "bench: cannot start a thread\n");
		exit(1);
	}
	pthread_barrier_wait(&start);
	uint64_t t0 = mbt_now_ns();
	bool oom = false;
	for (unsigned i = 0; i < n; i++) {
		pthread_join(tid[i], NULL);
		oom |= t[i].oom;
	}
	double dt = (double)(mbt_now_ns() - t0) * 1e-9;
	for (unsigned i = 0; i < n; i++)
		bench_rate_thread_free(&t[i]);
	pthread_barrier_destroy(&start);
	return oom ? 0 : 2.0 * rows * in * out * iters * n / dt * 1e-9;
}

/* bench_pinned_rate_k on OpenBLAS. */
static inline double bench_pinned_rate(enum bench_op op, uint32_t rows, uint32_t in, uint32_t out,
				       const int *cpus, unsigned n, unsigned copies, double seconds)
{
	return bench_pinned_rate_k(op, false, rows, in, out, cpus, n, copies, seconds);
}

#endif
