/*
 * The batcher: see batch.h.
 *
 * Locking: one mutex guards the FIFO and its counters; the batcher thread holds it only to pick rows (the
 * copies into the micro-batch happen outside it, since a request's memory stays put until its last row is
 * back). Segment lists come from a small free list of their own (one mutex, taken once per micro-batch on
 * each side), allocated only when more micro-batches are in flight than ever before: nothing is allocated
 * per micro-batch in steady state.
 */
#include "config.h"

#include "batch.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "util/clock.h"

typedef struct ps_seg {
	ps_req *req;
	uint32_t req_row; /* first row in the request */
	uint32_t mb_row;  /* first row in the micro-batch */
	uint32_t rows;
} ps_seg;

typedef struct ps_batch {
	struct ps_batch *next_free;
	uint64_t t_submit;
	uint32_t nseg;
	ps_seg seg[]; /* max_batch_rows entries: every row may belong to another request */
} ps_batch;

struct ps_batcher {
	ps_batcher_cfg cfg;
	size_t in_row_bytes;
	ps_engine eng; /* cfg.engine's, or the local pipeline's (below) */
	bool eng_started;
	ps_metrics *metrics;

	pthread_mutex_t mu; /* guards everything below up to `thread` */
	pthread_cond_t cv;  /* the batcher thread waits here (CLOCK_MONOTONIC) */
	ps_req *head, *tail;
	size_t queue_rows, queue_reqs; /* rows and requests in the FIFO */
	size_t admitted_rows;	       /* reserved or in the FIFO: the admission bound applies to this */
	bool stopping;
	bool started;
	pthread_t thread;

	_Atomic uint32_t inflight; /* micro-batches submitted and not yet back */
	_Atomic bool want_room;	   /* the batcher is about to sleep until inflight drops */

	pthread_mutex_t free_mu;
	ps_batch *free;

	mbp_model_weights *pin; /* the version micro-batches are pinned to (batcher thread only) */
	uint64_t pin_id;	/* its number; 0 with none */
	mbp_pipeline *local;	/* the default engine's pipeline */
};

/* ---- the default engine: a local pipeline (ctx: the batcher, whose `local` holds it) ---- */

static int local_start(void *ctx, const mbp_opts *o, const mbp_stage_desc *stages, unsigned n)
{
	ps_batcher *b = ctx;
	int rc = mbp_pipeline_new(&b->local, o);
	for (unsigned i = 0; !rc && i < n; i++)
		rc = mbp_pipeline_add_stage(b->local, &stages[i]);
	if (!rc && b->cfg.stages) /* --rebalance-replicas: the plan's replicas active, the others parked */
		rc = mbp_model_stages_attach(b->cfg.stages, b->local);
	return rc ? rc : mbp_pipeline_start(b->local);
}

static int local_acquire(void *ctx, mbp_mb **mb, int64_t timeout_ns)
{
	return mbp_mb_acquire(((ps_batcher *)ctx)->local, mb, timeout_ns);
}

static int local_submit(void *ctx, mbp_mb *mb, int64_t timeout_ns)
{
	return mbp_mb_submit(((ps_batcher *)ctx)->local, mb, timeout_ns);
}

static void local_release(void *ctx, mbp_mb *mb)
{
	mbp_mb_release(((ps_batcher *)ctx)->local, mb);
}

static int local_drain(void *ctx, int64_t timeout_ns)
{
	return mbp_pipeline_drain(((ps_batcher *)ctx)->local, timeout_ns);
}

static void local_destroy(void *ctx)
{
	ps_batcher *b = ctx;
	mbp_pipeline_destroy(b->local);
	b->local = NULL;
}

static mbp_pipeline *local_pipeline(void *ctx)
{
	return ((ps_batcher *)ctx)->local;
}

static ps_batch *batch_get(ps_batcher *b)
{
	pthread_mutex_lock(&b->free_mu);
	ps_batch *bt = b->free;
	if (bt)
		b->free = bt->next_free;
	pthread_mutex_unlock(&b->free_mu);
	if (!bt)
		bt = malloc(sizeof *bt + b->cfg.max_batch_rows * sizeof(ps_seg));
	if (bt)
		bt->nseg = 0;
	return bt;
}

