/*
 * Rebalancing the model's stages while they run: each layer timed where it runs, a look every window on
 * stage 0, and plans that micro-batches carry.
 *
 * Measurement. Every thread adds each layer's time (or what the cost hook says) and a count to its own
 * row of counters, [thread][layer], the threads numbered stage by stage and replica by replica within a
 * stage (row0[s] + replica): one writer per counter, so the replicas of a stage, which compute the same
 * layers at once, never share one (and a layer runs on whichever stage its micro-batch's plan gives it,
 * so around a move two stages time the same layer, each in its own rows). A look sums the rows and takes
 * the difference with its previous look: the cost of each layer per micro-batch on one thread over the
 * window. A window in which some layer was not measured yet (the stages downstream lag stage 0 by the
 * micro-batches in flight) is not looked at: the next look covers it too.
 *
 * Decision (mbp_model_rebalance_look, public so that a caller measuring by other means, pipetrain
 * --rebalance, decides by the same rule). Under the plan in use the measured costs give each stage's time
 * per micro-batch, its cost over its active replicas (a stage of r threads takes r micro-batches at once);
 * the fresh plan for the same costs is mbp__partition_fixed's, the best boundaries for the same replica
 * counts stage position by position (threads are made at start and a running stage keeps them: a layer
 * that got dear can move onto a replicated stage, but a replica cannot move to another stage), or, where
 * stages were made with threads to spare (o.replicas) and are attached to their pipeline,
 * mbp__partition_capped's: the boundaries and the active replicas together, each stage at most its
 * threads, and a move then sets the counts (mbp_pipeline_replicas_set: an inactive replica parks before
 * it claims, so nothing it held is lost). A move needs the slowest stage above (1 + threshold) times
 * the fresh plan's slowest, a fresh plan that cuts elsewhere, and both for `patience` looks in a row with
 * the same fresh plan each time (hysteresis: a window straddling a change of cost does not move alone, and
 * noise, which draws a different "better" plan at each look, seldom moves at all).
 *
 * Plans. The plan in use belongs to stage 0, whose replicas (when it has several) admit under
 * admit_lock: the count, the looks, the plan a micro-batch gets and the on_move calls are theirs in turn.
 * A new plan is written before the first micro-batch that carries it is pushed to the next stage, whose
 * ring hands it over with the micro-batch (the ring's release and acquire; the ordered merge of a
 * replicated stage hands it on the same way). Plans are never freed before the stages object: a
 * micro-batch may carry an old one for as long as it is in flight, and moves are few.
 */
#include "config.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "rebalance.h"
#include "strbuf.h"

#define DEFAULT_WINDOW	  64
#define DEFAULT_THRESHOLD 0.10
#define DEFAULT_PATIENCE  2

/* One layer's counters in one thread's row: written by that thread only. */
struct acc {
	_Atomic uint64_t ns, mbs;
};

struct mbp__rb {
	mbp_model *m;
	unsigned S, L;
	mbp_model_rebalance o;
	unsigned threads[MBP_MAX_STAGES]; /* each stage's, made at start: the most it may have active */
	unsigned want[MBP_MAX_STAGES];	  /* the first plan's replicas: the active ones once attached */
	unsigned cpus;			  /* the CPUs the active replicas share (0: no limit) */
	mbp_pipeline *p;		  /* attached (set before start): moves may change the counts */
	bool resize;			  /* attached with o.replicas: moves re-plan the counts */
	struct acc *acc; /* a row of `stride` entries per thread, each row on cache lines of its own */
	size_t stride;
	unsigned row0[MBP_MAX_STAGES + 1]; /* stage s's threads' rows: [row0[s], row0[s + 1]) */
	/* stage 0's, under admit_lock (its replicas admit in turn) */
	pthread_mutex_t admit_lock;
	struct mbp__rb_plan *cur; /* the newest plan: the list of every plan made, through `older` */
	mbp_model_plan cur_plan;  /* cur with its prediction */
	uint64_t admitted;
	mbp_model_rebalance_rule rule;			 /* threshold, patience and the strikes so far */
	uint64_t *seen_ns, *seen_mbs, *now_ns, *now_mbs; /* L each */
	double *cost, *handoff;				 /* L each */
	/* the statistics, copied out under the lock */
	pthread_mutex_t lock;
	mbp_model_rebalance_stats st;
};

