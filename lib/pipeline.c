/*
 * mbp_pipeline: construction, start, admission of submissions, single micro-batches, drain, cancel,
 * destroy. Jobs are in job.c, the ingress in ingress.c, the placement plan in affinity.c.
 *
 * Shutdown. drain and cancel both first stop accepting (state != RUNNING; submitters re-check after
 * announcing themselves in `submitting`, so once it reads zero no accepted entry is still on its way into the
 * ingress), then close the ingress. The thread of stage 0 drains the ingress and closes its output ring; each
 * thread in turn drains its input and closes its output; the threads exit in order and are joined. cancel
 * also raises `cancel`, which makes every stage fail (-ECANCELED) what it has not started instead of
 * computing it. Either way every accepted micro-batch completes or fails: accepted = completed + failed.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

#include "affinity.h"
#include "pipeline_internal.h"

/* ---- construction ---- */

int mbp_pipeline_new(mbp_pipeline **pp, const mbp_opts *o)
{
	if (!pp)
		return -EINVAL;
	*pp = NULL;
	int rc = mbp_opts_check(o, NULL);
	if (rc)
		return rc;
	mbp__wait_global_init();
	mbp__clock_init();
	struct mbp_pipeline *p = aligned_alloc(MBP_CACHELINE, (sizeof(*p) + MBP_CACHELINE - 1) & ~(size_t)63);
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	p->o = *o;
	mbp__opts_fill(&p->o); /* a field's 0 is its default */
	atomic_init(&p->state, ST_NEW);
	pthread_mutex_init(&p->err_lock, NULL);
	mbp__crew_init(&p->crew, "pipe", mbp__worker_run, p);
	pthread_mutex_init(&p->feed.lock, NULL);
	mbp__ingress_init(&p->ingress, p->o.ingress_depth);
	*pp = p;
	return 0;
}

/* ---- refusals ---- */

int mbp__pipeline_refuse(struct mbp_pipeline *p, int err, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	pthread_mutex_lock(&p->err_lock);
	p->refusal.err = err;
	vsnprintf(p->refusal.what, sizeof(p->refusal.what), fmt, ap);
	pthread_mutex_unlock(&p->err_lock);
	va_end(ap);
	return err;
}

int mbp_pipeline_error(const mbp_pipeline *p, mbp_pipeline_refusal *r)
{
	if (!p || !r)
		return -EINVAL;
	struct mbp_pipeline *q = (struct mbp_pipeline *)p; /* the lock is not the pipeline's state */
	pthread_mutex_lock(&q->err_lock);
	*r = q->refusal;
	pthread_mutex_unlock(&q->err_lock);
	return 0;
}

int mbp_pipeline_add_stage(mbp_pipeline *p, const mbp_stage_desc *d)
{
	/* relaxed: add_stage runs on the controlling thread, the only writer of state */
	if (!p || !d || !d->fn || atomic_load_explicit(&p->state, memory_order_relaxed) != ST_NEW)
		return -EINVAL;
	if (d->out_row_bytes > UINT32_MAX)
		return mbp__pipeline_refuse(p, -EINVAL, "stage %u: out_row_bytes %zu: above 4294967295",
					    p->nstages, d->out_row_bytes);
	if (p->nstages == MBP_MAX_STAGES)
		return mbp__pipeline_refuse(p, -E2BIG, "more than %d stages (MBP_MAX_STAGES)",
					    MBP_MAX_STAGES);
	unsigned r = d->replicas ? d->replicas : 1, threads = r;
	for (unsigned i = 0; i < p->nstages; i++)
		threads += p->stages[i].replicas;
	if (r > MBP_MAX_REPLICAS || threads > MBP_MAX_STAGES)
		return mbp__pipeline_refuse(
		    p, -E2BIG, "stage %u: %u replicas make %u threads: above %d (MBP_MAX_STAGES)", p->nstages,
		    r, threads, MBP_MAX_STAGES);
	if (r > 1 && d->pin_cpu)
		return mbp__pipeline_refuse(
		    p, -EINVAL, "stage %u: %u replicas and pin_cpu: a replicated stage names no CPU",
		    p->nstages, r);
	if (d->pin_cpu && (d->pin_cpu > CPU_SETSIZE || !mbp__cpu_allowed((int)d->pin_cpu - 1)))
		return mbp__pipeline_refuse(p, -ERANGE,
					    "stage %u: pin_cpu names CPU %u, which this process may not use",
					    p->nstages, d->pin_cpu - 1);
	struct mbp__stage *s = &p->stages[p->nstages];
	memset(s, 0, sizeof(*s));
	s->d = *d;
	s->idx = p->nstages;
	s->p = p;
	s->named_cpu = d->pin_cpu ? (int)d->pin_cpu - 1 : -1;
	s->replicas = r;
	atomic_init(&p->park.active[s->idx], r); /* every replica takes micro-batches until told */
	s->unit = s->idx;
	if (r > 1)
		p->units = true;
	if (d->name)
		snprintf(s->name, sizeof(s->name), "%s", d->name);
	else
		snprintf(s->name, sizeof(s->name), "stage%u", s->idx);
	s->d.name = s->name;
	p->crew.stage[s->idx] = (struct mbp__crew_stage){.init = d->init, .fini = d->fini, .ctx = d->ctx};
	s->in_row_bytes = s->idx ? p->stages[s->idx - 1].out_row_bytes : p->o.in_row_bytes;
	s->out_row_bytes = d->out_row_bytes ? d->out_row_bytes : s->in_row_bytes;
	p->nstages++;
	return 0;
}

