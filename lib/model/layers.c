/*
 * The layer kernels: dense (the packed kernel of dense.c, or OpenBLAS), activation, layer normalisation;
 * and the sequential reference (mbp_model_forward, mbp__forward_batched) that runs them layer after layer on
 * one thread.
 *
 * A dense layer computes Y = X W^T + b for a micro-batch X of r rows, on the kernel its weights were made
 * for (mbp__weights: a version packed when it was loaded, a trainable model made under the packed kernel),
 * whatever mbp_kernel_set chose since. With the packed kernel (the default where the CPU has AVX2 and FMA;
 * mbp_kernel_set, MBP_KERNEL) it reads the packed weights, starts from the bias and applies a ReLU at the
 * store when nothing needs the values before it; a row's result then depends only on the row and the
 * weights. With OpenBLAS the bias rows are copied into Y, then one
 * cblas_sgemm (beta = 1) adds X W^T (cblas_sgemv for a single row, 1.5-2x faster: no packing); the result
 * may depend on the micro-batch's row count. The activation and the normalisation then run in place over
 * Y, row by row, in a fixed order: the sequential reference, the pipeline stages and the training forward
 * pass (mbp__layer_fwd, which also keeps what the backward pass needs) call these same functions and agree
 * bit for bit.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common.h"
#include "model_internal.h"

float *mbp__scratch_alloc(size_t n)
{
	size_t bytes;
	if (!n || !mbp__mul_size(n, sizeof(float), &bytes) || bytes > SIZE_MAX - MBP_CACHELINE)
		return NULL;
	bytes = (bytes + MBP_CACHELINE - 1) & ~(size_t)(MBP_CACHELINE - 1);
	float *p = aligned_alloc(MBP_CACHELINE, bytes);
	if (p)
		memset(p, 0, bytes);
	return p;
}

/* ReLU in place: y > 0 ? y : +0 (a NaN and -0 become +0). gcc -O2 makes the scalar loop a compare and a
 * jump per element, which on a layer's mixed signs mispredicts about half the time: a tenth of a stage's
 * time at 64 rows (perf/results/model.md). MAXPS(y, 0) returns y where y > 0 and its second operand, +0,
 * otherwise (NaN and both-zero cases included), so the vector loop writes the scalar loop's bits. */
void mbp__relu(float *y, size_t n)
{
	size_t i = 0;
#if defined(__SSE2__)
	const __m128 zero = _mm_setzero_ps();
	for (; i + 16 <= n; i += 16) {
		__m128 a = _mm_loadu_ps(y + i), b = _mm_loadu_ps(y + i + 4), c = _mm_loadu_ps(y + i + 8),
		       d = _mm_loadu_ps(y + i + 12);
		_mm_storeu_ps(y + i, _mm_max_ps(a, zero));
		_mm_storeu_ps(y + i + 4, _mm_max_ps(b, zero));
		_mm_storeu_ps(y + i + 8, _mm_max_ps(c, zero));
		_mm_storeu_ps(y + i + 12, _mm_max_ps(d, zero));
	}
	for (; i + 4 <= n; i += 4)
		_mm_storeu_ps(y + i, _mm_max_ps(_mm_loadu_ps(y + i), zero));
#endif
	for (; i < n; i++)
		y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

/* ReLU's backward: out = y > 0 ? dy : +0, element by element (out may be y: each element is read before it
 * is written). The same mispredicted compare and jump as the forward's scalar loop; CMPGTPS gives all ones
 * exactly where y > 0 (false for NaN), and AND with dy writes dy's bits there and +0 elsewhere: the scalar
 * loop's bits. */
void mbp__relu_grad(const float *y, const float *dy, float *out, size_t n)
{
	size_t i = 0;
#if defined(__SSE2__)
	const __m128 zero = _mm_setzero_ps();
	for (; i + 8 <= n; i += 8) {
		__m128 a = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + i), zero), _mm_loadu_ps(dy + i)),
		       b = _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + i + 4), zero), _mm_loadu_ps(dy + i + 4));
		_mm_storeu_ps(out + i, a);
		_mm_storeu_ps(out + i + 4, b);
	}
	for (; i + 4 <= n; i += 4)
		_mm_storeu_ps(out + i,
			      _mm_and_ps(_mm_cmpgt_ps(_mm_loadu_ps(y + i), zero), _mm_loadu_ps(dy + i)));
