/*
 * The trainable model (include/mbpipe/model_train.h): every layer's gradient against central finite
 * differences of a double-precision reference; B = B_in + B_w bit for bit; micro-batch accumulation against
 * one batch, and the same bits whatever the stage split and the order of the micro-batches' operations;
 * training forward against inference and the saved file; losses, optimizers and the schedule against
 * hand-computed values; a tiny data set memorised; checkpoints and exact resume; stages on two threads.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include <mbpipe.h>

#include "model/mlp_internal.h" /* the stages' packed copies */

#include "check_main.h"
#include "test_tmpdir.h"

static void setup(void)
{
	tmpdir_make("mlp");
	openblas_set_num_threads(1);
}

static void teardown(void)
{
	tmpdir_remove();
}

static uint64_t lcg(uint64_t *s)
{
	*s = *s * 6364136223846793005u + 1442695040888963407u;
	return *s >> 33;
}

/* Uniform in [-1, 1). */
static float urand(uint64_t *s)
{
	return (float)((double)lcg(s) / (double)(1u << 30) - 1.0);
}

static float *random_floats(size_t n, uint64_t seed)
{
	float *x = malloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++)
		x[i] = urand(&seed);
	return x;
}

static int32_t *random_labels(size_t n, uint32_t classes, uint64_t seed)
{
	int32_t *y = malloc(n * sizeof(int32_t));
	for (size_t i = 0; i < n; i++)
		y[i] = (int32_t)(lcg(&seed) % classes);
	return y;
}

static mbp_mlp *new_mlp(const uint32_t *widths, unsigned L, mbp_act act, bool norm, uint64_t seed,
			const mbp_optim_opts *o)
{
	mbp_model_spec sp = {.layers = L, .widths = widths, .act = act, .norm = norm, .seed = seed};
	mbp_mlp *n;
	ck_assert_int_eq(mbp_mlp_new_random(&n, &sp, o), 0);
	return n;
}

/* Give every bias and norm parameter a random value (the initialisation sets them to 0 and 1). */
static void perturb(mbp_mlp *n, uint64_t seed)
{
	for (unsigned i = 0; i < mbp_mlp_layers(n); i++)
		for (int p = MBP_PART_BIAS; p <= MBP_PART_NORM_BIAS; p++) {
			size_t c;
			float *x = mbp_mlp_tensor(n, i, (mbp_mlp_part)p, MBP_ARRAY_PARAM, &c);
			for (size_t e = 0; x && e < c; e++)
				x[e] = (p == MBP_PART_NORM_WEIGHT ? 1.0f : 0.0f) + 0.5f * urand(&seed);
		}
}

/* Copy every array of kind `which` into one buffer (for bitwise comparisons). */
static float *snapshot(mbp_mlp *n, mbp_mlp_array which, size_t *len)
{
	size_t total = 0, c;
	for (unsigned i = 0; i < mbp_mlp_layers(n); i++)
		for (int p = 0; p < 4; p++)
			if (mbp_mlp_tensor(n, i, (mbp_mlp_part)p, which, &c))
				total += c;
	float *out = malloc((total ? total : 1) * sizeof(float)), *at = out;
	for (unsigned i = 0; i < mbp_mlp_layers(n); i++)
		for (int p = 0; p < 4; p++) {
			float *x = mbp_mlp_tensor(n, i, (mbp_mlp_part)p, which, &c);
			if (x) {
				memcpy(at, x, c * sizeof(float));
				at += c;
			}
		}
	*len = total;
	return out;
}

static void assert_same_array(mbp_mlp *a, mbp_mlp *b, mbp_mlp_array which)
{
	size_t la, lb;
	float *x = snapshot(a, which, &la), *y = snapshot(b, which, &lb);
	ck_assert_uint_eq(la, lb);
	ck_assert_msg(!memcmp(x, y, la * sizeof(float)), "array %d differs", which);
	free(x);
	free(y);
}

/* ---- the double-precision reference ---- */

#define RW 16 /* widest layer the reference handles */

static void ref_layer(mbp_mlp *n, unsigned i, const double *x, double *y, double *const *pp)
{
	mbp_layer_info li;
	mbp_mlp_layer_info(n, i, &li);
	const double *w = pp[0], *b = pp[1], *g = pp[2], *beta = pp[3];
	for (uint32_t o = 0; o < li.out; o++) {
		double s = b[o];
		for (uint32_t k = 0; k < li.in; k++)
			s += w[o * li.in + k] * x[k];
		if (li.act == MBP_ACT_RELU)
			s = s > 0 ? s : 0;
		else if (li.act == MBP_ACT_GELU)
			s = 0.5 * s * (1 + erf(s / sqrt(2.0)));
		y[o] = s;
	}
	if (li.norm) {
		double mean = 0, var = 0;
		for (uint32_t o = 0; o < li.out; o++)
			mean += y[o];
		mean /= li.out;
		for (uint32_t o = 0; o < li.out; o++)
			var += (y[o] - mean) * (y[o] - mean);
		var /= li.out;
		for (uint32_t o = 0; o < li.out; o++)
			y[o] = (y[o] - mean) / sqrt(var + li.eps) * g[o] + beta[o];
	}
}

/* The model's parameters in double: dp[layer * 4 + part]. */
static double **ref_params(mbp_mlp *n)
{
	unsigned L = mbp_mlp_layers(n);
	double **dp = calloc(4 * L, sizeof(*dp));
	for (unsigned i = 0; i < L; i++)
		for (int p = 0; p < 4; p++) {
			size_t c;
			float *x = mbp_mlp_tensor(n, i, (mbp_mlp_part)p, MBP_ARRAY_PARAM, &c);
			if (!x)
				continue;
			dp[i * 4 + p] = malloc(c * sizeof(double));
			for (size_t e = 0; e < c; e++)
				dp[i * 4 + p][e] = x[e];
		}
	return dp;
}

static void ref_params_free(mbp_mlp *n, double **dp)
{
	for (unsigned i = 0; i < 4 * mbp_mlp_layers(n); i++)
		free(dp[i]);
	free(dp);
}

/* Mean loss over `batch` rows of the rows given (cross-entropy with labels, or MSE against targets). */
static double ref_loss(mbp_mlp *n, double **dp, const double *x, uint32_t rows, const int32_t *labels,
		       const float *targets, size_t batch)
{
	unsigned L = mbp_mlp_layers(n);
	uint32_t inw = mbp_mlp_in_width(n), outw = mbp_mlp_out_width(n);
	double sum = 0;
	for (uint32_t r = 0; r < rows; r++) {
		double a[RW], b[RW];
		memcpy(a, x + (size_t)r * inw, inw * sizeof(double));
		for (unsigned i = 0; i < L; i++) {
			ref_layer(n, i, a, b, &dp[i * 4]);
			memcpy(a, b, sizeof(a));
		}
		if (labels) {
			double mx = a[0], se = 0;
			for (uint32_t c = 1; c < outw; c++)
				mx = fmax(mx, a[c]);
			for (uint32_t c = 0; c < outw; c++)
				se += exp(a[c] - mx);
			sum += mx + log(se) - a[labels[r]];
		} else {
			for (uint32_t c = 0; c < outw; c++) {
				double d = a[c] - targets[(size_t)r * outw + c];
				sum += d * d / outw;
			}
		}
	}
	return sum / (double)batch;
}

static bool close_to(double got, double want, double rel, double abs_tol)
{
	return fabs(got - want) <= abs_tol + rel * fabs(want);
}

/*
 * Gradients of a model split into two stages ([0, 1) and [1, L)), through the loss, against central
 * differences of the double reference for every parameter and every input value.
 */
static void check_gradients(mbp_act act, bool norm, bool xent)
{
	const uint32_t widths[] = {5, 7, 6, 4};
	const unsigned L = 3;
	enum { rows = 3 };
	const uint32_t outw = widths[L];
	mbp_mlp *n = new_mlp(widths, L, act, norm, 7 + act * 2 + norm, NULL);
	perturb(n, 99);
	mbp_mlp_stage *s0, *s1;
	ck_assert_int_eq(mbp_mlp_stage_new(&s0, n, 0, 1, rows), 0);
	ck_assert_int_eq(mbp_mlp_stage_new(&s1, n, 1, L, rows), 0);
	float *x = random_floats(rows * widths[0], 5);
	int32_t *labels = random_labels(rows, outw, 6);
	float *targets = random_floats(rows * outw, 8);
	float *stash0 = calloc(rows * mbp_mlp_stage_stash_floats(s0), sizeof(float));
	float *stash1 = calloc(rows * mbp_mlp_stage_stash_floats(s1), sizeof(float));
	float h1[rows * 7], out[rows * 4], dout[rows * 4], dh1[rows * 7], din[rows * 5];
	const size_t batch = 2 * rows; /* as if another micro-batch of the same size followed */
	ck_assert_int_eq(mbp_mlp_stage_forward(s0, x, h1, rows, stash0), 0);
	ck_assert_int_eq(mbp_mlp_stage_forward(s1, h1, out, rows, stash1), 0);
	double loss;
	if (xent)
		ck_assert_int_eq(mbp_loss_xent(out, labels, rows, outw, batch, dout, &loss, NULL), 0);
	else
		ck_assert_int_eq(mbp_loss_mse(out, targets, rows, outw, batch, dout, &loss), 0);
	ck_assert_int_eq(mbp_mlp_stage_backward(s1, stash1, h1, dout, dh1, rows), 0);
	ck_assert_int_eq(mbp_mlp_stage_backward(s0, stash0, x, dh1, din, rows), 0);

	double **dp = ref_params(n);
	double xd[rows * 5];
	for (size_t e = 0; e < rows * widths[0]; e++)
		xd[e] = x[e];
	const double h = 1e-6;
	double l0 = ref_loss(n, dp, xd, rows, xent ? labels : NULL, targets, batch);
	ck_assert_msg(close_to(loss / batch, l0, 1e-5, 1e-6), "loss %g, reference %g", loss / batch, l0);
	unsigned checked = 0;
	for (unsigned i = 0; i < L; i++)
		for (int p = 0; p < 4; p++) {
			size_t c;
			float *g = mbp_mlp_tensor(n, i, (mbp_mlp_part)p, MBP_ARRAY_GRAD, &c);
			if (!g)
				continue;
			double *v = dp[i * 4 + p];
			for (size_t e = 0; e < c; e++) {
				double keep = v[e];
				v[e] = keep + h;
				double lp = ref_loss(n, dp, xd, rows, xent ? labels : NULL, targets, batch);
				v[e] = keep - h;
				double lm = ref_loss(n, dp, xd, rows, xent ? labels : NULL, targets, batch);
				v[e] = keep;
				double fd = (lp - lm) / (2 * h);
				ck_assert_msg(close_to(g[e], fd, 1e-4, 1e-6),
					      "act %d norm %d xent %d: layer %u part %d [%zu]: %.8g, finite "
					      "differences %.8g",
					      act, norm, xent, i, p, e, g[e], fd);
				checked++;
			}
		}
	for (size_t e = 0; e < rows * widths[0]; e++) {
		double keep = xd[e];
		xd[e] = keep + h;
		double lp = ref_loss(n, dp, xd, rows, xent ? labels : NULL, targets, batch);
		xd[e] = keep - h;
		double lm = ref_loss(n, dp, xd, rows, xent ? labels : NULL, targets, batch);
		xd[e] = keep;
		double fd = (lp - lm) / (2 * h);
		ck_assert_msg(close_to(din[e], fd, 1e-4, 1e-6), "input [%zu]: %.8g, finite differences %.8g",
			      e, din[e], fd);
		checked++;
	}
	ck_assert_uint_gt(checked, 100);
	ref_params_free(n, dp);
	free(stash0);
	free(stash1);
	free(x);
	free(labels);
	free(targets);
	mbp_mlp_stage_destroy(s0);
	mbp_mlp_stage_destroy(s1);
	mbp_mlp_destroy(n);
}

START_TEST(every_layer_kind_gradient_matches_double_finite_differences)
{
	for (int act = MBP_ACT_NONE; act <= MBP_ACT_GELU; act++)
		for (int norm = 0; norm < 2; norm++)
			for (int xent = 0; xent < 2; xent++)
				check_gradients((mbp_act)act, norm, xent);
}
END_TEST

/* ---- one model driven by hand ---- */

/* A model, its stages and a data set of `total` rows, for the accumulation and order tests. */
struct rig {
	mbp_mlp *n;
	const uint32_t *w; /* the widths (L + 1) */
	unsigned L, S;
	mbp_mlp_stage *st[4];
	float *x;
	int32_t *y;
};

static const uint32_t rig_widths[] = {12, 16, 16, 16, 5};

static void rig_init_widths(struct rig *r, const uint32_t *w, unsigned L, const unsigned *cuts, unsigned S,
			    uint32_t max_rows, mbp_act act, bool norm, const mbp_optim_opts *o, size_t total)
{
	memset(r, 0, sizeof(*r));
	r->n = new_mlp(w, L, act, norm, 42, o);
	perturb(r->n, 43);
	r->w = w;
	r->L = L;
	r->S = S;
	for (unsigned s = 0; s < S; s++)
		ck_assert_int_eq(mbp_mlp_stage_new(&r->st[s], r->n, cuts[s], cuts[s + 1], max_rows), 0);
	r->x = random_floats(total * w[0], 44);
	r->y = random_labels(total, w[L], 45);
}

static void rig_init(struct rig *r, const unsigned *cuts, unsigned S, uint32_t max_rows, mbp_act act,
		     bool norm, const mbp_optim_opts *o, size_t total)
{
	rig_init_widths(r, rig_widths, 4, cuts, S, max_rows, act, norm, o, total);
}

static void rig_fini(struct rig *r)
{
	for (unsigned s = 0; s < r->S; s++)
		mbp_mlp_stage_destroy(r->st[s]);
	mbp_mlp_destroy(r->n);
	free(r->x);
	free(r->y);
}

/*
 * One step's gradients over M micro-batches of `mb` rows from row `first`, every stage's operations in
 * GPipe order (all forwards, then all backwards) or in 1F1B order; split B_in/B_w or combined backward.
 * Returns the summed loss.
 */