int mbp__pipeline_node_share(mbp_pipeline *p, unsigned k, unsigned m)
{
	/* relaxed: the controlling thread, the only writer of state */
	if (!p || (m && k >= m) || atomic_load_explicit(&p->state, memory_order_relaxed) != ST_NEW)
		return -EINVAL;
	p->node_k = k;
	p->node_m = m;
	return 0;
}

mbp_pool *mbp__pipeline_mb_pool(mbp_pipeline *p)
{
	return p->mb_pool;
}

/* Decide the threads, which stages each runs, each thread's CPU and the waits' budgets (the crew's plan). */
/* The units plan (a pipeline with replicas): a thread per replica; each copy of a stage gets its
 * counters, trace and links of its own at start (make_windows). */
static int plan_units(struct mbp_pipeline *p, int *named)
{
	unsigned T = 0;
	for (unsigned i = 0; i < p->nstages; i++)
		T += p->stages[i].replicas;
	if (p->o.threads && p->o.threads != T)
		return mbp__pipeline_refuse(p, -EINVAL,
					    "threads %" PRIu32
					    ": with replicas every stage has threads of its "
					    "own, %u in all (threads 0 or %u)",
					    p->o.threads, T, T);
	unsigned most = 1;
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		most = s->replicas > most ? s->replicas : most;
		if (s->replicas > 1) {
			s->rep = aligned_alloc(MBP_CACHELINE, sizeof(*s) * (s->replicas - 1));
			if (!s->rep)
				return -ENOMEM;
		}
	}
	/* Replica-major: every stage's replica 0, then every replica 1, ... The plan gives consecutive
	 * threads one CPU when they outnumber the CPUs, so this order puts a stage's replicas on different
	 * CPUs as far as there are CPUs (with threads <= CPUs each has its own anyway). */
	for (unsigned j = 0, u = 0; j < most; j++)
		for (unsigned i = 0; i < p->nstages; i++) {
			struct mbp__stage *s = &p->stages[i];
			if (j >= s->replicas)
				continue;
			struct mbp__stage *c = mbp__stage_replica(s, j);
			if (j) {
				memcpy(c, s, sizeof(*c));
				memset(&c->c, 0, sizeof(c->c));
				c->rep = NULL;
			}
			c->replica = j;
			c->unit = u;
			p->unit[u] = c;
			p->unit_stage[u] = i;
			p->unit_replica[u] = j;
			p->crew.stage[u] =
			    (struct mbp__crew_stage){.init = s->d.init, .fini = s->d.fini, .ctx = s->d.ctx};
			named[u++] = s->named_cpu;
		}
	p->nunits = T;
	p->crew.unit_stage = p->unit_stage;
	p->crew.unit_replica = p->unit_replica;
	return 0;
}