static void batch_put(ps_batcher *b, ps_batch *bt)
{
	pthread_mutex_lock(&b->free_mu);
	bt->next_free = b->free;
	b->free = bt;
	pthread_mutex_unlock(&b->free_mu);
}

static void req_finish(ps_req *r, uint64_t now)
{
	r->status = atomic_load_explicit(&r->err, memory_order_relaxed);
	r->t_done = now;
	r->done(r);
}

/* Account `rows` rows of `r` as back (with error `err`, or 0); the last ones complete it. */
static void req_rows_back(ps_req *r, size_t rows, int err, uint64_t now)
{
	if (err) {
		int zero = 0;
		atomic_compare_exchange_strong_explicit(&r->err, &zero, err, memory_order_relaxed,
							memory_order_relaxed);
	}
	/* acq_rel: release publishes this segment's output rows (and error); the last decrement acquires every
	 * other segment's, so done() sees the whole output. */
	if (atomic_fetch_sub_explicit(&r->left, rows, memory_order_acq_rel) == rows)
		req_finish(r, now);
}

/*
 * A micro-batch left the pipeline: wake the batcher if it waits for room. Dekker-style with the batcher's
 * check (seq_cst on both sides): it stores want_room then loads inflight, this decrements inflight then
 * loads want_room, so at least one of the two sees the other. When this side sees want_room, the batcher
 * holds mu until its wait releases it, so taking mu before signalling cannot miss the sleeper.
 */
static void room_back(ps_batcher *b)
{
	atomic_fetch_sub(&b->inflight, 1);
	if (!atomic_load(&b->want_room))
		return;
	pthread_mutex_lock(&b->mu);
	atomic_store(&b->want_room, false);
	pthread_mutex_unlock(&b->mu);
	pthread_cond_signal(&b->cv);
}

/* The pipeline's result callback, on the last stage's thread. */
static void on_result(void *arg, mbp_mb *mb)
{
	ps_batcher *b = arg;
	ps_batch *bt = mb->user;
	uint64_t now = mbt_now_ns();
	ps_hist_observe(&b->metrics->compute_ns, now - bt->t_submit);
	mbp_model_mb_unpin(mb); /* a micro-batch no stage saw still holds its pin */
	int err = mb->status;
	if (!err && mb->row_bytes != b->cfg.out_row_bytes)
		err = -EPROTO;
	for (uint32_t i = 0; i < bt->nseg; i++) {
		const ps_seg *s = &bt->seg[i];
		if (!err)
			memcpy((char *)s->req->out + (size_t)s->req_row * mb->row_bytes,
			       (const char *)mb->data + (size_t)s->mb_row * mb->row_bytes,
			       (size_t)s->rows * mb->row_bytes);
		req_rows_back(s->req, s->rows, err, now);
	}
	b->eng.release(b->eng.ctx, mb);
	batch_put(b, bt);
	room_back(b);
}

/* Pop requests that waited past the timeout without any row sent (the FIFO's head is the oldest).
 * Called with mu held; returns them as a list. */
static ps_req *expire_locked(ps_batcher *b, uint64_t now)
{
	ps_req *list = NULL, **tail = &list;
	while (b->cfg.timeout_ns && b->head && b->head->next_row == 0 &&
	       now - b->head->t_enqueue >= b->cfg.timeout_ns) {
		ps_req *r = b->head;
		b->head = r->next;
		if (!b->head)
			b->tail = NULL;
		b->queue_rows -= r->rows;
		b->queue_reqs--;
		b->admitted_rows -= r->rows;
		r->next = NULL;
		*tail = r;
		tail = &r->next;
	}
	return list;
}

/* Take up to max_batch_rows rows from the FIFO's head into bt; with head_only, only the head request's. Called
 * with mu held. */
