/*
 * The loop of one worker thread: take input, run the stage (or the consecutive stages this thread runs,
 * one calling the next), hand the result on, account the time.
 *
 * Stage 0 takes entries from the multi-producer ingress: a job (split here into micro-batches that read the
 * caller's input in place) or a caller's single micro-batch. The first stage of every other thread pops
 * bursts from its input ring. Every stage except the last writes into a buffer from its thread's pool cache,
 * releases its input into that cache (so the next get returns the buffer it just read, still hot) and hands
 * the output on: into the next ring, or by calling the next stage when this thread runs it. The last stage
 * writes the caller's memory directly: the job's output rows, or the caller's own buffer for a single
 * micro-batch, and completes.
 *
 * A failed micro-batch (a stage returned an error, or the pipeline is being cancelled) is not computed
 * again: it travels on with its status so that completion stays in order and in one place.
 *
 * The thread itself is the pipeline's crew's (crew.h): placement, pin, name, pool cache, the init/fini rule
 * and the start handshake; what this file gives the crew is the loop above (mbp__worker_run).
 *
 * Replicas (mbp_stage_desc.replicas): each replica is a thread of its own running this same loop on its
 * own copy of the stage (pipeline_internal.h), and the hops on either side of a replicated stage are
 * sequenced windows (seqwin.h): replicas claim the next micro-batch with one atomic increment (whichever is
 * free), put each result at its stream index, and the stage after takes them in that order (the ordered
 * merge); after a replicated last stage, whoever puts a result completes, in order, what is there. A
 * replicated stage 0 takes the next micro-batch of the ingress's stream under a lock (feed_claim). With
 * replicas of 1 everywhere none of this runs: the rings and the loop are those of before.
 *
 * Time accounting (single writer, this thread): busy = inside the stage function; starved = waiting for
 * input (charged to the thread's first stage); blocked = waiting for room downstream (its last stage) or
 * for a buffer (the stage that asked); parked = an inactive replica asleep until it is made active or
 * shutdown wakes it. Each is counted where the thread enters and leaves the state, so the four add up to
 * the thread's time but for the engine's own work between states (hand-offs, completion).
 */
#include "config.h"

#include <errno.h>
#include <string.h>

#include "job.h"
#include "pipeline_internal.h"

#define BURST 8

static inline bool cancelled(const struct mbp_pipeline *p)
{
	/* relaxed: a hint checked once per micro-batch; cancel() joins the threads afterwards */
	return atomic_load_explicit(&((struct mbp_pipeline *)p)->cancel, memory_order_relaxed) != 0;
}

/* ---- time accounting ---- */

/* Enter a timed state (busy, starved, blocked) at t0. */
static inline void state_begin(_Atomic uint64_t *since, uint64_t t0)
{
	/* relaxed: read by stats snapshots only, ordered against the total by state_end's release */
	atomic_store_explicit(since, t0, memory_order_relaxed);
}

/* Leave it at t1: clear `since` first, then publish the new total with release; partner: the acquire
 * load of the total in stats.c, after which a reader that sees the new total also sees `since` cleared
 * and does not count the interval twice. */
static inline void state_end(_Atomic uint64_t *since, _Atomic uint64_t *total, uint64_t t0, uint64_t t1)
{
	/* relaxed: `since` is ordered by the release below (partner: stats.c's acquire of the total); the
	 * total's load: only this thread writes it */
	atomic_store_explicit(since, 0, memory_order_relaxed);
	atomic_store_explicit(total, atomic_load_explicit(total, memory_order_relaxed) + (t1 - t0),
			      memory_order_release);
}

/* ---- waiting: one shape for every wait of a worker ---- */

static void flush_cache(void *arg)
{
	struct mbp__stage *s = arg;
	mbp_pool_cache_flush(s->cache); /* going idle: strand no buffer in this cache */
}

/* A wait of this worker: for input (counted as starved) or for room (blocked). The wait itself is the
 * link's or the ingress's own (the backoff of wait.h), handing back cached buffers before parking. */
enum wait_on { WAIT_INGRESS, WAIT_RING_IN, WAIT_RING_OUT };

