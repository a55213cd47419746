/*
 * mbp_pipeline: construction, start, submission, drain, cancel, destroy; job bookkeeping.
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
#include <string.h>
#include <time.h>

#include "affinity.h"
#include "pipeline_internal.h"

/* ---- bound with sleepers ---- */

void mbp__bound_init(struct mbp__bound *b, uint32_t limit)
{
	atomic_init(&b->used, 0);
	b->limit = limit;
	atomic_init(&b->seq, 0);
	atomic_init(&b->sleepers, 0);
	atomic_init(&b->closed, 0);
}

static bool bound_try(struct mbp__bound *b)
{
	uint32_t u = atomic_load_explicit(&b->used, memory_order_relaxed);
	while (u < b->limit) {
		/* relaxed: the unit carries no data; the entry it admits is published by the queue */
		if (atomic_compare_exchange_weak_explicit(&b->used, &u, u + 1, memory_order_relaxed,
							  memory_order_relaxed))
			return true;
	}
	return false;
}

int mbp__bound_take(struct mbp__bound *b, int64_t timeout_ns)
{
	uint64_t deadline = 0;
	for (;;) {
		if (atomic_load_explicit(&b->closed, memory_order_relaxed))
			return -ESHUTDOWN;
		if (bound_try(b))
			return 0;
		if (timeout_ns == 0)
			return -EAGAIN;
		if (deadline == 0)
			deadline = mbp__deadline(timeout_ns);
		/* seq_cst RMW and loads: a Dekker pair with give(), which decrements `used` and then reads
		 * `sleepers`; one of the two sides sees the other */
		uint32_t seq = atomic_load(&b->seq);
		atomic_fetch_add(&b->sleepers, 1);
		int rc = 0;
		if (!atomic_load(&b->closed) && atomic_load(&b->used) >= b->limit)
			rc = mbp__futex_wait(&b->seq, seq, deadline);
		atomic_fetch_sub(&b->sleepers, 1);
		if (rc == -ETIMEDOUT)
			return -ETIMEDOUT;
	}
}

void mbp__bound_give(struct mbp__bound *b, uint32_t n)
{
	atomic_fetch_sub(&b->used, n); /* seq_cst: partner of take()'s sleepers increment */
	if (atomic_load(&b->sleepers)) {
		atomic_fetch_add(&b->seq, 1);
		mbp__futex_wake(&b->seq, INT32_MAX);
	}
}

void mbp__bound_close(struct mbp__bound *b)
{
	atomic_store(&b->closed, 1);
	atomic_fetch_add(&b->seq, 1);
	mbp__futex_wake(&b->seq, INT32_MAX);
}

/* ---- construction ---- */

int mbp_pipeline_new(mbp_pipeline **pp, const mbp_opts *o)
{
	if (!pp)
		return -EINVAL;
	*pp = NULL;
	if (!o || o->in_row_bytes == 0 || o->in_row_bytes > UINT32_MAX || o->max_mb_rows == 0 ||
	    o->ring_capacity < 2 || o->ring_capacity > MBP__RING_MAX_CAPACITY ||
	    !mbp__is_pow2(o->ring_capacity) || o->ingress_depth == 0 || o->mb_buffers == 0 ||
	    o->cache_size == 0 || o->ncpus > MBP_MAX_CPUS)
		return -EINVAL;
	for (uint32_t i = 0; i < o->ncpus; i++)
		if (o->cpus[i] < 0 || o->cpus[i] >= CPU_SETSIZE)
			return -EINVAL;
	mbp__wait_global_init();
	mbp__clock_init();
	struct mbp_pipeline *p = aligned_alloc(MBP_CACHELINE, (sizeof(*p) + MBP_CACHELINE - 1) & ~(size_t)63);
	if (!p)
		return -ENOMEM;
	memset(p, 0, sizeof(*p));
	p->o = *o;
	atomic_init(&p->state, ST_NEW);
	pthread_mutex_init(&p->start_lock, NULL);
	pthread_cond_init(&p->start_cond, NULL);
	__cds_wfcq_init(&p->ingress.head, &p->ingress.tail);
	mbp__bound_init(&p->ingress.room, o->ingress_depth);
	*pp = p;
	return 0;
}

