/*
 * The planner (mbp_mlp_plan): from a short profile of the layers, the training plan with the shortest
 * predicted step whose predicted memory fits a budget.
 *
 * What a plan is: T threads (1 .. the caller's count), S stages (T for the schedules of one stage per
 * thread, 2T for the chunked ones, which place two chunks a thread), a schedule, a micro-batch size (one
 * of the profiled ones), the stage boundaries and which stages recompute every layer. The boundaries come
 * from the exact min-max partitioner (mbp_model_partition) on the layers' costs at that size, twice: once
 * with each layer's F + B_in + B_w (kept), once with its forward counted twice (recomputed), the second
 * split tried only where it differs. A schedule depends on (kind, S, M) alone, so it is built once and
 * played (mbp_schedule_simulate) against every split and recomputation of that kind, size and count.
 *
 * Memory. A stage's activation bytes per row are its layers' kept bytes plus the output of every layer
 * but its last (a later layer of the stage reads it): in the stash when the stage keeps them, in the work
 * buffer when it recomputes (mbp_mlp_stage_set_recompute on every layer: then no stash). Walking the
 * stage's own list of operations (mbp_schedule_stage_ops) as the trainer takes and frees the buffers
 * (a stash from its F to its last backward, a work buffer from its B or B_in to its last backward) gives
 * the most bytes the stage holds at once; the plan's activation peak is the sum over the stages, which
 * is at least the trainer's act_peak_bytes (the stages' peaks need not coincide), so a plan that fits
 * predicts a measured peak within the budget. Per stage the choice is independent: a combination's least
 * memory takes, stage by stage, the smaller of keeping and recomputing.
 *
 * Search. For each combination the plan without recomputation is played first; recomputation only adds
 * work (a stage's recomputation runs before its B or B_in: its forward again), and a fixed order's
 * makespan does not shrink when an operation grows, so subsets are tried only where that plan does not
 * fit and could still beat the best so far, only of the stages that hold less recomputing, and a subset
 * is played only when it fits and holds no fitting subset played before (fewest stages first): the
 * fastest fitting subset is always such a one. Every subset for up to PLAN_SUBSETS_ALL such stages, else
 * a growing prefix of them in the order of the bytes they save. Ties keep the plan found first, in a
 * fixed order of enumeration: the same profile gives the same plan.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "model_internal.h"

#define PLAN_SUBSETS_ALL 10 /* up to this many stages every recomputation subset is tried */

/* Every schedule with a fixed rule: the block ones (one stage per thread) first. */
static const mbp_sched_kind kinds[] = {MBP_SCHED_GPIPE, MBP_SCHED_1F1B,	       MBP_SCHED_ZBH1,
				       MBP_SCHED_ZBH2,	MBP_SCHED_INTERLEAVED, MBP_SCHED_LOOPED_BFS,
				       MBP_SCHED_ZBV,	MBP_SCHED_DUALPIPEV};

static bool chunked(mbp_sched_kind k)
{
	return k == MBP_SCHED_INTERLEAVED || k == MBP_SCHED_LOOPED_BFS || k == MBP_SCHED_ZBV ||
	       k == MBP_SCHED_DUALPIPEV;
}

/* Byte counts saturate at UINT64_MAX (a plan that large fits no budget but no limit at all). */
static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* The most bytes stage s holds at once under sc: stash sb from F to its last backward, work buffer wb
 * from its B or B_in to its last backward (B or W). */
static uint64_t stage_peak(const mbp_schedule *sc, unsigned s, uint64_t sb, uint64_t wb)
{
	const mbp_sched_op *ops;
	size_t n = mbp_schedule_stage_ops(sc, s, &ops);
	uint64_t held = 0, peak = 0;
	for (size_t i = 0; i < n; i++) {
		switch (ops[i].kind) {
		case MBP_OP_F:
			held = sat_add(held, sb);
			break;
		case MBP_OP_B:
		case MBP_OP_BIN:
			held = sat_add(held, wb);
			break;
		default:
			break;
		}
		if (held > peak)
			peak = held;
		if (held != UINT64_MAX && (ops[i].kind == MBP_OP_B || ops[i].kind == MBP_OP_W))
			held -= sb + wb; /* what this micro-batch's F (and B or B_in) added */
	}
	return peak;
}

/* One combination (T, S, kind, size, split): its stages' costs and peaks kept and recomputed. */
struct combo {
	unsigned S, T;
	mbp_op_costs keep[MBP_MAX_STAGES], rc[MBP_MAX_STAGES];
	uint64_t pk[MBP_MAX_STAGES], pr[MBP_MAX_STAGES];
};

struct search {
	const mbp_plan_profile *p;
	uint64_t budget;
	mbp_train_plan best, least; /* the fastest that fits; the one of least memory */
	bool have_best, have_least;
	unsigned considered, fitted;
};