static double rig_grads(struct rig *r, size_t first, unsigned M, uint32_t mb, bool one_f_one_b, bool split)
{
	const unsigned S = r->S;
	size_t batch = (size_t)M * mb;
	float *act[5][16], *grad[5][16], *stash[4][16], *work[4][16];
	for (unsigned s = 0; s <= S; s++)
		for (unsigned j = 0; j < M; j++) {
			uint32_t w = s == 0 ? r->w[0] : mbp_mlp_stage_out_width(r->st[s - 1]);
			size_t gw = s == 0 ? w : mbp_mlp_stage_dout_floats(r->st[s - 1]);
			act[s][j] = s == 0 ? r->x + (first + (size_t)j * mb) * r->w[0]
					   : calloc((size_t)mb * w, sizeof(float));
			grad[s][j] = calloc((size_t)mb * gw, sizeof(float));
			if (s < S) {
				stash[s][j] =
				    calloc(mb * mbp_mlp_stage_stash_floats(r->st[s]) + 1, sizeof(float));
				work[s][j] =
				    calloc(mb * mbp_mlp_stage_work_floats(r->st[s]) + 1, sizeof(float));
			}
		}
	double loss = 0;
	/* The order of (micro-batch, forward or backward) over the whole pipeline, flattened: GPipe runs all
	 * forwards first; the 1F1B-like order interleaves forward j + 1 with backward j. Each stage's
	 * backwards stay in micro-batch order in both. */
	unsigned nops = 2 * M, op[32][2];
	for (unsigned k = 0, f = 0, b = 0; k < nops; k++) {
		bool fwd = one_f_one_b ? (f < M && f <= b) : f < M;
		op[k][0] = fwd ? f++ : b++;
		op[k][1] = fwd;
	}
	for (unsigned k = 0; k < nops; k++) {
		unsigned j = op[k][0];
		if (op[k][1]) {
			for (unsigned s = 0; s < S; s++)
				ck_assert_int_eq(mbp_mlp_stage_forward(r->st[s], act[s][j], act[s + 1][j], mb,
								       stash[s][j]),
						 0);
			double l;
			ck_assert_int_eq(mbp_loss_xent(act[S][j], r->y + first + (size_t)j * mb, mb,
						       r->w[r->L], batch, grad[S][j], &l, NULL),
					 0);
			loss += l;
		} else {
			for (unsigned s = S; s-- > 0;) {
				float *din = s ? grad[s][j] : NULL;
				/* a stage that recomputes nothing ignores the work buffer: the plain calls */
				float *wk = mbp_mlp_stage_work_floats(r->st[s]) ? work[s][j] : NULL;
				if (wk)
					ck_assert_int_eq(
					    mbp_mlp_stage_recompute(r->st[s], stash[s][j], act[s][j], wk, mb),
					    0);
				if (split) {
					ck_assert_int_eq(mbp_mlp_stage_backward_in_r(r->st[s], stash[s][j],
										     wk, act[s][j],
										     grad[s + 1][j], din, mb),
							 0);
					ck_assert_int_eq(mbp_mlp_stage_backward_w_r(r->st[s], stash[s][j], wk,
										    act[s][j], mb),
							 0);
				} else {
					ck_assert_int_eq(mbp_mlp_stage_backward_r(r->st[s], stash[s][j], wk,
										  act[s][j], grad[s + 1][j],
										  din, mb),
							 0);
				}
			}
		}
	}
	for (unsigned s = 0; s <= S; s++)
		for (unsigned j = 0; j < M; j++) {
			if (s)
				free(act[s][j]);
			free(grad[s][j]);
			if (s < S) {
				free(stash[s][j]);
				free(work[s][j]);
			}
		}
	return loss;
}

/* Layers whose bit is set in `mask` recompute (on whichever stage holds them). */
static void rig_recompute(struct rig *r, unsigned mask)
{
	for (unsigned s = 0; s < r->S; s++)
		for (unsigned i = 0; i < r->L; i++)
			if (mask >> i & 1 && mbp_mlp_stage_set_recompute(r->st[s], i, true) == 0)
				ck_assert(mbp_mlp_stage_recomputes(r->st[s], i)); /* -EINVAL: not s's layer */
}

/* Recomputing any set of layers (a stage's first, last, middle, all, or runs of them) gives the gradients
 * and losses of stashing them, bit for bit, under every layer kind, both orders and both backward forms,
 * with a smaller stash: each recomputed layer's tensors move to the work buffer. */
START_TEST(recomputed_layers_give_the_same_bits_as_stashed_ones)
{
	const unsigned one[] = {0, 4}, two[] = {0, 2, 4}, three[] = {0, 1, 3, 4};
	const unsigned *cuts[] = {one, two, three}, nst[] = {1, 2, 3};
	for (int act = MBP_ACT_NONE; act <= MBP_ACT_GELU; act++)
		for (int norm = 0; norm < 2; norm++) {
			struct rig ref;
			rig_init(&ref, one, 1, 8, (mbp_act)act, norm, NULL, 48);
			double lref = rig_grads(&ref, 0, 6, 8, false, false);
			for (unsigned c = 0; c < 3; c++)
				for (unsigned mask = 1; mask < 16; mask += 1 + (c == 0)) {
					struct rig r;
					rig_init(&r, cuts[c], nst[c], 8, (mbp_act)act, norm, NULL, 48);
					size_t before = 0, after = 0, work = 0;
					for (unsigned s = 0; s < r.S; s++)
						before += mbp_mlp_stage_stash_floats(r.st[s]);
					rig_recompute(&r, mask);
					for (unsigned s = 0; s < r.S; s++) {
						after += mbp_mlp_stage_stash_floats(r.st[s]);
						work += mbp_mlp_stage_work_floats(r.st[s]);
					}
					ck_assert_uint_eq(before, after + work);
					ck_assert_uint_gt(work, 0);
					double l = rig_grads(&r, 0, 6, 8, mask & 1, mask & 2);
					ck_assert_msg(l == lref,
						      "act %d norm %d cuts %u mask %u: %.17g vs %.17g", act,
						      norm, c, mask, l, lref);
					assert_same_array(ref.n, r.n, MBP_ARRAY_GRAD);
					rig_fini(&r);
				}
			rig_fini(&ref);
		}
}
END_TEST

START_TEST(combined_backward_equals_backward_in_then_backward_w_bit_for_bit)
{
	const unsigned cuts[] = {0, 2, 4};
	for (int act = MBP_ACT_NONE; act <= MBP_ACT_GELU; act++)
		for (int norm = 0; norm < 2; norm++) {
			struct rig a, b;
			rig_init(&a, cuts, 2, 8, (mbp_act)act, norm, NULL, 32);
			rig_init(&b, cuts, 2, 8, (mbp_act)act, norm, NULL, 32);
			double la = rig_grads(&a, 0, 4, 8, false, false);
			double lb = rig_grads(&b, 0, 4, 8, false, true);
			ck_assert(la == lb);
			assert_same_array(a.n, b.n, MBP_ARRAY_GRAD);
			rig_fini(&a);
			rig_fini(&b);
		}
}
END_TEST

START_TEST(micro_batch_accumulation_equals_one_batch_and_repeats_bit_for_bit)
{
	const unsigned cuts[] = {0, 4};
	struct rig a, b, c;
	rig_init(&a, cuts, 1, 32, MBP_ACT_GELU, true, NULL, 32);
	rig_init(&b, cuts, 1, 32, MBP_ACT_GELU, true, NULL, 32);
	rig_init(&c, cuts, 1, 32, MBP_ACT_GELU, true, NULL, 32);
	double la = rig_grads(&a, 0, 4, 8, false, true);  /* 4 micro-batches of 8 */
	double lb = rig_grads(&b, 0, 1, 32, false, true); /* one batch of 32 */
	double lc = rig_grads(&c, 0, 4, 8, false, true);
	ck_assert_msg(close_to(la, lb, 1e-6, 0), "loss %.9g against %.9g", la, lb);
	ck_assert(la == lc);
	assert_same_array(a.n, c.n, MBP_ARRAY_GRAD);
	size_t len;
	float *ga = snapshot(a.n, MBP_ARRAY_GRAD, &len), *gb = snapshot(b.n, MBP_ARRAY_GRAD, &len);
	double scale = 0;
	for (size_t e = 0; e < len; e++)
		scale = fmax(scale, fabs(gb[e]));
	for (size_t e = 0; e < len; e++)
		ck_assert_msg(fabs(ga[e] - gb[e]) <= 1e-5 * scale, "[%zu] %.9g against %.9g", e, ga[e],
			      gb[e]);
	free(ga);
	free(gb);
	rig_fini(&a);
	rig_fini(&b);
	rig_fini(&c);
}
END_TEST

START_TEST(stage_splits_and_schedule_orders_give_the_same_bits)
{
	const unsigned one[] = {0, 4}, two[] = {0, 1, 4}, four[] = {0, 1, 2, 3, 4};
	struct rig ref;
	rig_init(&ref, one, 1, 8, MBP_ACT_RELU, true, NULL, 48);
	double lref = rig_grads(&ref, 0, 6, 8, false, false);
	for (int v = 0; v < 4; v++) {
		struct rig r;
		rig_init(&r, v & 2 ? four : two, v & 2 ? 4 : 2, 8, MBP_ACT_RELU, true, NULL, 48);
		double l = rig_grads(&r, 0, 6, 8, v & 1, v & 1);
		ck_assert(l == lref);
		assert_same_array(ref.n, r.n, MBP_ARRAY_GRAD);
		rig_fini(&r);
	}
	rig_fini(&ref);
}
END_TEST

/* Input gradients handed over to the next stage (with or without recomputation) give the same gradients,
 * bit for bit, as one stage over
 * every layer, in both orders and both forms of the backward: one-layer stages (stage 2 both takes and
 * gives), a two-layer stage that gives, a two-layer stage that takes (its last layer's dx goes to scratch
 * before the hand-back). */
static const struct {
	unsigned S, cuts[5],
	    gives[2]; /* stage s hands over to s + 1 for s in gives (0: none after the first) */
	unsigned ngives;
} hand_over_rigs[] = {
    {4, {0, 1, 2, 3, 4}, {1, 2}, 2},
    {2, {0, 2, 4}, {0}, 1},
    {3, {0, 1, 3, 4}, {1}, 1},
    {3, {0, 2, 3, 4}, {0, 1}, 2},
};

START_TEST(a_handed_over_input_gradient_gives_the_same_bits)
{
	const unsigned one[] = {0, 4};
	const mbp_act acts[] = {MBP_ACT_RELU, MBP_ACT_NONE};
	for (unsigned a = 0; a < 2; a++) {
		struct rig ref;
		rig_init(&ref, one, 1, 8, acts[a], false, NULL, 48);
		double lref = rig_grads(&ref, 0, 6, 8, false, false);
		for (size_t k = 0; k < sizeof hand_over_rigs / sizeof hand_over_rigs[0]; k++)
			for (int v = 0; v < 4; v++) {
				struct rig r;
				rig_init(&r, hand_over_rigs[k].cuts, hand_over_rigs[k].S, 8, acts[a], false,
					 NULL, 48);
				for (unsigned g = 0; g < hand_over_rigs[k].ngives; g++) {
					unsigned s = hand_over_rigs[k].gives[g];
					ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[s], r.st[s + 1]), 0);
					ck_assert_uint_eq(mbp_mlp_stage_dout_floats(r.st[s]), 16 + 16);
					ck_assert_uint_eq(mbp_mlp_stage_din_floats(r.st[s + 1]), 16 + 16);
				}
				ck_assert_uint_eq(mbp_mlp_stage_din_floats(r.st[0]), rig_widths[0]);
				/* and recomputing none, layers 0 and 2, 1 and 3, every layer: a giving stage's
				 * last layer, a taking stage's first (the hand-back reads the stage's input) */
				rig_recompute(&r, (unsigned)(v * 5));
				double l = rig_grads(&r, 0, 6, 8, v & 1, v & 2);
				ck_assert_msg(l == lref, "rig %zu, variant %d: loss %.17g against %.17g", k,
					      v, l, lref);
				assert_same_array(ref.n, r.n, MBP_ARRAY_GRAD);
				rig_fini(&r);
			}
		rig_fini(&ref);
	}
}
END_TEST

START_TEST(hand_over_is_refused_where_the_gradient_needs_the_previous_stash)
{
	const unsigned four[] = {0, 1, 2, 3, 4};
	struct rig r;
	rig_init(&r, four, 4, 8, MBP_ACT_GELU, false, NULL, 8);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], r.st[2]), -ENOTSUP); /* GELU needs z */
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(r.n, 1), -ENOTSUP);	/* the same rule */
	rig_fini(&r);
	rig_init(&r, four, 4, 8, MBP_ACT_RELU, true, NULL, 8);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], r.st[2]), -ENOTSUP); /* the norm's stash */
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(r.n, 1), -ENOTSUP);
	rig_fini(&r);
	rig_init(&r, four, 4, 8, MBP_ACT_RELU, false, NULL, 8);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[0], r.st[1]),
			 -EINVAL); /* layer 0: no input gradient */
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(r.n, 0), -EINVAL);
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(r.n, 4), -EINVAL); /* out of range */
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(NULL, 1), -EINVAL);
	ck_assert_int_eq(mbp_mlp_layer_hand_over_check(r.n, 3), 0);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], r.st[3]), -EINVAL); /* not neighbours */
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[2], r.st[1]), -EINVAL); /* the wrong way round */
	ck_assert_int_eq(mbp_mlp_stages_hand_over(NULL, r.st[1]), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], r.st[2]), 0);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], r.st[2]), -EINVAL); /* once */
	ck_assert_uint_eq(mbp_mlp_stage_dout_floats(NULL), 0);
	ck_assert_uint_eq(mbp_mlp_stage_din_floats(NULL), 0);
	/* the taking stage needs its input to find where the ReLU was active */
	float stash[8 * 64], dout[8 * 16], din[8 * 32];
	ck_assert_int_eq(mbp_mlp_stage_backward_in(r.st[2], stash, NULL, dout, din, 8), -EINVAL);
	rig_fini(&r);
	struct rig other;
	rig_init(&r, four, 4, 8, MBP_ACT_RELU, false, NULL, 8);
	rig_init(&other, four, 4, 8, MBP_ACT_RELU, false, NULL, 8);
	ck_assert_int_eq(mbp_mlp_stages_hand_over(r.st[1], other.st[2]), -EINVAL); /* another model */
	rig_fini(&r);
	rig_fini(&other);
}
END_TEST

START_TEST(training_forward_equals_inference_and_the_saved_model_bit_for_bit)
{
	const uint32_t widths[] = {9, 33, 17, 6};
	mbp_mlp *n = new_mlp(widths, 3, MBP_ACT_GELU, true, 3, NULL);
	perturb(n, 4);
	enum { rows = 10 };
	float *x = random_floats(rows * 9, 1);
	float out_train[rows * 6], out_inf[rows * 6], out_mlp[rows * 6], out_model[rows * 6], mid[rows * 33];
	mbp_mlp_stage *s0, *s1;
	ck_assert_int_eq(mbp_mlp_stage_new(&s0, n, 0, 1, rows), 0);
	ck_assert_int_eq(mbp_mlp_stage_new(&s1, n, 1, 3, rows), 0);
	float *st0 = calloc(rows * mbp_mlp_stage_stash_floats(s0), 4),
	      *st1 = calloc(rows * mbp_mlp_stage_stash_floats(s1), 4);
	ck_assert_int_eq(mbp_mlp_stage_forward(s0, x, mid, rows, st0), 0);
	ck_assert_int_eq(mbp_mlp_stage_forward(s1, mid, out_train, rows, st1), 0);
	ck_assert_int_eq(mbp_mlp_stage_forward(s0, x, mid, rows, NULL), 0);
	ck_assert_int_eq(mbp_mlp_stage_forward(s1, mid, out_inf, rows, NULL), 0);
	ck_assert_int_eq(mbp_mlp_forward(n, x, out_mlp, rows, 0), 0);
	ck_assert_int_eq(mbp_mlp_save(n, tmpdir_path("w.safetensors")), 0);
	mbp_model *m;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load(&m, tmpdir_path("w.safetensors"), &e) == 0, "%s", e.msg);
	ck_assert_int_eq(mbp_model_forward(m, x, out_model, rows, 0), 0);
	ck_assert(!memcmp(out_train, out_inf, sizeof(out_train)));
	ck_assert(!memcmp(out_train, out_mlp, sizeof(out_train)));
	ck_assert(!memcmp(out_train, out_model, sizeof(out_train)));
	/* The loaded model has the same structure and values; a copy of it trains from the same point. */
	mbp_mlp *n2;
	ck_assert_int_eq(mbp_mlp_new_from_model(&n2, m, NULL), 0);
	assert_same_array(n, n2, MBP_ARRAY_PARAM);
	for (unsigned i = 0; i < 3; i++) {
		mbp_layer_info a, b;
		ck_assert_int_eq(mbp_mlp_layer_info(n, i, &a), 0);
		ck_assert_int_eq(mbp_model_layer_info(m, i, &b), 0);
		ck_assert(a.in == b.in && a.out == b.out && a.act == b.act && a.norm == b.norm &&
			  a.eps == b.eps);
	}
	mbp_mlp_destroy(n2);
	mbp_model_destroy(m);
	free(st0);
	free(st1);
	free(x);
	mbp_mlp_stage_destroy(s0);
	mbp_mlp_stage_destroy(s1);
	mbp_mlp_destroy(n);
}
END_TEST