int mbp_pipeline_add_stage(mbp_pipeline *p, const mbp_stage_desc *d)
{
	if (!p || !d || !d->fn || atomic_load(&p->state) != ST_NEW || d->out_row_bytes > UINT32_MAX)
		return -EINVAL;
	if (p->nstages == MBP_MAX_STAGES)
		return -E2BIG;
	if (d->cpu >= CPU_SETSIZE || d->cpu < -1)
		return -ERANGE;
	struct mbp__stage *s = &p->stages[p->nstages];
	memset(s, 0, sizeof(*s));
	s->d = *d;
	s->idx = p->nstages;
	s->p = p;
	s->cpu = -1;
	if (d->name)
		snprintf(s->name, sizeof(s->name), "%s", d->name);
	else
		snprintf(s->name, sizeof(s->name), "stage%u", s->idx);
	s->d.name = s->name;
	s->in_row_bytes = s->idx ? p->stages[s->idx - 1].out_row_bytes : p->o.in_row_bytes;
	s->out_row_bytes = d->out_row_bytes ? d->out_row_bytes : s->in_row_bytes;
	p->nstages++;
	return 0;
}

/* Decide the threads, which stages each runs, each thread's CPU, and the wait mode. */
static int plan_placement(struct mbp_pipeline *p)
{
	int allowed[MBP_MAX_CPUS];
	unsigned quota = 0;
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, &quota);
	if (n < 0)
		return n;
	unsigned navail = (unsigned)(n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS);
	if (quota && quota < navail)
		navail = quota; /* a quota of q CPUs: more than q busy threads only share them */
	const int *list = p->o.ncpus ? p->o.cpus : allowed;
	unsigned nlist = p->o.ncpus ? p->o.ncpus : (unsigned)(n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS);
	unsigned distinct = p->o.ncpus ? p->o.ncpus : navail;
	if (distinct > navail)
		distinct = navail;
	if (distinct == 0)
		distinct = 1;

	const unsigned S = p->nstages;
	bool named = false;
	for (unsigned i = 0; i < S; i++)
		named |= p->o.pin && p->stages[i].d.cpu >= 0; /* unpinned, a named CPU means nothing */
	/* Threads: as asked; by default one per stage while they fit the CPUs (or where the caller placed
	 * stages itself), else one per CPU running consecutive stages (see "Threads and stages" in
	 * pipeline.h). */
	unsigned T = p->o.threads ? p->o.threads : named || S <= distinct ? S : distinct;
	if (T > S)
		T = S;
	p->nthreads = T;

	for (unsigned i = 0; i < S; i++) {
		struct mbp__stage *s = &p->stages[i];
		s->thread_idx = (unsigned)((uint64_t)i * T / S);
		s->leads = i == 0 || s[-1].thread_idx != s->thread_idx;
	}
	for (unsigned i = S; i-- > 0;) {
		struct mbp__stage *s = &p->stages[i];
		s->group_last = i + 1 == S || s[1].leads ? i : s[1].group_last;
	}
	for (unsigned i = 0; i < S; i++) {
		struct mbp__stage *s = &p->stages[i];
		if (!s->leads) {
			s->cpu = s[-1].cpu;
			s->pin_required = s[-1].pin_required;
			continue;
		}
		const unsigned t = s->thread_idx;
		s->cpu = -1;
		s->pin_required = false;
		if (!p->o.pin)
			continue;
		/* A CPU named by a stage of this thread; they must agree. */
		for (unsigned j = i; j <= s->group_last; j++) {
			int c = p->stages[j].d.cpu;
			if (c < 0)
				continue;
			if (s->pin_required && c != s->cpu)
				return -EINVAL;
			s->cpu = c;
			s->pin_required = true;
		}
		if (!s->pin_required && nlist) {
			/* Thread t on the t-th CPU; with more threads than CPUs, consecutive threads share a
			 * CPU (blocks, not round robin), so that half their hops stay on one core. */
			s->cpu = list[T <= nlist ? t : (unsigned)((uint64_t)t * nlist / T)];
			s->pin_required = p->o.ncpus != 0;
		}
	}
	/* Threads that want to run outnumber the CPUs: spinning only burns the slice the peer needs. */
	p->wopts = (struct mbp__wait_opts){
	    .spin_ns = p->o.spin_ns, .yield_ns = p->o.yield_ns, .no_spin = T > distinct};
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
		return -EOVERFLOW;
	/* What the engine can hold at once: full rings, a burst and an output per worker, full caches. */
	uint64_t S = p->nstages;
	uint64_t need = (S - 1) * p->o.ring_capacity + S * (8 + 2) + S * p->o.cache_size;
	if (need > UINT32_MAX)
		return -E2BIG;
	mbp_pool_opts po;
	mbp_pool_opts_init(&po);
	po.buf_bytes = hop_bytes;
	po.max_buffers = (uint32_t)need;
	po.max_bytes = p->o.pool_bytes;
	po.cache_size = p->o.cache_size;
	int rc = mbp_pool_new(&p->pool, &po);
	if (rc)
		return rc;
	mbp__pool_trust(p->pool); /* hop buffers never leave the workers */
	mbp_pool_stats st;
	mbp_pool_stats_get(p->pool, &st);
	if (st.max_buffers < need)
		return -ENOSPC; /* pool_bytes cannot hold what full rings need */
	po.buf_bytes = mb_bytes;
	po.max_buffers = p->o.mb_buffers;
	return mbp_pool_new(&p->mb_pool, &po);
}

