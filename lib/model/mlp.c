/*
 * mbp_mlp: the trainable model and its stages: construction (random or from a model), the forward pass
 * that keeps a stash, and the backward pass split into B_in and B_w.
 *
 * Backward of one layer (z = x W^T + b, h = act(z), y = norm(h) or h), given dy = dL/dy:
 *   norm:  dh = inv (g dy - mean(g dy) - xhat mean(g dy xhat)),  dg += dy xhat,  dbeta += dy
 *   act:   dz = dh act'(z)           (ReLU: z > 0; GELU: Phi(z) + z phi(z))
 *   dense: dx = dz W  (B_in),  dW += dz^T x,  db += sum over rows of dz  (B_w)
 * B_in writes dz over the stash's copy of z (which it no longer needs) and B_w reads it there, so B_w needs
 * neither dout nor any of B_in's scratch: a schedule may run it any time after B_in. The per-row means of
 * the normalisation's backward are taken in double, as its forward takes them.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "common.h"
#include "mlp_internal.h"

struct stash_off {
	size_t g, xhat, inv,
	    y;	 /* per-row offsets in floats; y is SIZE_MAX when the layer's output is not kept */
	bool rc; /* recomputed: the offsets are into the work buffer, which the recomputation fills */
};

struct mbp_mlp_stage {
	mbp_mlp *n;
	unsigned a, b; /* layers [a, b) */
	uint32_t max_rows, wmax;
	float *d0, *d1;	      /* max_rows x wmax each: gradients (and inference activations) between layers */
	float *row;	      /* wmax: one row of the normalisation's backward */
	size_t per_row;	      /* floats per row of the stash */
	size_t work_row;      /* floats per row of the work buffer (the recomputed layers' tensors) */
	struct stash_off *so; /* indexed by layer - a */
	bool gives, takes; /* the input gradient of layer b - 1 computed by the next stage; of a - 1 here */
};

/* ---- the model ---- */

static int resolve_opts(const mbp_optim_opts *in, mbp_optim_opts *o)
{
	static const mbp_optim_opts zero;
	*o = in ? *in : zero;
	if (o->kind != MBP_OPTIM_ADAMW && o->kind != MBP_OPTIM_SGD)
		return -EINVAL;
	const float nonneg[] = {o->lr, o->min_lr, o->weight_decay, o->eps};
	for (size_t i = 0; i < MBP_ARRAY_SIZE(nonneg); i++)
		if (!isfinite(nonneg[i]) || nonneg[i] < 0)
			return -EINVAL;
	const float unit[] = {o->momentum, o->beta1, o->beta2};
	for (size_t i = 0; i < MBP_ARRAY_SIZE(unit); i++)
		if (!(unit[i] >= 0 && unit[i] < 1))
			return -EINVAL;
	if (o->lr == 0)
		o->lr = 1e-3f;
	if (o->beta1 == 0)
		o->beta1 = 0.9f;
	if (o->beta2 == 0)
		o->beta2 = 0.999f;
	if (o->eps == 0)
		o->eps = 1e-8f;
	return 0;
}

void mbp_mlp_destroy(mbp_mlp *n)
{
	if (!n)
		return;
	free(n->l);
	free(n->lw);
	free(n->off);
	free(n->count);
	free(n->start);
	free(n->param);
	free(n->grad);
	free(n->m1);
	free(n->m2);
	free(n->step);
	free(n->lwp);
	free(n->wpad);
	free(n->wpack);
	free(n);
}

static size_t up16(size_t x)
{
	return (x + 15) & ~(size_t)15;
}

/* The row stride of a layer's weights in the stages' copy: rows of a multiple of 4 KiB padded. */
static uint32_t pad_ld(uint32_t in)
{
	return in % 1024 ? in : in + MBP__PAD_FLOATS;
}

/* Every padded or packed copy from the parameters (after a constructor has set them). */
static void pad_sync_all(mbp_mlp *n)
{
	for (unsigned i = 0; i < n->layers; i++) {
		float *pad = mbp__mlp_pad(n, i), *pk = mbp__mlp_pack(n, i);
		const uint32_t in = n->l[i].in, ld = n->lwp[i].ld;
		for (uint32_t r = 0; pad && r < n->l[i].out; r++)
			memcpy(pad + (size_t)r * ld, n->lw[i].w + (size_t)r * in, in * sizeof(float));
		if (pk)
			mbp__dense_pack(in, n->l[i].out, n->lw[i].w, 0, n->lw[i].b, pk);
	}
}

