/*
 * The dense product's own kernel: Y = X W^T + b (then ReLU, if asked) from weights packed once per
 * version, and the switch between it and OpenBLAS (mbp_kernel_set, MBP_KERNEL).
 *
 * Why. OpenBLAS packs the weights (its B operand) into panels on every call; at a stage's micro-batch sizes
 * that copy is 40 % of a product at 64 rows and 80 % at 8 (perf/results/model.md). A version's weights
 * never change, so the packing is done once, when the version is built (mbp__dense_pack), and every product
 * reads the panels.
 *
 * Layout (mbp__dense_pack): the out rows of W cut into panels of NR = 16 outputs; panel p holds, for
 * k = 0 .. in - 1, the 16 floats W[16p .. 16p + 15][k] (zeros past out), 64-byte aligned; after the last
 * panel the bias, padded to a multiple of 16 with zeros.
 *
 * The kernel (AVX2 + FMA): a tile of up to MR = 6 rows by 16 outputs in 12 accumulators, started from the
 * bias, then for k = 0, 1, ..., in - 1 in order acc = fma(x[r][k], W[j][k], acc): every output element is
 * that one chain of fused multiply-adds, whatever the tile's row count, the micro-batch's row count or the
 * row's position in it. K is cut into blocks of KC (the panel's block stays in L1 while the rows of the
 * micro-batch pass over it) and M into blocks of MC rows (which stay in L2); between K blocks a tile goes
 * through Y and comes back exactly (a float store and load), so the chain is unbroken. The rows of an M
 * block are copied per product into MR-row micro-panels in a buffer each thread allocates once (rows a
 * multiple of 4 KiB apart would otherwise share L1 sets). So a row's result depends only on that row
 * and the weights: the sequential reference, the pipeline stages and the training forward, which all call
 * mbp__layer_fwd, agree bit for bit, at any micro-batch size. A trainable model keeps its own packed copy,
 * which its updates write piece by piece (mbp__dense_pack_update, mbp__dense_pack_rows). A layer of such a
 * model whose tensors were handed out (mbp_mlp_tensor) keeps the packed kernel without a current copy: its
 * weights are packed one KC x 16 block at a time into a buffer on the stack, the same panels, the same
 * bits, slower.
 *
 * The switch: MBP_KERNEL=blas|packed in the environment (read once, at the first product or query), or
 * mbp_kernel_set(); the default is the packed kernel where the CPU has AVX2 and FMA, OpenBLAS elsewhere.
 * It applies to the objects made afterwards: a version packed when it was loaded, or a trainable model
 * made under the packed kernel, computes on it for its life, and one made under OpenBLAS on OpenBLAS.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model_internal.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define DENSE_X86 1
#include <immintrin.h>
#endif

#define NR 16  /* outputs per panel: two 8-float vectors */
#define MR 6   /* rows per tile: 6 x 2 accumulators, 2 for the panel, 1 broadcast: 15 of 16 registers */
#define KC 256 /* k per block: a panel's block is KC x 16 x 4 = 16 KiB, in L1 */
#define MC 96  /* rows per block: MC x KC x 4 = 96 KiB of X, in L2 */

/* ---- the switch ---- */

static _Atomic int kernel_sel; /* an mbp_kernel, resolved (never MBP_KERNEL_DEFAULT once set) */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;

bool mbp__dense_cpu_ok(void)
{
#ifdef DENSE_X86
	__builtin_cpu_init();
	return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
	return false;
#endif
}

static char env_warning[160]; /* written once, under env_once; "" when MBP_KERNEL was fine or unset */

static void read_env(void)
{
	const char *e = getenv("MBP_KERNEL");
	const bool ok = mbp__dense_cpu_ok();
	int k = ok ? MBP_KERNEL_PACKED : MBP_KERNEL_BLAS;
	if (e && !strcmp(e, "blas"))
		k = MBP_KERNEL_BLAS;
	else if (e && strcmp(e, "packed")) /* a typo ("BLAS", "openblas") would silently run the default */
		snprintf(env_warning, sizeof(env_warning),
			 "MBP_KERNEL='%.40s' is not a dense kernel (blas or packed): using %s", e,
			 mbp_kernel_name((mbp_kernel)k));
	else if (e && !ok) /* "packed" on a CPU without AVX2 and FMA: OpenBLAS, the only kernel that runs */
		snprintf(env_warning, sizeof(env_warning),
			 "MBP_KERNEL=packed needs AVX2 and FMA, which this CPU lacks: using blas");
	/* relaxed: pthread_once orders this store before every reader's load */
	atomic_store_explicit(&kernel_sel, k, memory_order_relaxed);
}

