/*
 * Rebalancing the model's stages while they run: each layer timed where it runs, counted in the window
 * its micro-batch was admitted in, a look at every window once all of it has left the pipeline, and
 * plans that micro-batches carry.
 *
 * Windows. Stage 0 admits micro-batches into windows of `window` in turn (struct mbp__rb_win): every
 * micro-batch of a window is computed with the window's plan (a move opens the next window), and carries
 * its window (mb->carry_plan) from stage to stage. A window holds a row of counters per thread, [thread]
 * [layer], the threads numbered stage by stage and replica by replica within a stage (row0[s] + replica):
 * one writer per counter, so the replicas of a stage, which compute the same layers at once, never share
 * one. Every thread adds each layer's time (or what the cost hook says) and a count to its row of the
 * micro-batch's window, and the thread that completes a micro-batch (stage 0's done hook, on a replica of
 * the last stage) counts it done in its row. A window is done when its micro-batches counted done are
 * all it admitted: then every layer of each of them was measured, whatever stage ran it, and its costs
 * are those of its own micro-batches and no other's, however far the stages downstream lag stage 0 (the
 * micro-batches in flight). A failed micro-batch is counted done too, measured where it ran. Windows are
 * made as a window fills and none is free, reused once done (a few: the lag; at most MAX_PENDING wait),
 * so a look never waits and the counting never allocates.
 *
 * Looks. When a window fills, stage 0 looks at the full windows not looked at yet, oldest first, and
 * decides on each one done (windows are done in about the order admitted, as their micro-batches
 * leave), and reuses it; one not done yet waits for a later look. A window is looked at only under the plan in use: the
 * windows admitted before a move, done after it, measured a plan no longer in use (a layer on another
 * stage, another core) and are not. The newest windows of a stream, not done at its last look, are never
 * looked at; nor is a window that is never done (a micro-batch whose done hook did not run).
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
 * the fresh plan's slowest, a fresh plan that cuts elsewhere, and both for `patience` windows in a row
 * with the same fresh plan each time (hysteresis: the one window straddling a change of cost does not
 * move alone, and noise, which draws a different "better" plan at each look, seldom moves at all).
 *
 * Plans. The plan in use belongs to stage 0, whose replicas (when it has several) admit under
 * admit_lock: the count, the windows, the looks, the plan a window gets and the on_move calls are theirs
 * in turn. A window (its plan, its counters zeroed) is written before the first micro-batch that carries
 * it is pushed to the next stage, whose ring hands it over with the micro-batch (the ring's release and
 * acquire; the ordered merge of a replicated stage hands it on the same way). Plans are never freed
 * before the stages object: a micro-batch may carry an old one for as long as it is in flight, and moves
 * are few. Windows are freed with it too.
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
/* Full windows not done yet, at most: past them the open window takes more micro-batches (looked at
 * later, as one window), so that windows whose micro-batches never all leave (stage functions called
 * outside a pipeline, without the done hook) cannot make windows without end. The stages downstream
 * lag stage 0 by a few windows: the micro-batches in flight. */
#define MAX_PENDING 64

/* One layer's counters in one thread's row of a window: written by that thread only. The row's entry
 * `L` (after the layers) counts in mbs the micro-batches this thread completed. */
struct mbp__rb_acc {
	_Atomic uint64_t ns, mbs;
};

