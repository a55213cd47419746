/*
 * The MLP's trainer stages: the trainer's callbacks (include/mbpipe/train.h) onto the model's stage
 * functions (include/mbpipe/model_train.h), one mt_stage per pipeline stage; and each layer's profile
 * (mt_profile), what the planners plan from.
 *
 * F, B_in, B_w and B map one to one to mbp_train_io's buffers. Where a stage hands its last layer's
 * input gradient over to the next (mbp_mlp_stages_hand_over: pipetrain's pt_partition chooses), its
 * gradient rows are wider than its output (grad_row_bytes): the layer's dense-output and input
 * gradients. The loss is softmax cross-entropy on int32 labels, averaged over the step's rows
 * (batch_rows = io->step_rows), so the micro-batches' gradients add up to the mini-batch's.
 *
 * Clipping by global norm. The trainer adds the stages' squared norms in stage order, so with another
 * partition the same gradients give a norm that may differ in its last bits, and so would the clip factor
 * and every later weight. To make a run independent of the stage count, the norm is the model's: each
 * stage's check stores its pieces' squared norms (mbp_mlp_stage_grad_sqnorm_pieces: pieces of a tensor
 * fixed by its size alone) in the shared table, and every update adds the table's entries piece by piece
 * into each layer's sum (mbp_mlp_layer_grad_sqnorm's bits) and those in layer order: the same sum, bit
 * for bit, whatever the stages and replicas. The trainer runs every check before any update, so the table
 * is complete when the updates read it. The end-of-step work goes by pieces (train.h, "Replicas"): a
 * replicated stage's replicas check, update and zero a range of its pieces each, at once, and the
 * layers' step counts advance once (op_update_end).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/shared/mlptrain.h"
#include "util/clock.h"

static int op_forward(void *ctx, const mbp_train_io *io)
{
	mt_stage *p = ctx;
	const mt_shared *sh = p->sh;
	if (sh->slow_ns > 0 && sh->step >= (uint64_t)sh->slow_step && sh->slow_layer >= p->first &&
	    sh->slow_layer < p->last) { /* PIPETRAIN_SLOW: the layer made dearer, in real time */
		uint64_t until = mbt_now_ns() + (uint64_t)sh->slow_ns;
		while (mbt_now_ns() < until)
			;
	}
	return mbp_mlp_stage_forward(p->st, io->in, io->out, io->rows, io->stash);
}

/* On the stage's thread at start: its products then allocate nothing (the dense kernel's rows). */
static int op_init(void *ctx, unsigned stage)
{
	mt_stage *p = ctx;
	(void)stage;
	return mbp_mlp_stage_thread_init(p->st);
}

static int op_recompute(void *ctx, const mbp_train_io *io)
{
	mt_stage *p = ctx;
	return mbp_mlp_stage_recompute(p->st, io->stash, io->in, io->work, io->rows);
}

static int op_backward(void *ctx, const mbp_train_io *io)
{
	mt_stage *p = ctx;
	return mbp_mlp_stage_backward_r(p->st, io->stash, io->work, io->in, io->dout, io->din, io->rows);
}

static int op_backward_in(void *ctx, const mbp_train_io *io)
{
	mt_stage *p = ctx;
	return mbp_mlp_stage_backward_in_r(p->st, io->stash, io->work, io->in, io->dout, io->din, io->rows);
}

static int op_backward_w(void *ctx, const mbp_train_io *io)
{
	mt_stage *p = ctx;
	return mbp_mlp_stage_backward_w_r(p->st, io->stash, io->work, io->in, io->rows);
}

/* The update's refusals before any stage updates (train.h): a non-finite gradient, which the squared
 * norms show (finite exactly when every gradient is, mbp_mlp_stage_grad_sqnorm_pieces), so the check of a
 * range of pieces computes their norms, into the trainer's sq and the shared table (every update reads
 * all of it). The clip factor is finite once every norm was (the trainer fails the step otherwise). */
static int op_check_pieces(void *ctx, size_t begin, size_t end, double *sq)
{
	mt_stage *p = ctx;
	int rc = mbp_mlp_stage_grad_sqnorm_pieces(p->st, begin, end, sq);
	double *table = p->sh->piece_sq + p->sh->piece0[p->first];
	for (size_t i = begin; rc == 0 && i < end; i++) {
		table[i] = sq[i - begin];
		if (!isfinite(table[i]))
			rc = -EDOM;
	}
	return rc;
}

/* Layer l's squared norm from the table: its pieces' added in order (mbp_mlp_layer_grad_sqnorm's bits). */
static double layer_sq(const mt_shared *sh, unsigned l)
{
	double sq = 0;
	for (size_t i = sh->piece0[l]; i < sh->piece0[l + 1]; i++)
		sq += sh->piece_sq[i];
	return sq;
}

static int op_update_pieces(void *ctx, const mbp_train_update *u, size_t begin, size_t end)
{
	(void)u;
	mt_stage *p = ctx;
	double sq = 0; /* every range of every stage adds the same table in the same order */
	for (unsigned l = 0; l < p->sh->layers; l++)
		sq += layer_sq(p->sh, l);
	float scale = mbp_clip_scale(sq, p->sh->clip);
	int rc = 0;
	/* piece by piece, each gradient zeroed while it is in cache (0 after op_check_pieces: the
	 * trainer reports otherwise) */
	for (size_t i = begin; i < end; i++) { /* after a refusal: zeroed, not updated */
		if (rc == 0)
			rc = mbp_mlp_stage_update_pieces(p->st, scale, i, i + 1);
		mbp_mlp_stage_zero_grad_pieces(p->st, i, i + 1);
	}
	return rc;
}