/* Allocate a model for a layer structure (copied): the layout, zeroed arrays and the weight views. */
static int mlp_alloc(mbp_mlp **out, unsigned L, const struct mbp__layer *l, const mbp_optim_opts *opt)
{
	mbp_optim_opts o;
	int rc = resolve_opts(opt, &o);
	if (rc)
		return rc;
	mbp_mlp *n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->layers = L;
	n->opt = o;
	n->l = calloc(L, sizeof(*n->l));
	n->lw = calloc(L, sizeof(*n->lw));
	n->off = calloc(L, sizeof(*n->off));
	n->count = calloc(L, sizeof(*n->count));
	n->start = calloc(L + 1, sizeof(*n->start));
	n->step = calloc(L, sizeof(*n->step));
	n->lwp = calloc(L, sizeof(*n->lwp));
	if (!n->l || !n->lw || !n->off || !n->count || !n->start || !n->step || !n->lwp)
		goto nomem;
	memcpy(n->l, l, L * sizeof(*l));
	size_t at = 0;
	for (unsigned i = 0; i < L; i++) {
		n->start[i] = at;
		size_t cnt[MBP__PARTS] = {(size_t)l[i].in * l[i].out, l[i].out, l[i].norm ? l[i].out : 0,
					  l[i].norm ? l[i].out : 0};
		for (unsigned k = 0; k < MBP__PARTS; k++) {
			n->off[i][k] = at;
			n->count[i][k] = cnt[k];
			at += up16(cnt[k]);
		}
		if (l[i].in > n->max_width)
			n->max_width = l[i].in;
		if (l[i].out > n->max_width)
			n->max_width = l[i].out;
	}
	n->start[L] = n->total = at;
	n->param = mbp__scratch_alloc(at);
	n->grad = mbp__scratch_alloc(at);
	if (!n->param || !n->grad)
		goto nomem;
	if (o.kind == MBP_OPTIM_ADAMW || o.momentum > 0) {
		if (!(n->m1 = mbp__scratch_alloc(at)))
			goto nomem;
	}
	if (o.kind == MBP_OPTIM_ADAMW && !(n->m2 = mbp__scratch_alloc(at)))
		goto nomem;
	for (unsigned i = 0; i < L; i++) {
		n->lw[i].w = n->param + n->off[i][MBP_PART_WEIGHT];
		n->lw[i].b = n->param + n->off[i][MBP_PART_BIAS];
		if (l[i].norm) {
			n->lw[i].g = n->param + n->off[i][MBP_PART_NORM_WEIGHT];
			n->lw[i].beta = n->param + n->off[i][MBP_PART_NORM_BIAS];
		}
	}
	/* the stages' copy of the dense weights: packed for the packed kernel, else padded (mlp_internal.h) */
	const bool packed = mbp_kernel_get() == MBP_KERNEL_PACKED;
	size_t copy = 0;
	for (unsigned i = 0; i < L; i++)
		copy += packed			     ? mbp__dense_packed_floats(l[i].in, l[i].out)
			: pad_ld(l[i].in) != l[i].in ? up16((size_t)l[i].out * pad_ld(l[i].in))
						     : 0;
	float *cp = copy ? mbp__scratch_alloc(copy) : NULL;
	if (copy && !cp)
		goto nomem;
	*(packed ? &n->wpack : &n->wpad) = cp;
	for (unsigned i = 0; i < L; i++) {
		n->lw[i].pack_as_it_goes = packed; /* the model's kernel for its life, even once handed out */
		n->lwp[i] = n->lw[i];
		if (packed) {
			n->lwp[i].wp = cp;
			cp += mbp__dense_packed_floats(l[i].in, l[i].out);
		} else if (pad_ld(l[i].in) != l[i].in) {
			n->lwp[i].w = cp;
			n->lwp[i].ld = pad_ld(l[i].in);
			cp += up16((size_t)l[i].out * pad_ld(l[i].in));
		}
	}
	*out = n;
	return 0;
nomem:
	mbp_mlp_destroy(n);
	return -ENOMEM;
}