static int timed_wait(struct mbp__stage *s, enum wait_on on)
{
	bool starved = on != WAIT_RING_OUT;
	_Atomic uint64_t *since = starved ? &s->c.starved_since : &s->c.blocked_since;
	_Atomic uint64_t *total = starved ? &s->c.starved_ns : &s->c.blocked_ns;
	uint64_t t0 = mbp__clock_ns();
	state_begin(since, t0);
	int rc;
	if (on == WAIT_INGRESS)
		rc = mbp__ingress_wait(&s->p->ingress, &s->p->crew.wopts, flush_cache, s);
	else if (on == WAIT_RING_IN)
		rc = mbp__ring_wait_pop(s->in, flush_cache, s, UINT64_MAX);
	else
		rc = mbp__ring_wait_push(s->out, flush_cache, s, UINT64_MAX);
	state_end(since, total, t0, mbp__clock_ns());
	return rc;
}

/* A wait on a window (seqwin.h), for micro-batch k to arrive (starved) or its slot to free (blocked, in
 * put). */
static void window_wait(struct mbp__stage *s, struct mbp__seqwin *w, uint32_t k)
{
	uint64_t t0 = mbp__clock_ns();
	state_begin(&s->c.starved_since, t0);
	mbp__seqwin_wait(w, k, &(struct mbp__seqwin_waiter){flush_cache, s});
	state_end(&s->c.starved_since, &s->c.starved_ns, t0, mbp__clock_ns());
}

static void window_put(struct mbp__stage *s, struct mbp__seqwin *w, uint32_t k, void *item,
		       const struct mbp__seqwin_rec *rec)
{
	uint64_t t0 = mbp__clock_ns();
	state_begin(&s->c.blocked_since, t0);
	mbp__seqwin_put(w, k, item, rec, &(struct mbp__seqwin_waiter){flush_cache, s});
	state_end(&s->c.blocked_since, &s->c.blocked_ns, t0, mbp__clock_ns());
}

/* ---- links: the hop between two stages ---- */

/* Pop up to BURST micro-batches; 0 at end of stream. */
static unsigned link_pop(struct mbp__stage *s, void **items)
{
	for (;;) {
		unsigned n = mbp__ring_pop_burst_sc(s->in, items, BURST);
		if (n)
			return n;
		if (timed_wait(s, WAIT_RING_IN) == -EPIPE) /* closed and drained */
			return 0;
	}
}

static void link_push(struct mbp__stage *s, mbp_mb *mb)
{
	while (!mbp__ring_push_sp(s->out, mb)) {
		/* only this thread closes its output ring, and only after its last push */
		int rc = timed_wait(s, WAIT_RING_OUT);
		MBP_VERIFY(rc == 0);
	}
}

/* A hop buffer from this worker's cache; waiting for one counts as blocked. Cannot fail: the engine's
 * pool is sized for full rings and caches, and waits without limit otherwise. */
static mbp_mb *hop_buffer(struct mbp__stage *s)
{
	mbp_mb *mb;
	if (MBP_LIKELY(mbp_pool_get(s->p->pool, s->cache, &mb, 0) == 0))
		return mb;
	uint64_t t0 = mbp__clock_ns();
	state_begin(&s->c.blocked_since, t0);
	int rc = mbp_pool_get(s->p->pool, s->cache, &mb, -1);
	MBP_VERIFY(rc == 0);
	state_end(&s->c.blocked_since, &s->c.blocked_ns, t0, mbp__clock_ns());
	return mb;
}

/* ---- running a stage ---- */

static unsigned log2_bucket(uint64_t ns)
{
	unsigned b = ns ? 63u - (unsigned)__builtin_clzll(ns) : 0;
	return b < MBP_HIST_BUCKETS ? b : MBP_HIST_BUCKETS - 1;
}

/* Prepare out's header from in, run the stage function, account. Returns the stage's status. */
static int run(struct mbp__stage *s, const mbp_mb *in, mbp_mb *out)
{
	out->rows = in->rows;
	out->row_bytes = (uint32_t)s->out_row_bytes;
	out->status = 0;
	out->stage = s->idx;
	out->seq = in->seq;
	out->job = in->job;
	out->user = in->user;
	out->carry = in->carry;
	uint64_t t0 = mbp__clock_ns();
	state_begin(&s->c.busy_since, t0);
	int rc = s->d.fn(s->d.ctx, in, out);
	uint64_t t1 = mbp__clock_ns();
	state_end(&s->c.busy_since, &s->c.busy_ns, t0, t1);
	if (rc > 0)
		rc = -EPROTO; /* a stage must return 0 or a negative errno */
	out->status = rc;
	struct mbp__stage_counters *c = &s->c;
	mbp__counter_add(&c->mbs, 1);
	mbp__counter_add(&c->rows, in->rows);
	mbp__counter_add(&c->hist[log2_bucket(t1 - t0)], 1);
	if (rc)
		mbp__counter_add(&c->failed, 1);
	if (s->trace.ev) /* the call only when tracing */
		mbp__trace_add(&s->trace, &(struct mbp__trace_ev){.t0 = t0,
								  .t1 = t1,
								  .job = out->job ? out->job->id : 0,
								  .mb = (uint32_t)out->seq,
								  .status = out->status,
								  .kind = MBP__TRACE_MB});
	return rc;
}

