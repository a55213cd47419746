/*
 * Optimizers: the learning-rate schedule (linear warm-up, cosine decay), the clip factor of gradient
 * clipping by global norm, the squared gradient norms it is computed from, and the per-stage update
 * (AdamW, SGD with momentum) on the stage's own slice of the parameter, gradient and moment arrays.
 *
 * Each layer keeps its own step count, so an update depends only on the layer's state and its gradient:
 * stages split differently, or a run resumed from a checkpoint, give the same bits. The formulas follow
 * PyTorch's AdamW and SGD (see include/mbpipe/model_train.h); scalars per layer (rate, bias corrections)
 * are computed in double, the elementwise update in float.
 *
 * The passes over a stage's arrays are the step's largest cost after the products (a 1024 x 1024 layer
 * holds 4 MiB of each array), so each is one loop that vector units run: AdamW reads the gradient and
 * both moments and writes the parameter and moments once, eight lanes at a time with AVX where the CPU
 * has it (else, and for a tensor's last few elements, plain C). Both compute the same operations in the
 * same order (IEEE multiplications, additions, divisions and square roots, each correctly rounded, and no
 * fused multiply-add), so they give the same bits: a checkpoint resumes to the same weights on any
 * x86-64. The finiteness check and the squared norm
 * read the gradient once each; the norm keeps eight partial sums in double, element e in sum e % 8, added
 * in one fixed order, so a tensor's norm depends only on its values.
 *
 * Pieces. Every tensor is cut into pieces of MBP_MLP_PIECE_FLOATS elements (its last shorter), and the
 * end-of-step work (squared norms, update, zeroing) runs piece by piece, so that several threads (a
 * trainer's replicas) can share one stage's, each over its own range of pieces. A layer's squared norm is
 * its pieces' sums added in order (0 + first + second ...), whichever thread computed each: the same bits
 * for any split, and for a tensor of one piece the bits of its plain sum. The update of an element reads
 * and writes that element only (and its padded copy), so any split gives the bits of the whole update; the
 * step counts advance once, after every piece (mbp_mlp_stage_update_end).
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define OPTIM_X86 1 /* AVX chosen at run time */
#endif

#include "common.h"
#include "mlp_internal.h"

double mbp_optim_lr(const mbp_optim_opts *in, uint64_t t)
{
	if (!in)
		return NAN;
	double lr = in->lr > 0 ? in->lr : 1e-3, min_lr = in->min_lr;
	if (t < in->warmup_steps)
		return lr * (double)(t + 1) / (double)in->warmup_steps;
	if (in->total_steps <= in->warmup_steps)
		return lr;
	if (t >= in->total_steps)
		return min_lr;
	double p = (double)(t - in->warmup_steps) / (double)(in->total_steps - in->warmup_steps);
	return min_lr + (lr - min_lr) * 0.5 * (1.0 + cos(M_PI * p));
}

float mbp_clip_scale(double sqnorm, float max_norm)
{
	if (!isfinite(sqnorm) || sqnorm < 0)
		return NAN;
	if (!(max_norm > 0))
		return 1.0f;
	double norm = sqrt(sqnorm);
	return norm + 1e-6 > max_norm ? (float)(max_norm / (norm + 1e-6)) : 1.0f;
}

/* AdamW's constants for one tensor's update. */
struct adamw_k {
	float b1, b2, c1, c2, eps, step, bc2_sqrt, keep, scale;
};

/* The update of elements [0, cnt), one at a time: the reference the vector loops compute lane by lane. */
static void adamw_c(const struct adamw_k *k, float *p, const float *g, float *m, float *v, size_t cnt)
{
	for (size_t e = 0; e < cnt; e++) {
		float ge = g[e] * k->scale;
		float pe = p[e] * k->keep;
		float me = k->b1 * m[e] + k->c1 * ge;
		float ve = k->b2 * v[e] + k->c2 * ge * ge;
		m[e] = me;
		v[e] = ve;
		p[e] = pe - k->step * me / (sqrtf(ve) / k->bc2_sqrt + k->eps);
	}
}

#if defined(OPTIM_X86)
/* Eight lanes with AVX; the rest as adamw_c. AVX has no fused multiply-add, so nothing here is contracted
 * into one (a build for a CPU with FMA, -march=native, might contract adamw_c's or these: the test of the
 * lanes against plain C says so). */