static uint32_t take_rows_locked(ps_batcher *b, ps_batch *bt, uint64_t now, bool head_only)
{
	uint32_t used = 0;
	while (b->head && used < b->cfg.max_batch_rows && !(head_only && used)) {
		ps_req *r = b->head;
		size_t take = r->rows - r->next_row;
		if (take > b->cfg.max_batch_rows - used)
			take = b->cfg.max_batch_rows - used;
		if (r->next_row == 0) {
			r->version = b->pin_id;
			r->t_dispatch = now;
			ps_hist_observe(&b->metrics->queue_ns, now - r->t_enqueue);
		}
		bt->seg[bt->nseg++] = (ps_seg){r, (uint32_t)r->next_row, used, (uint32_t)take};
		r->next_row += take;
		used += (uint32_t)take;
		b->queue_rows -= take;
		b->admitted_rows -= take;
		if (r->next_row == r->rows) {
			b->head = r->next;
			if (!b->head)
				b->tail = NULL;
			b->queue_reqs--;
		}
	}
	return used;
}

static void timed_wait(ps_batcher *b, uint64_t until_ns)
{
	struct timespec ts = mbt_timespec(until_ns);
	pthread_cond_timedwait(&b->cv, &b->mu, &ts);
}

/* Fail every segment of a micro-batch that could not be submitted. */
static void fail_batch(ps_batcher *b, ps_batch *bt, int err)
{
	uint64_t now = mbt_now_ns();
	for (uint32_t i = 0; i < bt->nseg; i++)
		req_rows_back(bt->seg[i].req, bt->seg[i].rows, err, now);
	batch_put(b, bt);
	room_back(b);
}

/* Form, fill and submit one micro-batch; called without mu. @return false when the pipeline refuses work
 * for good (everything queued then fails). */
static bool send_one(ps_batcher *b)
{
	mbp_mb *mb;
	/* Bounded wait, so that timeouts in the FIFO are still served while the pipeline is full. */
	int rc = b->eng.acquire(b->eng.ctx, &mb, 20 * 1000 * 1000);
	if (rc == -EAGAIN || rc == -ETIMEDOUT)
		return true;
	ps_batch *bt = rc ? NULL : batch_get(b);
	if (!bt) {
		if (!rc)
			b->eng.release(b->eng.ctx, mb);
		fprintf(stderr, "pipeserve: cannot get a micro-batch: %s\n", mbp_strerror(rc ? rc : -ENOMEM));
		return rc == 0; /* out of memory for a segment list: retry; a pipeline error: give up */
	}
	uint64_t now = mbt_now_ns();
	/* Only this thread takes rows, so the head's progress read here holds until take_rows_locked. */
	bool stale = b->cfg.model && mbp_model_version(b->cfg.model) != b->pin_id;
	pthread_mutex_lock(&b->mu);
	bool under_way = b->head && b->head->next_row > 0;
	pthread_mutex_unlock(&b->mu);
	if (stale && !under_way) { /* a clean boundary: move to the newest version */
		mbp_model_weights_put(b->pin);
		b->pin = mbp_model_weights_get(b->cfg.model);
		b->pin_id = mbp_model_weights_version(b->pin);
	}
	pthread_mutex_lock(&b->mu);
	uint32_t rows = take_rows_locked(b, bt, now, stale && under_way);
	pthread_mutex_unlock(&b->mu);
	if (!rows) { /* only the batcher removes rows, so this does not happen; stay safe */
		b->eng.release(b->eng.ctx, mb);
		batch_put(b, bt);
		return true;
	}
	if (b->pin)
		mbp_model_mb_pin(mb, b->pin);
	for (uint32_t i = 0; i < bt->nseg; i++) {
		const ps_seg *s = &bt->seg[i];
		memcpy((char *)mb->data + (size_t)s->mb_row * b->in_row_bytes,
		       (const char *)s->req->in + (size_t)s->req_row * b->in_row_bytes,
		       (size_t)s->rows * b->in_row_bytes);
	}
	mb->rows = rows;
	mb->user = bt;
	mb->seq = 0;
	bt->t_submit = mbt_now_ns();
	ps_hist_observe(&b->metrics->batch_rows, rows);
	atomic_fetch_add_explicit(&b->inflight, 1, memory_order_relaxed); /* only the batcher adds */
	rc = b->eng.submit(b->eng.ctx, mb, -1);
	if (rc) {
		mbp_pipeline_refusal rf = {0}; /* the limit, when it was one */
		if (b->eng.pipeline && b->eng.pipeline(b->eng.ctx))
			mbp_pipeline_error(b->eng.pipeline(b->eng.ctx), &rf);
		fprintf(stderr, "pipeserve: submit failed: %s%s%s\n", mbp_strerror(rc),
			rf.err == rc ? ": " : "", rf.err == rc ? rf.what : "");
		mbp_model_mb_unpin(mb);
		b->eng.release(b->eng.ctx, mb);
		fail_batch(b, bt, rc);
		return false;
	}
	return true;
}