/* Play the combination with the stages of mask recomputing; INFINITY when it cannot be played. */
static double play(const mbp_schedule *sc, const struct combo *c, uint64_t mask, double *bubble)
{
	mbp_op_costs costs[MBP_MAX_STAGES];
	for (unsigned s = 0; s < c->S; s++)
		costs[s] = mask >> s & 1 ? c->rc[s] : c->keep[s];
	mbp_sched_sim sim;
	if (mbp_schedule_simulate(sc, costs, c->T, &sim, NULL) < 0)
		return INFINITY;
	*bubble = sim.bubble;
	return sim.makespan;
}

static uint64_t act_of(const struct combo *c, uint64_t mask, uint64_t *per)
{
	uint64_t sum = 0;
	for (unsigned s = 0; s < c->S; s++) {
		uint64_t b = mask >> s & 1 ? c->pr[s] : c->pk[s];
		if (per)
			per[s] = b;
		sum = sat_add(sum, b);
	}
	return sum;
}

static void fill(mbp_train_plan *o, const struct search *q, const struct combo *c, mbp_sched_kind kind,
		 uint32_t mb, const unsigned *first, uint64_t mask, double step, double bubble)
{
	memset(o, 0, sizeof *o);
	o->stages = c->S;
	o->threads = c->T;
	o->schedule = kind;
	o->mb = mb;
	o->mbs = (q->p->batch + mb - 1) / mb;
	memcpy(o->first, first, (c->S + 1) * sizeof(unsigned));
	o->recompute = mask;
	o->step_ns = step;
	o->bubble = bubble;
	o->act_bytes = act_of(c, mask, o->stage_act_bytes);
	o->state_bytes = q->p->state_bytes;
	o->peak_bytes = sat_add(o->act_bytes, o->state_bytes);
}

/* The subsets of recomputing stages tried for c, in a fixed order: only stages that hold less
 * recomputing (the others would add work and memory), fewest stages first (then by value). Every one of
 * them for up to PLAN_SUBSETS_ALL such stages, else the prefixes of them ordered by the bytes recomputing
 * saves (ties: the earlier stage). Recomputing more stages never shortens the step, so of the subsets
 * that fit only those with no fitting subset inside them need playing (consider). */
static unsigned subsets(const struct combo *c, uint64_t useful, uint64_t *out)
{
	unsigned n = 0, k = (unsigned)__builtin_popcountll(useful);
	if (k <= PLAN_SUBSETS_ALL) {
		for (unsigned bits = 1; bits <= k; bits++) /* every submask of useful, by its stage count */
			for (uint64_t m = useful; m; m = (m - 1) & useful)
				if ((unsigned)__builtin_popcountll(m) == bits)
					out[n++] = m;
		/* the submask walk runs downwards: each count's run ascending instead */
		for (unsigned i = 0, j; i < n; i = j) {
			for (j = i; j < n && __builtin_popcountll(out[j]) == __builtin_popcountll(out[i]);
			     j++)
				;
			for (unsigned x = i, y = j - 1; x < y; x++, y--) {
				uint64_t t = out[x];
				out[x] = out[y];
				out[y] = t;
			}
		}
		return n;
	}
	unsigned ord[MBP_MAX_STAGES], no = 0;
	for (unsigned s = 0; s < c->S; s++)
		if (useful >> s & 1)
			ord[no++] = s;
	for (unsigned i = 1; i < no; i++) /* insertion sort: stable, so ties stay in stage order */
		for (unsigned j = i; j > 0; j--) {
			uint64_t a = c->pk[ord[j]] - c->pr[ord[j]], b = c->pk[ord[j - 1]] - c->pr[ord[j - 1]];
			if (a <= b)
				break;
			unsigned t = ord[j];
			ord[j] = ord[j - 1];
			ord[j - 1] = t;
		}
	uint64_t m = 0;
	for (unsigned i = 0; i < no; i++)
		out[n++] = m |= 1ull << ord[i];
	return n;
}