unsigned mbp__rb_threads(const mbp_model_plan *plan, const mbp_model_rebalance *o, unsigned s)
{
	unsigned r = plan->replicas[s] ? plan->replicas[s] : 1;
	return o && o->on && o->replicas > r ? o->replicas : r;
}

/* The CPUs of a move's plan: the option, else those this process may use under its quota (0: unknown,
 * no limit). */
static unsigned plan_cpus(const mbp_model_rebalance *o)
{
	if (o->cpus)
		return o->cpus;
	unsigned quota = 0;
	int n = mbp_cpus_allowed(NULL, 0, &quota);
	if (n <= 0)
		return 0;
	return quota && quota < (unsigned)n ? quota : (unsigned)n;
}

struct mbp__rb *mbp__rb_new(mbp_model *m, const mbp_model_plan *plan, const mbp_model_rebalance *o,
			    const unsigned *threads)
{
	struct mbp__rb *rb = calloc(1, sizeof(*rb));
	if (!rb)
		return NULL;
	rb->m = m;
	rb->S = plan->stages;
	rb->L = plan->layers;
	rb->o = *o;
	rb->o.window = o->window ? o->window : DEFAULT_WINDOW;
	rb->o.threshold = o->threshold > 0 ? o->threshold : DEFAULT_THRESHOLD;
	rb->o.patience = o->patience ? o->patience : DEFAULT_PATIENCE;
	size_t per_line = MBP_CACHELINE / sizeof(struct acc);
	rb->stride = (rb->L + per_line - 1) / per_line * per_line;
	for (unsigned s = 0; s < rb->S; s++) {
		rb->threads[s] = threads[s];
		rb->want[s] = plan->replicas[s] ? plan->replicas[s] : 1;
		rb->row0[s + 1] = rb->row0[s] + threads[s];
	}
	rb->cpus = plan_cpus(o);
	rb->acc = aligned_alloc(MBP_CACHELINE, rb->row0[rb->S] * rb->stride * sizeof(struct acc));
	rb->seen_ns = calloc(4 * (size_t)rb->L, sizeof(uint64_t));
	rb->cost = calloc(2 * (size_t)rb->L, sizeof(double));
	rb->cur = calloc(1, sizeof(*rb->cur));
	if (!rb->acc || !rb->seen_ns || !rb->cost || !rb->cur) {
		mbp__rb_destroy(rb);
		return NULL;
	}
	for (size_t i = 0; i < rb->row0[rb->S] * rb->stride; i++) {
		atomic_init(&rb->acc[i].ns, 0);
		atomic_init(&rb->acc[i].mbs, 0);
	}
	rb->seen_mbs = rb->seen_ns + rb->L;
	rb->now_ns = rb->seen_ns + 2 * (size_t)rb->L;
	rb->now_mbs = rb->seen_ns + 3 * (size_t)rb->L;
	rb->handoff = rb->cost + rb->L;
	for (unsigned l = 0; l + 1 < rb->L; l++)
		rb->handoff[l] = MBP__HANDOFF_FIXED_NS;
	rb->cur->id = 1;
	memcpy(rb->cur->first, plan->first, sizeof(rb->cur->first));
	rb->cur_plan = *plan;
	for (unsigned s = 0; s < rb->S; s++) /* until attached, every thread runs */
		rb->cur_plan.replicas[s] = threads[s];
	rb->rule.threshold = rb->o.threshold;
	rb->rule.patience = rb->o.patience;
	pthread_mutex_init(&rb->lock, NULL);
	pthread_mutex_init(&rb->admit_lock, NULL);
	rb->st.on = true;
	rb->st.plan = 1;
	rb->st.current = rb->cur_plan;
	memcpy(rb->st.threads, rb->threads, sizeof(rb->st.threads));
	return rb;
}

