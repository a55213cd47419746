/*
 * pipetrain stages: the trainer's callbacks (include/mbpipe/train.h) onto the model's stage functions
 * (include/mbpipe/model_train.h), one pt_stage per pipeline stage.
 *
 * F, B_in, B_w and B map one to one to mbp_train_io's buffers. The loss is softmax cross-entropy on int32
 * labels, averaged over the step's rows (batch_rows = io->step_rows), so the micro-batches' gradients add
 * up to the mini-batch's.
 *
 * Clipping by global norm. The trainer adds the stages' grad_sq values in stage order, so with another
 * partition the same gradients give a norm that may differ in its last bits, and so would the clip factor
 * and every later weight. To make a run independent of the stage count, each stage's grad_sq also stores
 * each of its layers' squared norms (in double, each tensor in one fixed order) in the shared table, and
 * every update adds the table's entries in layer order: the same sum, bit for bit, whatever the stages.
 * The trainer calls every stage's grad_sq before any update (the norm it passes is their sum), so the
 * table is complete when the updates read it.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pipetrain.h"

static int op_forward(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_forward(p->st, io->in, io->out, io->rows, io->stash);
}

static int op_backward(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward(p->st, io->stash, io->in, io->dout, io->din, io->rows);
}

static int op_backward_in(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward_in(p->st, io->stash, io->in, io->dout, io->din, io->rows);
}

static int op_backward_w(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward_w(p->st, io->stash, io->in, io->rows);
}

static double tensor_sq(mbp_mlp *n, unsigned layer, mbp_mlp_part part)
{
	size_t count;
	const float *g = mbp_mlp_tensor(n, layer, part, MBP_ARRAY_GRAD, &count);
	double s = 0;
	for (size_t i = 0; g && i < count; i++)
		s += (double)g[i] * g[i];
	return s;
}

static double op_grad_sq(void *ctx)
{
	pt_stage *p = ctx;
	double total = 0;
	for (unsigned l = p->first; l < p->last; l++) {
		double s = tensor_sq(p->sh->n, l, MBP_PART_WEIGHT) + tensor_sq(p->sh->n, l, MBP_PART_BIAS) +
			   tensor_sq(p->sh->n, l, MBP_PART_NORM_WEIGHT) +
			   tensor_sq(p->sh->n, l, MBP_PART_NORM_BIAS);
		p->sh->layer_sq[l] = s;
		total += s;
	}
	return total;
}

static void op_update(void *ctx, const mbp_train_update *u)
{
	(void)u;
	pt_stage *p = ctx;
	double sq = 0;
	for (unsigned l = 0; l < p->sh->layers; l++)
		sq += p->sh->layer_sq[l];
	float scale = mbp_clip_scale(sq, p->sh->clip);
	if (mbp_mlp_stage_update(p->st, scale) < 0)
		p->sh->update_err = (int)p->index + 1; /* cannot happen after a finite grad_sq; reported */
	mbp_mlp_stage_zero_grad(p->st);
}

static void op_discard(void *ctx)
{
	pt_stage *p = ctx;
	mbp_mlp_stage_zero_grad(p->st);
}

void pt_stage_desc(pt_stage *p, mbp_train_stage_desc *d)
{
	snprintf(p->name, sizeof p->name, "layers %u-%u", p->first, p->last - 1);
	*d = (mbp_train_stage_desc){
	    .name = p->name,
	    .ctx = p,
	    .out_row_bytes = mbp_mlp_stage_out_width(p->st) * sizeof(float),
	    .stash_row_bytes = mbp_mlp_stage_stash_floats(p->st) * sizeof(float),
	    .forward = op_forward,
	    .backward = op_backward,
	    .backward_in = op_backward_in,
	    .backward_w = op_backward_w,
	    .grad_sq = op_grad_sq,
	    .update = op_update,
	    .discard = op_discard,
	};
}

int pt_loss(void *arg, const mbp_train_io *io, double *loss)
{
	pt_shared *sh = arg;
	float *logits = io->out;
	if (io->mb == 0)
		sh->correct = 0;
	if (sh->fault_step >= 0 && io->step == (uint64_t)sh->fault_step && io->mb == 0)
		logits[0] = NAN; /* PIPETRAIN_FAULT: what a diverging model would give */
	uint32_t correct = 0;
	int rc = mbp_loss_xent(logits, io->targets, io->rows, sh->classes, io->step_rows, io->dout, loss,
			       &correct);
	sh->correct += correct;
	return rc;
}

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

int pt_profile(mbp_mlp *n, uint32_t rows, double *cost)
{
	unsigned L = mbp_mlp_layers(n);
	for (unsigned i = 0; i < L; i++) {
		mbp_mlp_stage *st;
		int rc = mbp_mlp_stage_new(&st, n, i, i + 1, rows);
		if (rc < 0)
			return rc;
		size_t in = mbp_mlp_stage_in_width(st), out = mbp_mlp_stage_out_width(st);
		float *x = calloc(rows * in, sizeof(float)), *y = calloc(rows * out, sizeof(float)),
		      *dy = calloc(rows * out, sizeof(float)), *dx = calloc(rows * in, sizeof(float)),
		      *stash = calloc(rows * mbp_mlp_stage_stash_floats(st) + 1, sizeof(float));
		rc = x && y && dy && dx && stash ? 0 : -ENOMEM;
		for (size_t k = 0; !rc && k < rows * in; k++)
			x[k] = (float)(k % 7) * 0.1f;
		for (size_t k = 0; !rc && k < rows * out; k++)
			dy[k] = (float)(k % 5) * 0.01f;
		/* The best of 5 after one warm-up: what the trainer's operations of this layer cost. Layer 0
		 * computes no input gradient (nothing before it needs one), as at stage 0. */
		cost[i] = 1e300;
		for (unsigned r = 0; !rc && r < 6; r++) {
			double t0 = now_ns();
			rc = mbp_mlp_stage_forward(st, x, y, rows, stash);
			rc = rc ? rc : mbp_mlp_stage_backward_in(st, stash, x, dy, i ? dx : NULL, rows);
			rc = rc ? rc : mbp_mlp_stage_backward_w(st, stash, x, rows);
			double t = now_ns() - t0;
			if (r && t < cost[i])
				cost[i] = t;
		}
		mbp_mlp_stage_zero_grad(st);
		mbp_mlp_stage_destroy(st);
		free(x);
		free(y);
		free(dy);
		free(dx);
		free(stash);
		if (rc < 0)
			return rc;
	}
	return 0;
}