static void consider(struct search *q, const mbp_schedule *sc, const struct combo *c, mbp_sched_kind kind,
		     uint32_t mb, const unsigned *first, uint64_t *masks)
{
	/* least memory: each stage's smaller choice (recompute only where it holds strictly less) */
	uint64_t lm = 0;
	for (unsigned s = 0; s < c->S; s++)
		if (c->pr[s] < c->pk[s])
			lm |= 1ull << s;
	uint64_t lbytes = sat_add(act_of(c, lm, NULL), q->p->state_bytes);
	double bub = 0, t;
	if (!q->have_least || lbytes < q->least.peak_bytes) {
		t = play(sc, c, lm, &bub);
		if (isfinite(t)) {
			fill(&q->least, q, c, kind, mb, first, lm, t, bub);
			q->have_least = true;
		}
	}
	q->considered++;
	double t0 = play(sc, c, 0, &bub);
	bool fits = sat_add(act_of(c, 0, NULL), q->p->state_bytes) <= q->budget;
	q->fitted += isfinite(t0) && fits;
	if (!isfinite(t0) || (q->have_best && !(t0 < q->best.step_ns)))
		return; /* no subset of it can be faster than the best so far */
	if (fits) {
		fill(&q->best, q, c, kind, mb, first, 0, t0, bub);
		q->have_best = true;
		return;
	}
	if (lbytes > q->budget)
		return; /* not even the least of it fits */
	unsigned n = subsets(c, lm, masks), nfit = 0;
	uint64_t *fit = masks + n; /* the fitting subsets played so far */
	for (unsigned i = 0; i < n; i++) {
		bool inside = false;
		for (unsigned f = 0; f < nfit && !inside; f++)
			inside = (fit[f] & ~masks[i]) == 0;
		if (inside || sat_add(act_of(c, masks[i], NULL), q->p->state_bytes) > q->budget)
			continue;
		fit[nfit++] = masks[i];
		q->considered++;
		q->fitted++;
		t = play(sc, c, masks[i], &bub);
		if (isfinite(t) && (!q->have_best || t < q->best.step_ns)) {
			fill(&q->best, q, c, kind, mb, first, masks[i], t, bub);
			q->have_best = true;
		}
	}
}

/* The stage costs and peaks of a split under sc at size mb (profile row k). */
static void combo_fill(struct combo *c, const mbp_plan_profile *p, const mbp_schedule *sc, unsigned k,
		       uint32_t mb, const unsigned *first)
{
	const mbp_op_costs *row = p->cost + (size_t)k * p->layers;
	for (unsigned s = 0; s < c->S; s++) {
		mbp_op_costs sum = {0, 0, 0};
		uint64_t bytes = 0;
		for (unsigned i = first[s]; i < first[s + 1]; i++) {
			sum.f += row[i].f;
			sum.b_in += row[i].b_in;
			sum.b_w += row[i].b_w;
			bytes += p->keep_bytes[i] + (i + 1 < first[s + 1] ? p->out_bytes[i] : 0); /* < 2^50 */
		}
		c->keep[s] = (mbp_op_costs){sum.f + p->op_ns, sum.b_in + p->op_ns, sum.b_w};
		c->rc[s] = c->keep[s];
		c->rc[s].b_in += sum.f; /* the recomputation runs before the B or B_in it serves */
		c->pk[s] = stage_peak(sc, s, mbp__mul_sat(bytes, mb), 0);
		c->pr[s] = stage_peak(sc, s, 0, mbp__mul_sat(bytes, mb));
	}
}

static int check_profile(const mbp_plan_profile *p)
{
	if (!p->layers || !p->sizes || p->sizes > MBP_PLAN_MAX_SIZES || !p->mb || !p->cost ||
	    !p->keep_bytes || !p->out_bytes || !p->batch || !isfinite(p->op_ns) || p->op_ns < 0)
		return -EINVAL;
	for (unsigned k = 0; k < p->sizes; k++) {
		if (!p->mb[k] || (k && p->mb[k] <= p->mb[k - 1]))
			return -EINVAL;
		for (unsigned i = 0; i < p->layers; i++) {
			const mbp_op_costs *c = &p->cost[(size_t)k * p->layers + i];
			if (!isfinite(c->f) || !isfinite(c->b_in) || !isfinite(c->b_w) || c->f < 0 ||
			    c->b_in < 0 || c->b_w < 0)
				return -EINVAL;
		}
	}
	for (unsigned i = 0; i < p->layers; i++) /* bytes per row, at most a micro-batch's worth of floats */
		if (p->keep_bytes[i] > (1ull << 40) || p->out_bytes[i] > (1ull << 40))
			return -EINVAL;
	return 0;
}