int mbp__rb_attach(struct mbp__rb *rb, mbp_pipeline *p)
{
	for (unsigned s = 0; s < rb->S; s++) {
		int rc = mbp_pipeline_replicas_set(p, s, rb->want[s]);
		if (rc)
			return rc;
	}
	rb->p = p;
	rb->resize = rb->o.replicas > 0;
	/* before start: stage 0's threads, made by the start, see it (thread creation orders it) */
	for (unsigned s = 0; s < rb->S; s++)
		rb->cur_plan.replicas[s] = rb->want[s];
	pthread_mutex_lock(&rb->lock);
	rb->st.current = rb->cur_plan;
	pthread_mutex_unlock(&rb->lock);
	return 0;
}

void mbp__rb_destroy(struct mbp__rb *rb)
{
	if (!rb)
		return;
	for (struct mbp__rb_plan *p = rb->cur, *older; p; p = older) {
		older = p->older;
		free(p);
	}
	if (rb->acc) { /* else the locks were never made */
		pthread_mutex_destroy(&rb->lock);
		pthread_mutex_destroy(&rb->admit_lock);
	}
	free(rb->acc);
	free(rb->seen_ns);
	free(rb->cost);
	free(rb);
}

/* A cost as counted: whole nanoseconds, 0 for a negative or NaN one, at most 10^18 (31 years). */
static uint64_t cost_ns(double t)
{
	if (!(t > 0))
		return 0;
	return t < 1e18 ? (uint64_t)llround(t) : UINT64_C(1000000000000000000);
}

void mbp__rb_run(struct mbp__rb *rb, unsigned stage, unsigned replica, const struct mbp__version *v,
		 unsigned a, unsigned b, const mbp_mb *in, float *y, float *s0, float *s1)
{
	const mbp_model *m = rb->m;
	MBP_VERIFY(rb->row0[stage] + replica < rb->row0[stage + 1]);
	struct acc *row = &rb->acc[(size_t)(rb->row0[stage] + replica) * rb->stride];
	const float *cur = in->data;
	for (unsigned i = a; i < b; i++) {
		/* the buffers of mbp__layers_run_lw, in its order: the same calls, the same bits */
		float *dst = i + 1 == b ? y : ((i - a) & 1) ? s1 : s0;
		uint64_t t0 = mbp__clock_ns();
		mbp__layer_run(&m->l[i], &v->lw[i], cur, dst, in->rows);
		double t = (double)(mbp__clock_ns() - t0);
		if (rb->o.cost)
			t = rb->o.cost(rb->o.cost_arg, stage, i, in, t);
		mbp__counter_add(&row[i].ns, cost_ns(t));
		mbp__counter_add(&row[i].mbs, 1);
		cur = dst;
	}
}

static void describe_range(char *buf, size_t n, unsigned a, unsigned b)
{
	if (b - a == 1)
		snprintf(buf, n, "layer %u", a);
	else
		snprintf(buf, n, "layers %u-%u", a, b - 1);
}

static unsigned replicas_of(const mbp_model_plan *p, unsigned s)
{
	return p->replicas[s] ? p->replicas[s] : 1;
}

/* Every stage with as many replicas in a as in b (0 read as 1). */
static bool same_replicas(const mbp_model_plan *a, const mbp_model_plan *b)
{
	for (unsigned s = 0; s < a->stages; s++)
		if (replicas_of(a, s) != replicas_of(b, s))
			return false;
	return true;
}

static bool plans_match(const mbp_model_plan *a, const mbp_model_plan *b)
{
	return a->stages == b->stages && a->layers == b->layers && a->stages >= 1 &&
	       a->stages <= MBP_MAX_STAGES;
}

static double rule_threshold(const mbp_model_rebalance_rule *r)
{
	return r->threshold > 0 ? r->threshold : DEFAULT_THRESHOLD;
}