static int plan_placement(struct mbp_pipeline *p)
{
	/* the crew plans units: the stages, or with replicas each replica (thread per unit) */
	int named[MBP_MAX_STAGES];
	int rc = p->units ? plan_units(p, named) : 0;
	if (rc)
		return rc;
	const unsigned S = p->units ? p->nunits : p->nstages;
	for (unsigned i = 0; !p->units && i < S; i++)
		named[i] = p->stages[i].named_cpu;
	struct mbp__placement_req rq = {.nstages = S,
					.threads = p->units ? S : p->o.threads,
					.pin = p->o.pinning == MBP_PIN_PLAN,
					.named = named,
					.ncpus = p->o.ncpus,
					.cpus = p->o.cpus,
					.node_k = p->node_k,
					.node_m = p->node_m};
	rc = mbp__crew_plan(&p->crew, &rq, p->o.spin_ns, p->o.yield_ns);
	const unsigned *thread_of = p->crew.thread_of;
	if (rc == -EINVAL && !p->units) {
		/* the first stage whose thread's stages already named another CPU */
		for (unsigned i = 1; i < S; i++)
			for (unsigned j = 0; j < i; j++)
				if (thread_of[j] == thread_of[i] && named[i] >= 0 && named[j] >= 0 &&
				    named[i] != named[j])
					return mbp__pipeline_refuse(p, rc,
								    "stages %u and %u run on one thread "
								    "(threads %u) but name CPUs %d and %d",
								    j, i, thread_of[S - 1] + 1 /* T */,
								    named[j], named[i]);
	}
	return rc;
}

/* A pool of `buf_bytes` buffers that mbp_pool_new() refused: in words where it is a limit. */
static int pool_refused(struct mbp_pipeline *p, int rc, size_t buf_bytes)
{
	if (rc == -EINVAL)
		return mbp__pipeline_refuse(p, rc, "pool_bytes (%zu) cannot hold one buffer of %zu bytes",
					    p->o.pool_bytes, buf_bytes);
	if (rc == -EOVERFLOW)
		return mbp__pipeline_refuse(p, rc, "buffers of %zu bytes: the pool's sizes overflow",
					    buf_bytes);
	return rc;
}

/* Slots of a hop: a ring's, or a window's (room for every replica's micro-batch beside a full ring's). */
static uint32_t window_capacity(const struct mbp_pipeline *p)
{
	if (!p->units)
		return p->o.ring_capacity;
	uint32_t r = 1;
	for (unsigned i = 0; i < p->nstages; i++)
		r = p->stages[i].replicas > r ? p->stages[i].replicas : r;
	uint64_t c = (uint64_t)p->o.ring_capacity + 2 * r, cap = 2;
	while (cap < c)
		cap <<= 1;
	return cap > (1u << 30) ? 1u << 30 : (uint32_t)cap;
}

/* The hops of a pipeline with replicas: a ring between two stages of one thread, else a window; a
 * completion window after a replicated last stage. Every copy of a stage gets its links. */
static int make_windows(struct mbp_pipeline *p)
{
	const uint32_t cap = window_capacity(p);
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		struct mbp__seqwin *w = NULL;
		bool last = i + 1 == p->nstages;
		if (last && s->replicas == 1)
			break;
		if (!last && s->replicas == 1 && s[1].replicas == 1)
			continue; /* the ring of before */
		int rc = mbp__seqwin_new(&w, cap, last ? 1 : s->replicas, &p->crew.wopts);
		if (rc)
			return rc;
		for (unsigned j = 0; j < s->replicas; j++)
			*(last ? &mbp__stage_replica(s, j)->win_done : &mbp__stage_replica(s, j)->win_out) =
			    w;
		for (unsigned j = 0; !last && j < s[1].replicas; j++)
			mbp__stage_replica(&s[1], j)->win_in = w;
	}
	return 0;
}