int mbp_mlp_new_random(mbp_mlp **out, const mbp_model_spec *sp, const mbp_optim_opts *opt)
{
	if (!out || !sp || sp->layers < 1 || sp->layers > MBP_MODEL_MAX_LAYERS || sp->act > MBP_ACT_GELU)
		return -EINVAL;
	*out = NULL;
	unsigned L = sp->layers;
	struct mbp__layer *l = calloc(L, sizeof(*l));
	if (!l)
		return -ENOMEM;
	int rc = 0;
	for (unsigned i = 0; i < L && !rc; i++) {
		l[i].in = sp->widths ? sp->widths[i] : i == 0 ? sp->in : sp->hidden;
		l[i].out = sp->widths ? sp->widths[i + 1] : i + 1 == L ? sp->out : sp->hidden;
		if (l[i].in < 1 || l[i].in > MBP_MODEL_MAX_WIDTH || l[i].out < 1 ||
		    l[i].out > MBP_MODEL_MAX_WIDTH)
			rc = -EINVAL;
		l[i].act = i + 1 < L ? sp->act : MBP_ACT_NONE;
		l[i].norm = sp->norm && i + 1 < L;
		l[i].eps = 1e-5f;
		l[i].dtype = MBP_DTYPE_F32;
	}
	mbp_mlp *n = NULL;
	if (!rc)
		rc = mlp_alloc(&n, L, l, opt);
	free(l);
	if (rc)
		return rc;
	uint64_t seed = sp->seed;
	for (unsigned i = 0; i < L; i++) {
		const struct mbp__layer *y = &n->l[i];
		float scale = y->act != MBP_ACT_NONE ? sqrtf(6.0f / (float)y->in)
						     : sqrtf(6.0f / (float)(y->in + y->out));
		float *w = n->param + n->off[i][MBP_PART_WEIGHT];
		for (size_t e = 0; e < n->count[i][MBP_PART_WEIGHT]; e++)
			w[e] = scale * mbp__uniform(&seed);
		float *g = n->param + n->off[i][MBP_PART_NORM_WEIGHT];
		for (size_t e = 0; e < n->count[i][MBP_PART_NORM_WEIGHT]; e++)
			g[e] = 1.0f;
	}
	pad_sync_all(n);
	*out = n;
	return 0;
}

int mbp_mlp_new_from_model(mbp_mlp **out, mbp_model *m, const mbp_optim_opts *opt)
{
	if (!out || !m)
		return -EINVAL;
	*out = NULL;
	mbp_mlp *n;
	int rc = mlp_alloc(&n, m->layers, m->l, opt);
	if (rc)
		return rc;
	struct mbp__version *v = mbp__version_get_locked(m);
	for (unsigned i = 0; i < n->layers; i++) {
		const float *src[MBP__PARTS] = {v->lw[i].w, v->lw[i].b, v->lw[i].g, v->lw[i].beta};
		for (unsigned k = 0; k < MBP__PARTS; k++)
			if (n->count[i][k])
				memcpy(n->param + n->off[i][k], src[k], n->count[i][k] * sizeof(float));
		n->l[i].dtype = MBP_DTYPE_F32;
	}
	mbp__version_put(v);
	pad_sync_all(n);
	*out = n;
	return 0;
}

int mbp_mlp_load(mbp_mlp **out, const char *path, const mbp_optim_opts *opt, mbp_model_error *err)
{
	if (out)
		*out = NULL;
	if (!out || !path) {
		if (err)
			memset(err, 0, sizeof(*err));
		return -EINVAL;
	}
	mbp_model *m;
	int rc = mbp_model_load(&m, path, err);
	if (rc)
		return rc;
	rc = mbp_mlp_new_from_model(out, m, opt);
	mbp_model_destroy(m);
	return rc;
}

unsigned mbp_mlp_layers(const mbp_mlp *n)
{
	return n ? n->layers : 0;
}

uint32_t mbp_mlp_in_width(const mbp_mlp *n)
{
	return n ? n->l[0].in : 0;
}

uint32_t mbp_mlp_out_width(const mbp_mlp *n)
{
	return n ? n->l[n->layers - 1].out : 0;
}