int mbp_model_rebalance_look(mbp_model_rebalance_rule *r, const mbp_model_plan *measured,
			     const mbp_model_plan *fresh)
{
	if (!r || !measured || !fresh || !plans_match(measured, fresh) || !isfinite(r->threshold) ||
	    r->threshold < 0)
		return -EINVAL;
	const size_t cuts = (measured->stages + 1) * sizeof(fresh->first[0]);
	bool elsewhere = memcmp(fresh->first, measured->first, cuts) != 0 || !same_replicas(measured, fresh);
	bool excess = measured->slowest_ns > (1.0 + rule_threshold(r)) * fresh->slowest_ns;
	/* hysteresis: the same better plan, look after look (noise draws a different one each time) */
	bool same = r->strikes && !memcmp(fresh->first, r->candidate, cuts);
	for (unsigned s = 0; s < fresh->stages; s++)
		same = same &&
		       replicas_of(fresh, s) == (r->candidate_replicas[s] ? r->candidate_replicas[s] : 1);
	r->strikes = !(elsewhere && excess) ? 0 : same ? r->strikes + 1 : 1;
	memset(r->candidate, 0, sizeof(r->candidate));
	memcpy(r->candidate, fresh->first, cuts);
	memset(r->candidate_replicas, 0, sizeof(r->candidate_replicas));
	for (unsigned s = 0; s < fresh->stages; s++)
		r->candidate_replicas[s] = replicas_of(fresh, s);
	if (r->strikes < (r->patience ? r->patience : DEFAULT_PATIENCE))
		return 0;
	r->strikes = 0;
	return 1;
}

/* The slowest stage measured, the fresh plan's slowest and cuts. */
int mbp_model_rebalance_reason(const mbp_model_rebalance_rule *r, const mbp_model_plan *measured,
			       const mbp_model_plan *fresh, double planned_ns, char *buf, size_t n)
{
	if (!r || !measured || !fresh || !plans_match(measured, fresh) || (!buf && n))
		return -EINVAL;
	unsigned worst = 0;
	for (unsigned s = 1; s < measured->stages; s++)
		if (measured->stage_ns[s] / replicas_of(measured, s) >
		    measured->stage_ns[worst] / replicas_of(measured, worst))
			worst = s;
	char range[40], reps[16] = "";
	describe_range(range, sizeof(range), measured->first[worst], measured->first[worst + 1]);
	if (replicas_of(measured, worst) > 1)
		snprintf(reps, sizeof(reps), " x%u", replicas_of(measured, worst));
	struct mbp__strbuf b = mbp__strbuf_fixed(buf, n);
	mbp__strbuf_printf(&b, "stage %u (%s)%s %.1f us > %.2f x %.1f us of a plan cutting before layer%s",
			   worst, range, reps, measured->slowest_ns / 1e3, 1.0 + rule_threshold(r),
			   fresh->slowest_ns / 1e3, fresh->stages > 2 ? "s" : "");
	for (unsigned s = 1; s < fresh->stages; s++)
		mbp__strbuf_printf(&b, "%s %u", s > 1 ? "," : "", fresh->first[s]);
	if (!same_replicas(measured, fresh)) /* a move of the active replicas too */
		for (unsigned s = 0; s < fresh->stages; s++)
			mbp__strbuf_printf(&b, "%s%u", s ? "," : " with replicas ", replicas_of(fresh, s));
	if (planned_ns > 0) /* a plan made without costs predicted nothing */
		mbp__strbuf_printf(&b, " (planned %.1f us)", planned_ns / 1e3);
	return (int)b.len;
}