const char *mbp_kernel_warning(void)
{
	pthread_once(&env_once, read_env);
	return env_warning[0] ? env_warning : NULL;
}

mbp_kernel mbp_kernel_get(void)
{
	pthread_once(&env_once, read_env);
	/* relaxed: a selection, not a publication; the products it picks read nothing it wrote */
	return (mbp_kernel)atomic_load_explicit(&kernel_sel, memory_order_relaxed);
}

int mbp_kernel_set(mbp_kernel k)
{
	if (k != MBP_KERNEL_DEFAULT && k != MBP_KERNEL_BLAS && k != MBP_KERNEL_PACKED)
		return -EINVAL;
	if (k == MBP_KERNEL_PACKED && !mbp__dense_cpu_ok())
		return -ENOTSUP;
	pthread_once(&env_once, read_env); /* so that a later first query does not overwrite the choice */
	if (k == MBP_KERNEL_DEFAULT)
		k = mbp__dense_cpu_ok() ? MBP_KERNEL_PACKED : MBP_KERNEL_BLAS;
	atomic_store_explicit(&kernel_sel, k, memory_order_relaxed); /* relaxed: as in mbp_kernel_get */
	return 0;
}

const char *mbp_kernel_name(mbp_kernel k)
{
	switch (k) {
	case MBP_KERNEL_BLAS:
		return "blas";
	case MBP_KERNEL_PACKED:
		return "packed";
	case MBP_KERNEL_DEFAULT:
		return "default";
	default:
		return "unknown";
	}
}

/* ---- packing ---- */

static size_t panels_of(uint32_t out)
{
	return ((size_t)out + NR - 1) / NR;
}

size_t mbp__dense_packed_floats(uint32_t in, uint32_t out)
{
	return panels_of(out) * NR * ((size_t)in + 1);
}

/* Rows k0 .. k0 + kc - 1 of panel p: dst[k][jj] = W[16p + jj][k0 + k], zero past out. */
static void pack_block(const float *w, size_t ld, uint32_t out, size_t p, size_t k0, size_t kc, float *dst)
{
	const size_t j0 = p * NR, nv = out - j0 < NR ? out - j0 : NR;
	for (size_t jj = 0; jj < nv; jj++) {
		const float *src = w + (j0 + jj) * ld + k0;
		for (size_t k = 0; k < kc; k++)
			dst[k * NR + jj] = src[k];
	}
	for (size_t jj = nv; jj < NR; jj++)
		for (size_t k = 0; k < kc; k++)
			dst[k * NR + jj] = 0.0f;
}

void mbp__dense_pack(uint32_t in, uint32_t out, const float *w, uint32_t ld, const float *b, float *dst)
{
	const size_t P = panels_of(out), ldw = ld ? ld : in;
	for (size_t p = 0; p < P; p++)
		pack_block(w, ldw, out, p, 0, in, dst + p * in * NR);
	memcpy(dst + P * in * NR, b, (size_t)out * sizeof(float));
	memset(dst + P * in * NR + out, 0, (P * NR - out) * sizeof(float));
}

void mbp__dense_pack_update(uint32_t in, uint32_t out, float *dst, bool bias, size_t e0, size_t e1,
			    const float *src)
{
	const size_t P = panels_of(out);
	if (bias) {
		memcpy(dst + P * in * NR + e0, src, (e1 - e0) * sizeof(float));
		return;
	}
	const size_t r = e0 / in, k0 = e0 % in;
	MBP_ASSERT(e1 - e0 <= in - k0); /* one row's segment */
	float *d = dst + (r / NR) * in * NR + k0 * NR + r % NR;
	for (size_t k = 0; k < e1 - e0; k++)
		d[k * NR] = src[k];
}