int mbp_mlp_layer_info(const mbp_mlp *n, unsigned i, mbp_layer_info *info)
{
	if (!n || !info)
		return -EINVAL;
	if (i >= n->layers)
		return -ERANGE;
	mbp__layer_info(&n->l[i], info);
	/* what is allocated: a layer's slot in wpack or wpad stays after mbp_mlp_tensor hands it out */
	if (n->wpack)
		info->packed_bytes = mbp__dense_packed_floats(info->in, info->out) * sizeof(float);
	else if (n->wpad && pad_ld(info->in) != info->in)
		info->pad_bytes = up16((size_t)info->out * pad_ld(info->in)) * sizeof(float);
	return 0;
}

int mbp_mlp_optim(const mbp_mlp *n, mbp_optim_opts *o)
{
	if (!n || !o)
		return -EINVAL;
	*o = n->opt;
	return 0;
}

uint64_t mbp_mlp_steps(const mbp_mlp *n, unsigned i)
{
	return n && i < n->layers ? n->step[i] : 0;
}

float *mbp_mlp_tensor(mbp_mlp *n, unsigned layer, mbp_mlp_part part, mbp_mlp_array which, size_t *count)
{
	if (!n || layer >= n->layers || (unsigned)part >= MBP__PARTS || !n->count[layer][part])
		return NULL;
	float *base = which == MBP_ARRAY_PARAM	   ? n->param
		      : which == MBP_ARRAY_GRAD	   ? n->grad
		      : which == MBP_ARRAY_MOMENT1 ? n->m1
		      : which == MBP_ARRAY_MOMENT2 ? n->m2
						   : NULL;
	if (!base)
		return NULL;
	if (count)
		*count = n->count[layer][part];
	if (which == MBP_ARRAY_PARAM &&
	    (part == MBP_PART_WEIGHT || (part == MBP_PART_BIAS && n->lwp[layer].wp)))
		n->lwp[layer] = n->lw[layer]; /* the caller may write them: the stages read them there now */
	return base + n->off[layer][part];
}

int mbp_mlp_forward(mbp_mlp *n, const float *in, float *out, size_t rows, uint32_t mb_rows)
{
	if (!n || (rows && (!in || !out)))
		return -EINVAL;
	/* lwp: the stages' copies (the same bits as lw's, faster) */
	return mbp__forward_batched(n->l, n->lwp, n->layers, n->max_width, in, out, rows, mb_rows);
}

/* ---- stages ---- */

void mbp_mlp_stage_destroy(mbp_mlp_stage *st)
{
	if (!st)
		return;
	free(st->d0);
	free(st->d1);
	free(st->row);
	free(st->so);
	free(st);
}

/* The stash's and the work buffer's layouts: per layer, in layer order, the dense output (z, then its
 * gradient), the normalisation's xhat and inverse deviations, and the output when a later layer of the
 * stage reads it; in the work buffer for a layer that recomputes, in the stash otherwise. */
static void layout(mbp_mlp_stage *st)
{
	size_t at[2] = {0, 0}; /* stash, work */
	for (unsigned i = st->a; i < st->b; i++) {
		const struct mbp__layer *l = &st->n->l[i];
		struct stash_off *so = &st->so[i - st->a];
		size_t *k = &at[so->rc];
		so->g = *k;
		*k += l->out;
		so->xhat = so->inv = SIZE_MAX;
		if (l->norm) {
			so->xhat = *k;
			*k += l->out;
			so->inv = *k;
			*k += 1;
		}
		so->y = SIZE_MAX;
		if (i + 1 < st->b) {
			so->y = *k;
			*k += l->out;
		}
	}
	st->per_row = at[0];
	st->work_row = at[1];
}

