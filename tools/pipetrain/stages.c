/*
 * pipetrain stages: the trainer's callbacks (include/mbpipe/train.h) onto the model's stage functions
 * (include/mbpipe/model_train.h), one pt_stage per pipeline stage.
 *
 * F, B_in, B_w and B map one to one to mbp_train_io's buffers. Where a stage hands its last layer's
 * input gradient over to the next (mbp_mlp_stages_hand_over, chosen by pt_partition), its gradient
 * rows are wider than its output (grad_row_bytes): the layer's dense-output and input gradients. The loss is softmax cross-entropy on int32
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
#include "util/clock.h"

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

/* The update's refusals before any stage updates (train.h): a non-finite gradient. The clip factor is
 * finite here once every grad_sq was (the trainer fails the step otherwise), so 1 stands for it. */
static int op_check(void *ctx)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_update_check(p->st, 1.0f);
}

static int op_update(void *ctx, const mbp_train_update *u)
{
	(void)u;
	pt_stage *p = ctx;
	double sq = 0;
	for (unsigned l = 0; l < p->sh->layers; l++)
		sq += p->sh->layer_sq[l];
	float scale = mbp_clip_scale(sq, p->sh->clip);
	int rc = mbp_mlp_stage_update(p->st, scale); /* 0 after op_check: the trainer reports otherwise */
	mbp_mlp_stage_zero_grad(p->st);
	return rc;
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
	    .grad_row_bytes = mbp_mlp_stage_dout_floats(p->st) * sizeof(float),
	    .stash_row_bytes = mbp_mlp_stage_stash_floats(p->st) * sizeof(float),
	    .forward = op_forward,
	    .backward = op_backward,
	    .backward_in = op_backward_in,
	    .backward_w = op_backward_w,
	    .grad_sq = op_grad_sq,
	    .check = op_check,
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

int pt_profile(mbp_mlp *n, uint32_t rows, double *cost, double *cost_in, double (*ops)[3])
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
		/* The best of 5 after one warm-up, each operation alone: what the trainer's operations of
		 * this layer cost. Layer 0 computes no input gradient (nothing before it needs one), as at
		 * stage 0. */
		double best[3] = {1e300, 1e300, 1e300};
		for (unsigned r = 0; !rc && r < 6; r++) {
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
		cost[i] = best[0] + best[1] + best[2];
		cost_in[i] = i ? best[1] : 0;
		for (unsigned k = 0; ops && k < 3; k++)
			ops[i][k] = k == 1 && i == 0 ? 0 : best[k];
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

int pt_auto_schedule(const double (*ops)[3], const mbp_model_plan *plan, const bool *gives, unsigned S,
		     uint32_t mbs, unsigned T, mbp_schedule **sc)
{
	mbp_op_costs c[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++) {
		c[s] = (mbp_op_costs){0, 0, 0};
		for (unsigned i = plan->first[s]; i < plan->first[s + 1]; i++) {
			c[s].f += ops[i][0];
			c[s].b_in += ops[i][1];
			c[s].b_w += ops[i][2];
		}
		/* a hand-over: stage s + 1 computes the input gradient of stage s's last layer */
		if (s + 1 < S && gives[s]) {
			double g = ops[plan->first[s + 1] - 1][1];
			c[s].b_in -= g;
			c[s + 1].b_in += g;
		}
	}
	/* the limit: what 1F1B holds at most per thread on these threads */
	mbp_schedule *one;
	int rc = mbp_schedule_new(&one, MBP_SCHED_1F1B, S, mbs);
	if (rc < 0)
		return rc;
	unsigned limit = 0;
	for (unsigned t = 0; t < T; t++) {
		mbp_sched_thread_figures f;
		if (mbp_schedule_thread_figures(one, T, t, &f) == 0 && f.held_peak > limit)
			limit = f.held_peak;
	}
	mbp_schedule_destroy(one);
	mbp_sched_build b = {
	    .stages = S, .mbs = mbs, .threads = T, .costs = c, .held_limit = limit, .split = true};
	return mbp_schedule_build(sc, &b);
}

/* Stage cost over layers [a, b): the layers' costs, plus the input gradient of layer a - 1 when it
 * takes it (hin), less that of layer b - 1 when it gives it (hout). */
static double part_cost(const double *pre, const double *cost_in, unsigned a, unsigned b, bool hin, bool hout)
{
	return pre[b] - pre[a] + (hin ? cost_in[a - 1] : 0) - (hout ? cost_in[b - 1] : 0);
}

int pt_partition(const double *cost, const double *cost_in, const bool *can_give, unsigned L, unsigned S,
		 pt_hand_over mode, mbp_model_plan *plan, bool *gives)
{
	memset(gives, 0, S * sizeof(bool));
	int rc = mbp_model_partition(cost, NULL, L, S, plan);
	if (rc < 0 || mode == PT_HAND_OVER_OFF || S < 2)
		return rc;
	/* best[t][b][h]: the smallest slowest stage of t stages over layers [0, b), h: the boundary at b
	 * hands layer b - 1's input gradient over to the stage after it (which the cost of stage t - 1
	 * already leaves out). from[t][b][h]: where stage t - 1 began and whether it took one. */
	typedef struct {
		double v;
		unsigned a;
		bool h;
	} cell;
	cell(*best)[PT_MAX_LAYERS + 1][2] = calloc(S + 1, sizeof(*best));
	double pre[PT_MAX_LAYERS + 1] = {0};
	if (!best)
		return -ENOMEM;
	for (unsigned i = 0; i < L; i++)
		pre[i + 1] = pre[i] + cost[i];
	for (unsigned t = 0; t <= S; t++)
		for (unsigned b = 0; b <= L; b++)
			best[t][b][0].v = best[t][b][1].v = INFINITY;
	best[0][0][0].v = 0;
	for (unsigned t = 0; t < S; t++)
		for (unsigned a = t; a < L; a++)
			for (unsigned hin = 0; hin < 2; hin++) {
				if (best[t][a][hin].v == INFINITY)
					continue;
				for (unsigned b = a + 1; b + (S - t - 1) <= L; b++)
					for (unsigned hout = 0; hout < 2; hout++) {
						bool can = b < L && t + 1 < S && can_give[b - 1];
						if (hout ? !can : can && mode == PT_HAND_OVER_ALL)
							continue;
						if (t + 1 == S && b != L)
							continue;
						double c = part_cost(pre, cost_in, a, b, hin, hout);
						double v = best[t][a][hin].v > c ? best[t][a][hin].v : c;
						if (v < best[t + 1][b][hout].v)
							best[t + 1][b][hout] = (cell){v, a, hin != 0};
					}
			}
	double slowest = best[S][L][0].v;
	if (slowest < plan->slowest_ns * 0.98 || mode == PT_HAND_OVER_ALL) {
		unsigned b = L;
		bool h = false;
		double sum = 0;
		for (unsigned t = S; t > 0; t--) {
			cell c = best[t][b][h];
			plan->first[t - 1] = c.a;
			plan->stage_ns[t - 1] = part_cost(pre, cost_in, c.a, b, c.h, h);
			sum += plan->stage_ns[t - 1];
			if (t > 1)
				gives[t - 2] = c.h;
			b = c.a;
			h = c.h;
		}
		plan->first[S] = L;
		plan->slowest_ns = slowest;
		plan->mean_ns = sum / S;
		plan->balance = slowest / plan->mean_ns;
	}
	free(best);
	return 0;
}