/* ---- losses ---- */

START_TEST(loss_values_and_gradients_match_hand_computed_ones)
{
	/* Cross-entropy. Row 0: logits (0, 0, ln 2), label 2: softmax (1/4, 1/4, 1/2), loss ln 2. Row 1: equal
	 * logits, label 0: softmax 1/3 each, loss ln 3. */
	float logits[] = {0.0f, 0.0f, (float)M_LN2, 1.0f, 1.0f, 1.0f}, d[6];
	int32_t labels[] = {2, 0};
	double loss;
	uint32_t correct;
	ck_assert_int_eq(mbp_loss_xent(logits, labels, 2, 3, 4, d, &loss, &correct), 0);
	ck_assert(close_to(loss, M_LN2 + log(3.0), 1e-7, 0));
	ck_assert_uint_eq(correct, 2); /* row 0's argmax is 2; row 1's ties go to the first class, 0 */
	int32_t other[] = {1, 1};
	ck_assert_int_eq(mbp_loss_xent(logits, other, 2, 3, 4, d, &loss, &correct), 0);
	ck_assert_uint_eq(correct, 0);
	ck_assert_int_eq(mbp_loss_xent(logits, labels, 2, 3, 4, d, &loss, &correct), 0);
	const double want[] = {0.25 / 4, 0.25 / 4, -0.5 / 4, (1.0 / 3 - 1) / 4, 1.0 / 3 / 4, 1.0 / 3 / 4};
	for (int i = 0; i < 6; i++)
		ck_assert_msg(close_to(d[i], want[i], 1e-6, 1e-8), "[%d] %g want %g", i, d[i], want[i]);
	/* In place gives the same. */
	float in_place[6];
	memcpy(in_place, logits, sizeof(logits));
	ck_assert_int_eq(mbp_loss_xent(in_place, labels, 2, 3, 4, in_place, &loss, NULL), 0);
	ck_assert(!memcmp(in_place, d, sizeof(d)));
	/* MSE: out (1, 2), target (0, 0): row loss (1 + 4) / 2, gradient 2 (y - t) / (batch x width). */
	float out[] = {1.0f, 2.0f}, t[] = {0.0f, 0.0f}, dm[2];
	ck_assert_int_eq(mbp_loss_mse(out, t, 1, 2, 2, dm, &loss), 0);
	ck_assert(close_to(loss, 2.5, 1e-12, 0));
	ck_assert(close_to(dm[0], 2.0 * 1 / 4, 1e-7, 0) && close_to(dm[1], 2.0 * 2 / 4, 1e-7, 0));
}
END_TEST

START_TEST(losses_refuse_bad_labels_non_finite_values_and_bad_arguments)
{
	float logits[6] = {0}, d[6];
	int32_t bad_hi[] = {0, 3}, bad_neg[] = {-1, 0}, ok[] = {0, 1};
	double loss;
	ck_assert_int_eq(mbp_loss_xent(logits, bad_hi, 2, 3, 2, d, &loss, NULL), -ERANGE);
	ck_assert_int_eq(mbp_loss_xent(logits, bad_neg, 2, 3, 2, d, &loss, NULL), -ERANGE);
	ck_assert_int_eq(mbp_loss_xent(logits, ok, 2, 3, 1, d, &loss, NULL), -EINVAL); /* batch < rows */
	ck_assert_int_eq(mbp_loss_xent(NULL, ok, 2, 3, 2, d, &loss, NULL), -EINVAL);
	ck_assert_int_eq(mbp_loss_xent(logits, ok, 0, 3, 2, d, &loss, NULL), -EINVAL);
	logits[4] = NAN;
	ck_assert_int_eq(mbp_loss_xent(logits, ok, 2, 3, 2, d, &loss, NULL), -EDOM);
	logits[4] = INFINITY;
	ck_assert_int_eq(mbp_loss_xent(logits, ok, 2, 3, 2, d, &loss, NULL), -EDOM);
	float out[2] = {1, INFINITY}, t[2] = {0, 0};
	ck_assert_int_eq(mbp_loss_mse(out, t, 1, 2, 1, d, &loss), -EDOM);
	ck_assert_int_eq(mbp_loss_mse(out, t, 1, 0, 1, d, &loss), -EINVAL);
	ck_assert_str_eq(mbp_strerror(-EDOM), "numerical error");
}
END_TEST

/* ---- optimizers ---- */

START_TEST(lr_schedule_warms_up_linearly_then_decays_by_cosine)
{
	mbp_optim_opts o = {.lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 4, .total_steps = 14};
	ck_assert(close_to(mbp_optim_lr(&o, 0), 0.25, 1e-12, 0));
	ck_assert(close_to(mbp_optim_lr(&o, 3), 1.0, 1e-12, 0));
	ck_assert(close_to(mbp_optim_lr(&o, 4), 1.0, 1e-12, 0));
	ck_assert(close_to(mbp_optim_lr(&o, 9), 0.1 + 0.9 * 0.5, 1e-7, 0)); /* halfway: cos(pi / 2) = 0 */
	ck_assert(close_to(mbp_optim_lr(&o, 14), 0.1, 1e-7, 0));
	ck_assert(close_to(mbp_optim_lr(&o, 1000), 0.1, 1e-7, 0));
	mbp_optim_opts c = {.lr = 0.5f};
	ck_assert(mbp_optim_lr(&c, 0) == (double)0.5f && mbp_optim_lr(&c, 99999) == (double)0.5f);
	mbp_optim_opts z = {0};
	ck_assert(close_to(mbp_optim_lr(&z, 7), 1e-3, 1e-6, 0));
	ck_assert(isnan(mbp_optim_lr(NULL, 0)));
	ck_assert(mbp_clip_scale(4.0, 1.0f) > 0.4999f && mbp_clip_scale(4.0, 1.0f) < 0.5f);
	ck_assert(mbp_clip_scale(0.25, 1.0f) == 1.0f);
	ck_assert(mbp_clip_scale(100.0, 0.0f) == 1.0f);
	ck_assert(isnan(mbp_clip_scale(INFINITY, 1.0f)));
}
END_TEST

/* A 1-layer 2 -> 1 model (weight 2 values, bias 1) whose gradients the test sets by hand. */
static mbp_mlp *tiny(const mbp_optim_opts *o, mbp_mlp_stage **st)
{
	const uint32_t w[] = {2, 1};
	mbp_mlp *n = new_mlp(w, 1, MBP_ACT_NONE, false, 1, o);
	ck_assert_int_eq(mbp_mlp_stage_new(st, n, 0, 1, 1), 0);
	float *p = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
	p[0] = 1.0f, p[1] = -2.0f;
	*mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL) = 0.5f;
	return n;
}

static void set_grads(mbp_mlp *n, float g0, float g1, float gb)
{
	float *g = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_GRAD, NULL);
	g[0] = g0, g[1] = g1;
	*mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_GRAD, NULL) = gb;
}

START_TEST(adamw_matches_hand_computed_steps)
{
	mbp_optim_opts o = {.kind = MBP_OPTIM_ADAMW,
			    .lr = 0.1f,
			    .weight_decay = 0.5f,
			    .warmup_steps = 2,
			    .beta1 = 0.8f,
			    .beta2 = 0.9f,
			    .eps = 1e-3f};
	mbp_mlp_stage *st;
	mbp_mlp *n = tiny(&o, &st);
	double p[3] = {1.0, -2.0, 0.5}, m[3] = {0}, v[3] = {0};
	const double g[2][3] = {{0.5, -1.0, 2.0}, {-0.25, 0.75, 1.0}};
	const float scale[2] = {1.0f, 0.5f};
	for (int t = 0; t < 2; t++) {
		set_grads(n, (float)g[t][0], (float)g[t][1], (float)g[t][2]);
		ck_assert_int_eq(mbp_mlp_stage_update(st, scale[t]), 0);
		double lr = 0.1 * (t + 1) / 2;
		for (int k = 0; k < 3; k++) {
			double gk = g[t][k] * scale[t];
			if (k < 2)
				p[k] *= 1 - lr * 0.5; /* the weights decay, the bias does not */
			m[k] = 0.8 * m[k] + 0.2 * gk;
			v[k] = 0.9 * v[k] + 0.1 * gk * gk;
			double mh = m[k] / (1 - pow(0.8, t + 1)), vh = v[k] / (1 - pow(0.9, t + 1));
			p[k] -= lr * mh / (sqrt(vh) + 1e-3);
		}
		float *pw = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
		float *pb = mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL);
		const float got[3] = {pw[0], pw[1], pb[0]};
		for (int k = 0; k < 3; k++)
			ck_assert_msg(close_to(got[k], p[k], 1e-6, 1e-7), "step %d [%d]: %.9g want %.9g", t,
				      k, got[k], p[k]);
		ck_assert_uint_eq(mbp_mlp_steps(n, 0), (uint64_t)t + 1);
	}
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
}
END_TEST

START_TEST(sgd_with_momentum_matches_hand_computed_steps)
{
	mbp_optim_opts o = {.kind = MBP_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f};
	mbp_mlp_stage *st;
	mbp_mlp *n = tiny(&o, &st);
	double p[3] = {1.0, -2.0, 0.5}, buf[3] = {0};
	const double g[3][3] = {{0.5, -1.0, 2.0}, {-0.25, 0.75, 1.0}, {1.0, 1.0, -1.0}};
	for (int t = 0; t < 3; t++) {
		set_grads(n, (float)g[t][0], (float)g[t][1], (float)g[t][2]);
		ck_assert_int_eq(mbp_mlp_stage_update(st, 1.0f), 0);
		for (int k = 0; k < 3; k++) {
			double gk = g[t][k] + (k < 2 ? 0.1 * p[k] : 0);
			buf[k] = t == 0 ? gk : 0.9 * buf[k] + gk;
			p[k] -= 0.1 * buf[k];
		}
		float *pw = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
		float *pb = mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL);
		const float got[3] = {pw[0], pw[1], pb[0]};
		for (int k = 0; k < 3; k++)
			ck_assert_msg(close_to(got[k], p[k], 1e-6, 1e-7), "step %d [%d]: %.9g want %.9g", t,
				      k, got[k], p[k]);
	}
	ck_assert_ptr_null(mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_MOMENT2, NULL));
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
	/* Without momentum: plain steps, no buffer kept. */
	mbp_optim_opts plain = {.kind = MBP_OPTIM_SGD, .lr = 0.5f};
	n = tiny(&plain, &st);
	ck_assert_ptr_null(mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_MOMENT1, NULL));
	set_grads(n, 1.0f, -1.0f, 2.0f);
	ck_assert_int_eq(mbp_mlp_stage_update(st, 0.5f), 0);
	float *pw = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
	ck_assert(pw[0] == 0.75f && pw[1] == -1.75f &&
		  *mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL) == 0.0f);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
}
END_TEST

START_TEST(clipping_by_global_norm_and_refusing_non_finite_gradients)
{
	mbp_mlp_stage *st;
	mbp_mlp *n = tiny(NULL, &st);
	set_grads(n, 3.0f, 0.0f, 4.0f);
	double sq;
	ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(st, &sq), 0);
	ck_assert(sq == 25.0);
	/* A NaN gradient: -EDOM and nothing changes, neither parameters nor moments nor the step. */
	size_t len;
	float *before = snapshot(n, MBP_ARRAY_PARAM, &len);
	mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_GRAD, NULL)[0] = NAN;
	ck_assert_int_eq(mbp_mlp_stage_update(st, 1.0f), -EDOM);
	ck_assert_int_eq(mbp_mlp_stage_update(st, NAN), -EDOM);
	ck_assert_int_eq(mbp_mlp_stage_update(st, -1.0f), -EDOM);
	float *after = snapshot(n, MBP_ARRAY_PARAM, &len);
	ck_assert(!memcmp(before, after, len * sizeof(float)));
	ck_assert_uint_eq(mbp_mlp_steps(n, 0), 0);
	free(before);
	free(after);
	/* Update with a scale equals the update of pre-scaled gradients, bit for bit. */
	mbp_mlp_stage *st2;
	mbp_mlp *n2 = tiny(NULL, &st2);
	set_grads(n, 3.0f, 0.0f, 4.0f);
	float c = mbp_clip_scale(sq, 1.0f);
	set_grads(n2, 3.0f * c, 0.0f * c, 4.0f * c);
	ck_assert_int_eq(mbp_mlp_stage_update(st, c), 0);
	ck_assert_int_eq(mbp_mlp_stage_update(st2, 1.0f), 0);
	assert_same_array(n, n2, MBP_ARRAY_PARAM);
	assert_same_array(n, n2, MBP_ARRAY_MOMENT2);
	ck_assert_int_eq(mbp_mlp_stage_zero_grad(st), 0);
	ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(st, &sq), 0);
	ck_assert(sq == 0.0);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_stage_destroy(st2);
	mbp_mlp_destroy(n);
	mbp_mlp_destroy(n2);
}
END_TEST

/* The check refuses exactly what the update refuses, and applies nothing: for every refusal and for an
 * accepted update, check then update give the same answer, and the check leaves parameters, moments and
 * step counts as they were. */
START_TEST(update_check_refuses_exactly_what_the_update_refuses_and_applies_nothing)
{
	static const struct {
		float g0, scale;
		int want;
	} cases[] = {{0.5f, 1.0f, 0},	      {0.5f, 0.0f, 0},	       {0.5f, NAN, -EDOM},
		     {0.5f, -1.0f, -EDOM},    {0.5f, INFINITY, -EDOM}, {NAN, 1.0f, -EDOM},
		     {INFINITY, 1.0f, -EDOM}, {-INFINITY, 0.5f, -EDOM}};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		mbp_mlp_stage *st;
		mbp_mlp *n = tiny(NULL, &st);
		set_grads(n, cases[i].g0, -1.0f, 2.0f);
		size_t len;
		float *before = snapshot(n, MBP_ARRAY_PARAM, &len),
		      *m_before = snapshot(n, MBP_ARRAY_MOMENT1, &len);
		ck_assert_int_eq(mbp_mlp_stage_update_check(st, cases[i].scale), cases[i].want);
		float *after = snapshot(n, MBP_ARRAY_PARAM, &len),
		      *m_after = snapshot(n, MBP_ARRAY_MOMENT1, &len);
		ck_assert_msg(!memcmp(before, after, len * sizeof(float)),
			      "case %zu: the check changed a parameter", i);
		ck_assert(!memcmp(m_before, m_after, len * sizeof(float)));
		ck_assert_uint_eq(mbp_mlp_steps(n, 0), 0);
		ck_assert_int_eq(mbp_mlp_stage_update(st, cases[i].scale), cases[i].want);
		ck_assert_uint_eq(mbp_mlp_steps(n, 0), cases[i].want == 0);
		free(before);
		free(after);
		free(m_before);
		free(m_after);
		mbp_mlp_stage_destroy(st);
		mbp_mlp_destroy(n);
	}
	ck_assert_int_eq(mbp_mlp_stage_update_check(NULL, 1.0f), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_update(NULL, 1.0f), -EINVAL);
}
END_TEST