int mbp_mlp_stage_new(mbp_mlp_stage **out, mbp_mlp *n, unsigned first, unsigned last, uint32_t max_rows)
{
	if (!out || !n || first >= last || last > n->layers || !max_rows)
		return -EINVAL;
	*out = NULL;
	mbp_mlp_stage *st = calloc(1, sizeof(*st));
	if (!st)
		return -ENOMEM;
	st->n = n;
	st->a = first;
	st->b = last;
	st->max_rows = max_rows;
	st->so = calloc(last - first, sizeof(*st->so));
	for (unsigned i = first; st->so && i < last; i++) {
		const struct mbp__layer *l = &n->l[i];
		if (l->in > st->wmax)
			st->wmax = l->in;
		if (l->out > st->wmax)
			st->wmax = l->out;
	}
	if (st->so)
		layout(st);
	size_t cnt;
	if (!st->so || !mbp__mul_size(max_rows, st->wmax, &cnt) || !(st->d0 = mbp__scratch_alloc(cnt)) ||
	    !(st->d1 = mbp__scratch_alloc(cnt)) || !(st->row = mbp__scratch_alloc(st->wmax))) {
		mbp_mlp_stage_destroy(st);
		return -ENOMEM;
	}
	mbp__blas_one_thread();
	*out = st;
	return 0;
}

int mbp_mlp_stage_thread_init(const mbp_mlp_stage *st)
{
	if (!st)
		return -EINVAL;
	mbp__dense_thread_init(st->n->lw[st->a].pack_as_it_goes); /* the model's kernel for its life */
	return 0;
}

int mbp_mlp_stage_new_replica(mbp_mlp_stage **out, const mbp_mlp_stage *like)
{
	if (!out || !like)
		return -EINVAL;
	int rc = mbp_mlp_stage_new(out, like->n, like->a, like->b, like->max_rows);
	if (rc < 0)
		return rc;
	mbp_mlp_stage *st = *out;
	for (unsigned i = like->a; i < like->b; i++)
		st->so[i - st->a].rc = like->so[i - like->a].rc;
	layout(st);
	st->gives = like->gives;
	st->takes = like->takes;
	return 0;
}

bool mbp_mlp_stage_bin_accumulates(const mbp_mlp_stage *st)
{
	for (unsigned i = st ? st->a : 0; st && i < st->b; i++)
		if (st->n->l[i].norm)
			return true;
	return false;
}

size_t mbp_mlp_stage_stash_floats(const mbp_mlp_stage *st)
{
	return st ? st->per_row : 0;
}

size_t mbp_mlp_stage_work_floats(const mbp_mlp_stage *st)
{
	return st ? st->work_row : 0;
}

int mbp_mlp_stage_set_recompute(mbp_mlp_stage *st, unsigned layer, bool on)
{
	if (!st || layer < st->a || layer >= st->b)
		return -EINVAL;
	st->so[layer - st->a].rc = on;
	layout(st);
	return 0;
}

bool mbp_mlp_stage_recomputes(const mbp_mlp_stage *st, unsigned layer)
{
	return st && layer >= st->a && layer < st->b && st->so[layer - st->a].rc;
}

uint32_t mbp_mlp_stage_in_width(const mbp_mlp_stage *st)
{
	return st ? st->n->l[st->a].in : 0;
}

uint32_t mbp_mlp_stage_out_width(const mbp_mlp_stage *st)
{
	return st ? st->n->l[st->b - 1].out : 0;
}

int mbp_mlp_layer_hand_over_check(const mbp_mlp *n, unsigned layer)
{
	if (!n || layer == 0 || layer >= n->layers)
		return -EINVAL;
	const struct mbp__layer *l = &n->l[layer];
	return l->norm || (l->act != MBP_ACT_RELU && l->act != MBP_ACT_NONE) ? -ENOTSUP : 0;
}

int mbp_mlp_stages_hand_over(mbp_mlp_stage *prev, mbp_mlp_stage *next)
{
	if (!prev || !next || prev->n != next->n || prev->b != next->a || prev->b < 2 || prev->gives ||
	    next->takes)
		return -EINVAL;
	int rc = mbp_mlp_layer_hand_over_check(prev->n, prev->b - 1);
	if (rc == 0)
		prev->gives = next->takes = true;
	return rc;
}

size_t mbp_mlp_stage_dout_floats(const mbp_mlp_stage *st)
{
	if (!st)
		return 0;
	const struct mbp__layer *l = &st->n->l[st->b - 1];
	return st->gives ? (size_t)l->out + l->in : l->out;
}