/* A look at the window since the last one; moves to a fresh plan when the rule says so. */
static void look(struct mbp__rb *rb)
{
	const unsigned L = rb->L, S = rb->S;
	for (unsigned l = 0; l < L; l++) {
		rb->now_ns[l] = rb->now_mbs[l] = 0;
		for (unsigned t = 0; t < rb->row0[S]; t++) {
			rb->now_ns[l] += mbp__counter_get(&rb->acc[t * rb->stride + l].ns);
			rb->now_mbs[l] += mbp__counter_get(&rb->acc[t * rb->stride + l].mbs);
		}
		if (rb->now_mbs[l] == rb->seen_mbs[l])
			return; /* a layer not measured yet in this window: the next look covers it */
	}
	for (unsigned l = 0; l < L; l++) {
		rb->cost[l] =
		    (double)(rb->now_ns[l] - rb->seen_ns[l]) / (double)(rb->now_mbs[l] - rb->seen_mbs[l]);
		rb->seen_ns[l] = rb->now_ns[l];
		rb->seen_mbs[l] = rb->now_mbs[l];
	}
	mbp_model_plan measured = rb->cur_plan, fresh;
	memcpy(measured.first, rb->cur->first, sizeof(measured.first));
	mbp__plan_cost(&measured, rb->cost, rb->handoff);
	/* the active replicas within each stage's threads, or the same replicas stage by stage */
	int prc = rb->resize
		      ? mbp__partition_capped(rb->cost, rb->handoff, L, S, rb->threads, rb->cpus, &fresh)
		      : mbp__partition_fixed(rb->cost, rb->handoff, L, S, rb->cur_plan.replicas, &fresh);
	if (prc < 0)
		return; /* out of memory: no move this time */
	fresh.mb_rows = rb->cur_plan.mb_rows;
	struct mbp__rb_plan *next = NULL;
	bool resized = false;
	mbp_model_move mv;
	if (mbp_model_rebalance_look(&rb->rule, &measured, &fresh) == 1) {
		next = calloc(1, sizeof(*next));
		if (next) { /* else no move this time */
			memset(&mv, 0, sizeof(mv));
			next->id = rb->cur->id + 1;
			memcpy(next->first, fresh.first, sizeof(next->first));
			next->older = rb->cur;
			mv.plan = next->id;
			mv.admitted = rb->admitted - 1; /* this one is the first under the new plan */
			mv.from = measured;
			mv.to = fresh;
			mv.measured_slowest_ns = measured.slowest_ns;
			mv.predicted_ns = rb->cur_plan.slowest_ns;
			mbp_model_rebalance_reason(&rb->rule, &measured, &fresh, rb->cur_plan.slowest_ns,
						   mv.reason, sizeof(mv.reason));
			rb->cur = next;
			resized = !same_replicas(&rb->cur_plan, &fresh);
			rb->cur_plan = fresh;
			/* the counts after the plan: a micro-batch's cuts are the plan it carries, whichever
			 * replica computes it, so the order of the two does not matter to any result */
			for (unsigned s = 0; resized && s < S; s++) {
				int rc = mbp_pipeline_replicas_set(rb->p, s, replicas_of(&fresh, s));
				MBP_VERIFY(rc == 0); /* at most the threads made (mbp__partition_capped) */
			}
		}
	}
	pthread_mutex_lock(&rb->lock);
	rb->st.windows++;
	for (unsigned s = 0; s < S; s++)
		rb->st.measured_ns[s] = measured.stage_ns[s];
	rb->st.fresh_slowest_ns = fresh.slowest_ns;
	if (next) {
		rb->st.plan = next->id;
		rb->st.moves++;
		rb->st.replica_moves += resized;
		rb->st.current = fresh;
		memcpy(rb->st.last_reason, mv.reason, sizeof(mv.reason));
		for (unsigned s = 0; s < S; s++) /* the new plan is not measured yet */
			rb->st.measured_ns[s] = 0;
	}
	pthread_mutex_unlock(&rb->lock);
	if (next && rb->o.on_move)
		rb->o.on_move(rb->o.on_move_arg, &mv);
}

const struct mbp__rb_plan *mbp__rb_admit(struct mbp__rb *rb)
{
	/* a lock, not atomics: a look reads and writes more than a word, and it comes once a window; the
	 * replicas of stage 0 wait for it (and for on_move) then */
	pthread_mutex_lock(&rb->admit_lock);
	if (MBP_UNLIKELY(++rb->admitted % rb->o.window == 0))
		look(rb);
	const struct mbp__rb_plan *p = rb->cur;
	pthread_mutex_unlock(&rb->admit_lock);
	return p;
}

int mbp__rb_stats(struct mbp__rb *rb, mbp_model_rebalance_stats *out)
{
	pthread_mutex_lock(&rb->lock);
	*out = rb->st;
	pthread_mutex_unlock(&rb->lock);
	return 0;
}
