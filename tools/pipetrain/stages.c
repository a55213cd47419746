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
 *
 * The plan (pt_plan_make). Each layer's F, B_in and B_w are timed at the micro-batch size (pt_profile);
 * pt_partition balances the stages' sums, which is not the shortest step: the fill and the drain of a
 * schedule wait on one stage's forward and another's input gradients, which a hand-over or a boundary
 * moves. So the split is then improved by the step the schedule predicts (mbp_schedule_simulate with the
 * stages' profiled costs: pt_predict), a move at a time (pt_refine). With --mb auto every power of two from
 * 16 to the batch is planned so and the shortest predicted step wins: a larger micro-batch runs the
 * products faster per row (each product packs its weights once), fewer of them leave a larger bubble.
 * None of this changes the weights' bits but the micro-batch size.
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
	const pt_shared *sh = p->sh;
	if (sh->slow_ns > 0 && sh->step >= (uint64_t)sh->slow_step && sh->slow_layer >= p->first &&
	    sh->slow_layer < p->last) { /* PIPETRAIN_SLOW: the layer made dearer, in real time */
		uint64_t until = mbt_now_ns() + (uint64_t)sh->slow_ns;
		while (mbt_now_ns() < until)
			;
	}
	return mbp_mlp_stage_forward(p->st, io->in, io->out, io->rows, io->stash);
}

static int op_recompute(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_recompute(p->st, io->stash, io->in, io->work, io->rows);
}

static int op_backward(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward_r(p->st, io->stash, io->work, io->in, io->dout, io->din, io->rows);
}

static int op_backward_in(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward_in_r(p->st, io->stash, io->work, io->in, io->dout, io->din, io->rows);
}

static int op_backward_w(void *ctx, const mbp_train_io *io)
{
	pt_stage *p = ctx;
	return mbp_mlp_stage_backward_w_r(p->st, io->stash, io->work, io->in, io->rows);
}

/* The update's refusals before any stage updates (train.h): a non-finite gradient, which the squared
 * norms show (finite exactly when every gradient is, mbp_mlp_stage_grad_sqnorm_pieces), so the check of a
 * range of pieces computes their norms, into the trainer's sq and the shared table (every update reads
 * all of it). The clip factor is finite once every norm was (the trainer fails the step otherwise). */