static int make_pools(struct mbp_pipeline *p)
{
	size_t width = p->o.in_row_bytes;
	for (unsigned i = 0; i < p->nstages; i++)
		if (p->stages[i].out_row_bytes > width)
			width = p->stages[i].out_row_bytes;
	p->out_row_bytes = p->stages[p->nstages - 1].out_row_bytes;
	size_t hop_bytes, mb_bytes;
	size_t mb_width = p->o.in_row_bytes > p->out_row_bytes ? p->o.in_row_bytes : p->out_row_bytes;
	if (!mbp__mul_size(width, p->o.max_mb_rows, &hop_bytes) ||
	    !mbp__mul_size(mb_width, p->o.max_mb_rows, &mb_bytes))
		return mbp__pipeline_refuse(p, -EOVERFLOW,
					    "max_mb_rows (%" PRIu32 ") rows of %zu bytes: the size overflows",
					    p->o.max_mb_rows, width > mb_width ? width : mb_width);
	/* What the engine can hold at once: full rings, a burst and an output per worker, full caches. */
	uint64_t S = p->nstages, T = p->units ? p->nunits : S;
	/* with replicas, the threads' share: a window holds up to its capacity, as a ring does */
	uint64_t need = (S - 1) * window_capacity(p) + T * (8 + 2) + T * p->o.cache_size;
	if (p->stages[S - 1].replicas > 1) /* its completion window holds hop buffers too */
		need += window_capacity(p);
	if (need > UINT32_MAX)
		return mbp__pipeline_refuse(p, -E2BIG,
					    "%" PRIu64 " stages with ring %" PRIu32 " and cache %" PRIu32
					    " need %" PRIu64 " buffers: above 4294967295",
					    S, p->o.ring_capacity, p->o.cache_size, need);
	mbp_pool_opts po;
	mbp_pool_opts_init(&po);
	po.buf_bytes = hop_bytes;
	po.max_buffers = (uint32_t)need;
	po.max_bytes = p->o.pool_bytes;
	po.cache_size = p->o.cache_size;
	int rc = mbp_pool_new(&p->pool, &po);
	if (rc)
		return pool_refused(p, rc, hop_bytes);
	mbp__pool_trust(p->pool); /* hop buffers never leave the workers */
	mbp_pool_stats st;
	mbp_pool_stats_get(p->pool, &st);
	if (st.max_buffers < need) /* pool_bytes cannot hold what full rings need */
		return mbp__pipeline_refuse(p, -ENOSPC,
					    "pool_bytes (%zu) holds %" PRIu64
					    " buffers of %zu bytes; full rings and caches need %" PRIu64,
					    p->o.pool_bytes, (uint64_t)st.max_buffers, hop_bytes, need);
	po.buf_bytes = mb_bytes;
	po.max_buffers = p->o.mb_buffers;
	rc = mbp_pool_new(&p->mb_pool, &po);
	return rc ? pool_refused(p, rc, mb_bytes) : 0;
}

int mbp_pipeline_start(mbp_pipeline *p)
{
	if (!p)
		return -EINVAL;
	/* relaxed: start runs on the controlling thread, the only writer of state */
	if (atomic_load_explicit(&p->state, memory_order_relaxed) != ST_NEW)
		return -EALREADY;
	if (p->nstages == 0)
		return mbp__pipeline_refuse(p, -EINVAL, "no stages: add one with mbp_pipeline_add_stage()");
	int rc = plan_placement(p);
	if (rc == 0)
		rc = make_pools(p);
	for (unsigned i = 0; rc == 0 && i + 1 < p->nstages; i++) {
		if (p->units ? p->stages[i].replicas > 1 || p->stages[i + 1].replicas > 1
			     : p->crew.thread_of[i + 1] == p->crew.thread_of[i])
			continue; /* a window (make_windows), or the same thread calls stage i + 1 */
		rc = mbp__ring_new(&p->stages[i].out, p->o.ring_capacity, &p->crew.wopts, 0);
		if (rc == 0)
			p->stages[i + 1].in = p->stages[i].out;
	}
	if (rc == 0 && p->units)
		rc = make_windows(p);
	for (unsigned i = 0; rc == 0 && i < p->nstages; i++)
		for (unsigned j = 0; rc == 0 && j < p->stages[i].replicas; j++)
			rc = mbp__trace_init(&mbp__stage_replica(&p->stages[i], j)->trace, p->o.trace_events);
	p->crew.pool = p->pool; /* each thread's cache */
	/* every init runs; on an error, every fini where the init succeeded */
	if (rc == 0)
		rc = mbp__crew_start(&p->crew);
	if (rc) {
		mbp__crew_stop(&p->crew); /* the CPUs back (the threads, if any, are joined already) */
		/* release; partner: the acquire load in mbp_pipeline_placement(): the pin errors */
		atomic_store_explicit(&p->state, ST_STOPPED, memory_order_release);
		return rc;
	}
	p->start_ns = mbp__clock_ns();
	/* its buffers can be given back without the handle from now on (mbp_mb_release(NULL, mb): a result
	 * callback has the buffer but may not have the pipeline), until its pool goes at destroy */
	mbp__pool_publish(p->mb_pool, true);
	/* release; partners: the loads of state in mbp__submit_enter() (seq_cst, so also acquire),
	 * mbp_mb_acquire() and mbp_pipeline_placement() (acquire). Publishes what start built: the pools,
	 * rings and placement, and start_ns, to any thread that sees RUNNING. */
	atomic_store_explicit(&p->state, ST_RUNNING, memory_order_release);
	return 0;
}