/* ---- completion (the last stage; stage 0 for work it never starts) ---- */

static void run_done_hooks(struct mbp_pipeline *p, mbp_mb *mb)
{
	for (unsigned i = 0; i < p->nstages; i++)
		if (p->stages[i].d.done)
			p->stages[i].d.done(p->stages[i].d.ctx, mb);
}

/* Deliver a caller's single micro-batch `x`, whose result is described by `res` (its data already in x). */
static void deliver(struct mbp__stage *s, mbp_mb *x, const mbp_mb *res)
{
	if (res) {
		x->rows = res->rows;
		x->row_bytes = (uint32_t)s->out_row_bytes;
		x->status = res->status;
		x->stage = s->idx;
		x->carry = res->carry;
	}
	mbp__counter_add(x->status ? &s->c.done_failed_mbs : &s->c.done_mbs, 1);
	if (!x->status)
		mbp__counter_add(&s->c.done_rows, x->rows);
	mbp__pool_unlend(x); /* the caller's again: it may release or submit it from the callback on */
	s->p->o.on_result(s->p->o.on_result_arg, x);
}

/* A job micro-batch leaves the pipeline: `mb` carries its job, seq, rows and status. */
static void complete_job_mb(struct mbp__stage *s, const mbp_mb *mb)
{
	if (!mb->status)
		mbp__counter_add(&s->c.done_rows, mb->rows);
	mbp__job_account(&s->c, mb->job, 1, mb->status ? 1 : 0, mb->status, (uint32_t)mb->seq);
}

/* The output view of the last stage for a job micro-batch: the caller's output rows. */
static void job_out_view(struct mbp__stage *s, const mbp_mb *in, mbp_mb *view)
{
	mbp_job *job = in->job;
	size_t row0 = (size_t)in->seq * job->mb_rows;
	memset(view, 0, sizeof(*view));
	view->data = (char *)job->out + row0 * s->out_row_bytes;
	view->capacity = (size_t)in->rows * s->out_row_bytes;
}

/* What the completer does for each record of a replicated last stage, in order, on its own thread (`arg`:
 * its copy of the stage, whose counters and cache it uses). */
static void complete_rec(void *arg, const struct mbp__seqwin_rec *rec)
{
	struct mbp__stage *s = arg;
	mbp_mb res = rec->res;
	run_done_hooks(s->p, &res);
	if (res.job)
		complete_job_mb(s, &res);
	else
		deliver(s, rec->x, &res);
	if (rec->hop)
		mbp_pool_put(s->p->pool, s->cache, rec->hop);
}

/* A replicated last stage's result `res` leaves in order: put it into the completion window, then
 * complete what is there (unless another replica is completing). */
static void complete_in_order(struct mbp__stage *s, const mbp_mb *res, mbp_mb *hop, mbp_mb *x)
{
	struct mbp__seqwin_rec rec = {.res = *res, .hop = hop, .x = x};
	window_put(s, s->win_done, s->cur_seq, NULL, &rec);
	mbp__seqwin_complete(s->win_done, complete_rec, s);
}

/* Last stage (not stage 0): a hop buffer arrives. */
static void last_stage(struct mbp__stage *s, mbp_mb *in)
{
	struct mbp_pipeline *p = s->p;
	mbp_mb *x = in->job ? NULL : *mbp__origin(in); /* the caller's buffer, for a single micro-batch */
	mbp_mb view, *res = in;
	if (in->status == 0 && cancelled(p))
		in->status = -ECANCELED;
	if (in->status == 0) {
		if (in->job) {
			job_out_view(s, in, &view);
		} else {
			memset(&view, 0, sizeof(view));
			view.data = x->data;
			view.capacity = x->capacity;
		}
		run(s, in, &view);
		res = &view;
	}
	if (s->win_done) {
		complete_in_order(s, res, in, x);
		return;
	}
	run_done_hooks(p, res);
	if (in->job)
		complete_job_mb(s, res);
	else
		deliver(s, x, res);
	mbp_pool_put(p->pool, s->cache, in); /* after: res may be `in` itself */
}