size_t mbp_mlp_stage_din_floats(const mbp_mlp_stage *st)
{
	if (!st)
		return 0;
	const struct mbp__layer *l = &st->n->l[st->a];
	return st->takes ? (size_t)l->in + st->n->l[st->a - 1].in : l->in;
}

/* A stash tensor of layer i for a micro-batch of r rows. */
static inline float *at(float *stash, size_t off, uint32_t r)
{
	return stash + off * r;
}

/* The buffer that holds layer i's tensors: the work buffer when it recomputes, else the stash. */
static inline float *buf_of(const mbp_mlp_stage *st, unsigned i, const float *stash, const float *work)
{
	return (float *)(st->so[i - st->a].rc ? work : stash);
}

int mbp_mlp_stage_forward(mbp_mlp_stage *st, const float *in, float *out, uint32_t rows, float *stash)
{
	if (!st || !in || !out || !rows || rows > st->max_rows)
		return -EINVAL;
	const mbp_mlp *n = st->n;
	if (!stash) {
		mbp__layers_run_lw(n->l, n->lwp, st->a, st->b, in, out, rows, st->d0, st->d1);
		return 0;
	}
	const float *x = in;
	for (unsigned i = st->a; i < st->b; i++) {
		const struct mbp__layer *l = &n->l[i];
		const struct stash_off *so = &st->so[i - st->a];
		/* a recomputed layer keeps nothing: its output goes through the scratch (the same bits) */
		float *y = i + 1 == st->b ? out
			   : so->rc	  ? (x == st->d0 ? st->d1 : st->d0)
					  : at(stash, so->y, rows);
		bool keep = !so->rc;
		mbp__layer_fwd(l, &n->lwp[i], x, y, rows,
			       keep && l->act != MBP_ACT_NONE ? at(stash, so->g, rows) : NULL,
			       keep && l->norm ? at(stash, so->xhat, rows) : NULL,
			       keep && l->norm ? at(stash, so->inv, rows) : NULL);
		x = y;
	}
	return 0;
}

int mbp_mlp_stage_recompute(mbp_mlp_stage *st, const float *stash, const float *in, float *work,
			    uint32_t rows)
{
	if (!st || !rows || rows > st->max_rows || (st->per_row && !stash) || (st->work_row && !work) ||
	    (st->so[0].rc && !in))
		return -EINVAL;
	const mbp_mlp *n = st->n;
	/* a giving stage's last layer: its backward takes its dense output's gradient from dout */
	unsigned end = st->gives ? st->b - 1 : st->b;
	for (unsigned i = st->a; i < end; i++) {
		const struct mbp__layer *l = &n->l[i];
		const struct stash_off *so = &st->so[i - st->a];
		if (!so->rc)
			continue;
		/* the same call on the same input as the forward's: the same bits */
		const float *x =
		    i == st->a ? in : at(buf_of(st, i - 1, stash, work), st->so[i - 1 - st->a].y, rows);
		float *y = i + 1 == st->b ? st->d0 : at(work, so->y, rows);
		mbp__layer_fwd(
		    l, &n->lwp[i], x, y, rows, l->act != MBP_ACT_NONE ? at(work, so->g, rows) : NULL,
		    l->norm ? at(work, so->xhat, rows) : NULL, l->norm ? at(work, so->inv, rows) : NULL);
	}
	return 0;
}

/* d/dz of z Phi(z) = Phi(z) + z phi(z), in float like the forward's erff (double would cost a third of a
 * 1024-wide layer's B_in). */
static inline float gelu_grad(float z)
{
	const float inv_sqrt_2pi = 0.398942280401432678f;
	return 0.5f * (1.0f + erff(z * (float)M_SQRT1_2)) + z * expf(-0.5f * z * z) * inv_sqrt_2pi;
}

/* Layer i's output gradient: dy (rows x out) -> dz over the stash's z (`stash`: the buffer that holds
 * layer i's tensors); the norm's gradients accumulate. */