static void join_all(struct mbp_pipeline *p)
{
	for (unsigned i = 0; i < p->nstages; i++) {
		if (p->stages[i].thread_started) {
			pthread_join(p->stages[i].thread, NULL);
			p->stages[i].thread_started = false;
		}
	}
}

int mbp_pipeline_start(mbp_pipeline *p)
{
	if (!p)
		return -EINVAL;
	if (atomic_load(&p->state) != ST_NEW)
		return -EALREADY;
	if (p->nstages == 0)
		return -EINVAL;
	int rc = plan_placement(p);
	if (rc == 0)
		rc = make_pools(p);
	for (unsigned i = 0; rc == 0 && i + 1 < p->nstages; i++) {
		if (!p->stages[i + 1].leads)
			continue; /* the same thread calls stage i + 1 */
		rc = mbp__ring_new(&p->stages[i].out, p->o.ring_capacity, &p->wopts, 0);
		if (rc == 0)
			p->stages[i + 1].in = p->stages[i].out;
	}
	if (rc == 0 && p->o.trace_events) {
		for (unsigned i = 0; i < p->nstages && rc == 0; i++) {
			p->stages[i].trace = calloc(p->o.trace_events, sizeof(struct mbp__trace_ev));
			if (!p->stages[i].trace)
				rc = -ENOMEM;
		}
	}
	unsigned launched = 0;
	for (unsigned i = 0; rc == 0 && i < p->nstages; i++) {
		struct mbp__stage *s = &p->stages[i];
		if (!s->leads)
			continue;
		rc = -pthread_create(&s->thread, NULL, mbp__worker_thread, s);
		if (rc == 0) {
			s->thread_started = true;
			launched++;
		}
	}
	pthread_mutex_lock(&p->start_lock);
	while (p->started < launched)
		pthread_cond_wait(&p->start_cond, &p->start_lock);
	if (rc == 0)
		rc = p->start_err;
	p->go = rc == 0 ? 1 : -1;
	pthread_cond_broadcast(&p->start_cond);
	pthread_mutex_unlock(&p->start_lock);
	if (rc) {
		join_all(p); /* each ran fini where its init succeeded */
		atomic_store(&p->state, ST_STOPPED);
		return rc;
	}
	p->start_ns = mbp__clock_ns();
	atomic_store(&p->state, ST_RUNNING);
	return 0;
}

/* ---- submission ---- */

/* Announce a submission; fails unless running. Pair with submit_leave(). */
static int submit_enter(struct mbp_pipeline *p)
{
	/* seq_cst: a Dekker pair with shutdown(), which stores the state and then reads `submitting` */
	atomic_fetch_add(&p->submitting, 1);
	int st = atomic_load(&p->state);
	if (st == ST_RUNNING)
		return 0;
	atomic_fetch_sub(&p->submitting, 1);
	return st == ST_NEW ? -ENOTCONN : -ESHUTDOWN;
}

static void submit_leave(struct mbp_pipeline *p)
{
	atomic_fetch_sub(&p->submitting, 1);
}

/* Reserve room, enqueue, wake stage 0. Called between submit_enter and submit_leave. */
static int ingress_put(struct mbp_pipeline *p, struct mbp__item *it, uint32_t kind, int64_t timeout_ns)
{
	int rc = mbp__bound_take(&p->ingress.room, timeout_ns);
	if (rc)
		return rc;
	it->kind = kind;
	struct cds_wfcq_node *node = (struct cds_wfcq_node *)(void *)it->link;
	cds_wfcq_node_init(node);
	MBP_TSAN_RELEASE(node); /* partner: MBP_TSAN_ACQUIRE after the dequeue in worker.c */
	cds_wfcq_enqueue(&p->ingress.head, &p->ingress.tail, node); /* a full barrier (xchg) */
	mbp__parker_wake(&p->ingress.cons_park);
	return 0;
}