/* ---- submission ---- */

/* Admission (pipeline_internal.h). */
int mbp__submit_enter(struct mbp_pipeline *p)
{
	/* seq_cst increment and load: a Dekker pair with stop_accepting(), which stores state (seq_cst) and
	 * then reads `submitting`: either it sees this submitter, or this load sees it is no longer
	 * RUNNING. The load is also the acquire partner of start's release store of RUNNING. */
	atomic_fetch_add_explicit(&p->submitting, 1, memory_order_seq_cst);
	int st = atomic_load_explicit(&p->state, memory_order_seq_cst);
	if (st == ST_RUNNING)
		return 0;
	/* relaxed: this submitter enqueued nothing, so it publishes nothing */
	atomic_fetch_sub_explicit(&p->submitting, 1, memory_order_relaxed);
	return st == ST_NEW ? -ENOTCONN : -ESHUTDOWN;
}

void mbp__submit_leave(struct mbp_pipeline *p)
{
	/* release; partner: the acquire load of `submitting` in stop_accepting(): once it reads zero, every
	 * accepted entry's enqueue (and accepted counts) is visible to the shutdown that follows */
	atomic_fetch_sub_explicit(&p->submitting, 1, memory_order_release);
}

/* ---- single micro-batches ---- */

int mbp_mb_acquire(mbp_pipeline *p, mbp_mb **mb, int64_t timeout_ns)
{
	if (!p || !mb)
		return -EINVAL;
	/* acquire; partner: start's release store of RUNNING: mb_pool exists */
	int st = atomic_load_explicit(&p->state, memory_order_acquire);
	if (st != ST_RUNNING)
		return st == ST_NEW ? -ENOTCONN : -ESHUTDOWN;
	int rc = mbp_pool_get(p->mb_pool, NULL, mb, timeout_ns);
	if (rc == 0) {
		(*mb)->row_bytes = (uint32_t)p->o.in_row_bytes;
		(*mb)->carry = NULL; /* the submitter's to set: stage 0 receives it as it is */
	}
	return rc;
}

int mbp_mb_submit(mbp_pipeline *p, mbp_mb *mb, int64_t timeout_ns)
{
	if (!p || !mb || !p->o.on_result)
		return -EINVAL;
	if (!p->mb_pool)
		return -ENOTCONN; /* never started: no buffer can have come from it */
	/* Before touching *mb: a pointer that mbp_mb_acquire() did not give, or one already submitted, is
	 * refused without a write (its ingress link would corrupt the queue or someone's memory). */
	int rc = mbp__pool_lend(p->mb_pool, mb);
	if (rc)
		return rc;
	if (mb->rows == 0 || mb->rows > p->o.max_mb_rows) {
		mbp__pool_unlend(mb);
		return mbp__pipeline_refuse(
		    p, -EINVAL, "a micro-batch of %" PRIu32 " rows: 1 to max_mb_rows (%" PRIu32 ")", mb->rows,
		    p->o.max_mb_rows);
	}
	rc = mbp__submit_enter(p);
	if (rc) {
		mbp__pool_unlend(mb);
		return rc;
	}
	mb->row_bytes = (uint32_t)p->o.in_row_bytes;
	mb->status = 0;
	mb->stage = UINT32_MAX;
	mb->job = NULL;
	struct mbp__buf *b = mbp__buf_of(mb);
	rc = mbp__ingress_put(&p->ingress, (struct mbp__item *)(void *)b->link, MBP__ITEM_MB, timeout_ns);
	if (rc == 0) /* relaxed: a statistic; drain reads it after the acquire of `submitting` */
		atomic_fetch_add_explicit(&p->mbs_accepted, 1, memory_order_relaxed);
	else
		mbp__pool_unlend(mb); /* not accepted: the caller still holds it */
	mbp__submit_leave(p);
	return rc;
}