#ifdef DENSE_X86
/* Rows [r0, r0 + 8) (r0 a multiple of 8) of w into the packed copy: 8 x 8 blocks transposed in registers,
 * each k's 8 values one store (half of a panel's line). */
__attribute__((target("avx2,fma"))) static void pack_rows8(uint32_t in, const float *w, size_t r0, float *dst)
{
	float *d = dst + (r0 / NR) * in * NR + r0 % NR;
	const float *s = w + r0 * in;
	size_t k = 0;
	for (; k + 8 <= in; k += 8) {
		__m256 r[8], t[8];
		for (int i = 0; i < 8; i++)
			r[i] = _mm256_loadu_ps(s + i * in + k);
		for (int i = 0; i < 8; i += 2) {
			t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
			t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
		}
		for (int i = 0; i < 8; i += 4) {
			r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
			r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
			r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
			r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
		}
		/* r[0..3]: columns k+{0,1,2,3} of rows 0-3 | k+{4,5,6,7} of rows 0-3; r[4..7]: rows 4-7 */
		for (int j = 0; j < 4; j++) {
			_mm256_storeu_ps(d + (k + j) * NR, _mm256_permute2f128_ps(r[j], r[j + 4], 0x20));
			_mm256_storeu_ps(d + (k + j + 4) * NR, _mm256_permute2f128_ps(r[j], r[j + 4], 0x31));
		}
	}
	for (; k < in; k++)
		for (int i = 0; i < 8; i++)
			d[k * NR + i] = s[i * in + k];
}
#endif

void mbp__dense_pack_rows(uint32_t in, uint32_t out, const float *w, size_t r0, size_t r1, float *dst)
{
	(void)out;
	/* pack_rows8's AVX2: callers hold a packed copy only where the packed kernel runs */
	MBP_ASSERT(mbp__dense_cpu_ok());
	size_t r = r0;
#ifdef DENSE_X86
	for (; r < r1 && r % 8; r++)
		mbp__dense_pack_update(in, out, dst, false, r * in, (r + 1) * in, w + r * in);
	for (; r + 8 <= r1; r += 8)
		pack_rows8(in, w, r, dst);
#endif
	for (; r < r1; r++)
		mbp__dense_pack_update(in, out, dst, false, r * in, (r + 1) * in, w + r * in);
}

int mbp__version_pack(struct mbp__version *v, const struct mbp__layer *l)
{
	if (mbp_kernel_get() != MBP_KERNEL_PACKED)
		return 0;
	size_t n = 0;
	for (unsigned i = 0; i < v->layers; i++)
		n += mbp__dense_packed_floats(l[i].in, l[i].out); /* a multiple of 16: each a cache line */
	float *at = mbp__scratch_alloc(n);
	if (!at)
		return -ENOMEM;
	v->packed = at;
	for (unsigned i = 0; i < v->layers; i++) {
		mbp__dense_pack(l[i].in, l[i].out, v->lw[i].w, v->lw[i].ld, v->lw[i].b, at);
		v->lw[i].wp = at;
		at += mbp__dense_packed_floats(l[i].in, l[i].out);
	}
	return 0;
}

/* ---- the kernel ---- */

#ifdef DENSE_X86
/*
 * One tile: mr rows (x, rows ldx apart) by the 16 outputs of a panel block bp (kc x 16). init: the bias
 * (start of the chain), or NULL to continue from the tile's values in c. nv: the valid outputs (16 but in
 * the last panel). relu: apply max(y, +0) at the store (MAXPS returns +0 for NaN and -0, as mbp__relu).
 */