static void grad_out(mbp_mlp_stage *st, unsigned i, float *stash, const float *dy, uint32_t rows)
{
	mbp_mlp *n = st->n;
	const struct mbp__layer *l = &n->l[i];
	const struct stash_off *so = &st->so[i - st->a];
	const uint32_t w = l->out;
	float *gz = at(stash, so->g, rows);
	const float *xhat = l->norm ? at(stash, so->xhat, rows) : NULL;
	const float *inv = l->norm ? at(stash, so->inv, rows) : NULL;
	const float *g = n->lw[i].g;
	float *dg = n->grad + n->off[i][MBP_PART_NORM_WEIGHT],
	      *dbeta = n->grad + n->off[i][MBP_PART_NORM_BIAS];
	for (uint32_t r = 0; r < rows; r++) {
		const float *dyr = dy + (size_t)r * w;
		float *gr = gz + (size_t)r * w;
		const float *src = dyr;
		if (l->norm) {
			const float *xr = xhat + (size_t)r * w;
			double s1 = 0, s2 = 0;
			for (uint32_t j = 0; j < w; j++) {
				double gy = (double)g[j] * dyr[j];
				s1 += gy;
				s2 += gy * xr[j];
			}
			double m1 = s1 / w, m2 = s2 / w, iv = inv[r];
			for (uint32_t j = 0; j < w; j++) {
				st->row[j] = (float)(iv * ((double)g[j] * dyr[j] - m1 - xr[j] * m2));
				dg[j] += dyr[j] * xr[j];
				dbeta[j] += dyr[j];
			}
			src = st->row;
		}
		switch (l->act) {
		case MBP_ACT_NONE:
			memcpy(gr, src, w * sizeof(float));
			break;
		case MBP_ACT_RELU:
			mbp__relu_grad(gr, src, gr, w);
			break;
		case MBP_ACT_GELU:
			for (uint32_t j = 0; j < w; j++)
				gr[j] = src[j] * gelu_grad(gr[j]);
			break;
		}
	}
}

/* Layer i's input gradient from the gradient of its dense output: dx = dz W. The one product for both
 * the owning stage and a stage it hands over to, so the two give the same bits. */
static void dz_times_w(const mbp_mlp *n, unsigned i, const float *dz, float *dx, uint32_t rows)
{
	const struct mbp__layer *l = &n->l[i];
	const struct mbp__weights *w = &n->lwp[i];
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)rows, (int)l->in, (int)l->out, 1.0f, dz,
		    (int)l->out, w->w, w->ld ? (int)w->ld : (int)l->in, 0.0f, dx, (int)l->in);
}

/* Layer i's input gradient, from the dense output's gradient in the stash. */
static void grad_in(const mbp_mlp_stage *st, unsigned i, float *stash, float *dx, uint32_t rows)
{
	dz_times_w(st->n, i, at(stash, st->so[i - st->a].g, rows), dx, rows);
}

/* Layer i's weight gradients: dW += dz^T x, db += column sums of dz (rows in order). */
static void grad_w(const mbp_mlp_stage *st, unsigned i, const float *stash, const float *work,
		   const float *in, uint32_t rows)
{
	mbp_mlp *n = st->n;
	const struct mbp__layer *l = &n->l[i];
	const float *gz = at(buf_of(st, i, stash, work), st->so[i - st->a].g, rows);
	const float *x = i == st->a ? in : at(buf_of(st, i - 1, stash, work), st->so[i - 1 - st->a].y, rows);
	float *dw = n->grad + n->off[i][MBP_PART_WEIGHT], *db = n->grad + n->off[i][MBP_PART_BIAS];
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, (int)l->out, (int)l->in, (int)rows, 1.0f, gz,
		    (int)l->out, x, (int)l->in, 1.0f, dw, (int)l->in);
	for (uint32_t r = 0; r < rows; r++) {
		const float *gr = gz + (size_t)r * l->out;
		for (uint32_t j = 0; j < l->out; j++)
			db[j] += gr[j];
	}
}

/* Layer k = a - 1's gradients, handed over from the previous stage: from dy, the gradient of its output
 * (this stage's input y), the gradient of its dense output dz = dy where y > 0 (ReLU: y > 0 exactly where
 * the pre-activation is) into din's first rows x out floats, then its input gradient dz W into the rest:
 * the same operations, on the same values, as the previous stage's grad_out and grad_in would run. */