void mbp_mb_release(mbp_pipeline *p, mbp_mb *mb)
{
	if (p) {
		mbp_pool_put(p->mb_pool, NULL, mb);
		return;
	}
	if (mbp__pool_put_published(mb))
		return;
	/* as mbp_pool_put() does for a pointer that is not its buffer: going on would corrupt memory */
	fprintf(stderr, "mbpipe: mbp_mb_release: %p is not a buffer of a started pipeline that exists\n",
		(void *)mb);
	abort();
}

/* ---- shutdown ---- */

/* Stop accepting; wait until no submitter is between its check and its enqueue. */
static void stop_accepting(struct mbp_pipeline *p)
{
	/* seq_cst store, then a seq_cst load of `submitting`: the Dekker pair of mbp__submit_enter() */
	atomic_store_explicit(&p->state, ST_DRAINING, memory_order_seq_cst);
	mbp__ingress_refuse(&p->ingress); /* wake submitters blocked on a full ingress */
	/* seq_cst (so also acquire); partner: the release decrement in mbp__submit_leave() */
	while (atomic_load_explicit(&p->submitting, memory_order_seq_cst))
		sched_yield();
}

static uint64_t completed_total(struct mbp_pipeline *p)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < p->nstages; i++)
		for (unsigned j = 0; j < p->stages[i].replicas; j++) {
			struct mbp__stage *s = mbp__stage_replica(&p->stages[i], j);
			n += mbp__counter_get(&s->c.done_mbs) + mbp__counter_get(&s->c.done_failed_mbs);
		}
	return n;
}

/* Every parked replica back to work, for good: each runs on to the end of the stream (it sees the
 * ingress closed, or its window's end) and says it is done, as a window's producer must. */
static void wake_parked(struct mbp_pipeline *p)
{
	/* relaxed: published by the bump's release (partner: the acquire of gen in park_inactive) */
	atomic_store_explicit(&p->park.all, 1, memory_order_relaxed);
	mbp__gen_bump(&p->park.gen);
}

static void close_and_join(struct mbp_pipeline *p)
{
	if (p->units)
		wake_parked(p);
	mbp__ingress_close(&p->ingress); /* every admitted submitter has left: the end of the stream */
	mbp__crew_stop(&p->crew);	 /* the threads drain in order and exit; their CPUs go back */
	/* release; partner: the acquire load in mbp_pipeline_placement(). Nothing else to publish: the
	 * threads are joined, and the controlling thread is the only other reader of STOPPED */
	atomic_store_explicit(&p->state, ST_STOPPED, memory_order_release);
}

/* Shared entry of drain and cancel: 1 to go on, else the return value (0: already stopped). */
static int shutdown_check(struct mbp_pipeline *p)
{
	if (!p)
		return -EINVAL;
	/* relaxed: drain and cancel run on the controlling thread, the only writer of state */
	int st = atomic_load_explicit(&p->state, memory_order_relaxed);
	if (st == ST_NEW)
		return -ENOTCONN;
	return st == ST_STOPPED ? 0 : 1;
}

