/*
 * pipetrain's plan of a run by hand (the trainer's stage callbacks, the loss and the layers' profile are
 * tools/shared/stages.c's).
 *
 * The plan (pt_plan_make). Each layer's F, B_in and B_w are timed at the micro-batch size (mt_profile);
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
static mbp_op_costs stage_costs(const mt_costs *pc, const unsigned *first, const bool *gives, unsigned S,
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

int pt_auto_schedule(const mt_costs *pc, const unsigned *first, const bool *gives, unsigned S, uint32_t mbs,
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

double pt_predict(const mt_costs *pc, const unsigned *first, const bool *gives, unsigned S, unsigned T,
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

double pt_refine(const mt_costs *pc, const bool *can_give, unsigned L, unsigned S, unsigned T,
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

void pt_split_figures(const mt_costs *pc, unsigned S, mbp_model_plan *plan, const bool *gives)
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
	int rc = mt_profile(n, mb, 5, &p->costs);
	return rc < 0 ? rc : pt_plan_costs(&p->costs, mbp_mlp_layers(n), c, S, T, can_give, file, p);
}

int pt_plan_costs(const mt_costs *costs, unsigned L, const pt_config *c, unsigned S, unsigned T,
		  const bool *can_give, const mbp_schedule *file, pt_plan *p)
{
	const mt_costs pc = *costs; /* costs may be p->costs */
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