__attribute__((target("avx2,fma"), always_inline)) static inline void tile(const int mr, size_t kc,
									   const float *ap, const float *bp,
									   float *c, size_t ldc, size_t nv,
									   const float *init, bool relu)
{
	__m256 a0[MR], a1[MR];
	float tmp[MR][NR] __attribute__((aligned(32)));
	if (init) {
		const __m256 b0 = _mm256_loadu_ps(init), b1 = _mm256_loadu_ps(init + 8);
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			a0[i] = b0;
			a1[i] = b1;
		}
	} else if (nv == NR) {
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			a0[i] = _mm256_loadu_ps(c + i * ldc);
			a1[i] = _mm256_loadu_ps(c + i * ldc + 8);
		}
	} else {
		for (int i = 0; i < mr; i++) {
			memcpy(tmp[i], c + i * ldc, nv * sizeof(float));
			memset(tmp[i] + nv, 0, (NR - nv) * sizeof(float));
		}
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			a0[i] = _mm256_load_ps(tmp[i]);
			a1[i] = _mm256_load_ps(tmp[i] + 8);
		}
	}
	for (size_t k = 0; k < kc; k++) {
		const __m256 b0 = _mm256_load_ps(bp + k * NR), b1 = _mm256_load_ps(bp + k * NR + 8);
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			const __m256 a = _mm256_broadcast_ss(ap + k * MR + i);
			a0[i] = _mm256_fmadd_ps(a, b0, a0[i]);
			a1[i] = _mm256_fmadd_ps(a, b1, a1[i]);
		}
	}
	if (relu) {
		const __m256 zero = _mm256_setzero_ps();
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			a0[i] = _mm256_max_ps(a0[i], zero);
			a1[i] = _mm256_max_ps(a1[i], zero);
		}
	}
	if (nv == NR) {
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			_mm256_storeu_ps(c + i * ldc, a0[i]);
			_mm256_storeu_ps(c + i * ldc + 8, a1[i]);
		}
	} else {
#pragma GCC unroll 6
		for (int i = 0; i < mr; i++) {
			_mm256_store_ps(tmp[i], a0[i]);
			_mm256_store_ps(tmp[i] + 8, a1[i]);
		}
		for (int i = 0; i < mr; i++)
			memcpy(c + i * ldc, tmp[i], nv * sizeof(float));
	}
}

/* Every tile of an M block (ap: its rows packed, MR-row micro-panels of kc x MR) against one panel block:
 * full tiles of MR rows, then the tail with its own row count (the same chain per element). */
__attribute__((target("avx2,fma"))) static void panel_rows(size_t mc, size_t kc, const float *ap,
							   const float *bp, float *c, size_t ldc, size_t nv,
							   const float *init, bool relu)
{
	size_t r = 0;
	for (; r + MR <= mc; r += MR)
		tile(MR, kc, ap + r * kc, bp, c + r * ldc, ldc, nv, init, relu);
		/* the tail: one instance of tile per height, each with its loops unrolled */
#define TAIL(n)                                                                                              \
	case n:                                                                                              \
		tile(n, kc, ap + r * kc, bp, c + r * ldc, ldc, nv, init, relu);                              \
		break;
	switch (mc - r) {
		TAIL(5)
		TAIL(4)
		TAIL(3)
		TAIL(2)
		TAIL(1)
	default:
		break;
	}
#undef TAIL
}

/* Rows [0, mc) x columns [0, kc) of x (rows ldx apart) into MR-row micro-panels: row r's k-th value at
 * ap[(r / MR) * MR * kc + k * MR + r % MR]. A copy, so the kernel's loads are contiguous: rows of X a
 * multiple of 4 KiB apart would all fall into the same L1 sets. */
static void pack_rows(size_t mc, size_t kc, const float *x, size_t ldx, float *ap)
{
	for (size_t r0 = 0; r0 < mc; r0 += MR) {
		const size_t mr = mc - r0 < MR ? mc - r0 : MR;
		float *dst = ap + r0 * kc;
		for (size_t i = 0; i < mr; i++) {
			const float *src = x + (r0 + i) * ldx;
			for (size_t k = 0; k < kc; k++)
				dst[k * MR + i] = src[k];
		}
	}
}

/* Each thread's buffer for the packed rows (MC x KC floats), allocated by mbp__dense_thread_init (a stage's
 * init, on its thread) or else at the thread's first product, and freed when the thread exits: nothing is
 * allocated per product. A thread that cannot have one (out of memory, or
 * no key slot to free it by at exit) records that once and runs every product without it. */