int mbp_mlp_plan(const mbp_plan_profile *p, uint64_t budget, unsigned threads, mbp_train_plan *out,
		 uint64_t *need)
{
	if (!p || !out || !budget || !threads || threads > MBP_MAX_STAGES)
		return -EINVAL;
	int rc = check_profile(p);
	if (rc < 0)
		return rc;
	struct search q = {.p = p, .budget = budget};
	unsigned L = p->layers;
	double *cost = malloc(2 * (size_t)L * sizeof(*cost));
	struct combo *c = malloc(sizeof(*c));
	/* the subsets tried and the fitting ones among them: at most 2^PLAN_SUBSETS_ALL or a prefix a stage */
	size_t nm = (1u << PLAN_SUBSETS_ALL) + MBP_MAX_STAGES;
	uint64_t *masks = malloc(2 * nm * sizeof(*masks));
	if (!cost || !c || !masks) {
		rc = -ENOMEM;
		goto out;
	}
	for (unsigned T = 1; T <= threads; T++)
		for (unsigned ki = 0; ki < sizeof kinds / sizeof kinds[0]; ki++) {
			mbp_sched_kind kind = kinds[ki];
			unsigned S = chunked(kind) ? 2 * T : T;
			if (S > L || S > MBP_MAX_STAGES)
				continue;
			for (unsigned k = 0; k < p->sizes; k++) {
				uint32_t mb = p->mb[k];
				if (mb > p->batch)
					break;
				uint32_t M = (p->batch + mb - 1) / mb;
				if (M > MBP_TRAIN_MAX_MBS)
					continue;
				mbp_schedule *sc;
				rc = mbp_schedule_new_placed(&sc, kind, S, M, chunked(kind) ? T : 0);
				if (rc == -ENOMEM)
					goto out;
				if (rc < 0) /* a placement this kind cannot make (dualpipev: M < S) */
					continue;
				mbp_model_plan split[2];
				const mbp_op_costs *row = p->cost + (size_t)k * L;
				for (unsigned i = 0; i < L; i++) {
					cost[i] = row[i].f + row[i].b_in + row[i].b_w;
					cost[L + i] = cost[i] + row[i].f;
				}
				for (unsigned v = 0; v < 2 && rc >= 0; v++)
					rc = mbp_model_partition(cost + v * L, NULL, L, S, &split[v]);
				for (unsigned v = 0; v < 2 && rc >= 0; v++) {
					if (v && !memcmp(split[0].first, split[1].first,
							 (S + 1) * sizeof(unsigned)))
						continue;
					c->S = S;
					c->T = T;
					combo_fill(c, p, sc, k, mb, split[v].first);
					consider(&q, sc, c, kind, mb, split[v].first, masks);
				}
				mbp_schedule_destroy(sc);
				if (rc < 0)
					goto out;
			}
		}
	rc = 0;
	if (q.have_best) {
		*out = q.best;
	} else if (q.have_least) {
		*out = q.least;
		rc = -ENOSPC;
	} else {
		rc = -EINVAL; /* no schedule could be placed at any size */
	}
	if (rc == 0 || rc == -ENOSPC) {
		out->considered = q.considered;
		out->fitted = q.fitted;
		if (need)
			*need = q.least.peak_bytes;
	}
out:
	free(cost);
	free(c);
	free(masks);
	return rc;
}

int mbp_mlp_plan_predict(const mbp_plan_profile *p, mbp_train_plan *pl)
{
	if (!p || !pl)
		return -EINVAL;
	int rc = check_profile(p);
	if (rc < 0)
		return rc;
	unsigned k = 0, S = pl->stages, T = pl->threads, L = p->layers;
	while (k < p->sizes && p->mb[k] != pl->mb)
		k++;
	bool known = false;
	for (unsigned i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
		known |= kinds[i] == pl->schedule;
	if (k == p->sizes || pl->mb > p->batch || !known || !T || S != (chunked(pl->schedule) ? 2 * T : T) ||
	    S > L || S > MBP_MAX_STAGES || pl->first[0] != 0 || pl->first[S] != L ||
	    (S < 64 && pl->recompute >> S))
		return -EINVAL;
	for (unsigned s = 0; s < S; s++)
		if (pl->first[s + 1] <= pl->first[s])
			return -EINVAL;
	uint32_t M = (p->batch + pl->mb - 1) / pl->mb;
	if (M > MBP_TRAIN_MAX_MBS)
		return -EINVAL;
	mbp_schedule *sc;
	rc = mbp_schedule_new_placed(&sc, pl->schedule, S, M, chunked(pl->schedule) ? T : 0);
	if (rc < 0)
		return rc;
	struct combo *c = malloc(sizeof(*c));
	if (!c) {
		mbp_schedule_destroy(sc);
		return -ENOMEM;
	}
	c->S = S;
	c->T = T;
	combo_fill(c, p, sc, k, pl->mb, pl->first);
	double bubble = 0, t = play(sc, c, pl->recompute, &bubble);
	if (isfinite(t)) {
		struct search q = {.p = p};
		unsigned first[MBP_MAX_STAGES + 1];
		memcpy(first, pl->first, sizeof first);
		fill(pl, &q, c, pl->schedule, pl->mb, first, pl->recompute, t, bubble);
		pl->considered = pl->fitted = 1;
	}
	free(c);
	mbp_schedule_destroy(sc);
	return isfinite(t) ? 0 : -EINVAL;
}