#endif
	for (; i < n; i++)
		out[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void activate(mbp_act act, float *y, size_t n)
{
	switch (act) {
	case MBP_ACT_NONE:
		break;
	case MBP_ACT_RELU:
		mbp__relu(y, n);
		break;
	case MBP_ACT_GELU:
		for (size_t i = 0; i < n; i++)
			y[i] = 0.5f * y[i] * (1.0f + erff(y[i] * (float)M_SQRT1_2));
		break;
	}
}

/* Normalise one row in place: mean and variance in double (two passes), then the affine map in float. Training
 * keeps the normalised values (xhat) and 1/sqrt(var + eps) for the backward pass; inference passes NULL. */
static void layer_norm(float *y, uint32_t n, float eps, const float *g, const float *beta, float *xhat,
		       float *inv_out)
{
	double sum = 0.0;
	for (uint32_t i = 0; i < n; i++)
		sum += y[i];
	double mean = sum / n, var = 0.0;
	for (uint32_t i = 0; i < n; i++) {
		double d = y[i] - mean;
		var += d * d;
	}
	var /= n;
	float inv = (float)(1.0 / sqrt(var + eps)), fmean = (float)mean;
	if (inv_out)
		*inv_out = inv;
	for (uint32_t i = 0; i < n; i++) {
		float h = (y[i] - fmean) * inv;
		if (xhat)
			xhat[i] = h;
		y[i] = h * g[i] + beta[i];
	}
}

void mbp__layer_fwd(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		    uint32_t rows, float *z, float *xhat, float *inv)
{
	const int in = (int)l->in, out = (int)l->out, ldw = w->ld ? (int)w->ld : in;
	mbp_act act = l->act;
	if (w->wp || w->pack_as_it_goes) { /* the object's kernel (model_internal.h), not the switch's */
		/* the ReLU at the store, unless the backward pass needs the values before it */
		bool fuse = act == MBP_ACT_RELU && !z;
		mbp__dense_packed(l, w, x, y, rows, fuse);
		if (fuse)
			act = MBP_ACT_NONE;
	} else {
		for (uint32_t r = 0; r < rows; r++)
			memcpy(y + (size_t)r * out, w->b, (size_t)out * sizeof(float));
		if (rows == 1)
			cblas_sgemv(CblasRowMajor, CblasNoTrans, out, in, 1.0f, w->w, ldw, x, 1, 1.0f, y, 1);
		else
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)rows, out, in, 1.0f, x, in,
				    w->w, ldw, 1.0f, y, out);
	}
	if (z)
		memcpy(z, y, (size_t)rows * out * sizeof(float));
	activate(act, y, (size_t)rows * out);
	if (l->norm)
		for (uint32_t r = 0; r < rows; r++)
			layer_norm(y + (size_t)r * out, l->out, l->eps, w->g, w->beta,
				   xhat ? xhat + (size_t)r * out : NULL, inv ? inv + r : NULL);
}

void mbp__layer_run(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		    uint32_t rows)
{
	mbp__layer_fwd(l, w, x, y, rows, NULL, NULL, NULL);
}

void mbp__layers_run_lw(const struct mbp__layer *l, const struct mbp__weights *lw, unsigned a, unsigned b,
			const float *x, float *y, uint32_t rows, float *s0, float *s1)
{
	MBP_ASSERT(a < b);
	const float *cur = x;
	for (unsigned i = a; i < b; i++) {
		float *dst = i + 1 == b ? y : ((i - a) & 1) ? s1 : s0;
		mbp__layer_run(&l[i], &lw[i], cur, dst, rows);
		cur = dst;
	}
}

void mbp__layers_run(const mbp_model *m, const struct mbp__version *v, unsigned a, unsigned b, const float *x,
		     float *y, uint32_t rows, float *s0, float *s1)
{
	MBP_ASSERT(a < b && b <= m->layers);
	mbp__layers_run_lw(m->l, v->lw, a, b, x, y, rows, s0, s1);
}

int mbp__forward_batched(const struct mbp__layer *l, const struct mbp__weights *lw, unsigned L,
			 uint32_t max_width, const float *in, float *out, size_t rows, uint32_t mb_rows)
{
	if (!rows)
		return 0;
	size_t mb = mb_rows && mb_rows < rows ? mb_rows : rows;
	if (mb > UINT32_MAX)
		mb = UINT32_MAX;
	float *s0 = NULL, *s1 = NULL;
	if (L > 1) {
		size_t n;
		if (!mbp__mul_size(mb, max_width, &n))
			return -ENOMEM;
		s0 = mbp__scratch_alloc(n);
		s1 = mbp__scratch_alloc(n);
		if (!s0 || !s1) {
			free(s0);
			free(s1);
			return -ENOMEM;
		}
	}
	const size_t inw = l[0].in, outw = l[L - 1].out;
	for (size_t off = 0; off < rows; off += mb) {
		uint32_t r = (uint32_t)(rows - off < mb ? rows - off : mb);
		mbp__layers_run_lw(l, lw, 0, L, in + off * inw, out + off * outw, r, s0, s1);
	}
	free(s0);
	free(s1);
	return 0;
}

/* The sequential reference: the model's current weights, every layer in turn, on the caller's thread. */
int mbp_model_forward(mbp_model *m, const float *in, float *out, size_t rows, uint32_t mb_rows)
{
	if (!m || (rows && (!in || !out)))
		return -EINVAL;
	if (!rows)
		return 0;
	struct mbp__version *v = mbp__version_get_locked(m);
	int rc = mbp__forward_batched(m->l, v->lw, m->layers, m->max_width, in, out, rows, mb_rows);
	mbp__version_put(v);
	return rc;
}