/* The update runs vector lanes over most of a tensor and plain C over its last few elements: every
 * element must get the bits the plain loop gives it, wherever it sits. Each element of a 40-wide weight
 * tensor (vector lanes) is updated beside the same values in a 2-element tensor of its own (plain C only),
 * three AdamW steps with weight decay, a clip factor and new gradients each step. */
START_TEST(adamw_gives_an_element_the_same_bits_in_a_vector_lane_as_alone)
{
	mbp_optim_opts o = {.kind = MBP_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.1f, .warmup_steps = 2};
	enum { W = 40 };
	const uint32_t wide_w[] = {W, 1};
	mbp_mlp *wide = new_mlp(wide_w, 1, MBP_ACT_NONE, false, 3, &o);
	mbp_mlp_stage *wst;
	ck_assert_int_eq(mbp_mlp_stage_new(&wst, wide, 0, 1, 1), 0);
	mbp_mlp_stage *st[W];
	mbp_mlp *alone[W];
	float *wp = mbp_mlp_tensor(wide, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
	float *wg = mbp_mlp_tensor(wide, 0, MBP_PART_WEIGHT, MBP_ARRAY_GRAD, NULL);
	for (int e = 0; e < W; e++) {
		alone[e] = tiny(&o, &st[e]);
		mbp_mlp_tensor(alone[e], 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL)[0] = wp[e];
	}
	uint64_t seed = 11;
	for (int t = 0; t < 3; t++) {
		const float scale = t == 1 ? 0.37f : 1.0f;
		for (int e = 0; e < W; e++) {
			wg[e] = urand(&seed) * (e % 3 ? 1.0f : 1e-3f);
			set_grads(alone[e], wg[e], 0.25f, 0.5f);
			ck_assert_int_eq(mbp_mlp_stage_update(st[e], scale), 0);
		}
		ck_assert_int_eq(mbp_mlp_stage_update(wst, scale), 0);
		for (int e = 0; e < W; e++)
			for (int a = MBP_ARRAY_PARAM; a <= MBP_ARRAY_MOMENT2; a++) {
				if (a == MBP_ARRAY_GRAD)
					continue;
				float x = mbp_mlp_tensor(wide, 0, MBP_PART_WEIGHT, (mbp_mlp_array)a, NULL)[e];
				float y =
				    mbp_mlp_tensor(alone[e], 0, MBP_PART_WEIGHT, (mbp_mlp_array)a, NULL)[0];
				ck_assert_msg(!memcmp(&x, &y, sizeof x),
					      "step %d, element %d, array %d: %.9g in the tensor, %.9g alone",
					      t, e, a, x, y);
			}
	}
	for (int e = 0; e < W; e++) {
		mbp_mlp_stage_destroy(st[e]);
		mbp_mlp_destroy(alone[e]);
	}
	mbp_mlp_stage_destroy(wst);
	mbp_mlp_destroy(wide);
}
END_TEST

/* A layer's squared gradient norm: the sum of its tensors' squares (against a sequential sum in double),
 * a stage's the sum of its layers' in layer order, and not finite exactly when some gradient is not, at any
 * position (the vector lanes and the tail); the update's check finds the same element. */
START_TEST(layer_grad_sqnorm_sums_the_squares_and_is_finite_exactly_when_every_gradient_is)
{
	const uint32_t w[] = {13, 9, 3};
	mbp_mlp *n = new_mlp(w, 2, MBP_ACT_RELU, false, 5, NULL);
	mbp_mlp_stage *st;
	ck_assert_int_eq(mbp_mlp_stage_new(&st, n, 0, 2, 1), 0);
	uint64_t seed = 17;
	double want[2] = {0, 0};
	for (unsigned l = 0; l < 2; l++)
		for (int p = MBP_PART_WEIGHT; p <= MBP_PART_BIAS; p++) {
			size_t c;
			float *g = mbp_mlp_tensor(n, l, (mbp_mlp_part)p, MBP_ARRAY_GRAD, &c);
			for (size_t e = 0; e < c; e++) {
				g[e] = urand(&seed) * 3.0f;
				want[l] += (double)g[e] * g[e];
			}
		}
	double q[2], sq;
	for (unsigned l = 0; l < 2; l++) {
		ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(n, l, &q[l]), 0);
		ck_assert_msg(close_to(q[l], want[l], 1e-12, 0), "layer %u: %.17g, want %.17g", l, q[l],
			      want[l]);
	}
	ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(st, &sq), 0);
	ck_assert(sq == 0.0 + q[0] + q[1]);
	size_t c;
	float *g = mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_GRAD, &c);
	const float bad[] = {NAN, INFINITY, -INFINITY};
	for (size_t e = 0; e < c; e++)
		for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
			float keep = g[e];
			g[e] = bad[k];
			double b;
			ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(n, 0, &b), 0);
			ck_assert_msg(!isfinite(b), "element %zu = %g: norm %g", e, (double)bad[k], b);
			ck_assert_int_eq(mbp_mlp_stage_update_check(st, 1.0f), -EDOM);
			g[e] = keep;
		}
	ck_assert_int_eq(mbp_mlp_stage_update_check(st, 1.0f), 0);
	ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(n, 2, &sq), -EINVAL);
	ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(NULL, 0, &sq), -EINVAL);
	ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(n, 0, NULL), -EINVAL);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
}
END_TEST

/* ---- the trainer on the model's stages, glued as a user would, without grad_sq ---- */

struct tstage {
	mbp_mlp_stage *st;
	float *poison; /* set: this gradient element becomes NaN after each weight gradient */
};

static int ts_forward(void *ctx, const mbp_train_io *io)
{
	struct tstage *t = ctx;
	return mbp_mlp_stage_forward(t->st, io->in, io->out, io->rows, io->stash);
}

static int ts_poisoned(struct tstage *t, int rc)
{
	if (rc == 0 && t->poison)
		*t->poison = NAN;
	return rc;
}

static int ts_recompute(void *ctx, const mbp_train_io *io)
{
	struct tstage *t = ctx;
	return mbp_mlp_stage_recompute(t->st, io->stash, io->in, io->work, io->rows);
}

static int ts_backward(void *ctx, const mbp_train_io *io)
{
	struct tstage *t = ctx;
	return ts_poisoned(
	    t, mbp_mlp_stage_backward_r(t->st, io->stash, io->work, io->in, io->dout, io->din, io->rows));
}

static int ts_backward_in(void *ctx, const mbp_train_io *io)
{
	struct tstage *t = ctx;
	return mbp_mlp_stage_backward_in_r(t->st, io->stash, io->work, io->in, io->dout, io->din, io->rows);
}

static int ts_backward_w(void *ctx, const mbp_train_io *io)
{
	struct tstage *t = ctx;
	return ts_poisoned(t, mbp_mlp_stage_backward_w_r(t->st, io->stash, io->work, io->in, io->rows));
}

static int ts_check(void *ctx)
{
	struct tstage *t = ctx;
	return mbp_mlp_stage_update_check(t->st, 1.0f);
}

static int ts_update(void *ctx, const mbp_train_update *u)
{
	(void)u;
	struct tstage *t = ctx;
	int rc = mbp_mlp_stage_update(t->st, 1.0f);
	mbp_mlp_stage_zero_grad(t->st);
	return rc;
}

static void ts_discard(void *ctx)
{
	struct tstage *t = ctx;
	mbp_mlp_stage_zero_grad(t->st);
}

static int ts_loss(void *arg, const mbp_train_io *io, double *loss)
{
	(void)arg;
	uint32_t correct;
	return mbp_loss_xent(io->out, io->targets, io->rows, rig_widths[4], io->step_rows, io->dout, loss,
			     &correct);
}

static mbp_trainer *model_trainer_on(struct rig *r, struct tstage *ts, mbp_sched_kind kind, bool check,
				     unsigned threads)
{
	mbp_train_opts o = {.in_row_bytes = rig_widths[0] * sizeof(float),
			    .target_row_bytes = sizeof(int32_t),
			    .max_mb_rows = 8,
			    .schedule = kind,
			    .threads = threads,
			    .trace_events = 64,
			    .loss = ts_loss};
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	for (unsigned s = 0; s < r->S; s++) {
		ts[s] = (struct tstage){r->st[s], NULL};
		mbp_train_stage_desc d = {
		    .ctx = &ts[s],
		    .out_row_bytes = mbp_mlp_stage_out_width(r->st[s]) * sizeof(float),
		    .stash_row_bytes = mbp_mlp_stage_stash_floats(r->st[s]) * sizeof(float),
		    .work_row_bytes = mbp_mlp_stage_work_floats(r->st[s]) * sizeof(float),
		    .recompute = ts_recompute,
		    .forward = ts_forward,
		    .backward = kind == MBP_SCHED_ZBH1 ? NULL : ts_backward,
		    .backward_in = ts_backward_in,
		    .backward_w = ts_backward_w,
		    .check = check ? ts_check : NULL, /* and no grad_sq */
		    .update = ts_update,
		    .discard = ts_discard};
		ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	}
	ck_assert_int_eq(mbp_trainer_start(t), 0);
	return t;
}

static mbp_trainer *model_trainer(struct rig *r, struct tstage *ts, mbp_sched_kind kind, bool check)
{
	return model_trainer_on(r, ts, kind, check, 0);
}

static const unsigned trainer_cuts[3][5] = {{0, 2, 4}, {0, 1, 3, 4}, {0, 1, 2, 3, 4}}; /* S = 2, 3, 4 */

/* The schedules the trainer tests below run: the one-stage-a-thread ones and the chunked ones (several
 * chunks a thread, where they can place S stages on `threads`, 0: their default). */
static const mbp_sched_kind trainer_kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B,	       MBP_SCHED_ZBH1,
					       MBP_SCHED_ZBH2,	MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS,
					       MBP_SCHED_ZBV,	MBP_SCHED_DUALPIPEV};
enum { TRAINER_KINDS = sizeof trainer_kinds / sizeof trainer_kinds[0] };

static bool can_place(mbp_sched_kind kind, unsigned S, unsigned threads)
{
	mbp_schedule *sc;
	if (mbp_schedule_new_placed(&sc, kind, S, 4, threads) < 0)
		return false;
	mbp_schedule_destroy(sc);
	return true;
}

/* Twin models, one recomputing the layers of `mask`, trained three steps by the trainer under every
 * schedule at S = 2..4 (the chunked ones where they place S chunks on their default threads, a thread
 * recomputing for several chunks): every parameter and moment byte the same; each recomputing stage ran
 * one recomputation per backward (its own figure and trace event, R), the others none. */
START_TEST(trainer_with_recomputation_gives_the_same_parameters_bit_for_bit)
{
	static const unsigned masks[] = {0x2, 0x5, 0xf};
	for (unsigned c = 0; c < 3; c++)
		for (size_t k = 0; k < TRAINER_KINDS; k++)
			for (size_t m = 0; m < 3 && can_place(trainer_kinds[k], c + 2, 0); m++) {
				const mbp_sched_kind *kinds = trainer_kinds;
				struct rig a, b;
				struct tstage ta[4], tb[4];
				rig_init(&a, trainer_cuts[c], c + 2, 8, MBP_ACT_GELU, true, NULL, 32);
				rig_init(&b, trainer_cuts[c], c + 2, 8, MBP_ACT_GELU, true, NULL, 32);
				rig_recompute(&b, masks[m]);
				mbp_trainer *x = model_trainer(&a, ta, kinds[k], true),
					    *y = model_trainer(&b, tb, kinds[k], true);
				for (int step = 0; step < 3; step++) {
					double la, lb;
					ck_assert_int_eq(mbp_trainer_step(x, a.x, a.y, 32, 8, &la), 0);
					ck_assert_int_eq(mbp_trainer_step(y, b.x, b.y, 32, 8, &lb), 0);
					ck_assert(la == lb);
				}
				for (int arr = MBP_ARRAY_PARAM; arr <= MBP_ARRAY_MOMENT2; arr++)
					assert_same_array(a.n, b.n, (mbp_mlp_array)arr);
				mbp_train_stage_stats ss[4];
				ck_assert_int_eq(mbp_trainer_stats_get(y, NULL, ss, 4), (int)b.S);
				mbp_train_event ev[4 * 64];
				int nev = mbp_trainer_events_get(y, ev, 4 * 64);
				ck_assert_int_le(nev, 4 * 64);
				for (unsigned s = 0; s < b.S; s++) {
					bool rc = mbp_mlp_stage_work_floats(b.st[s]) != 0;
					unsigned r_events = 0;
					for (int e = 0; e < nev; e++)
						r_events += ev[e].stage == s && ev[e].kind == MBP_OP_R;
					ck_assert_uint_eq(ss[s].r_count, rc ? 4 : 0);
					ck_assert_uint_eq(r_events, rc ? 4 : 0);
					ck_assert(rc ? ss[s].r_ns > 0 : ss[s].r_ns == 0);
				}
				mbp_trainer_destroy(x);
				mbp_trainer_destroy(y);
				rig_fini(&a);
				rig_fini(&b);
			}
}
END_TEST

/* Twin models, one trained with its second stage on two replicas (mbp_mlp_stage_new_replica: scratch of
 * its own, the model shared), three steps: every parameter and moment byte the same, under GPipe, 1F1B
 * and ZB-H1; with normalised layers too, whose B_in adds to the gradient, so the replicated stage gives
 * the trainer its whole backward only (merged in turn; ZB-H1 needs it split and is left out). */
START_TEST(trainer_with_a_replicated_stage_gives_the_same_parameters_bit_for_bit)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	for (int norm = 0; norm < 2; norm++)
		for (size_t k = 0; k < sizeof kinds / sizeof kinds[0] - (size_t)norm; k++) {
			struct rig a, b;
			struct tstage ta[4], tb[4], rep;
			rig_init(&a, trainer_cuts[0], 2, 8, MBP_ACT_RELU, norm, NULL, 32);
			rig_init(&b, trainer_cuts[0], 2, 8, MBP_ACT_RELU, norm, NULL, 32);
			ck_assert(mbp_mlp_stage_bin_accumulates(b.st[1]) == (bool)norm);
			mbp_trainer *x = model_trainer(&a, ta, kinds[k], true);
			mbp_train_opts o = {.in_row_bytes = rig_widths[0] * sizeof(float),
					    .target_row_bytes = sizeof(int32_t),
					    .max_mb_rows = 8,
					    .schedule = kinds[k],
					    .loss = ts_loss};
			mbp_trainer *y;
			ck_assert_int_eq(mbp_trainer_new(&y, &o), 0);
			rep = (struct tstage){NULL, NULL};
			ck_assert_int_eq(mbp_mlp_stage_new_replica(&rep.st, b.st[1]), 0);
			for (unsigned s = 0; s < 2; s++) {
				tb[s] = (struct tstage){b.st[s], NULL};
				void *ctx[2] = {&tb[s], &rep};
				bool whole = s == 1 && norm;
				mbp_train_stage_desc d = {
				    .ctx = &tb[s],
				    .replicas = s == 1 ? 2 : 1,
				    .replica_ctx = s == 1 ? ctx : NULL,
				    .out_row_bytes = mbp_mlp_stage_out_width(b.st[s]) * sizeof(float),
				    .stash_row_bytes = mbp_mlp_stage_stash_floats(b.st[s]) * sizeof(float),
				    .forward = ts_forward,
				    .backward = kinds[k] == MBP_SCHED_ZBH1 ? NULL : ts_backward,
				    .backward_in = whole ? NULL : ts_backward_in,
				    .backward_w = whole ? NULL : ts_backward_w,
				    .check = ts_check,
				    .update = ts_update,
				    .discard = ts_discard};
				ck_assert_int_eq(mbp_trainer_add_stage(y, &d), 0);
			}
			ck_assert_int_eq(mbp_trainer_start(y), 0);
			for (int step = 0; step < 3; step++) {
				double la, lb;
				ck_assert_int_eq(mbp_trainer_step(x, a.x, a.y, 32, 8, &la), 0);
				ck_assert_int_eq(mbp_trainer_step(y, b.x, b.y, 32, 8, &lb), 0);
				ck_assert(la == lb);
			}
			for (int arr = MBP_ARRAY_PARAM; arr <= MBP_ARRAY_MOMENT2; arr++)
				assert_same_array(a.n, b.n, (mbp_mlp_array)arr);
			mbp_trainer_destroy(x);
			mbp_trainer_destroy(y);
			mbp_mlp_stage_destroy(rep.st);
			rig_fini(&a);
			rig_fini(&b);
		}
}
END_TEST