struct mbp__rb {
	mbp_model *m;
	unsigned S, L;
	mbp_model_rebalance o;
	unsigned threads[MBP_MAX_STAGES];  /* each stage's, made at start: the most it may have active */
	unsigned want[MBP_MAX_STAGES];	   /* the first plan's replicas: the active ones once attached */
	unsigned cpus;			   /* the CPUs the active replicas share (0: no limit) */
	mbp_pipeline *p;		   /* attached (set before start): moves may change the counts */
	bool resize;			   /* attached with o.replicas: moves re-plan the counts */
	size_t stride;			   /* a window's row: L + 1 entries, on cache lines of its own */
	unsigned row0[MBP_MAX_STAGES + 1]; /* stage s's threads' rows: [row0[s], row0[s + 1]) */
	/* stage 0's, under admit_lock (its replicas admit in turn): written at each admission, a line
	 * away from the fields above, which every stage reads at each micro-batch */
	char gap[MBP_CACHELINE];
	pthread_mutex_t admit_lock;
	struct mbp__rb_plan *cur;      /* the newest plan: the list of every plan made, through `older` */
	mbp_model_plan cur_plan;       /* cur with its prediction */
	uint64_t admitted, open_since; /* micro-batches admitted: all, before `open` */
	struct mbp__rb_win *open;      /* the window being filled */
	struct mbp__rb_win *pending, **pending_end; /* full, not looked at yet: oldest first */
	unsigned npending;
	struct mbp__rb_win *spare;     /* looked at (or skipped): free to reuse */
	struct mbp__rb_win *made;      /* every window made */
	mbp_model_rebalance_rule rule; /* threshold, patience and the strikes so far */
	double *cost, *handoff;	       /* L each */
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

/* A window's rows of counters, zeroed: a new window, or one of `spare` (NULL: out of memory). Its plan,
 * number and count are the caller's to set. */
static struct mbp__rb_win *win_take(struct mbp__rb *rb)
{
	struct mbp__rb_win *w = rb->spare;
	const size_t n = rb->row0[rb->S] * rb->stride;
	if (w) {
		rb->spare = w->next;
	} else {
		const size_t head = (sizeof(*w) + MBP_CACHELINE - 1) / MBP_CACHELINE * MBP_CACHELINE;
		w = aligned_alloc(MBP_CACHELINE, head + n * sizeof(struct mbp__rb_acc));
		if (!w)
			return NULL;
		w->acc = (struct mbp__rb_acc *)((char *)w + head); /* the rows on lines of their own */
		w->made = rb->made;
		rb->made = w;
	}
	/* relaxed: nobody else holds w (new, or every micro-batch of it has left: look's acquire of the
	 * counts done); the ring that hands its first micro-batch on orders these before any other
	 * thread's counts */
	for (size_t i = 0; i < n; i++) {
		atomic_store_explicit(&w->acc[i].ns, 0, memory_order_relaxed);
		atomic_store_explicit(&w->acc[i].mbs, 0, memory_order_relaxed);
	}
	w->next = NULL;
	w->admitted = 0; /* set when full */
	return w;
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
	size_t per_line = MBP_CACHELINE / sizeof(struct mbp__rb_acc);
	rb->stride = (rb->L + 1 + per_line - 1) / per_line * per_line; /* the layers, then done */
	for (unsigned s = 0; s < rb->S; s++) {
		rb->threads[s] = threads[s];
		rb->want[s] = plan->replicas[s] ? plan->replicas[s] : 1;
		rb->row0[s + 1] = rb->row0[s] + threads[s];
	}
	rb->cpus = plan_cpus(o);
	rb->pending_end = &rb->pending;
	rb->cost = calloc(2 * (size_t)rb->L, sizeof(double));
	rb->cur = calloc(1, sizeof(*rb->cur));
	if (!rb->cost || !rb->cur || !(rb->open = win_take(rb))) {
		mbp__rb_destroy(rb);
		return NULL;
	}
	rb->handoff = rb->cost + rb->L;
	for (unsigned l = 0; l + 1 < rb->L; l++)
		rb->handoff[l] = MBP__HANDOFF_FIXED_NS;
	rb->cur->id = 1;
	memcpy(rb->cur->first, plan->first, sizeof(rb->cur->first));
	rb->open->plan = rb->cur;
	rb->open->n = 0;
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
	for (struct mbp__rb_win *w = rb->made, *made; w; w = made) {
		made = w->made;
		free(w);
	}
	if (rb->open) { /* else the locks were never made */
		pthread_mutex_destroy(&rb->lock);
		pthread_mutex_destroy(&rb->admit_lock);
	}
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

void mbp__rb_run(struct mbp__rb *rb, const struct mbp__rb_win *w, unsigned stage, unsigned replica,
		 const struct mbp__version *v, unsigned a, unsigned b, const mbp_mb *in, float *y, float *s0,
		 float *s1)
{
	const mbp_model *m = rb->m;
	MBP_VERIFY(rb->row0[stage] + replica < rb->row0[stage + 1]);
	struct mbp__rb_acc *row = &w->acc[(size_t)(rb->row0[stage] + replica) * rb->stride];
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

void mbp__rb_done(struct mbp__rb *rb, const struct mbp__rb_win *w)
{
	/* the thread that completes a micro-batch is one of the last stage's (or, on a stage 0 that is
	 * also the last, one of its): its own row */
	const unsigned row = rb->row0[rb->S - 1] + mbp_stage_replica();
	MBP_VERIFY(row < rb->row0[rb->S]);
	_Atomic uint64_t *done = &w->acc[(size_t)row * rb->stride + rb->L].mbs;
	/* release: partner win_done's acquire; every count of this micro-batch is before it, this
	 * thread's and, through the rings and merges that handed it here, every stage's before it.
	 * Relaxed load: only this thread writes it. */
	atomic_store_explicit(done, atomic_load_explicit(done, memory_order_relaxed) + 1,
			      memory_order_release);
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

/* Whether every micro-batch window w admitted has left the pipeline. */
static bool win_done(const struct mbp__rb *rb, const struct mbp__rb_win *w)
{
	uint64_t done = 0;
	for (unsigned t = 0; t < rb->row0[rb->S]; t++) /* acquire: partner mbp__rb_done's release */
		done += atomic_load_explicit(&w->acc[t * rb->stride + rb->L].mbs, memory_order_acquire);
	return done == w->admitted;
}

/* A look at window w, done and of the plan in use: its costs; a move to a fresh plan when the rule
 * says so (the next window opened is the first of it). */
static void look(struct mbp__rb *rb, const struct mbp__rb_win *w)
{
	const unsigned L = rb->L, S = rb->S;
	for (unsigned l = 0; l < L; l++) {
		uint64_t ns = 0, mbs = 0;
		/* relaxed: win_done's acquire ordered every count of the window before these */
		for (unsigned t = 0; t < rb->row0[S]; t++) {
			ns += mbp__counter_get(&w->acc[t * rb->stride + l].ns);
			mbs += mbp__counter_get(&w->acc[t * rb->stride + l].mbs);
		}
		if (!mbs)
			return; /* a layer never measured (every micro-batch of the window failed first) */
		rb->cost[l] = (double)ns / (double)mbs;
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
			mv.admitted = rb->admitted; /* the next one opens the first window of the new plan */
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

/* The windows full and not looked at yet: each one done is looked at if of the plan in use, and free
 * again either way; the others wait for a later look. */
static void look_at_done(struct mbp__rb *rb)
{
	struct mbp__rb_win **pw = &rb->pending;
	while (*pw) {
		struct mbp__rb_win *w = *pw;
		if (!win_done(rb, w)) {
			pw = &w->next;
			continue;
		}
		*pw = w->next;
		rb->npending--;
		if (w->plan == rb->cur) /* else admitted before a move: it measured another plan */
			look(rb, w);
		w->next = rb->spare;
		rb->spare = w;
	}
	rb->pending_end = pw;
}

/* The open window is full (or has taken another window's worth since): open the next one after a look
 * at the windows done so far. Out of memory, or with MAX_PENDING windows not done, the open one takes
 * another window of micro-batches instead (and is looked at later, as one window). */
static void next_window(struct mbp__rb *rb)
{
	struct mbp__rb_win *w = rb->open, *next = win_take(rb);
	if (!next)
		return;
	if (rb->npending >= MAX_PENDING)
		look_at_done(rb); /* a move only with a window looked at: then there is room */
	if (rb->npending >= MAX_PENDING) {
		next->next = rb->spare;
		rb->spare = next;
		return;
	}
	/* its count, written once: the stages read the line of w's plan at each micro-batch, which a
	 * count kept there at each admission would take from them */
	w->admitted = rb->admitted - rb->open_since;
	*rb->pending_end = w;
	rb->pending_end = &w->next;
	rb->npending++;
	look_at_done(rb);
	next->plan = rb->cur; /* after the look: a move's first window */
	next->n = w->n + 1;
	rb->open = next;
	rb->open_since = rb->admitted;
}

const struct mbp__rb_win *mbp__rb_admit(struct mbp__rb *rb)
{
	/* a lock, not atomics: a look reads and writes more than a word, and it comes once a window; the
	 * replicas of stage 0 wait for it (and for on_move) then */
	pthread_mutex_lock(&rb->admit_lock);
	const uint64_t in_open = rb->admitted - rb->open_since;
	if (MBP_UNLIKELY(in_open >= rb->o.window && in_open % rb->o.window == 0))
		next_window(rb);
	struct mbp__rb_win *w = rb->open;
	rb->admitted++;
	pthread_mutex_unlock(&rb->admit_lock);
	return w;
}

int mbp__rb_stats(struct mbp__rb *rb, mbp_model_rebalance_stats *out)
{
	pthread_mutex_lock(&rb->lock);
	*out = rb->st;
	pthread_mutex_unlock(&rb->lock);
	return 0;
}