__attribute__((target("avx"))) static void adamw_avx(const struct adamw_k *k, float *p, const float *g,
						     float *m, float *v, size_t cnt)
{
	const __m256 b1 = _mm256_set1_ps(k->b1), b2 = _mm256_set1_ps(k->b2), c1 = _mm256_set1_ps(k->c1),
		     c2 = _mm256_set1_ps(k->c2), eps = _mm256_set1_ps(k->eps), step = _mm256_set1_ps(k->step),
		     bc = _mm256_set1_ps(k->bc2_sqrt), keep = _mm256_set1_ps(k->keep),
		     scale = _mm256_set1_ps(k->scale);
	size_t e = 0;
	for (; e + 8 <= cnt; e += 8) {
		__m256 ge = _mm256_mul_ps(_mm256_loadu_ps(g + e), scale);
		__m256 pe = _mm256_mul_ps(_mm256_loadu_ps(p + e), keep);
		__m256 me = _mm256_add_ps(_mm256_mul_ps(b1, _mm256_loadu_ps(m + e)), _mm256_mul_ps(c1, ge));
		__m256 ve = _mm256_add_ps(_mm256_mul_ps(b2, _mm256_loadu_ps(v + e)),
					  _mm256_mul_ps(_mm256_mul_ps(c2, ge), ge));
		_mm256_storeu_ps(m + e, me);
		_mm256_storeu_ps(v + e, ve);
		__m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(ve), bc), eps);
		_mm256_storeu_ps(p + e, _mm256_sub_ps(pe, _mm256_div_ps(_mm256_mul_ps(step, me), den)));
	}
	adamw_c(k, p + e, g + e, m + e, v + e, cnt - e);
}
#endif

/* AdamW's constants for update t of a tensor at rate lr. */
static struct adamw_k adamw_consts(const mbp_optim_opts *o, double lr, uint64_t t, float decay, float scale)
{
	const double bc1 = 1.0 - pow(o->beta1, (double)(t + 1)), bc2 = 1.0 - pow(o->beta2, (double)(t + 1));
	return (struct adamw_k){.b1 = o->beta1,
				.b2 = o->beta2,
				.c1 = 1.0f - o->beta1,
				.c2 = 1.0f - o->beta2,
				.eps = o->eps,
				.step = (float)(lr / bc1),
				.bc2_sqrt = (float)sqrt(bc2),
				.keep = (float)(1.0 - lr * decay),
				.scale = scale};
}

typedef void (*adamw_fn)(const struct adamw_k *, float *, const float *, float *, float *, size_t);

static adamw_fn adamw_pick(void)
{
#if defined(OPTIM_X86)
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx"))
		return adamw_avx;
#endif
	return adamw_c;
}
/* Does g[0, cnt) hold a NaN or an infinity (its exponent bits all ones)? */
static bool any_non_finite(const float *g, size_t cnt)
{
	size_t e = 0;
	bool bad = false;
#if defined(__SSE2__)
	const __m128i exp = _mm_set1_epi32(0x7f800000);
	__m128i acc = _mm_setzero_si128();
	for (; e + 4 <= cnt; e += 4) {
		__m128i x = _mm_and_si128(_mm_loadu_si128((const __m128i *)(const void *)(g + e)), exp);
		acc = _mm_or_si128(acc, _mm_cmpeq_epi32(x, exp));
	}
	bad = _mm_movemask_epi8(acc) != 0;
#endif
	for (; e < cnt; e++)
		bad |= !isfinite(g[e]);
	return bad;
}

/* The sum of g[e]^2 in double: element e in partial sum e % 8 (the last cnt % 8 elements in a ninth),
 * the sums added in index order. */
static double sum_squares(const float *g, size_t cnt)
{
	double lane[8] = {0}, tail = 0;
	size_t e = 0;
#if defined(__SSE2__)
	__m128d a[4] = {_mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd(), _mm_setzero_pd()};
	for (; e + 8 <= cnt; e += 8) {
		__m128 lo = _mm_loadu_ps(g + e), hi = _mm_loadu_ps(g + e + 4);
		__m128d x[4] = {_mm_cvtps_pd(lo), _mm_cvtps_pd(_mm_movehl_ps(lo, lo)), _mm_cvtps_pd(hi),
				_mm_cvtps_pd(_mm_movehl_ps(hi, hi))};
		for (int j = 0; j < 4; j++)
			a[j] = _mm_add_pd(a[j], _mm_mul_pd(x[j], x[j]));
	}
	for (int j = 0; j < 4; j++)
		_mm_storeu_pd(lane + 2 * j, a[j]);
#else
	for (; e + 8 <= cnt; e += 8)
		for (int j = 0; j < 8; j++)
			lane[j] += (double)g[e + j] * g[e + j];
#endif
	for (; e < cnt; e++)
		tail += (double)g[e] * g[e];
	double s = 0;
	for (int j = 0; j < 8; j++)
		s += lane[j];
	return s + tail;
}