/* After a fatal pipeline error: fail everything queued and refuse new work. Called with mu held. */
static void fail_all_locked(ps_batcher *b, int err)
{
	b->stopping = true;
	while (b->head) {
		ps_req *r = b->head;
		b->head = r->next;
		b->queue_rows -= r->rows - r->next_row;
		b->admitted_rows -= r->rows - r->next_row;
		b->queue_reqs--;
		size_t rest = r->rows - r->next_row;
		r->next_row = r->rows;
		pthread_mutex_unlock(&b->mu);
		req_rows_back(r, rest, err, mbt_now_ns());
		pthread_mutex_lock(&b->mu);
	}
	b->tail = NULL;
}

static void *batcher_main(void *arg)
{
	ps_batcher *b = arg;
	pthread_mutex_lock(&b->mu);
	for (;;) {
		uint64_t now = mbt_now_ns();
		ps_req *expired = expire_locked(b, now);
		if (expired) {
			pthread_mutex_unlock(&b->mu);
			while (expired) {
				ps_req *r = expired;
				expired = r->next;
				atomic_store_explicit(&r->err, -ETIMEDOUT, memory_order_relaxed);
				req_finish(r, now);
			}
			pthread_mutex_lock(&b->mu);
			continue;
		}
		if (!b->head) {
			if (b->pin) { /* idle: let an old version go once its micro-batches are back */
				mbp_model_weights *w = b->pin;
				b->pin = NULL;
				b->pin_id = 0;
				pthread_mutex_unlock(&b->mu);
				mbp_model_weights_put(w);
				pthread_mutex_lock(&b->mu);
				continue;
			}
			if (b->stopping)
				break;
			pthread_cond_wait(&b->cv, &b->mu);
			continue;
		}
		uint64_t due = b->head->t_enqueue + b->cfg.max_delay_ns;
		if (b->queue_rows < b->cfg.max_batch_rows && now < due && !b->stopping) {
			uint64_t wake = due;
			if (b->cfg.timeout_ns && b->head->t_enqueue + b->cfg.timeout_ns < wake)
				wake = b->head->t_enqueue + b->cfg.timeout_ns;
			timed_wait(b, wake);
			continue;
		}
		atomic_store(&b->want_room, true); /* pairs with room_back() */
		if (atomic_load(&b->inflight) >= b->cfg.max_inflight) {
			uint64_t wake = now + 20 * 1000 * 1000;
			if (b->cfg.timeout_ns && b->head->next_row == 0 &&
			    b->head->t_enqueue + b->cfg.timeout_ns < wake)
				wake = b->head->t_enqueue + b->cfg.timeout_ns;
			timed_wait(b, wake);
			continue;
		}
		atomic_store_explicit(&b->want_room, false, memory_order_relaxed);
		pthread_mutex_unlock(&b->mu);
		bool ok = send_one(b);
		pthread_mutex_lock(&b->mu);
		if (!ok)
			fail_all_locked(b, -ESHUTDOWN);
	}
	pthread_mutex_unlock(&b->mu);
	return NULL;
}