static inline bool is_last(const struct mbp__stage *s)
{
	return s->idx + 1 == s->p->nstages;
}

static void stage_input(struct mbp__stage *s, mbp_mb *in);

/* Hand a hop buffer to the next stage: through the ring when that stage has a thread of its own, else
 * by calling it here (it runs on this thread: opts.threads). */
static void pass_on(struct mbp__stage *s, mbp_mb *mb)
{
	if (s->out) {
		link_push(s, mb);
	} else if (s->win_out) {
		/* a replica puts the index it took; a stage of one thread numbers its outputs */
		window_put(s, s->win_out, s->replicas > 1 ? s->cur_seq : s->out_seq, mb, NULL);
		s->out_seq++;
	} else {
		stage_input(s + 1, mb);
	}
}

/* Middle stage: compute into a fresh hop buffer, release the input into the cache, pass on. */
static void middle_stage(struct mbp__stage *s, mbp_mb *in)
{
	if (in->status == 0 && cancelled(s->p))
		in->status = -ECANCELED;
	if (in->status != 0) {
		pass_on(s, in); /* failed upstream: travel on with the status */
		return;
	}
	mbp_mb *out = hop_buffer(s);
	run(s, in, out);
	if (!in->job)
		*mbp__origin(out) = *mbp__origin(in);
	mbp_pool_put(s->p->pool, s->cache, in); /* the next hop_buffer() returns this one, still hot */
	pass_on(s, out);
}

/* A hop buffer arrives at stage s (not stage 0). */
static void stage_input(struct mbp__stage *s, mbp_mb *in)
{
	if (is_last(s))
		last_stage(s, in);
	else
		middle_stage(s, in);
}

static void ring_stage_loop(struct mbp__stage *s)
{
	void *items[BURST];
	unsigned n;
	while ((n = link_pop(s, items)) != 0) {
		/* The burst's headers were written on another core: start fetching them all, and each
		 * next one's payload while this one computes, instead of missing on each in turn. */
		for (unsigned i = 0; i < n; i++)
			__builtin_prefetch(items[i]);
		for (unsigned i = 0; i < n; i++) {
			if (i + 1 < n)
				__builtin_prefetch(((mbp_mb *)items[i + 1])->data);
			stage_input(s, items[i]);
		}
	}
}

/* ---- active replicas ---- */

/* Whether this replica takes micro-batches (mbp_pipeline_replicas_set): replica 0 always. */
static inline bool replica_active(const struct mbp__stage *s)
{
	struct mbp_pipeline *p = s->p;
	/* relaxed, both: a hint read once per micro-batch; a stale "active" claims one more, a stale
	 * "inactive" parks, and park_inactive reads both again after its acquire of gen */
	return s->replica < atomic_load_explicit(&p->park.active[s->idx], memory_order_relaxed) ||
	       atomic_load_explicit(&p->park.all, memory_order_relaxed);
}

/* An inactive replica parks here, before it claims: it holds no micro-batch, so the ordered merge gets
 * every one from the active replicas. Its cached buffers go back first. Its time here counts as parked,
 * in none of busy, starved or blocked: it is off. Two clock reads a park, off the hot path (a replica
 * comes here only when it was made inactive, or read a stale count once). */
static void park_inactive(struct mbp__stage *s)
{
	struct mbp_pipeline *p = s->p;
	uint64_t t0 = mbp__clock_ns();
	state_begin(&s->c.parked_since, t0);
	flush_cache(s);
	for (;;) {
		uint32_t g = mbp__gen_get(&p->park.gen); /* acquire; partner: the setter's bump */
		if (replica_active(s))
			break;
		mbp__gen_wait(&p->park.gen, g); /* returns at once if gen moved since */
	}
	state_end(&s->c.parked_since, &s->c.parked_ns, t0, mbp__clock_ns());
}

/* A stage whose input is a window: a stage of one thread takes the stream in order (the ordered merge of
 * the replicas before it); a replica claims the next index, if it is active. */
static void window_stage_loop(struct mbp__stage *s)
{
	for (;;) {
		if (s->replicas > 1 && MBP_UNLIKELY(!replica_active(s)))
			park_inactive(s);
		uint32_t k = s->replicas > 1 ? mbp__seqwin_claim(s->win_in) : s->in_seq++;
		if (!mbp__seqwin_ready(s->win_in, k))
			window_wait(s, s->win_in, k);
		mbp_mb *mb = mbp__seqwin_take(s->win_in, k);
		if (!mb)
			return; /* the end of the stream */
		s->cur_seq = k;
		stage_input(s, mb);
	}
}

