/*
 * Optimizers: the learning-rate schedule (linear warm-up, cosine decay), the clip factor of gradient
 * clipping by global norm, and the per-stage update (AdamW, SGD with momentum) on the stage's own slice of
 * the parameter, gradient and moment arrays.
 *
 * Each layer keeps its own step count, so an update depends only on the layer's state and its gradient:
 * stages split differently, or a run resumed from a checkpoint, give the same bits. The formulas follow
 * PyTorch's AdamW and SGD (see include/mbpipe/model_train.h); scalars per layer (rate, bias corrections)
 * are computed in double, the elementwise update in float.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <string.h>

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

static void adamw(const mbp_optim_opts *o, double lr, uint64_t t, float decay, float scale, float *p,
		  const float *g, float *m, float *v, size_t cnt)
{
	const float b1 = o->beta1, b2 = o->beta2, eps = o->eps;
	const double bc1 = 1.0 - pow(b1, (double)(t + 1)), bc2 = 1.0 - pow(b2, (double)(t + 1));
	const float step = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	const float keep = (float)(1.0 - lr * decay);
	for (size_t e = 0; e < cnt; e++) {
		float ge = g[e] * scale;
		p[e] *= keep;
		m[e] = b1 * m[e] + (1.0f - b1) * ge;
		v[e] = b2 * v[e] + (1.0f - b2) * ge * ge;
		p[e] -= step * m[e] / (sqrtf(v[e]) / bc2_sqrt + eps);
	}
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

int mbp_mlp_stage_update_check(const mbp_mlp_stage *st, float scale)
{
	if (!st)
		return -EINVAL;
	if (!isfinite(scale) || scale < 0)
		return -EDOM;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	for (size_t e = n->start[a]; e < n->start[b]; e++)
		if (!isfinite(n->grad[e]))
			return -EDOM;
	return 0;
}

int mbp_mlp_stage_update(mbp_mlp_stage *st, float scale)
{
	/* All or nothing: a non-finite gradient anywhere in the stage leaves every parameter as it was. */
	int rc = mbp_mlp_stage_update_check(st, scale);
	if (rc < 0)
		return rc;
	mbp_mlp *n;
	unsigned a, b;
	mbp__mlp_stage_range(st, &n, &a, &b);
	const mbp_optim_opts *o = &n->opt;
	for (unsigned i = a; i < b; i++) {
		uint64_t t = n->step[i];
		double lr = mbp_optim_lr(o, t);
		for (unsigned k = 0; k < MBP__PARTS; k++) {
			size_t off = n->off[i][k], cnt = n->count[i][k];
			float decay = k == MBP_PART_WEIGHT ? o->weight_decay : 0.0f;
			if (!cnt)
				continue;
			if (o->kind == MBP_OPTIM_ADAMW)
				adamw(o, lr, t, decay, scale, n->param + off, n->grad + off, n->m1 + off,
				      n->m2 + off, cnt);
			else
				sgd(o, lr, t, decay, scale, n->param + off, n->grad + off,
				    n->m1 ? n->m1 + off : NULL, cnt);
		}
		n->step[i] = t + 1;
	}
	return 0;
}