void mbp_job_init(mbp_job *job, const void *in, void *out, size_t rows, uint32_t mb_rows)
{
	memset(job, 0, sizeof(*job));
	job->in = in;
	job->out = out;
	job->rows = rows;
	job->mb_rows = mb_rows;
}

int mbp_job_submit(mbp_pipeline *p, mbp_job *job, int64_t timeout_ns)
{
	if (!p || !job || !job->in || !job->out || job->rows == 0 || job->mb_rows == 0)
		return -EINVAL;
	if (job->mb_rows > p->o.max_mb_rows)
		return -E2BIG;
	uint64_t nmb = (job->rows + job->mb_rows - 1) / job->mb_rows;
	if (nmb > UINT32_MAX)
		return -EINVAL;
	int rc = submit_enter(p);
	if (rc)
		return rc;
	struct mbp__job_priv *jp = mbp__jp(job);
	memset(jp, 0, sizeof(*jp));
	job->status = 0;
	job->mbs = (uint32_t)nmb;
	job->mbs_failed = 0;
	job->done_ns = 0;
	job->submit_ns = mbp__now_ns();
	job->id = atomic_fetch_add_explicit(&p->next_job_id, 1, memory_order_relaxed) + 1;
	atomic_init(&jp->left, (uint32_t)nmb);
	atomic_init(&jp->first_err, UINT64_MAX);
	rc = ingress_put(p, &jp->item, MBP__ITEM_JOB, timeout_ns);
	if (rc == 0) {
		atomic_fetch_add_explicit(&p->jobs_accepted, 1, memory_order_relaxed);
		atomic_fetch_add_explicit(&p->mbs_accepted, nmb, memory_order_relaxed);
	}
	submit_leave(p);
	return rc;
}

void mbp__job_account(struct mbp__stage_counters *c, mbp_job *job, uint32_t k, uint32_t failed, int err,
		      uint32_t seq)
{
	struct mbp__job_priv *jp = mbp__jp(job);
	if (failed) {
		uint64_t mine = ((uint64_t)seq << 32) | (uint32_t)err;
		uint64_t cur = atomic_load_explicit(&jp->first_err, memory_order_relaxed);
		/* relaxed: published to the finisher by the acq_rel decrement of `left` below */
		while (mine < cur &&
		       !atomic_compare_exchange_weak_explicit(&jp->first_err, &cur, mine,
							      memory_order_relaxed, memory_order_relaxed))
			;
		atomic_fetch_add_explicit(&jp->failed, failed, memory_order_relaxed);
	}
	mbp__counter_add(&c->done_mbs, k - failed);
	mbp__counter_add(&c->done_failed_mbs, failed);
	/* acq_rel: the thread that brings `left` to zero sees every other completer's writes (first_err,
	 * failed, the output rows it wrote) */
	uint32_t left = atomic_fetch_sub_explicit(&jp->left, k, memory_order_acq_rel) - k;
	if (left)
		return;
	uint64_t fe = atomic_load_explicit(&jp->first_err, memory_order_relaxed);
	job->status = fe == UINT64_MAX ? 0 : (int)(uint32_t)fe;
	job->mbs_failed = atomic_load_explicit(&jp->failed, memory_order_relaxed);
	job->done_ns = mbp__now_ns();
	mbp__counter_add(job->status ? &c->done_failed_jobs : &c->done_jobs, 1);
	if (job->cb) {
		job->cb(job, job->cb_arg); /* may free the job: touch nothing after */
		return;
	}
	/* release; partner: the acquire load in mbp_job_done()/mbp_job_wait(): the results are visible */
	if (atomic_exchange_explicit(&jp->state, 1, memory_order_release) == 2)
		mbp__futex_wake(&jp->state, INT32_MAX);
}

bool mbp_job_done(const mbp_job *job)
{
	struct mbp__job_priv *jp = mbp__jp((mbp_job *)job);
	/* acquire; partner: the release exchange in mbp__job_account(): the job's results are visible */
	return atomic_load_explicit(&jp->state, memory_order_acquire) == 1;
}

int mbp_job_wait(mbp_job *job, int64_t timeout_ns)
{
	if (!job)
		return -EINVAL;
	struct mbp__job_priv *jp = mbp__jp(job);
	uint64_t deadline = mbp__deadline(timeout_ns);
	for (;;) {
		/* acquire; partner: the release exchange in mbp__job_account() */
		uint32_t st = atomic_load_explicit(&jp->state, memory_order_acquire);
		if (st == 1)
			return 0;
		if (timeout_ns == 0)
			return -ETIMEDOUT;
		if (st == 0) {
			/* announce a sleeper; acquire: on failure it may be the completion (1) */
			if (!atomic_compare_exchange_strong_explicit(&jp->state, &st, 2, memory_order_acquire,
								     memory_order_acquire))
				continue;
		}
		if (mbp__futex_wait(&jp->state, 2, deadline) == -ETIMEDOUT &&
		    atomic_load_explicit(&jp->state, memory_order_acquire) != 1)
			return -ETIMEDOUT;
	}
}