int ps_batcher_new(ps_batcher **bp, const ps_batcher_cfg *cfg, const mbp_opts *o,
		   const mbp_stage_desc *stages, unsigned nstages, ps_metrics *metrics)
{
	*bp = NULL;
	if (!cfg->max_batch_rows || !cfg->max_queue_rows || !cfg->out_row_bytes || !cfg->max_inflight)
		return -EINVAL;
	ps_batcher *b = calloc(1, sizeof *b);
	if (!b)
		return -ENOMEM;
	b->cfg = *cfg;
	b->in_row_bytes = o->in_row_bytes;
	b->metrics = metrics;
	pthread_mutex_init(&b->mu, NULL);
	pthread_mutex_init(&b->free_mu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&b->cv, &ca);
	pthread_condattr_destroy(&ca);

	mbp_opts opts = *o;
	opts.max_mb_rows = cfg->max_batch_rows;
	opts.on_result = on_result;
	opts.on_result_arg = b;
	if (cfg->engine)
		b->eng = *cfg->engine;
	else
		b->eng = (ps_engine){.ctx = b,
				     .start = local_start,
				     .acquire = local_acquire,
				     .submit = local_submit,
				     .release = local_release,
				     .drain = local_drain,
				     .destroy = local_destroy,
				     .pipeline = local_pipeline};
	b->eng_started = true; /* destroy() undoes a start that failed half-way too */
	int rc = b->eng.start(b->eng.ctx, &opts, stages, nstages);
	if (!rc) {
		rc = -pthread_create(&b->thread, NULL, batcher_main, b);
		b->started = !rc;
	}
	if (rc) {
		ps_batcher_destroy(b);
		return rc;
	}
	*bp = b;
	return 0;
}

int ps_batcher_reserve(ps_batcher *b, size_t rows)
{
	int rc = 0;
	pthread_mutex_lock(&b->mu);
	if (b->stopping)
		rc = -ESHUTDOWN;
	else if (rows > b->cfg.max_queue_rows)
		rc = -E2BIG;
	else if (rows > b->cfg.max_queue_rows - b->admitted_rows)
		rc = -EAGAIN;
	else
		b->admitted_rows += rows;
	pthread_mutex_unlock(&b->mu);
	return rc;
}

void ps_batcher_enqueue(ps_batcher *b, ps_req *r)
{
	r->next = NULL;
	r->next_row = 0;
	r->status = 0;
	r->t_dispatch = r->t_done = 0;
	atomic_store_explicit(&r->left, r->rows, memory_order_relaxed);
	atomic_store_explicit(&r->err, 0, memory_order_relaxed);
	r->t_enqueue = mbt_now_ns();
	pthread_mutex_lock(&b->mu);
	bool wake = !b->head || b->queue_rows + r->rows >= b->cfg.max_batch_rows;
	if (b->tail)
		b->tail->next = r;
	else
		b->head = r;
	b->tail = r;
	b->queue_rows += r->rows;
	b->queue_reqs++;
	pthread_mutex_unlock(&b->mu);
	/* The batcher sleeps either with an empty FIFO or until the head's delay runs out: only an arrival
	 * into an empty FIFO or one that fills a micro-batch changes what it waits for. */
	if (wake)
		pthread_cond_signal(&b->cv);
}

void ps_batcher_queue(ps_batcher *b, uint64_t *requests, uint64_t *rows)
{
	pthread_mutex_lock(&b->mu);
	*requests = b->queue_reqs;
	*rows = b->queue_rows;
	pthread_mutex_unlock(&b->mu);
}

mbp_pipeline *ps_batcher_pipeline(ps_batcher *b)
{
	return b->eng.pipeline(b->eng.ctx);
}

void ps_batcher_stop(ps_batcher *b)
{
	pthread_mutex_lock(&b->mu);
	b->stopping = true;
	pthread_cond_signal(&b->cv);
	pthread_mutex_unlock(&b->mu);
	if (b->started) {
		pthread_join(b->thread, NULL);
		b->started = false;
	}
	if (b->eng_started && b->eng.pipeline(b->eng.ctx)) {
		int rc;
		while ((rc = b->eng.drain(b->eng.ctx, 1000 * 1000 * 1000)) == -ETIMEDOUT)
			fprintf(stderr, "pipeserve: still draining the pipeline\n");
		if (rc)
			fprintf(stderr, "pipeserve: draining the pipeline: %s\n", mbp_strerror(rc));
	}
}

void ps_batcher_destroy(ps_batcher *b)
{
	if (!b)
		return;
	ps_batcher_stop(b);
	if (b->eng_started)
		b->eng.destroy(b->eng.ctx);
	mbp_model_weights_put(b->pin);
	while (b->free) {
		ps_batch *bt = b->free;
		b->free = bt->next_free;
		free(bt);
	}
	pthread_cond_destroy(&b->cv);
	pthread_mutex_destroy(&b->mu);
	pthread_mutex_destroy(&b->free_mu);
	free(b);
}