static void sgd(const mbp_optim_opts *o, double lr, uint64_t t, float decay, float scale, float *p,
		const float *g, float *buf, size_t cnt)
{
	const float flr = (float)lr, mu = o->momentum;
	for (size_t e = 0; e < cnt; e++) {
		float ge = g[e] * scale + decay * p[e];
		if (buf) {
			buf[e] = t == 0 ? ge : mu * buf[e] + ge;
			ge = buf[e];
		}
		p[e] -= flr * ge;
	}
}

/* ---- pieces ---- */

/* Visit the pieces [begin, end) of layers [a, b): fn(arg, layer, tensor, first element, end element),
 * in order. */
typedef void (*piece_fn)(void *arg, unsigned i, unsigned k, size_t e0, size_t e1);

static void pieces_visit(const mbp_mlp *n, unsigned a, unsigned b, size_t begin, size_t end, piece_fn fn,
			 void *arg)
{
	size_t p = 0;
	for (unsigned i = a; i < b && p < end; i++)
		for (unsigned k = 0; k < MBP__PARTS && p < end; k++) {
			size_t cnt = n->count[i][k],
			       np = (cnt + MBP_MLP_PIECE_FLOATS - 1) / MBP_MLP_PIECE_FLOATS;
			if (p + np <= begin) { /* the whole tensor before the range */
				p += np;
				continue;
			}
			size_t e = 0;
			if (p < begin) { /* the range begins inside this tensor: straight to its piece */
				e = (begin - p) * MBP_MLP_PIECE_FLOATS;
				p = begin;
			}
			for (; e < cnt && p < end; e += MBP_MLP_PIECE_FLOATS, p++)
				fn(arg, i, k, e,
				   cnt - e < MBP_MLP_PIECE_FLOATS ? cnt : e + MBP_MLP_PIECE_FLOATS);
		}
}

static size_t pieces_of(const mbp_mlp *n, unsigned a, unsigned b)
{
	size_t p = 0;
	for (unsigned i = a; i < b; i++)
		for (unsigned k = 0; k < MBP__PARTS; k++)
			p += (n->count[i][k] + MBP_MLP_PIECE_FLOATS - 1) / MBP_MLP_PIECE_FLOATS;
	return p;
}

size_t mbp_mlp_layer_pieces(const mbp_mlp *n, unsigned layer)
{
	return n && layer < n->layers ? pieces_of(n, layer, layer + 1) : 0;
}

size_t mbp_mlp_stage_pieces(const mbp_mlp_stage *st)
{
	if (!st)
		return 0;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	return pieces_of(n, a, b);
}

/* The stage's model and layers [a, b) for a call on its pieces [begin, end): 0, or -EINVAL for a bad
 * range. */
static int pieces_range(const mbp_mlp_stage *st, size_t begin, size_t end, mbp_mlp **n, unsigned *a,
			unsigned *b)
{
	if (!st || begin > end || end > mbp_mlp_stage_pieces(st))
		return -EINVAL;
	mbp__mlp_stage_range(st, n, a, b);
	return 0;
}

/* The squared norms of pieces, into out[0], out[1] ... (or added into *sum, in order). */
struct sq_visit {
	const mbp_mlp *n;
	double *out, *sum;
};

static void sq_piece(void *arg, unsigned i, unsigned k, size_t e0, size_t e1)
{
	struct sq_visit *v = arg;
	double q = sum_squares(v->n->grad + v->n->off[i][k] + e0, e1 - e0);
	if (v->out)
		*v->out++ = q;
	else
		*v->sum += q;
}

int mbp_mlp_stage_grad_sqnorm_pieces(const mbp_mlp_stage *st, size_t begin, size_t end, double *sq)
{
	mbp_mlp *n;
	unsigned a, b;
	if (pieces_range(st, begin, end, &n, &a, &b) < 0 || (!sq && end > begin))
		return -EINVAL;
	struct sq_visit v = {.n = n, .out = sq};
	pieces_visit(n, a, b, begin, end, sq_piece, &v);
	return 0;
}

int mbp_mlp_layer_grad_sqnorm(const mbp_mlp *n, unsigned layer, double *sq)
{
	if (!n || !sq || layer >= n->layers)
		return -EINVAL;
	double s = 0;
	struct sq_visit v = {.n = n, .sum = &s};
	pieces_visit(n, layer, layer + 1, 0, SIZE_MAX, sq_piece, &v);
	*sq = s;
	return 0;
}

int mbp_mlp_stage_grad_sqnorm(const mbp_mlp_stage *st, double *sq)
{
	if (!st || !sq)
		return -EINVAL;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	double s = 0;
	for (unsigned i = a; i < b; i++) {
		double q = 0;
		mbp_mlp_layer_grad_sqnorm(n, i, &q);
		s += q;
	}
	*sq = s;
	return 0;
}