int mbp_run(mbp_pipeline *p, const void *in, void *out, size_t rows, uint32_t mb_rows)
{
	mbp_job job;
	mbp_job_init(&job, in, out, rows, mb_rows);
	int rc = mbp_job_submit(p, &job, -1);
	if (rc)
		return rc;
	mbp_job_wait(&job, -1);
	return job.status;
}

/* ---- single micro-batches ---- */

int mbp_mb_acquire(mbp_pipeline *p, mbp_mb **mb, int64_t timeout_ns)
{
	if (!p || !mb)
		return -EINVAL;
	int st = atomic_load(&p->state);
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
	if (!p || !mb || !p->o.on_result || mb->rows == 0 || mb->rows > p->o.max_mb_rows)
		return -EINVAL;
	int rc = submit_enter(p);
	if (rc)
		return rc;
	mb->row_bytes = (uint32_t)p->o.in_row_bytes;
	mb->status = 0;
	mb->stage = UINT32_MAX;
	mb->job = NULL;
	struct mbp__buf *b = mbp__buf_of(mb);
	rc = ingress_put(p, (struct mbp__item *)(void *)b->link, MBP__ITEM_MB, timeout_ns);
	if (rc == 0)
		atomic_fetch_add_explicit(&p->mbs_accepted, 1, memory_order_relaxed);
	submit_leave(p);
	return rc;
}

void mbp_mb_release(mbp_pipeline *p, mbp_mb *mb)
{
	mbp_pool_put(p->mb_pool, NULL, mb);
}

/* ---- shutdown ---- */

/* Stop accepting; wait until no submitter is between its check and its enqueue. */
static void stop_accepting(struct mbp_pipeline *p)
{
	atomic_store(&p->state, ST_DRAINING); /* seq_cst: partner of submit_enter()'s increment */
	mbp__bound_close(&p->ingress.room);   /* wake submitters blocked on a full ingress */
	while (atomic_load(&p->submitting))
		sched_yield();
}

static uint64_t completed_total(struct mbp_pipeline *p)
{
	uint64_t n = 0;
	for (unsigned i = 0; i < p->nstages; i++)
		n += mbp__counter_get(&p->stages[i].c.done_mbs) +
		     mbp__counter_get(&p->stages[i].c.done_failed_mbs);
	return n;
}

static void close_and_join(struct mbp_pipeline *p)
{
	/* release; partner: the acquire loads of closed in worker.c (ingress_ready, ingress_pop) */
	atomic_store_explicit(&p->ingress.closed, 1, memory_order_release);
	mbp__parker_wake(&p->ingress.cons_park);
	join_all(p);
	atomic_store(&p->state, ST_STOPPED);
}

/* Shared entry of drain and cancel: 1 to go on, else the return value (0: already stopped). */
static int shutdown_check(struct mbp_pipeline *p)
{
	if (!p)
		return -EINVAL;
	int st = atomic_load(&p->state);
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
	atomic_store(&p->cancel, 1);
	stop_accepting(p);
	close_and_join(p);
	return 0;
}

void mbp_pipeline_destroy(mbp_pipeline *p)
{
	if (!p)
		return;
	int st = atomic_load(&p->state);
	if (st == ST_RUNNING || st == ST_DRAINING)
		mbp_pipeline_cancel(p);
	for (unsigned i = 0; i < p->nstages; i++) {
		mbp__ring_destroy(p->stages[i].out);
		free(p->stages[i].trace);
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
	pthread_cond_destroy(&p->start_cond);
	pthread_mutex_destroy(&p->start_lock);
	free(p);
}

/* ---- placement ---- */

int mbp_pipeline_placement(mbp_pipeline *p, mbp_placement *out, unsigned n)
{
	if (!p || (!out && n))
		return -EINVAL;
	if (atomic_load(&p->state) == ST_NEW)
		return -ENOTCONN;
	for (unsigned i = 0; i < p->nstages && i < n; i++) {
		out[i].cpu = p->stages[i].pin_error ? -1 : p->stages[i].cpu;
		out[i].pin_error = p->stages[i].pin_error;
		out[i].thread = p->stages[i].thread_idx;
	}
	return (int)p->nstages;
}