int mbp_pipeline_drain(mbp_pipeline *p, int64_t timeout_ns)
{
	int rc = shutdown_check(p);
	if (rc != 1)
		return rc;
	stop_accepting(p);
	uint64_t deadline = mbp__deadline(timeout_ns);
	/* relaxed counters: accepted is final now; completed only grows */
	uint64_t accepted = atomic_load_explicit(&p->mbs_accepted, memory_order_relaxed);
	while (completed_total(p) < accepted) {
		if (mbp__now_ns() >= deadline)
			return -ETIMEDOUT;
		struct timespec ts = {0, 100000}; /* drain is not a hot path: poll every 100 us */
		nanosleep(&ts, NULL);
	}
	close_and_join(p);
	return 0;
}

int mbp_pipeline_cancel(mbp_pipeline *p)
{
	int rc = shutdown_check(p);
	if (rc != 1)
		return rc;
	/* relaxed: a hint the workers read once per micro-batch; close_and_join() joins them after */
	atomic_store_explicit(&p->cancel, 1, memory_order_relaxed);
	stop_accepting(p);
	close_and_join(p);
	return 0;
}

void mbp_pipeline_destroy(mbp_pipeline *p)
{
	if (!p)
		return;
	/* relaxed: destroy runs on the controlling thread, the only writer of state */
	int st = atomic_load_explicit(&p->state, memory_order_relaxed);
	if (st == ST_RUNNING || st == ST_DRAINING)
		mbp_pipeline_cancel(p);
	for (unsigned i = 0; i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		mbp__ring_destroy(s->out);
		/* a window is replica 0's of the stage that puts into it (win_out, win_done) */
		mbp__seqwin_destroy(s->win_out);
		mbp__seqwin_destroy(s->win_done);
		for (unsigned j = 1; s->rep && j < s->replicas; j++)
			mbp__trace_free(&mbp__stage_replica(s, j)->trace);
		free(s->rep);
		mbp__trace_free(&s->trace);
	}
	int rc = mbp_pool_destroy(p->pool);
	MBP_VERIFY(rc == 0); /* every hop buffer is back once the threads have stopped */
	rc = mbp_pool_destroy(p->mb_pool);
	if (rc) {
		/* The caller still holds buffers from mbp_mb_acquire() or results it never released: a
		 * leak of the caller's making. Keep the pool's memory (freeing it would turn the caller's
		 * pointers into dangling ones) and say so. */
		fprintf(stderr, "mbp_pipeline_destroy: buffers from mbp_mb_acquire() not released; leaked\n");
	}
	mbp__crew_destroy(&p->crew);
	pthread_mutex_destroy(&p->feed.lock);
	pthread_mutex_destroy(&p->err_lock);
	free(p);
}

/* ---- active replicas ---- */

int mbp_pipeline_replicas_set(mbp_pipeline *p, unsigned stage, unsigned active)
{
	if (!p)
		return -EINVAL;
	/* nstages and replicas are fixed before start, on the thread that hands the pipeline on */
	if (stage >= p->nstages || active == 0 || active > p->stages[stage].replicas)
		return -ERANGE;
	/* relaxed: published by the bump's release; a replica that reads it late claims one micro-batch
	 * more, or parks once in vain and reads it again after the bump (worker.c, park_inactive) */
	atomic_store_explicit(&p->park.active[stage], active, memory_order_relaxed);
	if (p->units)
		mbp__gen_bump(&p->park.gen);
	return 0;
}

int mbp_pipeline_replicas_active(mbp_pipeline *p, unsigned stage)
{
	if (!p)
		return -EINVAL;
	if (stage >= p->nstages)
		return -ERANGE;
	/* relaxed: a statistic, the value last set */
	return (int)atomic_load_explicit(&p->park.active[stage], memory_order_relaxed);
}

/* ---- placement ---- */

int mbp_pipeline_placement(mbp_pipeline *p, mbp_placement *out, unsigned n)
{
	if (!p || (!out && n))
		return -EINVAL;
	/* acquire; partner: start's release store (RUNNING, or STOPPED when start failed): the workers'
	 * pin errors, written before start's handshake, are visible */
	int st = atomic_load_explicit(&p->state, memory_order_acquire);
	if (st == ST_NEW)
		return -ENOTCONN;
	for (unsigned i = 0; i < p->nstages && i < n; i++)
		out[i] = mbp__crew_place(&p->crew, p->stages[i].unit, st != ST_STOPPED);
	return (int)p->nstages;
}