/* ---- stage 0 ---- */

/* One micro-batch of stage 0, from a view of the caller's input (job) or the caller's buffer. */
static void first_stage_mb(struct mbp__stage *s, mbp_mb *in, mbp_mb *x)
{
	struct mbp_pipeline *p = s->p;
	if (!is_last(s)) {
		mbp_mb *out = hop_buffer(s);
		run(s, in, out);
		if (!in->job)
			*mbp__origin(out) = x;
		pass_on(s, out);
		return;
	}
	/* a single stage: it is also the last */
	if (in->job) {
		mbp_mb view;
		job_out_view(s, in, &view);
		run(s, in, &view);
		if (s->win_done) {
			complete_in_order(s, &view, NULL, NULL);
			return;
		}
		run_done_hooks(p, &view);
		complete_job_mb(s, &view);
		return;
	}
	/* the input is the caller's buffer: compute into a hop buffer, then copy back */
	mbp_mb *tmp = hop_buffer(s);
	run(s, in, tmp);
	if (s->win_done) {
		/* the result into the caller's buffer now; the hooks and the callback in order */
		if (tmp->status == 0)
			memcpy(x->data, tmp->data, (size_t)tmp->rows * s->out_row_bytes);
		mbp_mb res = *tmp;
		res.data = x->data;
		res.capacity = x->capacity;
		complete_in_order(s, &res, tmp, x);
		return;
	}
	run_done_hooks(p, tmp);
	if (tmp->status == 0)
		memcpy(x->data, tmp->data, (size_t)tmp->rows * s->out_row_bytes);
	deliver(s, x, tmp);
	mbp_pool_put(p->pool, s->cache, tmp);
}

/* Split a job into micro-batches that read the caller's input in place. The job's fields are read once
 * into locals: the last stage writes the job's bookkeeping (priv) for every micro-batch it completes, and
 * a caller's mbp_job may put that on the same cache line as the fields read here. */
static void first_stage_job(struct mbp__stage *s, mbp_job *job)
{
	const char *in = job->in;
	const size_t nrows = job->rows, m = job->mb_rows, width = s->in_row_bytes;
	const uint32_t nmb = job->mbs;
	for (uint32_t k = 0; k < nmb; k++) {
		if (cancelled(s->p)) {
			/* never started: they fail here and do not enter the pipeline */
			mbp__job_account(&s->c, job, nmb - k, nmb - k, -ECANCELED, k);
			return;
		}
		size_t row0, rows = mbp__job_mb_rows(nrows, m, k, &row0);
		mbp_mb view = {
		    .data = (void *)(in + row0 * width),
		    .capacity = rows * width,
		    .rows = (uint32_t)rows,
		    .row_bytes = (uint32_t)width,
		    .stage = UINT32_MAX,
		    .seq = k,
		    .job = job,
		};
		first_stage_mb(s, &view, NULL);
	}
}

static void first_stage_single(struct mbp__stage *s, mbp_mb *x)
{
	if (cancelled(s->p)) {
		x->status = -ECANCELED;
		deliver(s, x, NULL); /* never started: no stage saw it, so no done hooks */
		return;
	}
	first_stage_mb(s, x, x);
}

/* Next ingress entry, waiting for one; NULL once the ingress is closed and empty. */
static struct mbp__item *ingress_pop(struct mbp__stage *s)
{
	for (;;) {
		struct mbp__item *it = mbp__ingress_pop(&s->p->ingress);
		if (it)
			return it;
		if (timed_wait(s, WAIT_INGRESS) == -EPIPE)
			return NULL;
	}
}

static void first_stage_loop(struct mbp__stage *s)
{
	struct mbp__item *it;
	while ((it = ingress_pop(s)) != NULL) {
		if (it->kind == MBP__ITEM_JOB)
			first_stage_job(s, mbp__container_of(it, mbp_job, priv.opaque));
		else
			first_stage_single(s, &mbp__container_of(it, struct mbp__buf, link)->mb);
	}
}