static void hand_back(const mbp_mlp_stage *st, const float *y, const float *dy, float *din, uint32_t rows)
{
	const unsigned k = st->a - 1;
	const struct mbp__layer *l = &st->n->l[k];
	const size_t cnt = (size_t)rows * l->out;
	if (l->act == MBP_ACT_RELU)
		mbp__relu_grad(y, dy, din, cnt);
	else
		memcpy(din, dy, cnt * sizeof(float));
	dz_times_w(st->n, k, din, din + cnt, rows);
}

/* The sweep from the last layer to the first: output gradients, optionally weight gradients, and the
 * input gradient of every layer but the first (whose goes to din, when asked). A stage that gives finds
 * its last layer's dense-output and input gradients in dout; one that takes computes the previous
 * layer's into din. */
static int backward(mbp_mlp_stage *st, float *stash, float *work, const float *in, const float *dout,
		    float *din, uint32_t rows, bool weights)
{
	if (!st || (st->per_row && !stash) || (st->work_row && !work) || !dout || !rows ||
	    rows > st->max_rows || ((weights || (st->takes && din)) && !in))
		return -EINVAL;
	const float *dy = dout;
	unsigned i = st->b;
	if (st->gives) {
		i--;
		const size_t cnt = (size_t)rows * st->n->l[i].out;
		memcpy(at(buf_of(st, i, stash, work), st->so[i - st->a].g, rows), dout, cnt * sizeof(float));
		if (weights)
			grad_w(st, i, stash, work, in, rows);
		dy = dout + cnt; /* the gradient of layer i's input */
	}
	while (i-- > st->a) {
		float *own = buf_of(st, i, stash, work);
		grad_out(st, i, own, dy, rows);
		if (weights)
			grad_w(st, i, stash, work, in, rows);
		if (i > st->a || din) {
			float *dx = i > st->a || st->takes ? (dy == st->d0 ? st->d1 : st->d0) : din;
			grad_in(st, i, own, dx, rows);
			dy = dx;
		}
	}
	if (din && st->takes)
		hand_back(st, in, dy, din, rows);
	else if (din && dy != din) /* a giving stage of one layer: its input gradient came in dout */
		memcpy(din, dy, (size_t)rows * st->n->l[st->a].in * sizeof(float));
	return 0;
}

int mbp_mlp_stage_backward_in_r(mbp_mlp_stage *st, float *stash, float *work, const float *in,
				const float *dout, float *din, uint32_t rows)
{
	return backward(st, stash, work, in, dout, din, rows, false);
}

int mbp_mlp_stage_backward_r(mbp_mlp_stage *st, float *stash, float *work, const float *in, const float *dout,
			     float *din, uint32_t rows)
{
	return backward(st, stash, work, in, dout, din, rows, true);
}

int mbp_mlp_stage_backward_w_r(mbp_mlp_stage *st, const float *stash, const float *work, const float *in,
			       uint32_t rows)
{
	if (!st || (st->per_row && !stash) || (st->work_row && !work) || !in || !rows || rows > st->max_rows)
		return -EINVAL;
	for (unsigned i = st->b; i-- > st->a;)
		grad_w(st, i, stash, work, in, rows);
	return 0;
}

int mbp_mlp_stage_backward_in(mbp_mlp_stage *st, float *stash, const float *in, const float *dout, float *din,
			      uint32_t rows)
{
	return backward(st, stash, NULL, in, dout, din, rows, false);
}

int mbp_mlp_stage_backward(mbp_mlp_stage *st, float *stash, const float *in, const float *dout, float *din,
			   uint32_t rows)
{
	return backward(st, stash, NULL, in, dout, din, rows, true);
}

int mbp_mlp_stage_backward_w(mbp_mlp_stage *st, const float *stash, const float *in, uint32_t rows)
{
	return mbp_mlp_stage_backward_w_r(st, stash, NULL, in, rows);
}

int mbp_mlp_stage_zero_grad(mbp_mlp_stage *st)
{
	if (!st)
		return -EINVAL;
	const mbp_mlp *n = st->n;
	memset(n->grad + n->start[st->a], 0, (n->start[st->b] - n->start[st->a]) * sizeof(float));
	return 0;
}

void mbp__mlp_stage_range(const mbp_mlp_stage *st, mbp_mlp **n, unsigned *a, unsigned *b)
{
	*n = st->n;
	*a = st->a;
	*b = st->b;
}