/* Pieces of a stage: each tensor cut every MBP_MLP_PIECE_FLOATS elements, the stage's its layers' in
 * order; a layer's squared norm is its pieces' added in order to 0 (the bits of any split of them); the
 * update by two ranges, however cut, and update_end give the bytes of the whole update; bad ranges and
 * scales are refused. */
START_TEST(a_stage_by_pieces_updates_and_measures_as_the_whole_stage)
{
	static const uint32_t widths[] = {12, 1024, 40, 5}; /* 40960 weights: 3 pieces */
	static const unsigned cuts[] = {0, 3};
	for (unsigned cut = 0; cut <= 6; cut++) {
		struct rig a, b;
		rig_init_widths(&a, widths, 3, cuts, 1, 8, MBP_ACT_RELU, false, NULL, 8);
		rig_init_widths(&b, widths, 3, cuts, 1, 8, MBP_ACT_RELU, false, NULL, 8);
		ck_assert_uint_eq(mbp_mlp_layer_pieces(a.n, 0), 2); /* 12288 weights, 1024 biases */
		ck_assert_uint_eq(mbp_mlp_layer_pieces(a.n, 1), 4);
		ck_assert_uint_eq(mbp_mlp_layer_pieces(a.n, 2), 2);
		ck_assert_uint_eq(mbp_mlp_stage_pieces(a.st[0]), 8);
		for (unsigned l = 0; l < 3; l++)
			for (int p = MBP_PART_WEIGHT; p <= MBP_PART_BIAS; p++) {
				size_t c;
				float *ga = mbp_mlp_tensor(a.n, l, (mbp_mlp_part)p, MBP_ARRAY_GRAD, &c);
				float *gb = mbp_mlp_tensor(b.n, l, (mbp_mlp_part)p, MBP_ARRAY_GRAD, &c);
				uint64_t seed = 99 + l * 4 + (unsigned)p;
				for (size_t e = 0; e < c; e++)
					ga[e] = gb[e] = urand(&seed) * 0.01f;
			}
		double sq[8], q;
		ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(a.st[0], 0, cut, sq), 0);
		ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(a.st[0], cut, 8, sq + cut), 0);
		for (unsigned l = 0, at = 0; l < 3; l++) {
			double want = 0;
			for (size_t i = 0; i < mbp_mlp_layer_pieces(a.n, l); i++)
				want += sq[at++];
			ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(a.n, l, &q), 0);
			ck_assert_msg(q == want, "layer %u: %.17g, its pieces %.17g", l, q, want);
		}
		ck_assert_int_eq(mbp_mlp_stage_update(a.st[0], 0.5f), 0);
		ck_assert_int_eq(mbp_mlp_stage_update_pieces(b.st[0], 0.5f, cut, 8), 0);
		ck_assert_int_eq(mbp_mlp_stage_update_pieces(b.st[0], 0.5f, 0, cut), 0);
		for (unsigned l = 0; l < 3; l++)
			ck_assert_uint_eq(mbp_mlp_steps(b.n, l), 0); /* until update_end */
		ck_assert_int_eq(mbp_mlp_stage_update_end(b.st[0]), 0);
		for (unsigned l = 0; l < 3; l++)
			ck_assert_uint_eq(mbp_mlp_steps(b.n, l), 1);
		/* a second update reads the padded rows the first one wrote: the products see them */
		float out_a[8 * 5], out_b[8 * 5];
		ck_assert_int_eq(mbp_mlp_stage_forward(a.st[0], a.x, out_a, 8, NULL), 0);
		ck_assert_int_eq(mbp_mlp_stage_forward(b.st[0], b.x, out_b, 8, NULL), 0);
		ck_assert(memcmp(out_a, out_b, sizeof out_a) == 0);
		ck_assert_int_eq(mbp_mlp_stage_zero_grad_pieces(b.st[0], 0, cut), 0);
		ck_assert_int_eq(mbp_mlp_stage_zero_grad_pieces(b.st[0], cut, 8), 0);
		ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(b.st[0], &q), 0);
		ck_assert(q == 0);
		for (int arr = MBP_ARRAY_PARAM; arr <= MBP_ARRAY_MOMENT2; arr++)
			if (arr != MBP_ARRAY_GRAD)
				assert_same_array(a.n, b.n, (mbp_mlp_array)arr);
		if (cut == 0) {
			ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(a.st[0], 0, 9, sq), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(a.st[0], 2, 1, sq), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(a.st[0], 0, 1, NULL), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm_pieces(NULL, 0, 0, sq), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_update_pieces(a.st[0], 1.0f, 0, 9), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_update_pieces(a.st[0], NAN, 0, 8), -EDOM);
			ck_assert_int_eq(mbp_mlp_stage_update_pieces(a.st[0], -1.0f, 0, 8), -EDOM);
			ck_assert_int_eq(mbp_mlp_stage_zero_grad_pieces(a.st[0], 3, 2), -EINVAL);
			ck_assert_int_eq(mbp_mlp_stage_update_end(NULL), -EINVAL);
			ck_assert_uint_eq(mbp_mlp_stage_pieces(NULL), 0);
			ck_assert_uint_eq(mbp_mlp_layer_pieces(a.n, 3), 0);
		}
		rig_fini(&a);
		rig_fini(&b);
	}
}
END_TEST

/* The global norm as pipetrain takes it (independent of the stages): each layer's squared norm, the
 * layers' added in layer order, the clip factor from it. A stage by pieces fills the table of pieces and
 * adds each layer's pieces in order (mbp_mlp_layer_grad_sqnorm's definition); a whole stage fills the
 * table of layers. */
struct pnorms {
	mbp_mlp *n;
	unsigned L;
	float clip;
	double layer[4], piece[64];
	size_t piece0[5];
	float scale[2];	  /* per stage, the last update's clip factor (written by one thread) */
	unsigned ends[4]; /* update_end calls per stage */
};

struct pstage {
	mbp_mlp_stage *st;
	struct pnorms *nm;
	unsigned idx, first, last;
};

static float pn_scale(struct pnorms *nm, bool pieces)
{
	double sq = 0;
	for (unsigned l = 0; l < nm->L; l++) {
		double q = 0;
		for (size_t i = nm->piece0[l]; pieces && i < nm->piece0[l + 1]; i++)
			q += nm->piece[i];
		sq += pieces ? q : nm->layer[l];
	}
	return mbp_clip_scale(sq, nm->clip);
}

static int ps_check(void *ctx)
{
	struct pstage *p = ctx;
	for (unsigned l = p->first; l < p->last; l++)
		ck_assert_int_eq(mbp_mlp_layer_grad_sqnorm(p->nm->n, l, &p->nm->layer[l]), 0);
	return mbp_mlp_stage_update_check(p->st, 1.0f);
}

static int ps_update(void *ctx, const mbp_train_update *u)
{
	(void)u;
	struct pstage *p = ctx;
	int rc = mbp_mlp_stage_update(p->st, p->nm->scale[p->idx] = pn_scale(p->nm, false));
	mbp_mlp_stage_zero_grad(p->st);
	return rc;
}

static void ps_discard(void *ctx)
{
	struct pstage *p = ctx;
	mbp_mlp_stage_zero_grad(p->st);
}

static int ps_check_pieces(void *ctx, size_t begin, size_t end, double *sq)
{
	struct pstage *p = ctx;
	int rc = mbp_mlp_stage_grad_sqnorm_pieces(p->st, begin, end, sq);
	for (size_t i = begin; rc == 0 && i < end; i++)
		p->nm->piece[p->nm->piece0[p->first] + i] = sq[i - begin];
	return rc;
}

static int ps_update_pieces(void *ctx, const mbp_train_update *u, size_t begin, size_t end)
{
	(void)u;
	struct pstage *p = ctx;
	int rc = mbp_mlp_stage_update_pieces(p->st, pn_scale(p->nm, true), begin, end);
	return rc ? rc : mbp_mlp_stage_zero_grad_pieces(p->st, begin, end);
}

static void ps_discard_pieces(void *ctx, size_t begin, size_t end)
{
	struct pstage *p = ctx;
	mbp_mlp_stage_zero_grad_pieces(p->st, begin, end);
}

static void ps_update_end(void *ctx, const mbp_train_update *u)
{
	(void)u;
	struct pstage *p = ctx;
	mbp_mlp_stage_update_end(p->st);
	p->nm->scale[p->idx] = pn_scale(p->nm, true); /* the one every range used */
	p->nm->ends[p->idx]++;
}

/* A trainer over rig r (its stages at `cuts`) whose stage 1 runs on `reps` replicas, every stage's update by pieces (pieces) or
 * whole on replica 0 (not). ps[] and rs[] (the replicas' model stages) are the caller's. */
static mbp_trainer *pieces_trainer(struct rig *r, const unsigned *cuts, struct pnorms *nm, struct pstage *ps,
				   struct tstage *ts, mbp_mlp_stage **rs, mbp_sched_kind kind, unsigned reps,
				   bool pieces)
{
	*nm = (struct pnorms){.n = r->n, .L = r->L, .clip = 0.05f};
	for (unsigned l = 0; l < r->L; l++)
		nm->piece0[l + 1] = nm->piece0[l] + mbp_mlp_layer_pieces(r->n, l);
	ck_assert_uint_le(nm->piece0[r->L], 64);
	mbp_train_opts o = {.in_row_bytes = r->w[0] * sizeof(float),
			    .target_row_bytes = sizeof(int32_t),
			    .max_mb_rows = 8,
			    .schedule = kind,
			    .loss = ts_loss};
	mbp_trainer *t;
	ck_assert_int_eq(mbp_trainer_new(&t, &o), 0);
	for (unsigned s = 0; s < r->S; s++) {
		unsigned nr = s == 1 ? reps : 1;
		ps[s] = (struct pstage){r->st[s], nm, s, cuts[s], cuts[s + 1]};
		void *ctx[3];
		for (unsigned k = 0; k < nr; k++) {
			if (k && !rs[k - 1])
				ck_assert_int_eq(mbp_mlp_stage_new_replica(&rs[k - 1], r->st[s]), 0);
			ts[s * 3 + k] = (struct tstage){k ? rs[k - 1] : r->st[s], NULL};
			ctx[k] = &ts[s * 3 + k];
		}
		mbp_train_stage_desc d = {.ctx = &ps[s],
					  .replicas = nr,
					  .replica_ctx = ctx,
					  .out_row_bytes = mbp_mlp_stage_out_width(r->st[s]) * sizeof(float),
					  .stash_row_bytes =
					      mbp_mlp_stage_stash_floats(r->st[s]) * sizeof(float),
					  .forward = ts_forward,
					  .backward = kind == MBP_SCHED_ZBH1 ? NULL : ts_backward,
					  .backward_in = ts_backward_in,
					  .backward_w = ts_backward_w,
					  .check = pieces ? NULL : ps_check,
					  .update = pieces ? NULL : ps_update,
					  .discard = pieces ? NULL : ps_discard,
					  .pieces = pieces ? mbp_mlp_stage_pieces(r->st[s]) : 0,
					  .check_pieces = ps_check_pieces,
					  .update_pieces = ps_update_pieces,
					  .discard_pieces = ps_discard_pieces,
					  .update_end = ps_update_end};
		ck_assert_int_eq(mbp_trainer_add_stage(t, &d), 0);
	}
	ck_assert_int_eq(mbp_trainer_start(t), 0);
	return t;
}

/* The end-of-step work by pieces (train.h, "Replicas"): twin models, one trained with every update whole
 * on one thread, the other with stage 1 on 1, 2 and 3 replicas that check, clip and update a range of its
 * pieces each (a layer of 1024 inputs: two pieces of its weights, each copied to its padded rows), three
 * steps under GPipe, 1F1B and ZB-H1, with AdamW and with SGD (momentum) clipped by the global norm: every
 * parameter and moment byte the same, the clip active, each layer's step count 3 (update_end once a
 * step). */
START_TEST(updates_by_pieces_on_replicas_give_the_parameters_of_one_thread_bit_for_bit)
{
	static const uint32_t widths[] = {12, 1024, 24, 5};
	static const unsigned cuts[] = {0, 1, 3};
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	const mbp_optim_opts opts[] = {{.kind = MBP_OPTIM_ADAMW, .lr = 1e-2f, .weight_decay = 0.01f},
				       {.kind = MBP_OPTIM_SGD, .lr = 0.5f, .momentum = 0.9f}};
	for (size_t o = 0; o < sizeof opts / sizeof opts[0]; o++)
		for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++)
			for (unsigned reps = 1; reps <= 3; reps++) {
				struct rig a, b;
				rig_init_widths(&a, widths, 3, cuts, 2, 8, MBP_ACT_RELU, false, &opts[o], 32);
				rig_init_widths(&b, widths, 3, cuts, 2, 8, MBP_ACT_RELU, false, &opts[o], 32);
				ck_assert_uint_eq(mbp_mlp_stage_pieces(b.st[1]), 5); /* 2 + 1 + 1 + 1 */
				struct pnorms na, nb;
				struct pstage pa[2], pb[2];
				struct tstage ta[6], tb[6];
				mbp_mlp_stage *ra[2] = {NULL, NULL}, *rb[2] = {NULL, NULL};
				mbp_trainer *x =
						pieces_trainer(&a, cuts, &na, pa, ta, ra, kinds[k], 1, false),
					    *y = pieces_trainer(&b, cuts, &nb, pb, tb, rb, kinds[k], reps,
								true);
				for (int step = 0; step < 3; step++) {
					double la, lb;
					ck_assert_int_eq(mbp_trainer_step(x, a.x, a.y, 32, 8, &la), 0);
					ck_assert_int_eq(mbp_trainer_step(y, b.x, b.y, 32, 8, &lb), 0);
					ck_assert(la == lb);
					ck_assert(na.scale[0] == nb.scale[0] && na.scale[1] == nb.scale[1]);
					ck_assert(nb.scale[0] == nb.scale[1]);
				}
				ck_assert_msg(nb.scale[1] < 1.0f, "the clip never acted: %g",
					      (double)nb.scale[1]);
				for (int arr = MBP_ARRAY_PARAM; arr <= MBP_ARRAY_MOMENT2; arr++)
					assert_same_array(a.n, b.n, (mbp_mlp_array)arr);
				for (unsigned l = 0; l < 3; l++)
					ck_assert_uint_eq(mbp_mlp_steps(b.n, l), 3);
				ck_assert_uint_eq(nb.ends[0], 3);
				ck_assert_uint_eq(nb.ends[1], 3);
				mbp_trainer_destroy(x);
				mbp_trainer_destroy(y);
				for (int q = 0; q < 2; q++) {
					mbp_mlp_stage_destroy(ra[q]);
					mbp_mlp_stage_destroy(rb[q]);
				}
				rig_fini(&a);
				rig_fini(&b);
			}
}
END_TEST