static int op_check_pieces(void *ctx, size_t begin, size_t end, double *sq)
{
	pt_stage *p = ctx;
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
static double layer_sq(const pt_shared *sh, unsigned l)
{
	double sq = 0;
	for (size_t i = sh->piece0[l]; i < sh->piece0[l + 1]; i++)
		sq += sh->piece_sq[i];
	return sq;
}

static int op_update_pieces(void *ctx, const mbp_train_update *u, size_t begin, size_t end)
{
	(void)u;
	pt_stage *p = ctx;
	double sq = 0; /* every range of every stage adds the same table in the same order */
	for (unsigned l = 0; l < p->sh->layers; l++)
		sq += layer_sq(p->sh, l);
	float scale = mbp_clip_scale(sq, p->sh->clip);
	int rc = 0;
	/* piece by piece, each gradient zeroed while it is in cache (0 after op_check_pieces: the
	 * trainer reports otherwise) */
	for (size_t i = begin; i < end && rc == 0; i++) {
		rc = mbp_mlp_stage_update_pieces(p->st, scale, i, i + 1);
		mbp_mlp_stage_zero_grad_pieces(p->st, i, i + 1);
	}
	return rc;
}

/* Once every range is updated: the layers' step counts, and their norms for the log (grad_norm). */
static void op_update_end(void *ctx, const mbp_train_update *u)
{
	(void)u;
	pt_stage *p = ctx;
	mbp_mlp_stage_update_end(p->st);
	for (unsigned l = p->first; l < p->last; l++)
		p->sh->layer_sq[l] = layer_sq(p->sh, l);
}

static void op_discard_pieces(void *ctx, size_t begin, size_t end)
{
	pt_stage *p = ctx;
	mbp_mlp_stage_zero_grad_pieces(p->st, begin, end);
}

int pt_shared_pieces(pt_shared *sh)
{
	sh->piece0[0] = 0;
	for (unsigned l = 0; l < sh->layers; l++)
		sh->piece0[l + 1] = sh->piece0[l] + mbp_mlp_layer_pieces(sh->n, l);
	free(sh->piece_sq);
	sh->piece_sq = calloc(sh->piece0[sh->layers] + 1, sizeof(double));
	return sh->piece_sq ? 0 : -ENOMEM;
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
	    .work_row_bytes = mbp_mlp_stage_work_floats(p->st) * sizeof(float),
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

int pt_loss(void *arg, const mbp_train_io *io, double *loss)
{
	pt_shared *sh = arg;
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

int pt_profile(mbp_mlp *n, uint32_t rows, unsigned reps, pt_costs *pc)
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

/* Stage s's operation costs under a split (first[], gives[]): its layers' F, B_in and B_w, the input
 * gradient it takes over from stage s - 1 added to its B_in, the one it gives to stage s + 1 taken out. */
static mbp_op_costs stage_costs(const pt_costs *pc, const unsigned *first, const bool *gives, unsigned S,
				unsigned s)
{
	mbp_op_costs c = {0, 0, 0};
	for (unsigned i = first[s]; i < first[s + 1]; i++) {
		c.f += pc->f[i];
		c.b_in += pc->b_in[i];
		c.b_w += pc->b_w[i];
	}
	if (s + 1 < S && gives[s])
		c.b_in -= pc->b_in[first[s + 1] - 1];
	if (s > 0 && gives[s - 1])
		c.b_in += pc->b_in[first[s] - 1];
	return c;
}

int pt_auto_schedule(const pt_costs *pc, const unsigned *first, const bool *gives, unsigned S, uint32_t mbs,
		     unsigned T, mbp_schedule **sc)
{
	mbp_op_costs c[MBP_MAX_STAGES];
	for (unsigned s = 0; s < S; s++)
		c[s] = stage_costs(pc, first, gives, S, s);
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

double pt_predict(const pt_costs *pc, const unsigned *first, const bool *gives, unsigned S, unsigned T,
		  const mbp_schedule *sc)
{
	mbp_op_costs c[MBP_MAX_STAGES] = {{0, 0, 0}};
	for (unsigned s = 0; s < S; s++)
		c[s] = stage_costs(pc, first, gives, S, s);
	mbp_sched_sim sim;
	return mbp_schedule_simulate(sc, c, T, &sim, NULL) == 0 ? sim.makespan : INFINITY;
}

/* May the stage ending before layer b give layer b - 1's input gradient to the next under the mode (ALL:
 * then it must)? */
static bool may_give(const bool *can_give, unsigned b, pt_hand_over mode)
{
	return mode != PT_HAND_OVER_OFF && b >= 2 && can_give[b - 1];
}

double pt_refine(const pt_costs *pc, const bool *can_give, unsigned L, unsigned S, unsigned T,
		 pt_hand_over mode, const mbp_schedule *sc, mbp_model_plan *plan, bool *gives)
{
	double best = pt_predict(pc, plan->first, gives, S, T, sc);
	for (unsigned round = 0; round < 4 * L * S; round++) {
		unsigned bf[MBP_MAX_STAGES + 1];
		bool bg[MBP_MAX_STAGES];
		double cand_best = best;
		for (unsigned s = 1; s < S; s++)
			for (int d = -1; d <= 1; d++)
				for (int h = 0; h < 2; h++) { /* boundary s moved by d, hand-over h there */
					unsigned f[MBP_MAX_STAGES + 1];
					bool g[MBP_MAX_STAGES];
					memcpy(f, plan->first, (S + 1) * sizeof(unsigned));
					memcpy(g, gives, S * sizeof(bool));
					f[s] = (unsigned)((int)f[s] + d);
					bool can = may_give(can_give, f[s], mode);
					if (f[s] <= f[s - 1] || f[s] >= f[s + 1] || (h && !can) ||
					    (mode == PT_HAND_OVER_ALL && h != can) ||
					    (d == 0 && h == g[s - 1]))
						continue;
					g[s - 1] = h;
					double t = pt_predict(pc, f, g, S, T, sc);
					if (t < cand_best) {
						cand_best = t;
						memcpy(bf, f, sizeof bf);
						memcpy(bg, g, S * sizeof(bool));
					}
				}
		if (!(cand_best < best * 0.995))
			break;
		best = cand_best;
		memcpy(plan->first, bf, (S + 1) * sizeof(unsigned));
		memcpy(gives, bg, S * sizeof(bool));
	}
	pt_split_figures(pc, S, plan, gives);
	return best;
}

void pt_split_figures(const pt_costs *pc, unsigned S, mbp_model_plan *plan, const bool *gives)
{
	double sum = 0;
	plan->slowest_ns = 0;
	for (unsigned s = 0; s < S; s++) {
		mbp_op_costs c = stage_costs(pc, plan->first, gives, S, s);
		plan->stage_ns[s] = c.f + c.b_in + c.b_w;
		sum += plan->stage_ns[s];
		if (plan->stage_ns[s] > plan->slowest_ns)
			plan->slowest_ns = plan->stage_ns[s];
	}
	plan->mean_ns = sum / S;
	plan->balance = plan->mean_ns > 0 ? plan->slowest_ns / plan->mean_ns : 1;
}

/* One micro-batch size: profile, then pt_plan_costs. */
static int plan_at(mbp_mlp *n, const pt_config *c, unsigned S, unsigned T, const bool *can_give, uint32_t mb,
		   const mbp_schedule *file, pt_plan *p)
{
	p->sched = NULL;
	int rc = pt_profile(n, mb, 5, &p->costs);
	return rc < 0 ? rc : pt_plan_costs(&p->costs, mbp_mlp_layers(n), c, S, T, can_give, file, p);
}

int pt_plan_costs(const pt_costs *costs, unsigned L, const pt_config *c, unsigned S, unsigned T,
		  const bool *can_give, const mbp_schedule *file, pt_plan *p)
{
	const pt_costs pc = *costs; /* costs may be p->costs */
	uint32_t mb = pc.rows;
	int rc = 0;
	p->sched = NULL;
	p->costs = pc;
	double cost[PT_MAX_LAYERS], cost_in[PT_MAX_LAYERS], layer_sum = 0;
	for (unsigned i = 0; i < L; i++) {
		cost[i] = pc.f[i] + pc.b_in[i] + pc.b_w[i];
		cost_in[i] = i ? pc.b_in[i] : 0;
		layer_sum += cost[i];
	}
	p->mb = mb;
	pt_hand_over mode = S > 1 ? c->hand_over : PT_HAND_OVER_OFF;
	if (c->nsplit) { /* --split: the stages as given, no hand-over, not refined */
		mode = PT_HAND_OVER_OFF;
		memset(p->gives, 0, sizeof p->gives);
		p->split =
		    (mbp_model_plan){.stages = S, .layers = L, .mb_rows = mb, .sequential_ns = layer_sum};
		for (unsigned s = 1; s < S; s++)
			p->split.first[s] = c->split[s - 1];
		p->split.first[S] = L;
	} else {
		rc = pt_partition(cost, cost_in, can_give, L, S, mode, &p->split, p->gives);
	}
	if (rc < 0)
		return rc;
	unsigned M = (c->batch + mb - 1) / mb;
	bool automatic = !file && c->schedule == MBP_SCHED_AUTO;
	mbp_schedule *own = NULL;
	if (automatic)
		rc = pt_auto_schedule(&pc, p->split.first, p->gives, S, M, T, &own);
	else if (!file)
		rc = mbp_schedule_new_placed(&own, c->schedule, S, M, c->threads);
	if (rc < 0)
		return rc;
	const mbp_schedule *sc = file ? file : own;
	if (mbp_schedule_threads(sc)) /* a chunked or custom placement runs on its own threads */
		T = mbp_schedule_threads(sc);
	p->threads = T;
	if (c->nsplit) {
		p->step_ns = pt_predict(&pc, p->split.first, p->gives, S, T, sc);
		pt_split_figures(&pc, S, &p->split, p->gives);
	} else {
		p->step_ns = pt_refine(&pc, can_give, L, S, T, mode, sc, &p->split, p->gives);
	}
	mbp_schedule *again;
	if (automatic && pt_auto_schedule(&pc, p->split.first, p->gives, S, M, T, &again) == 0) {
		double t = pt_predict(&pc, p->split.first, p->gives, S, T, again);
		mbp_schedule *lose = t < p->step_ns ? own : again;
		if (lose == own) {
			own = again;
			p->step_ns = t;
		}
		mbp_schedule_destroy(lose);
	}
	if (automatic)
		p->sched = own;
	else
		mbp_schedule_destroy(own);
	p->seq_ns = layer_sum * M;
	if (!isfinite(p->step_ns)) {
		pt_plan_clear(p);
		return -EINVAL;
	}
	return 0;
}

void pt_plan_clear(pt_plan *p)
{
	mbp_schedule_destroy(p->sched);
	p->sched = NULL;
}

int pt_plan_make(mbp_mlp *n, const pt_config *c, unsigned S, unsigned T, const bool *can_give,
		 const mbp_schedule *file, pt_plan *p)
{
	unsigned L = mbp_mlp_layers(n);
	memset(p, 0, sizeof *p);
	if (c->mb && S == 1 && !file && c->schedule != MBP_SCHED_AUTO) { /* one stage: nothing to choose */
		p->mb = c->mb;
		p->threads = 1;
		p->split = (mbp_model_plan){.stages = 1, .layers = L, .first = {0, L}, .balance = 1};
		return 0;
	}
	if (c->mb)
		return plan_at(n, c, S, T, can_give, c->mb, file, p);
	if (file) /* the file fixes the micro-batches */
		return -EINVAL;
	unsigned tried = 0;
	uint32_t tried_mb[PT_MB_CANDIDATES];
	double tried_ns[PT_MB_CANDIDATES];
	pt_plan best = {0}, cand;
	for (uint32_t mb = 16; mb <= c->batch && tried < PT_MB_CANDIDATES; mb *= 2) {
		if ((c->batch + mb - 1) / mb > MBP_TRAIN_MAX_MBS)
			continue;
		int rc = plan_at(n, c, S, T, can_give, mb, NULL, &cand);
		if (rc ==
		    -EINVAL) /* a size the schedule cannot place (dualpipev: fewer micro-batches than stages) */
			continue;
		if (rc < 0) {
			pt_plan_clear(&best);
			return rc;
		}
		tried_mb[tried] = mb;
		tried_ns[tried++] = cand.step_ns;
		if (!best.mb || cand.step_ns < best.step_ns) {
			pt_plan_clear(&best);
			best = cand;
		} else
			pt_plan_clear(&cand);
	}
	best.tried = tried;
	memcpy(best.tried_mb, tried_mb, tried * sizeof(uint32_t));
	memcpy(best.tried_ns, tried_ns, tried * sizeof(double));
	*p = best;
	return p->mb ? 0 : -EINVAL;
}