/* A replicated stage 0: take the next micro-batch of the ingress's stream under the feed's lock (the
 * ingress has one consumer at a time; a replica waiting for an entry holds the lock, and the others wait
 * on it asleep). Fills `view` (a job's micro-batch, read in place) or *x (a caller's buffer) and the
 * stream index; false at the end of the stream. Work that will not start (cancel) fails here, as
 * first_stage_job and first_stage_single fail it. */
static bool feed_claim(struct mbp__stage *s, mbp_mb *view, mbp_mb **x)
{
	struct mbp_pipeline *p = s->p;
	uint64_t t0 = mbp__clock_ns(); /* waiting for the lock is waiting for input */
	state_begin(&s->c.starved_since, t0);
	pthread_mutex_lock(&p->feed.lock);
	state_end(&s->c.starved_since, &s->c.starved_ns, t0, mbp__clock_ns());
	bool got = false;
	for (;;) {
		mbp_job *job = p->feed.job;
		if (job) {
			const uint32_t nmb = job->mbs, k = p->feed.k;
			if (k < nmb && cancelled(p)) {
				mbp__job_account(&s->c, job, nmb - k, nmb - k, -ECANCELED, k);
				p->feed.job = NULL;
				continue;
			}
			if (k < nmb) {
				size_t row0;
				const size_t width = s->in_row_bytes,
					     rows = mbp__job_mb_rows(job->rows, job->mb_rows, k, &row0);
				*view = (mbp_mb){.data = (void *)((const char *)job->in + row0 * width),
						 .capacity = rows * width,
						 .rows = (uint32_t)rows,
						 .row_bytes = (uint32_t)width,
						 .stage = UINT32_MAX,
						 .seq = k,
						 .job = job};
				*x = NULL;
				if (++p->feed.k == nmb)
					p->feed.job = NULL;
				got = true;
				break;
			}
			p->feed.job = NULL;
		}
		struct mbp__item *it = ingress_pop(s);
		if (!it)
			break; /* closed and empty */
		if (it->kind == MBP__ITEM_JOB) {
			p->feed.job = mbp__container_of(it, mbp_job, priv.opaque);
			p->feed.k = 0;
			continue;
		}
		mbp_mb *mb = &mbp__container_of(it, struct mbp__buf, link)->mb;
		if (cancelled(p)) {
			mb->status = -ECANCELED;
			deliver(s, mb, NULL); /* never started: no stage saw it, so no done hooks */
			continue;
		}
		*x = mb;
		got = true;
		break;
	}
	if (got)
		s->cur_seq = p->feed.seq++;
	pthread_mutex_unlock(&p->feed.lock);
	return got;
}

static void feed_loop(struct mbp__stage *s)
{
	mbp_mb view, *x;
	for (;;) {
		if (MBP_UNLIKELY(!replica_active(s)))
			park_inactive(s);
		if (!feed_claim(s, &view, &x))
			return;
		first_stage_mb(s, x ? x : &view, x);
	}
}

/* The loop of a thread of the units plan (a pipeline with replicas): one stage, or one replica of it. */
static void unit_run(struct mbp__stage *s)
{
	if (s->idx == 0)
		s->replicas > 1 ? feed_loop(s) : first_stage_loop(s);
	else if (s->win_in)
		window_stage_loop(s);
	else
		ring_stage_loop(s);
	if (s->out)
		mbp__ring_close(s->out); /* end of stream for the next thread, after our last push */
	if (s->win_out)
		mbp__seqwin_producer_done(s->win_out, s->out_seq);
}

/* ---- the thread: what the pipeline gives its crew ---- */

/* The loop of the thread of stages th->first .. th->last (mbp__crew_run_fn), once every thread is
 * inited. Its stages take buffers from the thread's pool cache. */
void mbp__worker_run(void *arg, struct mbp__crew_thread *th)
{
	struct mbp_pipeline *p = arg;
	if (p->units) {
		struct mbp__stage *u = p->unit[th->first];
		u->cache = th->cache;
		unit_run(u);
		u->cache = NULL;
		return;
	}
	struct mbp__stage *s = &p->stages[th->first];
	for (unsigned i = th->first; i <= th->last; i++)
		p->stages[i].cache = th->cache;
	if (s->idx == 0)
		first_stage_loop(s);
	else
		ring_stage_loop(s);
	struct mbp__ring *out = p->stages[th->last].out;
	if (out)
		mbp__ring_close(out); /* end of stream for the next thread, after our last push */
	for (unsigned i = th->first; i <= th->last; i++)
		p->stages[i].cache = NULL; /* the crew destroys the thread's cache next */
}