/* A move between two trainer steps, as a rebalancing trainer would make it (issue 25: "moves happen
 * between steps only, and a step's parameters are the same as with no move"): after two steps the stages
 * are made again at another split over the same model (parameters, moments and step counts are the
 * model's, per layer) and a new trainer runs two more. Every parameter and moment byte is that of the
 * twin that kept its split, under every one-stage-a-thread schedule. */
START_TEST(stages_made_again_at_another_split_between_steps_give_the_same_parameters_bit_for_bit)
{
	static const unsigned from[] = {0, 2, 4}, to[] = {0, 1, 4};
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
		struct rig a, b;
		struct tstage ta[4], tb[4];
		rig_init(&a, from, 2, 8, MBP_ACT_GELU, true, NULL, 32);
		rig_init(&b, from, 2, 8, MBP_ACT_GELU, true, NULL, 32);
		mbp_trainer *x = model_trainer(&a, ta, kinds[k], true),
			    *y = model_trainer(&b, tb, kinds[k], true);
		for (int step = 0; step < 4; step++) {
			if (step == 2) { /* the move: between steps, with nothing in flight */
				mbp_trainer_destroy(y);
				for (unsigned s = 0; s < b.S; s++) {
					mbp_mlp_stage_destroy(b.st[s]);
					ck_assert_int_eq(
					    mbp_mlp_stage_new(&b.st[s], b.n, to[s], to[s + 1], 8), 0);
				}
				y = model_trainer(&b, tb, kinds[k], true);
			}
			double la, lb;
			ck_assert_int_eq(mbp_trainer_step(x, a.x, a.y, 32, 8, &la), 0);
			ck_assert_int_eq(mbp_trainer_step(y, b.x, b.y, 32, 8, &lb), 0);
			ck_assert_msg(la == lb, "schedule %zu, step %d: loss %.17g against %.17g", k, step,
				      lb, la);
		}
		for (int arr = MBP_ARRAY_PARAM; arr <= MBP_ARRAY_MOMENT2; arr++)
			assert_same_array(a.n, b.n, (mbp_mlp_array)arr);
		for (unsigned l = 0; l < 4; l++)
			ck_assert_uint_eq(mbp_mlp_steps(b.n, l), 4);
		mbp_trainer_destroy(x);
		mbp_trainer_destroy(y);
		rig_fini(&a);
		rig_fini(&b);
	}
}
END_TEST

/* What a step holds of activations, played from the schedule: per stage, a stash from F to its last
 * backward, a work buffer from the recomputation (before B or B_in) to the last backward; on one thread
 * (the global order) also the total at once, in bytes and in buffers. */
static void act_play(const mbp_schedule *sc, const mbp_train_stage_stats *ss, uint64_t *stage_peak,
		     uint64_t *peak_bytes, uint64_t *peak_bufs)
{
	const mbp_sched_op *ops;
	size_t n = mbp_schedule_order(sc, &ops);
	uint64_t now[4] = {0}, bytes = 0, bufs = 0;
	*peak_bytes = *peak_bufs = 0;
	memset(stage_peak, 0, 4 * sizeof(*stage_peak));
	for (size_t k = 0; k < n; k++) {
		unsigned s = ops[k].stage;
		uint64_t st = ss[s].act_stash_bytes, wk = ss[s].act_work_bytes;
		if (ops[k].kind == MBP_OP_F) {
			now[s] += st;
			bytes += st;
			bufs += st != 0;
		} else if (ops[k].kind == MBP_OP_B || ops[k].kind == MBP_OP_BIN) {
			now[s] += wk;
			bytes += wk;
			bufs += wk != 0;
		}
		stage_peak[s] = now[s] > stage_peak[s] ? now[s] : stage_peak[s];
		*peak_bytes = bytes > *peak_bytes ? bytes : *peak_bytes;
		*peak_bufs = bufs > *peak_bufs ? bufs : *peak_bufs;
		if (ops[k].kind == MBP_OP_B || ops[k].kind == MBP_OP_W) {
			now[s] -= st + wk;
			bytes -= st + wk;
			bufs -= (st != 0) + (wk != 0);
		}
	}
}

/* The activation figures: each stage's stash and work bytes per micro-batch (less stash, as much work, for
 * a recomputing stage), each stage's peak over the step as the schedule plays it (whatever the timing), and
 * on one thread the trainer's peak at once over every stage: exactly what the activation pool held at its
 * high-water mark (its buffers counted), with and without recomputation, under every schedule (the
 * chunked ones wherever they place the stages on one thread or two). On more threads the pool's mark bounds
 * the trainer's. */
START_TEST(activation_memory_peaks_equal_the_schedule_and_the_pools_high_water_mark)
{
	const mbp_sched_kind *kinds = trainer_kinds;
	for (unsigned c = 0; c < 3; c++)
		for (size_t k = 0; k < TRAINER_KINDS; k++)
			for (unsigned mask = 0; mask < 16; mask += 5)
				for (unsigned threads = 1; threads <= 2; threads++) {
					if (!can_place(kinds[k], c + 2, threads))
						continue;
					struct rig r;
					struct tstage ts[4];
					rig_init(&r, trainer_cuts[c], c + 2, 8, MBP_ACT_RELU, true, NULL, 32);
					rig_recompute(&r, mask);
					mbp_trainer *t = model_trainer_on(&r, ts, kinds[k], true, threads);
					ck_assert_int_eq(mbp_trainer_step(t, r.x, r.y, 32, 8, NULL), 0);
					mbp_train_stats st;
					mbp_train_stage_stats ss[4];
					ck_assert_int_eq(mbp_trainer_stats_get(t, &st, ss, 4), (int)r.S);
					uint64_t sp[4], bytes, bufs;
					act_play(mbp_trainer_schedule(t), ss, sp, &bytes, &bufs);
					for (unsigned s = 0; s < r.S; s++) {
						ck_assert_uint_eq(ss[s].act_stash_bytes,
								  8 * sizeof(float) *
								      mbp_mlp_stage_stash_floats(r.st[s]));
						ck_assert_uint_eq(ss[s].act_work_bytes,
								  8 * sizeof(float) *
								      mbp_mlp_stage_work_floats(r.st[s]));
						ck_assert_uint_eq(ss[s].act_peak_bytes, sp[s]);
					}
					ck_assert_uint_gt(st.act_buf_bytes, 0);
					if (threads == 1) {
						ck_assert_uint_eq(st.act_peak_bytes, bytes);
						ck_assert_uint_eq(st.act_peak_bufs, bufs);
						ck_assert_uint_eq(st.act_pool.high_water, st.act_peak_bufs);
					} else {
						ck_assert_uint_le(st.act_peak_bufs, st.act_pool.high_water);
					}
					ck_assert_uint_le(st.act_pool.high_water, st.act_pool.allocated);
					ck_assert_uint_eq(st.act_pool.in_use, 0);
					mbp_trainer_destroy(t);
					rig_fini(&r);
				}
}
END_TEST

static void layer_steps_are(mbp_mlp *n, uint64_t want, int except, uint64_t there)
{
	for (unsigned l = 0; l < mbp_mlp_layers(n); l++)
		ck_assert_msg(mbp_mlp_steps(n, l) == ((int)l == except ? there : want),
			      "layer %u: %llu updates", l, (unsigned long long)mbp_mlp_steps(n, l));
}

/* A NaN in stage 1's gradient, no stage giving grad_sq: with the check, the step fails naming stage 1 and
 * no stage's parameters move (they did at the three other stages before, and the step returned 0); the
 * next step updates every stage. Without a check the update's refusal is still reported: -ENOTRECOVERABLE
 * naming stage 1, then for every later step. */
START_TEST(a_nan_gradient_at_one_stage_without_grad_sq_updates_no_stage)
{
	static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B, MBP_SCHED_ZBH1};
	static const unsigned cuts[] = {0, 1, 2, 3, 4};
	for (size_t k = 0; k < 3; k++) {
		struct rig r;
		rig_init(&r, cuts, 4, 8, MBP_ACT_RELU, false, NULL, 32);
		struct tstage ts[4];
		mbp_trainer *t = model_trainer(&r, ts, kinds[k], true);
		size_t len;
		float *before = snapshot(r.n, MBP_ARRAY_PARAM, &len);
		ts[1].poison = mbp_mlp_tensor(r.n, 1, MBP_PART_BIAS, MBP_ARRAY_GRAD, NULL);
		ck_assert_int_eq(mbp_trainer_step(t, r.x, r.y, 32, 8, NULL), -EDOM);
		mbp_train_error e;
		mbp_trainer_error(t, &e);
		ck_assert_int_eq(e.stage, 1);
		ck_assert_int_eq(e.op, MBP_OP_UPDATE);
		float *after = snapshot(r.n, MBP_ARRAY_PARAM, &len);
		ck_assert_msg(!memcmp(before, after, len * sizeof(float)), "%s: a stage updated",
			      mbp_sched_name(kinds[k]));
		layer_steps_are(r.n, 0, -1, 0);
		ts[1].poison = NULL;
		ck_assert_int_eq(mbp_trainer_step(t, r.x, r.y, 32, 8, NULL), 0);
		layer_steps_are(r.n, 1, -1, 0);
		mbp_trainer_destroy(t);
		free(before);
		free(after);

		t = model_trainer(&r, ts, kinds[k], false); /* a stage that breaks the contract */
		ts[1].poison = mbp_mlp_tensor(r.n, 1, MBP_PART_BIAS, MBP_ARRAY_GRAD, NULL);
		ck_assert_int_eq(mbp_trainer_step(t, r.x, r.y, 32, 8, NULL), -ENOTRECOVERABLE);
		mbp_trainer_error(t, &e);
		ck_assert_int_eq(e.stage, 1);
		ck_assert_int_eq(e.op, MBP_OP_UPDATE);
		layer_steps_are(r.n, 2, 1, 1); /* stages 0, 2, 3 updated, stage 1 did not */
		ts[1].poison = NULL;
		ck_assert_int_eq(mbp_trainer_step(t, r.x, r.y, 32, 8, NULL), -ENOTRECOVERABLE);
		layer_steps_are(r.n, 2, 1, 1);
		mbp_trainer_destroy(t);
		rig_fini(&r);
	}
}
END_TEST

/* ---- training ---- */

/* One training step of the rig on its stages: gradients, clip, update, zero. */
static double rig_step(struct rig *r, size_t first, unsigned M, uint32_t mb, float max_norm)
{
	double loss = rig_grads(r, first, M, mb, true, true), sq = 0, q;
	for (unsigned s = 0; s < r->S; s++) {
		ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(r->st[s], &q), 0);
		sq += q;
	}
	float c = mbp_clip_scale(sq, max_norm);
	for (unsigned s = 0; s < r->S; s++) {
		ck_assert_int_eq(mbp_mlp_stage_update(r->st[s], c), 0);
		ck_assert_int_eq(mbp_mlp_stage_zero_grad(r->st[s]), 0);
	}
	return loss / ((double)M * mb);
}

/* TWIN_ROWS rows of a's input through the two stages of twins a and b (5 outputs) into out[0] and out[1]:
 * the same bits in both, and a's inference's (mbp_mlp_forward). */
enum { TWIN_ROWS = 4 };
static void twins_forward(struct rig *a, struct rig *b, float out[2][TWIN_ROWS * 5])
{
	float *mid = malloc((size_t)TWIN_ROWS * mbp_mlp_stage_out_width(a->st[0]) * sizeof(float));
	float ref[TWIN_ROWS * 5];
	struct rig *r[2] = {a, b};
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(mbp_mlp_stage_forward(r[k]->st[0], a->x, mid, TWIN_ROWS, NULL), 0);
		ck_assert_int_eq(mbp_mlp_stage_forward(r[k]->st[1], mid, out[k], TWIN_ROWS, NULL), 0);
	}
	ck_assert_int_eq(mbp_mlp_forward(a->n, a->x, ref, TWIN_ROWS, 0), 0);
	ck_assert(!memcmp(out[0], out[1], sizeof out[0]));
	ck_assert(!memcmp(out[0], ref, sizeof ref));
	free(mid);
}

/* Layers whose weight rows are a multiple of 4 KiB long (1024 inputs here: layers 0 and 2) are read by
 * the stages from a padded copy that the updates keep current. Training gives the same bits as a twin whose
 * weights mbp_mlp_tensor handed out (its stages read them in place), the training forward the bits of
 * inference (which reads the parameters), and once a padded layer's weights are handed out, a write
 * through the pointer is seen by the next forward. */
START_TEST(padded_weight_copies_train_to_the_same_bits_as_weights_read_in_place)
{
	/* the padded copy is OpenBLAS's: the packed kernel's models hold a packed copy instead */
	const mbp_kernel was = mbp_kernel_get();
	ck_assert_int_eq(mbp_kernel_set(MBP_KERNEL_BLAS), 0);
	static const uint32_t w[] = {1024, 24, 1024, 5};
	const unsigned cuts[] = {0, 2, 3};
	mbp_optim_opts o = {.kind = MBP_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.1f};
	struct rig a, b;
	rig_init_widths(&a, w, 3, cuts, 2, 4, MBP_ACT_RELU, false, &o, 24);
	rig_init_widths(&b, w, 3, cuts, 2, 4, MBP_ACT_RELU, false, &o, 24);
	mbp_layer_info li;
	for (unsigned i = 0; i < 3; i++) { /* layers 0 and 2: 1024 inputs, rows 4 KiB apart */
		ck_assert(i == 1 ? !mbp__mlp_pad(a.n, i) : !!mbp__mlp_pad(a.n, i));
		ck_assert_ptr_null(a.n->lwp[i].wp);
		ck_assert_int_eq(mbp_mlp_layer_info(a.n, i, &li), 0);
		ck_assert_uint_eq(li.packed_bytes, 0);
		ck_assert_uint_eq(li.pad_bytes, i == 1 ? 0 : w[i + 1] * (1024 + 16) * sizeof(float));
	}
	for (unsigned i = 0; i < 3; i++)
		ck_assert_ptr_nonnull(mbp_mlp_tensor(b.n, i, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL));
	for (unsigned i = 0; i < 3; i++) { /* handed out: read in place, the copy still allocated */
		ck_assert_ptr_null(mbp__mlp_pad(b.n, i));
		ck_assert_int_eq(mbp_mlp_layer_info(b.n, i, &li), 0);
		ck_assert_uint_eq(li.pad_bytes, i == 1 ? 0 : w[i + 1] * (1024 + 16) * sizeof(float));
	}
	for (unsigned t = 0; t < 3; t++) {
		double la = rig_step(&a, 8 * t, 2, 4, 1.0f), lb = rig_step(&b, 8 * t, 2, 4, 1.0f);
		ck_assert_msg(la == lb, "step %u: loss %.17g padded, %.17g in place", t, la, lb);
	}
	enum { rows = TWIN_ROWS };
	float mid[rows * 1024], out[2][rows * 5], ref[rows * 5];
	twins_forward(&a, &b, out);
	assert_same_array(a.n, b.n, MBP_ARRAY_PARAM);
	assert_same_array(a.n, b.n, MBP_ARRAY_MOMENT1);
	assert_same_array(a.n, b.n, MBP_ARRAY_MOMENT2);
	/* a's weights are handed out now (the snapshots took them): a write is seen */
	float *w2 = mbp_mlp_tensor(a.n, 2, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL);
	for (size_t e = 0; e < 5 * 1024; e++)
		w2[e] += 0.25f;
	ck_assert_int_eq(mbp_mlp_stage_forward(a.st[0], a.x, mid, rows, NULL), 0);
	ck_assert_int_eq(mbp_mlp_stage_forward(a.st[1], mid, out[0], rows, NULL), 0);
	ck_assert_int_eq(mbp_mlp_forward(a.n, a.x, ref, rows, 0), 0);
	ck_assert(memcmp(out[0], out[1], sizeof out[0]));
	ck_assert(!memcmp(out[0], ref, sizeof ref));
	rig_fini(&a);
	rig_fini(&b);
	ck_assert_int_eq(mbp_kernel_set(was), 0);
}
END_TEST