static pthread_key_t rows_key;
static pthread_once_t rows_once = PTHREAD_ONCE_INIT;
static bool rows_key_ok;
static _Thread_local float *rows_buf;
static _Thread_local bool rows_failed;

/* The key's destructor, on the exiting thread: the pointer goes first, so that a later destructor whose
 * thread still computes a product allocates anew rather than use the freed buffer. */
static void rows_free(void *p)
{
	rows_buf = NULL;
	free(p);
}

static void rows_key_make(void)
{
	rows_key_ok = pthread_key_create(&rows_key, rows_free) == 0;
}

static float *thread_rows_buf(void)
{
	if (MBP_LIKELY(rows_buf != NULL) || rows_failed)
		return rows_buf;
	pthread_once(&rows_once, rows_key_make);
	float *p = rows_key_ok ? mbp__scratch_alloc((size_t)MC * KC) : NULL;
	if (p && pthread_setspecific(rows_key, p)) {
		free(p);
		p = NULL;
	}
	rows_failed = !p; /* no retry on every product: the fallback below allocates nothing */
	return rows_buf = p;
}

void mbp__dense_thread_init(bool packed)
{
	if (packed)
		(void)thread_rows_buf(); /* without it (out of memory), the products' fallback */
}

bool mbp__dense_thread_has_rows(void)
{
	return rows_buf != NULL;
}

__attribute__((target("avx2,fma"))) static void dense_avx2(uint32_t in, uint32_t out,
							   const struct mbp__weights *w, const float *x,
							   float *y, uint32_t rows, bool relu)
{
	const size_t P = panels_of(out), ldw = w->ld ? w->ld : in;
	const float *wp = w->wp;
	float bias[NR] __attribute__((aligned(32)));
	float blk[KC * NR] __attribute__((aligned(64))); /* a panel block, when there is no packed copy */
	float small[MR * KC]
	    __attribute__((aligned(64))); /* the rows, one tile at a time, without a buffer */
	float *ap = thread_rows_buf();
	/* Without the thread's buffer (out of memory), M blocks of one tile: the same chains, slower. */
	const size_t mcb = ap ? MC : MR;
	if (!ap)
		ap = small;
	for (size_t m0 = 0; m0 < rows; m0 += mcb) {
		const size_t mc = rows - m0 < mcb ? rows - m0 : mcb;
		for (size_t k0 = 0; k0 < in; k0 += KC) {
			const size_t kc = in - k0 < KC ? in - k0 : KC;
			const bool last = k0 + kc == in;
			pack_rows(mc, kc, x + m0 * in + k0, in, ap);
			for (size_t p = 0; p < P; p++) {
				const size_t j0 = p * NR, nv = out - j0 < NR ? out - j0 : NR;
				const float *bp, *init = NULL;
				if (wp) {
					bp = wp + p * in * NR + k0 * NR;
					if (!k0)
						init = wp + P * in * NR + j0;
				} else {
					pack_block(w->w, ldw, out, p, k0, kc, blk);
					bp = blk;
					if (!k0) {
						memcpy(bias, w->b + j0, nv * sizeof(float));
						memset(bias + nv, 0, (NR - nv) * sizeof(float));
						init = bias;
					}
				}
				panel_rows(mc, kc, ap, bp, y + m0 * out + j0, out, nv, init, relu && last);
			}
		}
	}
}
#else
void mbp__dense_thread_init(bool packed)
{
	(void)packed;
}

bool mbp__dense_thread_has_rows(void)
{
	return false;
}
#endif

void mbp__dense_packed(const struct mbp__layer *l, const struct mbp__weights *w, const float *x, float *y,
		       uint32_t rows, bool relu)
{
	/* the panels' aligned loads (_mm256_load_ps): every packed copy comes from mbp__scratch_alloc */
	MBP_ASSERT(((uintptr_t)w->wp & (MBP_CACHELINE - 1)) == 0);
#ifdef DENSE_X86
	dense_avx2(l->in, l->out, w, x, y, rows, relu);
#else
	(void)l, (void)w, (void)x, (void)y, (void)rows, (void)relu;
	MBP_VERIFY(!"the packed kernel needs AVX2 and FMA");
#endif
}