int mbp_mlp_stage_update_check(const mbp_mlp_stage *st, float scale)
{
	if (!st)
		return -EINVAL;
	if (!isfinite(scale) || scale < 0)
		return -EDOM;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	return any_non_finite(n->grad + n->start[a], n->start[b] - n->start[a]) ? -EDOM : 0;
}

/* The update of pieces: each element's, row segment by row segment where the layer's dense weights have
 * a padded copy (the segment copied there while it is in cache). */
struct upd_visit {
	mbp_mlp *n;
	float scale;
	adamw_fn run;
};

static void upd_piece(void *arg, unsigned i, unsigned k, size_t e0, size_t e1)
{
	struct upd_visit *v = arg;
	mbp_mlp *n = v->n;
	const mbp_optim_opts *o = &n->opt;
	const uint64_t t = n->step[i]; /* advanced by mbp_mlp_stage_update_end, after every piece */
	const double lr = mbp_optim_lr(o, t);
	const float decay = k == MBP_PART_WEIGHT ? o->weight_decay : 0.0f;
	const size_t off = n->off[i][k];
	float *p = n->param + off, *m = n->m1 ? n->m1 + off : NULL, *w = n->m2 ? n->m2 + off : NULL;
	const float *g = n->grad + off;
	/* the stages' padded or packed copy of the dense weights follows them (mlp_internal.h) */
	float *pad = k == MBP_PART_WEIGHT ? mbp__mlp_pad(n, i) : NULL;
	float *pk = k == MBP_PART_WEIGHT || k == MBP_PART_BIAS ? mbp__mlp_pack(n, i) : NULL;
	const size_t row = n->l[i].in, ld = n->lwp[i].ld;
	const bool rows = pad || (pk && k == MBP_PART_WEIGHT); /* segment by segment of a row */
	const struct adamw_k ak = adamw_consts(o, lr, t, decay, v->scale);
	for (size_t e = e0; e < e1;) {
		size_t to = rows && (e / row + 1) * row < e1 ? (e / row + 1) * row : e1;
		if (o->kind == MBP_OPTIM_ADAMW)
			v->run(&ak, p + e, g + e, m + e, w + e, to - e);
		else
			sgd(o, lr, t, decay, v->scale, p + e, g + e, m ? m + e : NULL, to - e);
		if (pad)
			memcpy(pad + (e / row) * ld + e % row, p + e, (to - e) * sizeof(float));
		if (pk && (k == MBP_PART_BIAS || to - e < row)) /* whole rows: after the loop */
			mbp__dense_pack_update(row, n->l[i].out, pk, k == MBP_PART_BIAS, e, to, p + e);
		e = to;
	}
	if (pk && k == MBP_PART_WEIGHT) { /* the piece's whole rows, still in cache */
		const size_t r0 = (e0 + row - 1) / row, r1 = e1 / row;
		if (r0 < r1)
			mbp__dense_pack_rows(row, n->l[i].out, p, r0, r1, pk);
	}
}

int mbp_mlp_stage_update_pieces(mbp_mlp_stage *st, float scale, size_t begin, size_t end)
{
	mbp_mlp *n;
	unsigned a, b;
	if (pieces_range(st, begin, end, &n, &a, &b) < 0)
		return -EINVAL;
	if (!isfinite(scale) || scale < 0)
		return -EDOM;
	struct upd_visit v = {.n = n, .scale = scale, .run = adamw_pick()};
	pieces_visit(n, a, b, begin, end, upd_piece, &v);
	return 0;
}

int mbp_mlp_stage_update_end(mbp_mlp_stage *st)
{
	if (!st)
		return -EINVAL;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	for (unsigned i = a; i < b; i++)
		n->step[i]++;
	return 0;
}

static void zero_piece(void *arg, unsigned i, unsigned k, size_t e0, size_t e1)
{
	mbp_mlp *n = arg;
	memset(n->grad + n->off[i][k] + e0, 0, (e1 - e0) * sizeof(float));
}

int mbp_mlp_stage_zero_grad_pieces(mbp_mlp_stage *st, size_t begin, size_t end)
{
	mbp_mlp *n;
	unsigned a, b;
	if (pieces_range(st, begin, end, &n, &a, &b) < 0)
		return -EINVAL;
	pieces_visit(n, a, b, begin, end, zero_piece, n);
	return 0;
}

int mbp_mlp_stage_update(mbp_mlp_stage *st, float scale)
{
	/* All or nothing: a non-finite gradient anywhere in the stage leaves every parameter as it was. */
	int rc = mbp_mlp_stage_update_check(st, scale);
	if (rc < 0)
		return rc;
	/* the pieces' update over the whole stage, the one code path whatever the split */
	MBP_VERIFY(mbp_mlp_stage_update_pieces(st, scale, 0, mbp_mlp_stage_pieces(st)) == 0);
	return mbp_mlp_stage_update_end(st);
}