/* A trainable model keeps the kernel it was made with: after mbp_kernel_set switches to the other kernel,
 * its inference and its stages' forward give the bits they gave before (a product reading the switch would
 * give the other kernel's, as a model made after the switch shows). Both ways, where the CPU has both. */
START_TEST(switching_the_kernel_leaves_a_trainable_model_made_before_on_its_own_bits)
{
	const mbp_kernel was = mbp_kernel_get();
	if (mbp_kernel_set(MBP_KERNEL_PACKED) == -ENOTSUP)
		return; /* one kernel only: nothing to switch to */
	static const uint32_t w[] = {300, 70, 9};
	enum { rows = 7 };
	const mbp_optim_opts o = {.kind = MBP_OPTIM_SGD, .lr = 0.01f};
	float *x = random_floats(rows * 300, 8), y0[rows * 9], y1[rows * 9], mid[rows * 70];
	static const mbp_kernel ks[] = {MBP_KERNEL_PACKED, MBP_KERNEL_BLAS};
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(mbp_kernel_set(ks[k]), 0);
		mbp_mlp *n = new_mlp(w, 2, MBP_ACT_RELU, false, 7, &o);
		mbp_mlp_stage *st[2];
		ck_assert_int_eq(mbp_mlp_stage_new(&st[0], n, 0, 1, rows), 0);
		ck_assert_int_eq(mbp_mlp_stage_new(&st[1], n, 1, 2, rows), 0);
		ck_assert_int_eq(mbp_mlp_forward(n, x, y0, rows, 0), 0);
		ck_assert_int_eq(mbp_kernel_set(ks[1 - k]), 0);
		ck_assert_int_eq(mbp_mlp_forward(n, x, y1, rows, 0), 0);
		ck_assert_msg(!memcmp(y0, y1, sizeof y0), "made under %s: inference moved with the switch",
			      mbp_kernel_name(ks[k]));
		ck_assert_int_eq(mbp_mlp_stage_forward(st[0], x, mid, rows, NULL), 0);
		ck_assert_int_eq(mbp_mlp_stage_forward(st[1], mid, y1, rows, NULL), 0);
		ck_assert(!memcmp(y0, y1, sizeof y0));
		/* a layer whose tensors are handed out stays on the model's kernel (packing as it goes) */
		ck_assert_ptr_nonnull(mbp_mlp_tensor(n, 0, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL));
		ck_assert_ptr_nonnull(mbp_mlp_tensor(n, 0, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL));
		ck_assert_int_eq(mbp_mlp_forward(n, x, y1, rows, 0), 0);
		ck_assert(!memcmp(y0, y1, sizeof y0));
		/* the same model made under the other kernel: other bits, so the checks above could fail */
		mbp_mlp *n2 = new_mlp(w, 2, MBP_ACT_RELU, false, 7, &o);
		ck_assert_int_eq(mbp_mlp_forward(n2, x, y1, rows, 0), 0);
		ck_assert(memcmp(y0, y1, sizeof y0) != 0);
		mbp_mlp_destroy(n2);
		mbp_mlp_stage_destroy(st[0]);
		mbp_mlp_stage_destroy(st[1]);
		mbp_mlp_destroy(n);
	}
	free(x);
	ck_assert_int_eq(mbp_kernel_set(was), 0);
}
END_TEST

/* What a fresh thread holds before and after mbp_mlp_stage_thread_init on `st`. */
struct rows_probe {
	mbp_mlp_stage *st;
	bool before, after;
	int rc;
};

static void *rows_probe_main(void *arg)
{
	struct rows_probe *p = arg;
	p->before = mbp__dense_thread_has_rows();
	p->rc = mbp_mlp_stage_thread_init(p->st);
	p->after = mbp__dense_thread_has_rows();
	return NULL;
}

/* A trainer stage's init readies its thread: under the packed kernel the thread holds the kernel's row
 * buffer before its first product (no product allocates), under OpenBLAS nothing is allocated; the kernel
 * is the model's (the one it was made under), not the one in use when the thread starts. */
START_TEST(a_stage_thread_init_gives_the_thread_its_row_buffer_only_for_a_packed_model)
{
	const mbp_kernel was = mbp_kernel_get();
	static const uint32_t w[] = {300, 70, 9};
	const mbp_optim_opts o = {.kind = MBP_OPTIM_SGD, .lr = 0.01f};
	static const mbp_kernel ks[] = {MBP_KERNEL_PACKED, MBP_KERNEL_BLAS};
	for (int k = 0; k < 2; k++) {
		if (mbp_kernel_set(ks[k]) == -ENOTSUP)
			continue; /* no packed kernel on this CPU */
		mbp_mlp *n = new_mlp(w, 2, MBP_ACT_RELU, false, 7, &o);
		struct rows_probe p = {0};
		ck_assert_int_eq(mbp_mlp_stage_new(&p.st, n, 0, 2, 7), 0);
		(void)mbp_kernel_set(ks[1 - k]); /* the thread starts under the other kernel */
		pthread_t th;
		ck_assert_int_eq(pthread_create(&th, NULL, rows_probe_main, &p), 0);
		ck_assert_int_eq(pthread_join(th, NULL), 0);
		ck_assert_int_eq(p.rc, 0);
		ck_assert_msg(!p.before, "a new thread already held a row buffer");
		ck_assert_msg(p.after == (ks[k] == MBP_KERNEL_PACKED), "made under %s: row buffer %s",
			      mbp_kernel_name(ks[k]), p.after ? "allocated" : "missing");
		mbp_mlp_stage_destroy(p.st);
		mbp_mlp_destroy(n);
	}
	ck_assert_int_eq(mbp_mlp_stage_thread_init(NULL), -EINVAL);
	ck_assert_int_eq(mbp_kernel_set(was), 0);
}
END_TEST

/* Under the packed kernel the stages read each layer's weights and bias from a packed copy that the
 * updates keep current element by element. Training gives the same bits as a twin whose weights and biases
 * mbp_mlp_tensor handed out (no packed copy: the kernel packs them as it goes, which gives the same bits
 * when the copy is current), the copies are still there after the steps, and the training forward gives
 * the bits of inference; a stale weight or bias in a copy would change the twins' losses from step 2 on. */
START_TEST(packed_copies_follow_every_update_and_train_to_the_bits_of_weights_packed_as_they_go)
{
	if (mbp_kernel_get() != MBP_KERNEL_PACKED)
		return; /* a CPU without AVX2 and FMA, or MBP_KERNEL=blas */
	/* 1020 inputs: pieces of 16384 weights end inside rows, rows are not a multiple of 8 long */
	static const uint32_t w[] = {1020, 40, 17, 5};
	const unsigned cuts[] = {0, 2, 3};
	mbp_optim_opts o = {.kind = MBP_OPTIM_ADAMW, .lr = 0.01f, .weight_decay = 0.1f};
	struct rig a, b;
	struct rig *r[2] = {&a, &b};
	for (int k = 0; k < 2; k++) {
		memset(r[k], 0, sizeof(*r[k]));
		r[k]->n =
		    new_mlp(w, 3, MBP_ACT_RELU, false, 42, &o); /* not perturbed: that hands out biases */
		r[k]->w = w;
		r[k]->L = 3;
		r[k]->S = 2;
		r[k]->x = random_floats(24 * 1020, 44);
		r[k]->y = random_labels(24, 5, 45);
	}
	for (unsigned i = 0; i < 3; i++) {
		ck_assert_ptr_nonnull(a.n->lwp[i].wp);
		ck_assert_ptr_nonnull(mbp_mlp_tensor(b.n, i, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL));
		ck_assert_ptr_nonnull(mbp_mlp_tensor(b.n, i, MBP_PART_BIAS, MBP_ARRAY_PARAM, NULL));
		ck_assert_ptr_null(b.n->lwp[i].wp);
	}
	for (int k = 0; k < 2; k++)
		for (unsigned s = 0; s < 2; s++)
			ck_assert_int_eq(mbp_mlp_stage_new(&r[k]->st[s], r[k]->n, cuts[s], cuts[s + 1], 4),
					 0);
	for (unsigned t = 0; t < 4; t++) {
		double la = rig_step(&a, 8 * (t % 3), 2, 4, 1.0f), lb = rig_step(&b, 8 * (t % 3), 2, 4, 1.0f);
		ck_assert_msg(la == lb, "step %u: loss %.17g packed ahead, %.17g as they go", t, la, lb);
	}
	for (unsigned i = 0; i < 3; i++) { /* (assert_same_array hands the tensors out: after it) */
		ck_assert_ptr_nonnull(a.n->lwp[i].wp);
		/* b's copies were handed out, still allocated, and counted as such */
		mbp_layer_info la, lb;
		ck_assert_int_eq(mbp_mlp_layer_info(a.n, i, &la), 0);
		ck_assert_int_eq(mbp_mlp_layer_info(b.n, i, &lb), 0);
		ck_assert_uint_eq(la.packed_bytes, (w[i + 1] + 15) / 16 * 16 * (w[i] + 1) * sizeof(float));
		ck_assert_uint_eq(lb.packed_bytes, la.packed_bytes);
		ck_assert_uint_eq(lb.pad_bytes, 0);
	}
	float out[2][TWIN_ROWS * 5];
	twins_forward(&a, &b, out);
	assert_same_array(a.n, b.n, MBP_ARRAY_PARAM);
	rig_fini(&a);
	rig_fini(&b);
}
END_TEST

START_TEST(loss_decreases_and_a_tiny_data_set_is_memorised)
{
	const unsigned cuts[] = {0, 2, 4};
	const mbp_optim_opts opts[] = {
	    {.kind = MBP_OPTIM_ADAMW,
	     .lr = 1e-2f,
	     .warmup_steps = 10,
	     .total_steps = 400,
	     .weight_decay = 1e-4f},
	    {.kind = MBP_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .warmup_steps = 10, .total_steps = 400},
	};
	for (unsigned k = 0; k < 2; k++) {
		struct rig r;
		rig_init(&r, cuts, 2, 8, MBP_ACT_RELU, k == 0, &opts[k], 32);
		double first = rig_step(&r, 0, 4, 8, 5.0f), last = first;
		for (int step = 1; step < 400; step++)
			last = rig_step(&r, 0, 4, 8, 5.0f);
		ck_assert_msg(last < 0.05 && last < first / 20, "optimizer %u: loss %.4f -> %.4f", k, first,
			      last);
		/* Every one of the 32 random points gets its random label. */
		float out[32 * 5];
		ck_assert_int_eq(mbp_mlp_forward(r.n, r.x, out, 32, 0), 0);
		for (int i = 0; i < 32; i++) {
			int best = 0;
			for (int c = 1; c < 5; c++)
				if (out[i * 5 + c] > out[i * 5 + best])
					best = c;
			ck_assert_int_eq(best, r.y[i]);
		}
		rig_fini(&r);
	}
}
END_TEST

START_TEST(checkpoint_resume_continues_bit_for_bit)
{
	const unsigned cuts[] = {0, 3, 4};
	const mbp_optim_opts opts[] = {
	    {.kind = MBP_OPTIM_ADAMW,
	     .lr = 5e-3f,
	     .warmup_steps = 3,
	     .total_steps = 12,
	     .weight_decay = 0.01f},
	    {.kind = MBP_OPTIM_SGD, .lr = 0.05f, .momentum = 0.9f, .weight_decay = 0.01f},
	    {.kind = MBP_OPTIM_SGD, .lr = 0.05f},
	};
	for (unsigned k = 0; k < 3; k++) {
		struct rig straight, first, resumed;
		rig_init(&straight, cuts, 2, 8, MBP_ACT_GELU, true, &opts[k], 64);
		rig_init(&first, cuts, 2, 8, MBP_ACT_GELU, true, &opts[k], 64);
		for (int s = 0; s < 10; s++)
			rig_step(&straight, (size_t)(s % 2) * 32, 4, 8, 1.0f);
		for (int s = 0; s < 5; s++)
			rig_step(&first, (size_t)(s % 2) * 32, 4, 8, 1.0f);
		ck_assert_int_eq(mbp_mlp_save(first.n, tmpdir_path("ck.safetensors")), 0);
		ck_assert_int_eq(mbp_mlp_save_optim(first.n, tmpdir_path("ck.optim.safetensors")), 0);
		/* Resume: weights from the model file, moments and steps from the optimizer file. */
		rig_init(&resumed, cuts, 2, 8, MBP_ACT_GELU, true, &opts[k], 64);
		for (unsigned s = 0; s < resumed.S; s++)
			mbp_mlp_stage_destroy(resumed.st[s]);
		mbp_mlp_destroy(resumed.n);
		mbp_model_error e;
		ck_assert_msg(mbp_mlp_load(&resumed.n, tmpdir_path("ck.safetensors"), &opts[k], &e) == 0,
			      "%s", e.msg);
		ck_assert_msg(mbp_mlp_load_optim(resumed.n, tmpdir_path("ck.optim.safetensors"), &e) == 0,
			      "%s", e.msg);
		for (unsigned s = 0; s < resumed.S; s++)
			ck_assert_int_eq(
			    mbp_mlp_stage_new(&resumed.st[s], resumed.n, cuts[s], cuts[s + 1], 8), 0);
		assert_same_array(first.n, resumed.n, MBP_ARRAY_PARAM);
		ck_assert_uint_eq(mbp_mlp_steps(resumed.n, 3), 5);
		for (int s = 5; s < 10; s++)
			rig_step(&resumed, (size_t)(s % 2) * 32, 4, 8, 1.0f);
		assert_same_array(straight.n, resumed.n, MBP_ARRAY_PARAM);
		if (k < 2)
			assert_same_array(straight.n, resumed.n, MBP_ARRAY_MOMENT1);
		if (k == 0)
			assert_same_array(straight.n, resumed.n, MBP_ARRAY_MOMENT2);
		rig_fini(&straight);
		rig_fini(&first);
		rig_fini(&resumed);
	}
}
END_TEST