/* Once every range is updated: the layers' step counts, and their norms for the log (grad_norm). */
static void op_update_end(void *ctx, const mbp_train_update *u)
{
	(void)u;
	mt_stage *p = ctx;
	mbp_mlp_stage_update_end(p->st);
	for (unsigned l = p->first; l < p->last; l++)
		p->sh->layer_sq[l] = layer_sq(p->sh, l);
}

static void op_discard_pieces(void *ctx, size_t begin, size_t end)
{
	mt_stage *p = ctx;
	mbp_mlp_stage_zero_grad_pieces(p->st, begin, end);
}

int mt_shared_pieces(mt_shared *sh)
{
	sh->piece0[0] = 0;
	for (unsigned l = 0; l < sh->layers; l++)
		sh->piece0[l + 1] = sh->piece0[l] + mbp_mlp_layer_pieces(sh->n, l);
	free(sh->piece_sq);
	sh->piece_sq = calloc(sh->piece0[sh->layers] + 1, sizeof(double));
	return sh->piece_sq ? 0 : -ENOMEM;
}

int mt_stage_make(mt_stage *p, mt_shared *sh, unsigned index, unsigned first, unsigned last, uint32_t mb,
		  mt_stage *giver, uint64_t recompute)
{
	*p = (mt_stage){.sh = sh, .index = index, .first = first, .last = last};
	int rc = mbp_mlp_stage_new(&p->st, sh->n, first, last, mb);
	if (rc == 0 && giver)
		rc = mbp_mlp_stages_hand_over(giver->st, p->st);
	for (unsigned l = first; rc == 0 && l < last; l++)
		if (recompute >> l & 1)
			rc = mbp_mlp_stage_set_recompute(p->st, l, true);
	return rc;
}

void mt_stage_desc(mt_stage *p, mbp_train_stage_desc *d)
{
	snprintf(p->name, sizeof p->name, "layers %u-%u", p->first, p->last - 1);
	*d = (mbp_train_stage_desc){
	    .name = p->name,
	    .ctx = p,
	    .out_row_bytes = mbp_mlp_stage_out_width(p->st) * sizeof(float),
	    .grad_row_bytes = mbp_mlp_stage_dout_floats(p->st) * sizeof(float),
	    .stash_row_bytes = mbp_mlp_stage_stash_floats(p->st) * sizeof(float),
	    .work_row_bytes = mbp_mlp_stage_work_floats(p->st) * sizeof(float),
	    .init = op_init,
	    .recompute = op_recompute,
	    .forward = op_forward,
	    .backward = op_backward,
	    .backward_in = op_backward_in,
	    .backward_w = op_backward_w,
	    .pieces = mbp_mlp_stage_pieces(p->st),
	    .check_pieces = op_check_pieces,
	    .update_pieces = op_update_pieces,
	    .discard_pieces = op_discard_pieces,
	    .update_end = op_update_end,
	};
}

int mt_loss(void *arg, const mbp_train_io *io, double *loss)
{
	mt_shared *sh = arg;
	float *logits = io->out;
	if (sh->fault_step >= 0 && io->step == (uint64_t)sh->fault_step && io->mb == 0)
		logits[0] = NAN; /* PIPETRAIN_FAULT: what a diverging model would give */
	uint32_t correct = 0;
	int rc = mbp_loss_xent(logits, io->targets, io->rows, sh->classes, io->step_rows, io->dout, loss,
			       &correct);
	/* relaxed: a count, read by main after the step (whose end orders it) */
	atomic_fetch_add_explicit(&sh->correct, correct, memory_order_relaxed);
	return rc;
}

int mt_profile(mbp_mlp *n, uint32_t rows, unsigned reps, mt_costs *pc)
{
	unsigned L = mbp_mlp_layers(n);
	pc->rows = rows;
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
		/* The best of reps after one warm-up, each operation alone: what the trainer's operations
		 * of this layer cost. Layer 0 computes no input gradient (nothing before it needs one), as
		 * at stage 0. */
		double best[3] = {1e300, 1e300, 1e300};
		for (unsigned r = 0; !rc && r <= reps; r++) {
			double t[4];
			t[0] = (double)mbt_now_ns();
			rc = mbp_mlp_stage_forward(st, x, y, rows, stash);
			t[1] = (double)mbt_now_ns();
			rc = rc ? rc : mbp_mlp_stage_backward_in(st, stash, x, dy, i ? dx : NULL, rows);
			t[2] = (double)mbt_now_ns();
			rc = rc ? rc : mbp_mlp_stage_backward_w(st, stash, x, rows);
			t[3] = (double)mbt_now_ns();
			for (unsigned k = 0; r && k < 3; k++)
				if (t[k + 1] - t[k] < best[k])
					best[k] = t[k + 1] - t[k];
		}
		pc->f[i] = best[0];
		pc->b_in[i] = best[1];
		pc->b_w[i] = best[2];
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