START_TEST(optimizer_files_of_another_model_or_optimizer_are_refused_naming_the_file)
{
	const uint32_t w[] = {4, 6, 3}, w2[] = {4, 7, 3};
	mbp_optim_opts adam = {0}, sgd = {.kind = MBP_OPTIM_SGD, .momentum = 0.5f};
	mbp_mlp *a = new_mlp(w, 2, MBP_ACT_RELU, false, 1, &adam);
	mbp_mlp *b = new_mlp(w, 2, MBP_ACT_RELU, false, 1, &sgd);
	mbp_mlp *c = new_mlp(w2, 2, MBP_ACT_RELU, false, 1, &adam);
	mbp_mlp *d = new_mlp(w, 2, MBP_ACT_RELU, true, 1, &adam);
	const char *pa = tmpdir_path("a.optim.safetensors");
	ck_assert_int_eq(mbp_mlp_save_optim(a, pa), 0);
	mbp_model_error e;
	ck_assert_int_eq(mbp_mlp_load_optim(b, pa, &e), -EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, pa));
	ck_assert_ptr_nonnull(strstr(e.msg, "adamw"));
	ck_assert_int_eq(mbp_mlp_load_optim(c, pa, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_MODEL_SHAPE);
	ck_assert_int_eq(mbp_mlp_load_optim(d, pa, &e), -ENOENT); /* d's norm moments are missing */
	ck_assert_int_eq(e.rule, MBP_MODEL_MISSING);
	ck_assert_ptr_nonnull(strstr(e.tensor, "norm"));
	const char *pd = tmpdir_path("d.optim.safetensors");
	ck_assert_int_eq(mbp_mlp_save_optim(d, pd), 0);
	ck_assert_int_eq(mbp_mlp_load_optim(a, pd, &e), -EINVAL); /* a has no norm: unknown tensors */
	ck_assert_int_eq(e.rule, MBP_MODEL_UNKNOWN_TENSOR);
	ck_assert_int_eq(mbp_mlp_load_optim(a, tmpdir_path("missing"), &e), -ENOENT);
	ck_assert_ptr_nonnull(strstr(e.msg, "missing"));
	/* A weights file is not an optimizer file. */
	const char *pw = tmpdir_path("a.safetensors");
	ck_assert_int_eq(mbp_mlp_save(a, pw), 0);
	ck_assert_int_lt(mbp_mlp_load_optim(a, pw, &e), 0);
	ck_assert_ptr_nonnull(strstr(e.msg, pw));
	ck_assert_int_eq(mbp_mlp_load_optim(a, pa, &e), 0);
	mbp_mlp_destroy(a);
	mbp_mlp_destroy(b);
	mbp_mlp_destroy(c);
	mbp_mlp_destroy(d);
}
END_TEST

START_TEST(an_optimizer_file_saved_with_other_weights_is_refused_and_its_settings_read_back)
{
	const uint32_t w[] = {4, 6, 3};
	mbp_optim_opts o = {.lr = 0.01f, .min_lr = 0.001f, .warmup_steps = 7, .total_steps = 90};
	mbp_mlp *a = new_mlp(w, 2, MBP_ACT_RELU, false, 1, &o);
	mbp_mlp *b = new_mlp(w, 2, MBP_ACT_RELU, false, 2, &o); /* same shapes and optimizer, other weights */
	const char *pa = tmpdir_path("a.optim.safetensors");
	ck_assert_int_eq(mbp_mlp_save_optim(a, pa), 0);
	mbp_model_error e;
	ck_assert_int_eq(mbp_mlp_load_optim(b, pa, &e), -EINVAL);
	ck_assert_int_eq(e.rule, MBP_MODEL_ACTIVATION);
	ck_assert_msg(strstr(e.msg, "other weights") && strstr(e.msg, pa), "%s", e.msg);
	ck_assert_int_eq(mbp_mlp_load_optim(a, pa, &e), 0);
	mbp_optim_opts r, want;
	ck_assert_int_eq(mbp_mlp_optim(a, &want), 0);
	ck_assert_int_eq(mbp_mlp_optim_read(pa, &r, &e), 0);
	ck_assert_int_eq(r.kind, want.kind);
	ck_assert(r.lr == want.lr && r.min_lr == want.min_lr && r.beta1 == want.beta1 &&
		  r.beta2 == want.beta2 && r.eps == want.eps && r.weight_decay == want.weight_decay);
	ck_assert_uint_eq(r.warmup_steps, 7);
	ck_assert_uint_eq(r.total_steps, 90);
	/* A weights file has no optimizer settings. */
	const char *pw = tmpdir_path("a.safetensors");
	ck_assert_int_eq(mbp_mlp_save(a, pw), 0);
	ck_assert_int_eq(mbp_mlp_optim_read(pw, &r, &e), -EINVAL);
	ck_assert_ptr_nonnull(strstr(e.msg, pw));
	ck_assert_int_eq(mbp_mlp_optim_read(NULL, &r, &e), -EINVAL);
	mbp_mlp_destroy(a);
	mbp_mlp_destroy(b);
}
END_TEST

/* ---- concurrency ---- */

struct worker {
	mbp_mlp_stage *st;
	float *x, *dout;
	uint32_t rows, in_w, out_w;
	int rounds, rc;
	pthread_barrier_t *bar;
};

/* Forward, split backward and update on one stage, with inputs and output gradients of its own. */
static void stage_rounds(struct worker *w)
{
	float *out = malloc((size_t)w->rows * w->out_w * sizeof(float));
	float *din = malloc((size_t)w->rows * w->in_w * sizeof(float));
	float *stash = malloc(w->rows * mbp_mlp_stage_stash_floats(w->st) * sizeof(float));
	for (int k = 0; k < w->rounds && !w->rc; k++) {
		w->rc = mbp_mlp_stage_forward(w->st, w->x, out, w->rows, stash);
		w->rc = w->rc ? w->rc : mbp_mlp_stage_backward_in(w->st, stash, w->x, w->dout, din, w->rows);
		w->rc = w->rc ? w->rc : mbp_mlp_stage_backward_w(w->st, stash, w->x, w->rows);
		w->rc = w->rc ? w->rc : mbp_mlp_stage_update(w->st, 1.0f);
		w->rc = w->rc ? w->rc : mbp_mlp_stage_zero_grad(w->st);
	}
	free(out);
	free(din);
	free(stash);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	pthread_barrier_wait(w->bar);
	stage_rounds(w);
	return NULL;
}

START_TEST(stages_on_two_threads_touch_only_their_own_layers)
{
	const uint32_t widths[] = {24, 40, 40, 40, 8};
	mbp_mlp *par = new_mlp(widths, 4, MBP_ACT_GELU, true, 5, NULL);
	mbp_mlp *seq = new_mlp(widths, 4, MBP_ACT_GELU, true, 5, NULL);
	const unsigned cuts[] = {0, 2, 4};
	struct worker w[2][2];
	pthread_barrier_t bar;
	pthread_barrier_init(&bar, NULL, 2);
	for (int v = 0; v < 2; v++)
		for (int s = 0; s < 2; s++) {
			struct worker *x = &w[v][s];
			memset(x, 0, sizeof(*x));
			ck_assert_int_eq(mbp_mlp_stage_new(&x->st, v ? seq : par, cuts[s], cuts[s + 1], 16),
					 0);
			x->rows = 16;
			x->in_w = widths[cuts[s]];
			x->out_w = widths[cuts[s + 1]];
			x->x = random_floats(16 * x->in_w, 10 + s);
			x->dout = random_floats(16 * x->out_w, 20 + s);
			x->rounds = (int)mbp_iters(200, 20);
			x->bar = &bar;
		}
	pthread_t t[2];
	for (int s = 0; s < 2; s++)
		ck_assert_int_eq(pthread_create(&t[s], NULL, worker_main, &w[0][s]), 0);
	for (int s = 0; s < 2; s++)
		pthread_join(t[s], NULL);
	for (int s = 0; s < 2; s++)
		stage_rounds(&w[1][s]);
	for (int v = 0; v < 2; v++)
		for (int s = 0; s < 2; s++)
			ck_assert_int_eq(w[v][s].rc, 0);
	assert_same_array(par, seq, MBP_ARRAY_PARAM);
	assert_same_array(par, seq, MBP_ARRAY_MOMENT2);
	for (int v = 0; v < 2; v++)
		for (int s = 0; s < 2; s++) {
			mbp_mlp_stage_destroy(w[v][s].st);
			free(w[v][s].x);
			free(w[v][s].dout);
		}
	pthread_barrier_destroy(&bar);
	mbp_mlp_destroy(par);
	mbp_mlp_destroy(seq);
}
END_TEST

/* ---- arguments ---- */

START_TEST(bad_arguments_are_refused)
{
	const uint32_t w[] = {3, 4, 2};
	mbp_model_spec sp = {.layers = 2, .widths = w, .act = MBP_ACT_RELU};
	mbp_mlp *n;
	ck_assert_int_eq(mbp_mlp_new_random(NULL, &sp, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_new_random(&n, NULL, NULL), -EINVAL);
	const mbp_optim_opts bad[] = {{.kind = (mbp_optim_kind)7},
				      {.lr = -1.0f},
				      {.lr = NAN},
				      {.momentum = 1.0f},
				      {.beta2 = 1.5f},
				      {.weight_decay = -0.1f},
				      {.eps = -1.0f},
				      {.min_lr = INFINITY}};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_int_eq(mbp_mlp_new_random(&n, &sp, &bad[i]), -EINVAL);
	const uint32_t zero[] = {3, 0, 2};
	mbp_model_spec sz = {.layers = 2, .widths = zero};
	ck_assert_int_eq(mbp_mlp_new_random(&n, &sz, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_new_random(&n, &sp, NULL), 0);
	mbp_optim_opts o;
	ck_assert_int_eq(mbp_mlp_optim(n, &o), 0);
	ck_assert(o.kind == MBP_OPTIM_ADAMW && o.lr == 1e-3f && o.beta1 == 0.9f && o.beta2 == 0.999f &&
		  o.eps == 1e-8f);
	ck_assert_uint_eq(mbp_mlp_layers(n), 2);
	ck_assert_uint_eq(mbp_mlp_in_width(n), 3);
	ck_assert_uint_eq(mbp_mlp_out_width(n), 2);
	mbp_layer_info li;
	ck_assert_int_eq(mbp_mlp_layer_info(n, 2, &li), -ERANGE);
	ck_assert_ptr_null(mbp_mlp_tensor(n, 0, MBP_PART_NORM_WEIGHT, MBP_ARRAY_PARAM, NULL));
	ck_assert_ptr_null(mbp_mlp_tensor(n, 5, MBP_PART_WEIGHT, MBP_ARRAY_PARAM, NULL));
	mbp_mlp_stage *st;
	ck_assert_int_eq(mbp_mlp_stage_new(&st, n, 1, 1, 4), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_new(&st, n, 0, 3, 4), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_new(&st, n, 0, 2, 0), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_new(&st, n, 0, 2, 4), 0);
	ck_assert_uint_eq(mbp_mlp_stage_in_width(st), 3);
	ck_assert_uint_eq(mbp_mlp_stage_out_width(st), 2);
	float x[5 * 3] = {0}, y[5 * 2] = {0}, stash[5 * 64];
	ck_assert_uint_le(mbp_mlp_stage_stash_floats(st), 64);
	ck_assert_int_eq(mbp_mlp_stage_forward(st, x, y, 5, stash), -EINVAL); /* above max_rows */
	ck_assert_int_eq(mbp_mlp_stage_forward(st, x, y, 0, stash), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_forward(st, NULL, y, 2, stash), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_backward_in(st, NULL, x, y, NULL, 2), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_backward_w(st, stash, NULL, 2), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_backward(st, stash, NULL, y, NULL, 2), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_grad_sqnorm(st, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_stage_update(NULL, 1.0f), -EINVAL);
	ck_assert_int_eq(mbp_mlp_save(n, NULL), -EINVAL);
	ck_assert_int_eq(mbp_mlp_save(n, "/nonexistent-dir/x.safetensors"), -ENOENT);
	ck_assert_int_eq(mbp_mlp_forward(n, NULL, y, 1, 0), -EINVAL);
	mbp_model_error e;
	mbp_mlp *none = n;
	ck_assert_int_eq(mbp_mlp_load(&none, "/nonexistent-dir/x.safetensors", NULL, &e), -ENOENT);
	ck_assert_ptr_null(none);
	mbp_mlp_stage_destroy(st);
	mbp_mlp_destroy(n);
	mbp_mlp_stage_destroy(NULL);
	mbp_mlp_destroy(NULL);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("mlp");
	TCase *tc = tcase_create("training");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, every_layer_kind_gradient_matches_double_finite_differences);
	tcase_add_test(tc, combined_backward_equals_backward_in_then_backward_w_bit_for_bit);
	tcase_add_test(tc, micro_batch_accumulation_equals_one_batch_and_repeats_bit_for_bit);
	tcase_add_test(tc, stage_splits_and_schedule_orders_give_the_same_bits);
	tcase_add_test(tc, a_handed_over_input_gradient_gives_the_same_bits);
	tcase_add_test(tc, recomputed_layers_give_the_same_bits_as_stashed_ones);
	tcase_add_test(tc, trainer_with_recomputation_gives_the_same_parameters_bit_for_bit);
	tcase_add_test(tc, trainer_with_a_replicated_stage_gives_the_same_parameters_bit_for_bit);
	tcase_add_test(tc, a_stage_by_pieces_updates_and_measures_as_the_whole_stage);
	tcase_add_test(tc, updates_by_pieces_on_replicas_give_the_parameters_of_one_thread_bit_for_bit);
	tcase_add_test(tc,
		       stages_made_again_at_another_split_between_steps_give_the_same_parameters_bit_for_bit);
	tcase_add_test(tc, activation_memory_peaks_equal_the_schedule_and_the_pools_high_water_mark);
	tcase_add_test(tc, hand_over_is_refused_where_the_gradient_needs_the_previous_stash);
	tcase_add_test(tc, training_forward_equals_inference_and_the_saved_model_bit_for_bit);
	tcase_add_test(tc, padded_weight_copies_train_to_the_same_bits_as_weights_read_in_place);
	tcase_add_test(tc, switching_the_kernel_leaves_a_trainable_model_made_before_on_its_own_bits);
	tcase_add_test(tc, a_stage_thread_init_gives_the_thread_its_row_buffer_only_for_a_packed_model);
	tcase_add_test(tc,
		       packed_copies_follow_every_update_and_train_to_the_bits_of_weights_packed_as_they_go);
	tcase_add_test(tc, loss_values_and_gradients_match_hand_computed_ones);
	tcase_add_test(tc, losses_refuse_bad_labels_non_finite_values_and_bad_arguments);
	tcase_add_test(tc, lr_schedule_warms_up_linearly_then_decays_by_cosine);
	tcase_add_test(tc, adamw_matches_hand_computed_steps);
	tcase_add_test(tc, sgd_with_momentum_matches_hand_computed_steps);
	tcase_add_test(tc, clipping_by_global_norm_and_refusing_non_finite_gradients);
	tcase_add_test(tc, update_check_refuses_exactly_what_the_update_refuses_and_applies_nothing);
	tcase_add_test(tc, adamw_gives_an_element_the_same_bits_in_a_vector_lane_as_alone);
	tcase_add_test(tc, layer_grad_sqnorm_sums_the_squares_and_is_finite_exactly_when_every_gradient_is);
	tcase_add_test(tc, a_nan_gradient_at_one_stage_without_grad_sq_updates_no_stage);
	tcase_add_test(tc, loss_decreases_and_a_tiny_data_set_is_memorised);
	tcase_add_test(tc, checkpoint_resume_continues_bit_for_bit);
	tcase_add_test(tc, optimizer_files_of_another_model_or_optimizer_are_refused_naming_the_file);
	tcase_add_test(tc, an_optimizer_file_saved_with_other_weights_is_refused_and_its_settings_read_back);
	tcase_add_test(tc, bad_arguments_are_refused);
	suite_add_tcase(s, tc);
	TCase *tt = tcase_create("threads");
	tcase_set_timeout(tt, 60);
	tcase_add_test(tt, stages_on_two_threads_touch_only_their_own_layers);
	suite_add_tcase(s, tt);
	return s;
}
