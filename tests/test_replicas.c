/*
 * Replicated stages (mbp_stage_desc.replicas): items stamped (producer, sequence) pass a replicated stage
 * whose function sleeps a different time per item, so that its replicas finish out of order, and come out
 * in submission order, each once, with its own bits; errors in a replica fail their micro-batches only;
 * cancel and destroy with work in flight account for everything; each replica runs init and fini once on
 * its own thread and knows its index; the replicas' statistics sum to the stage's, and a replicated
 * stage's input reports its window's occupancy; more threads than CPUs still completes; the limits are
 * refused with their errors.
 *
 * A row is WORDS 32-bit words: word 0 the producer, word 1 its sequence, words 2.. a payload that stage k
 * maps to w * 3 + k + 1, so a row that skipped a stage, passed one twice or came back in the wrong place
 * is caught.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <mbpipe.h>

#include "pipeline_internal.h"

#include "check_main.h"
#include "pipeline_rig.h"

#define MAXREP 8

struct rep_ctx {
	unsigned k;		/* stage index */
	unsigned sleep_us;	/* the longest sleep per item (0: none); item i sleeps a hash of i below it */
	unsigned fail_mod;	/* fail the items whose sequence % fail_mod == 1 (0: never) */
	_Atomic unsigned *gate; /* if set, wait while *gate == 0 */
	_Atomic unsigned long calls[MAXREP]; /* fn calls per replica */
	_Atomic unsigned long inits[MAXREP], finis[MAXREP];
	_Atomic unsigned init_stage_wrong; /* an init that received another stage's index */
	pthread_t init_tid[MAXREP];
	_Atomic unsigned long fn_elsewhere; /* fn calls on another thread than its replica's init */
	/* overtaking: an item that finished before an earlier one */
	_Atomic unsigned long finished, overtakes;
	_Atomic uint32_t last_seq_done;
};

static uint32_t map(uint32_t w, unsigned k)
{
	return w * 3u + k + 1u;
}

static uint32_t hash32(uint32_t x)
{
	x ^= x >> 16;
	x *= 0x7feb352du;
	x ^= x >> 15;
	x *= 0x846ca68bu;
	x ^= x >> 16;
	return x;
}

static int rep_init(void *arg, unsigned stage)
{
	struct rep_ctx *c = arg;
	unsigned r = mbp_stage_replica();
	if (stage != c->k)
		atomic_fetch_add(&c->init_stage_wrong, 1);
	if (r < MAXREP) {
		c->init_tid[r] = pthread_self();
		atomic_fetch_add(&c->inits[r], 1);
	}
	return 0;
}

static void rep_fini(void *arg)
{
	struct rep_ctx *c = arg;
	unsigned r = mbp_stage_replica();
	if (r < MAXREP)
		atomic_fetch_add(&c->finis[r], 1);
}

static int rep_fn(void *arg, const mbp_mb *in, mbp_mb *out)
{
	struct rep_ctx *c = arg;
	unsigned r = mbp_stage_replica();
	if (r < MAXREP) {
		atomic_fetch_add(&c->calls[r], 1);
		if (c->init_tid[r] && !pthread_equal(c->init_tid[r], pthread_self()))
			atomic_fetch_add(&c->fn_elsewhere, 1);
	}
	if (c->gate)
		while (atomic_load(c->gate) == 0)
			usleep(100);
	const uint32_t *iw = in->data;
	uint32_t *ow = out->data;
	uint32_t seq = iw[1];
	if (c->sleep_us) {
		struct timespec ts = {0, (long)(hash32(seq * 2654435761u + c->k) % c->sleep_us) * 1000};
		nanosleep(&ts, NULL);
	}
	for (uint32_t row = 0; row < in->rows; row++) {
		const uint32_t *a = iw + (size_t)row * WORDS;
		uint32_t *b = ow + (size_t)row * WORDS;
		b[0] = a[0];
		b[1] = a[1];
		for (unsigned w = 2; w < WORDS; w++)
			b[w] = map(a[w], c->k);
	}
	unsigned long nth = atomic_fetch_add(&c->finished, 1);
	(void)nth;
	uint32_t prev = atomic_exchange(&c->last_seq_done, seq);
	if (seq < prev && in->rows == 1)
		atomic_fetch_add(&c->overtakes, 1);
	if (c->fail_mod && seq % c->fail_mod == 1)
		return -EIO;
	return 0;
}

/* The payload word w of a row stamped (producer, seq) at input, and after stages 0 .. S - 1. */
static uint32_t payload(uint32_t producer, uint32_t seq, unsigned w)
{
	return hash32(producer * 1000003u + seq * 31u + w);
}

static uint32_t expected(uint32_t producer, uint32_t seq, unsigned w, unsigned S)
{
	uint32_t v = payload(producer, seq, w);
	for (unsigned k = 0; k < S; k++)
		v = map(v, k);
	return v;
}

static void stamp(uint32_t *row, uint32_t producer, uint32_t seq)
{
	row[0] = producer;
	row[1] = seq;
	for (unsigned w = 2; w < WORDS; w++)
		row[w] = payload(producer, seq, w);
}

/* ---- a pipeline of S stages with replicas reps[k] ---- */

#define MAXPROD 4

struct results {
	unsigned S;
	_Atomic unsigned long got, ok, failed, wrong_bits, out_of_order, wrong_status;
	uint32_t next[MAXPROD]; /* per producer: the next sequence expected (results come on one thread at
				   a time, in order: no lock needed beyond the pipeline's own ordering) */
	unsigned fail_mod;	/* the status expected: -EIO where seq % fail_mod == 1 */
	bool cancelled;		/* -ECANCELED allowed */
	pthread_mutex_t lock;	/* the callback may run on different replicas' threads, one at a time */
};

static void check_result(void *arg, mbp_mb *mb)
{
	struct results *r = arg;
	pthread_mutex_lock(&r->lock);
	const uint32_t *row = mb->data;
	uint32_t prod = row[0], seq = row[1];
	if (mb->status == 0 || mb->status == -EIO) {
		/* the stages passed the stamp on; a cancelled one that no stage saw is unchanged too */
		if (prod < MAXPROD) {
			if (seq != r->next[prod])
				r->out_of_order++;
			r->next[prod] = seq + 1;
		}
	}
	if (mb->status == 0) {
		r->ok++;
		for (unsigned w = 2; w < WORDS; w++)
			if (row[w] != expected(prod, seq, w, r->S))
				r->wrong_bits++;
		if (r->fail_mod && seq % r->fail_mod == 1)
			r->wrong_status++;
	} else {
		r->failed++;
		if (mb->status == -EIO) {
			if (!r->fail_mod || seq % r->fail_mod != 1)
				r->wrong_status++;
		} else if (!(r->cancelled && mb->status == -ECANCELED)) {
			r->wrong_status++;
		}
		if (r->cancelled && prod < MAXPROD)
			r->next[prod] = seq + 1; /* cancel: order is not promised for what never started */
	}
	atomic_fetch_add(&r->got, 1);
	pthread_mutex_unlock(&r->lock);
	mbp_mb_release(NULL, mb);
}

static mbp_pipeline *make(unsigned S, const unsigned *reps, struct rep_ctx *ctx, struct results *res)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.on_result = check_result;
	o.on_result_arg = res;
	res->S = S;
	pthread_mutex_init(&res->lock, NULL);
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (unsigned k = 0; k < S; k++) {
		ctx[k].k = k;
		mbp_stage_desc d = {
		    .fn = rep_fn, .init = rep_init, .fini = rep_fini, .ctx = &ctx[k], .replicas = reps[k]};
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	}
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	return p;
}

struct producer {
	mbp_pipeline *p;
	uint32_t id, n;
	unsigned long accepted;
};

static void *produce(void *arg)
{
	struct producer *pr = arg;
	for (uint32_t i = 0; i < pr->n; i++) {
		mbp_mb *mb;
		if (mbp_mb_acquire(pr->p, &mb, -1))
			break;
		mb->rows = 1;
		stamp(mb->data, pr->id, i);
		if (mbp_mb_submit(pr->p, mb, -1)) {
			mbp_mb_release(pr->p, mb);
			break;
		}
		pr->accepted++;
	}
	return NULL;
}

/* Submit n stamped items from each of np producers; returns how many were accepted. */
static unsigned long produce_all(mbp_pipeline *p, unsigned np, uint32_t n)
{
	pthread_t t[MAXPROD];
	struct producer pr[MAXPROD];
	for (unsigned i = 0; i < np; i++) {
		pr[i] = (struct producer){.p = p, .id = i, .n = n};
		ck_assert_int_eq(pthread_create(&t[i], NULL, produce, &pr[i]), 0);
	}
	unsigned long acc = 0;
	for (unsigned i = 0; i < np; i++) {
		pthread_join(t[i], NULL);
		acc += pr[i].accepted;
	}
	return acc;
}

/* Each test's stages and results (in the test's own process: fork mode), zeroed before each test. */
static struct rep_ctx ctx[4];
static struct results res;

static void reset(void)
{
	memset(ctx, 0, sizeof(ctx));
	memset(&res, 0, sizeof(res));
}

/* Every result of `acc` came back, computed, once, in order, with its bits. */
static void assert_all_in_order(unsigned long acc)
{
	ck_assert_uint_eq(res.got, acc);
	ck_assert_uint_eq(res.ok, acc);
	ck_assert_uint_eq(res.out_of_order, 0);
	ck_assert_uint_eq(res.wrong_bits, 0);
}

static void check_replica_stats(mbp_pipeline *p, unsigned S)
{
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[8];
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, S), (int)S);
	for (unsigned k = 0; k < S; k++) {
		mbp_stage_stats rs[MAXREP];
		int r = mbp_pipeline_replica_stats(p, k, rs, MAXREP);
		ck_assert_int_eq(r, (int)ss[k].replicas);
		ck_assert_int_le(r, MAXREP);
		uint64_t mbs = 0, rows = 0, failed = 0, busy = 0, hist = 0, shist = 0;
		for (int j = 0; j < r; j++) {
			ck_assert_uint_eq(rs[j].replicas, 1);
			mbs += rs[j].mbs;
			rows += rs[j].rows;
			failed += rs[j].failed;
			busy += rs[j].busy_ns;
			for (unsigned b = 0; b < MBP_HIST_BUCKETS; b++)
				hist += rs[j].hist[b];
		}
		for (unsigned b = 0; b < MBP_HIST_BUCKETS; b++)
			shist += ss[k].hist[b];
		ck_assert_uint_eq(mbs, ss[k].mbs);
		ck_assert_uint_eq(rows, ss[k].rows);
		ck_assert_uint_eq(failed, ss[k].failed);
		ck_assert_uint_eq(hist, shist);
		/* busy is read per copy at slightly different instants: after drain they are final */
		ck_assert_uint_eq(busy, ss[k].busy_ns);
	}
	ck_assert_uint_eq(ps.mbs_accepted, ps.mbs_completed + ps.mbs_failed);
}

START_TEST(stamped_items_pass_a_replicated_middle_stage_in_submission_order_with_their_bits)
{
	ctx[1].sleep_us = 300;
	const unsigned reps[3] = {1, 3, 1};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	uint32_t n = (uint32_t)mbp_iters(600, 120);
	unsigned long acc = produce_all(p, 2, n);
	ck_assert_uint_eq(acc, 2ul * n);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	ck_assert_uint_eq(res.next[0], n);
	ck_assert_uint_eq(res.next[1], n);
	/* the replicas did finish out of order: the merge had something to put back */
	ck_assert_uint_gt(ctx[1].overtakes, 0);
	for (unsigned j = 0; j < 3; j++) {
		ck_assert_uint_gt(ctx[1].calls[j], 0); /* whichever was free took work */
		ck_assert_uint_eq(ctx[1].inits[j], 1);
		ck_assert_uint_eq(ctx[1].finis[j], 1);
	}
	ck_assert_uint_eq(ctx[1].init_stage_wrong, 0);
	ck_assert_uint_eq(ctx[1].fn_elsewhere, 0);
	ck_assert_uint_eq(ctx[0].inits[0], 1);
	ck_assert_uint_eq(ctx[0].inits[1], 0);
	check_replica_stats(p, 3);
	mbp_pipeline_destroy(p);
}
END_TEST

/* Every arrangement of replicas around the hops: two replicated stages side by side, a replicated first
 * and last stage, a single replicated stage (first and last at once). */
static const unsigned shapes[][4] = {
    {1, 2, 3, 1}, /* window to window: the replicas of stage 2 claim what those of stage 1 put */
    {3, 1, 1, 2}, /* a replicated stage 0 (the feed) and last stage (completion in order) */
    {2, 0, 0, 0}, /* one stage, replicated */
    {1, 1, 4, 0},
};
static const unsigned shape_stages[] = {4, 4, 1, 3};

START_TEST(every_arrangement_of_replicas_keeps_order_and_bits)
{
	unsigned S = shape_stages[_i];
	for (unsigned k = 0; k < S; k++)
		ctx[k].sleep_us = shapes[_i][k] > 1 ? 200 : 0;
	mbp_pipeline *p = make(S, shapes[_i], ctx, &res);
	uint32_t n = (uint32_t)mbp_iters(400, 100);
	unsigned long acc = produce_all(p, 3, n);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	for (unsigned k = 0; k < S; k++)
		for (unsigned j = 0; j < shapes[_i][k]; j++) {
			ck_assert_uint_eq(ctx[k].inits[j], 1);
			ck_assert_uint_eq(ctx[k].finis[j], 1);
		}
	check_replica_stats(p, S);
	mbp_pipeline_destroy(p);
}
END_TEST

/* Jobs through replicated stages: the output rows land in place, the job completes once with its
 * counts. */
START_TEST(jobs_through_replicated_stages_complete_with_every_row_in_place)
{
	ctx[0].sleep_us = 100;
	ctx[2].sleep_us = 100;
	const unsigned reps[3] = {2, 1, 3};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	enum { JOBS = 6, ROWS = 301, MB = 4 };
	static uint32_t in[JOBS][ROWS][WORDS], out[JOBS][ROWS][WORDS];
	static mbp_job jobs[JOBS];
	for (unsigned j = 0; j < JOBS; j++) {
		for (unsigned r = 0; r < ROWS; r++)
			stamp(in[j][r], j, r);
		memset(out[j], 0, sizeof(out[j]));
		mbp_job_init(&jobs[j], in[j], out[j], ROWS, MB);
		ck_assert_int_eq(mbp_job_submit(p, &jobs[j], -1), 0);
	}
	for (unsigned j = 0; j < JOBS; j++) {
		ck_assert_int_eq(mbp_job_wait(&jobs[j], -1), 0);
		ck_assert_int_eq(jobs[j].status, 0);
		ck_assert_uint_eq(jobs[j].mbs, (ROWS + MB - 1) / MB);
		for (unsigned r = 0; r < ROWS; r++) {
			ck_assert_uint_eq(out[j][r][0], j);
			ck_assert_uint_eq(out[j][r][1], r);
			for (unsigned w = 2; w < WORDS; w++)
				ck_assert_uint_eq(out[j][r][w], expected(j, r, w, 3));
		}
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.jobs_completed, JOBS);
	ck_assert_uint_eq(ps.mbs_completed, JOBS * ((ROWS + MB - 1) / MB));
	check_replica_stats(p, 3);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(an_error_in_a_replica_fails_its_micro_batch_only_and_in_order)
{
	ctx[1].sleep_us = 100;
	ctx[1].fail_mod = 5;
	res.fail_mod = 5;
	const unsigned reps[3] = {1, 3, 2};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	uint32_t n = (uint32_t)mbp_iters(300, 60);
	unsigned long acc = produce_all(p, 1, n);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(res.got, acc);
	ck_assert_uint_eq(res.wrong_status, 0);
	ck_assert_uint_eq(res.out_of_order, 0);
	ck_assert_uint_eq(res.wrong_bits, 0);
	unsigned long bad = 0;
	for (uint32_t i = 0; i < n; i++)
		bad += i % 5 == 1;
	ck_assert_uint_eq(res.failed, bad);
	ck_assert_uint_eq(res.ok, acc - bad);
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[3];
	mbp_pipeline_stats_get(p, &ps, ss, 3);
	ck_assert_uint_eq(ss[1].failed, bad);
	ck_assert_uint_eq(ss[2].mbs, acc - bad); /* a failed one travels on, not computed again */
	ck_assert_uint_eq(ps.mbs_failed, bad);
	check_replica_stats(p, 3);
	mbp_pipeline_destroy(p);
}
END_TEST

/* A job whose micro-batches fail in replicas: its status is the first failure's. */
START_TEST(a_job_failing_in_replicas_reports_its_first_failure)
{
	ctx[0].sleep_us = 100;
	ctx[0].fail_mod = 4; /* the micro-batches whose first row's seq % 4 == 1: rows 1*1... */
	const unsigned reps[2] = {3, 1};
	mbp_pipeline *p = make(2, reps, ctx, &res);
	enum { ROWS = 64 };
	static uint32_t in[ROWS][WORDS], out[ROWS][WORDS];
	for (unsigned r = 0; r < ROWS; r++)
		stamp(in[r], 0, r);
	mbp_job job;
	mbp_job_init(&job, in, out, ROWS, 1);
	ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
	ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
	ck_assert_int_eq(job.status, -EIO);
	ck_assert_uint_eq(job.mbs_failed, ROWS / 4);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_destroy(p);
}
END_TEST

static _Atomic unsigned gate;

START_TEST(cancel_with_work_in_replicas_accounts_for_every_micro_batch)
{
	atomic_store(&gate, 0);
	res.cancelled = true;
	ctx[1].gate = &gate;
	ctx[1].sleep_us = 50;
	const unsigned reps[3] = {1, 3, 2};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	/* a job and single micro-batches, all waiting behind the gate */
	enum { ROWS = 200 };
	static uint32_t in[ROWS][WORDS], out[ROWS][WORDS];
	for (unsigned r = 0; r < ROWS; r++)
		stamp(in[r], 3, r);
	mbp_job job;
	mbp_job_init(&job, in, out, ROWS, 2);
	ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
	unsigned long acc = 0;
	for (uint32_t i = 0; i < 40; i++) {
		mbp_mb *mb;
		ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
		mb->rows = 1;
		stamp(mb->data, 0, i);
		ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
		acc++;
	}
	usleep(20000);
	atomic_store(&gate, 1); /* the replicas inside fn finish; the rest fails */
	ck_assert_int_eq(mbp_pipeline_cancel(p), 0);
	ck_assert_int_eq(mbp_job_wait(&job, 0), 0);
	ck_assert_uint_eq(res.got, acc);
	ck_assert_uint_eq(res.wrong_status, 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, acc + job.mbs);
	ck_assert_uint_eq(ps.jobs_completed + ps.jobs_failed, 1);
	ck_assert_uint_eq(ps.mbs_completed + ps.mbs_failed, acc + job.mbs);
	for (unsigned j = 0; j < 3; j++)
		ck_assert_uint_eq(ctx[1].finis[j], 1);
	mbp_pipeline_destroy(p);
}
END_TEST

/* Poll the statistics until stage k's input holds `want` micro-batches while each of its `held`
 * replicas has entered its fn once (held behind the gate: no replica claims more, so the count is final,
 * not a passing value while one replica has yet to claim; 10 s at most); the last snapshot into ss. */
static void wait_occupancy(mbp_pipeline *p, unsigned S, mbp_stage_stats *ss, unsigned k, uint32_t want,
			   unsigned held)
{
	mbp_pipeline_stats ps;
	for (int i = 0; i < 10000; i++) {
		ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, S), (int)S);
		bool all_in = true;
		for (unsigned j = 0; j < held; j++)
			all_in &= atomic_load(&ctx[k].calls[j]) == 1;
		if (all_in && ss[k].ring_occupancy == want)
			return;
		usleep(1000);
	}
}

/* A replicated stage's input, and the next stage's, are sequenced windows, not rings: their statistics
 * give what waits in the window and its slots (each replica's entry the window it shares), not 0 of 0. */
START_TEST(a_replicated_stage_reports_the_occupancy_of_its_window)
{
	atomic_store(&gate, 0);
	ctx[1].gate = &gate;
	const unsigned reps[3] = {1, 2, 1};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	enum { N = 10 };
	for (uint32_t i = 0; i < N; i++) {
		mbp_mb *mb;
		ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
		mb->rows = 1;
		stamp(mb->data, 0, i);
		ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
	}
	/* both replicas hold one micro-batch behind the gate; stage 0 put the others into the window */
	mbp_stage_stats ss[3];
	wait_occupancy(p, 3, ss, 1, N - 2, 2);
	ck_assert_msg(ss[1].ring_occupancy == N - 2, "stage 1: %u of %u waiting, expected %u",
		      ss[1].ring_occupancy, ss[1].ring_capacity, N - 2);
	ck_assert_uint_eq(ss[1].ring_capacity, p->stages[1].win_in->capacity);
	ck_assert_uint_ge(ss[1].ring_capacity, N);
	mbp_stage_stats rs[2];
	ck_assert_int_eq(mbp_pipeline_replica_stats(p, 1, rs, 2), 2);
	for (unsigned j = 0; j < 2; j++) {
		ck_assert_uint_eq(rs[j].ring_occupancy, N - 2);
		ck_assert_uint_eq(rs[j].ring_capacity, ss[1].ring_capacity);
	}
	/* stage 2 reads the window after the replicas: empty, with its slots */
	ck_assert_uint_eq(ss[2].ring_occupancy, 0);
	ck_assert_uint_eq(ss[2].ring_capacity, p->stages[2].win_in->capacity);
	atomic_store(&gate, 1);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(N);
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, 3), 3);
	ck_assert_uint_eq(ss[1].ring_occupancy, 0);
	ck_assert_uint_eq(ss[2].ring_occupancy, 0);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(destroy_with_work_in_replicas_completes_every_micro_batch)
{
	res.cancelled = true;
	ctx[0].sleep_us = 200;
	ctx[1].sleep_us = 200;
	const unsigned reps[2] = {2, 3};
	mbp_pipeline *p = make(2, reps, ctx, &res);
	unsigned long acc = 0;
	for (uint32_t i = 0; i < 100; i++) {
		mbp_mb *mb;
		ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
		mb->rows = 1;
		stamp(mb->data, 1, i);
		ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
		acc++;
	}
	mbp_pipeline_destroy(p); /* cancels; every result comes back before it returns */
	ck_assert_uint_eq(res.got, acc);
	ck_assert_uint_eq(res.wrong_status, 0);
	ck_assert_uint_eq(res.wrong_bits, 0);
}
END_TEST

/* More threads than CPUs (3 replicas and two stages on this 2-core machine) completes, and no wait
 * spins: a spinning thread would take the slice its
 * peer on the same CPU needs. */
START_TEST(more_replicas_than_cpus_completes)
{
	/* at most 2 of this process's CPUs, so that 3 replicas and the two other stages outnumber them on any
	 * machine (64 threads at most could not outnumber the CPUs of a 64-CPU runner) */
	cpu_set_t given, two;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(given), &given), 0);
	CPU_ZERO(&two);
	for (int c = 0, n = 0; c < CPU_SETSIZE && n < 2; c++)
		if (CPU_ISSET(c, &given)) {
			CPU_SET(c, &two);
			n++;
		}
	ck_assert_int_eq(sched_setaffinity(0, sizeof(two), &two), 0);
	int cpus[MBP_MAX_CPUS];
	int ncpu = mbp_cpus_allowed(cpus, MBP_MAX_CPUS, NULL);
	ck_assert_int_gt(ncpu, 0);
	ck_assert_int_le(ncpu, 2);
	const unsigned reps[3] = {1, (unsigned)ncpu + 1, 1};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	uint32_t n = (uint32_t)mbp_iters(2000, 200);
	unsigned long acc = produce_all(p, 1, n);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.threads, 2 + reps[1]);
	/* threads outnumber the CPUs: no wait spins, on the rings' side or the windows' */
	ck_assert(p->crew.wopts.no_spin);
	ck_assert(p->stages[0].win_out && p->stages[0].win_out->wopts.no_spin);
	ck_assert(p->stages[1].win_out && p->stages[1].win_out->wopts.no_spin);
	mbp_pipeline_destroy(p);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(given), &given), 0);
}
END_TEST

START_TEST(replicas_are_pinned_each_on_its_own_cpu_where_cpus_allow)
{
	int cpus[MBP_MAX_CPUS];
	int ncpu = mbp_cpus_allowed(cpus, MBP_MAX_CPUS, NULL);
	if (ncpu < 2)
		return; /* nothing to tell apart */
	const unsigned reps[1] = {2};
	mbp_pipeline *p = make(1, reps, ctx, &res);
	mbp_stage_stats rs[2];
	ck_assert_int_eq(mbp_pipeline_replica_stats(p, 0, rs, 2), 2);
	if (rs[0].cpu >= 0 && rs[1].cpu >= 0) /* pinned (a failed pin is reported as -1) */
		ck_assert_int_ne(rs[0].cpu, rs[1].cpu);
	mbp_placement pl;
	ck_assert_int_eq(mbp_pipeline_placement(p, &pl, 1), 1);
	ck_assert_int_eq(pl.cpu, rs[0].cpu); /* the stage's placement is its replica 0's */
	mbp_pipeline_destroy(p);
}
END_TEST

/* Start a pipeline of a stage with 2 replicas and one of 1 on `threads` threads: start's result, and
 * the refusal in `rf`. */
static int start_replicas_2_1(unsigned threads, mbp_pipeline_refusal *rf)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.threads = threads;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = copy_fn, .replicas = 2};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	d.replicas = 1;
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	int rc = mbp_pipeline_start(p);
	mbp_pipeline_error(p, rf);
	mbp_pipeline_destroy(p);
	return rc;
}

/* Threads outnumbering the CPUs: a stage's replicas still go to different CPUs while there are two. */
START_TEST(oversubscribed_replicas_of_a_stage_take_different_cpus)
{
	int cpus[MBP_MAX_CPUS];
	int ncpu = mbp_cpus_allowed(cpus, MBP_MAX_CPUS, NULL);
	if (ncpu < 2)
		return;
	const unsigned r = (unsigned)ncpu > 8 ? 8 : (unsigned)ncpu; /* 2 stages of r: 2 r threads */
	const unsigned reps[2] = {r, r};
	mbp_pipeline *p = make(2, reps, ctx, &res);
	for (unsigned k = 0; k < 2; k++) {
		mbp_stage_stats rs[8];
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, rs, 8), (int)r);
		for (unsigned a = 0; a < r; a++)
			for (unsigned b = a + 1; b < r; b++)
				if (rs[a].cpu >= 0 && rs[b].cpu >= 0)
					ck_assert_msg(rs[a].cpu != rs[b].cpu,
						      "stage %u: replicas %u and %u both on CPU %d", k, a, b,
						      rs[a].cpu);
	}
	unsigned long acc = produce_all(p, 1, 200);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(replica_limits_are_refused_with_their_errors)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = copy_fn, .replicas = MBP_MAX_REPLICAS + 1};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -E2BIG);
	d.replicas = 2;
	d.pin_cpu = MBP_PIN_CPU(0);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -EINVAL);
	mbp_pipeline_refusal rf;
	mbp_pipeline_error(p, &rf);
	ck_assert_ptr_nonnull(strstr(rf.what, "replicas"));
	d.pin_cpu = 0;
	d.replicas = MBP_MAX_STAGES - 1;
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	d.replicas = 2; /* 65 threads */
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -E2BIG);
	d.replicas = 0; /* 0 means 1: 64 threads */
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	mbp_pipeline_destroy(p);

	/* threads must be 0 or the sum of the replicas */
	ck_assert_int_eq(start_replicas_2_1(2, &rf), -EINVAL);
	ck_assert_ptr_nonnull(strstr(rf.what, "threads"));
	ck_assert_int_eq(start_replicas_2_1(3, &rf), 0);
	ck_assert_int_eq(start_replicas_2_1(0, &rf), 0);
}
END_TEST

START_TEST(a_trace_has_a_track_per_replica)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.trace_events = 64;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = copy_fn, .name = "front"};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	d = (mbp_stage_desc){.fn = copy_fn, .name = "heavy", .replicas = 2};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	static uint32_t in[16][WORDS], out[16][WORDS];
	ck_assert_int_eq(mbp_run(p, in, out, 16, 1), 0);
	char *t = trace_text(p);
	ck_assert_ptr_nonnull(strstr(t, "front"));
	ck_assert_ptr_nonnull(strstr(t, "heavy replica 0"));
	ck_assert_ptr_nonnull(strstr(t, "heavy replica 1"));
	free(t);
	mbp_pipeline_destroy(p);
}
END_TEST

/* The replica index is 0 outside the pipeline's threads. */
START_TEST(the_replica_index_is_zero_off_the_pipeline)
{
	ck_assert_uint_eq(mbp_stage_replica(), 0);
}
END_TEST

/* ---- active replicas (mbp_pipeline_replicas_set) ---- */

/* Poll until `want` results came back (a wait for a condition, not a timed check). */
static void wait_results(unsigned long want)
{
	while (atomic_load(&res.got) < want)
		usleep(1000);
}

static unsigned long calls_of(unsigned k, unsigned j)
{
	return atomic_load(&ctx[k].calls[j]);
}

/* A replicated stage 0 (the feed), a replicated middle stage (a window's claim) and a replicated last
 * stage (the completion window), each made to run on replica 0 alone: once the claims its replicas held
 * when they were made inactive are spent (one each at most), a batch of stamped items passes with the
 * inactive replicas calling fn not once, their own statistics standing still and saying so (active 0),
 * every item in order with its bits; made active again, they take work again; drain wakes none that is
 * parked in vain: every replica's fini runs once. */
START_TEST(inactive_replicas_claim_nothing_and_reactivated_ones_take_work_again_in_order)
{
	for (unsigned k = 0; k < 3; k++)
		ctx[k].sleep_us = 200;
	const unsigned reps[3] = {2, 3, 2};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	for (unsigned k = 0; k < 3; k++) {
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, k), (int)reps[k]);
		ck_assert_int_eq(mbp_pipeline_replicas_set(p, k, 1), 0);
		ck_assert_int_eq(mbp_pipeline_replicas_active(p, k), 1);
	}
	const uint32_t n = (uint32_t)mbp_iters(200, 60);
	unsigned long acc = produce_all(p, 1, n); /* spends the claims made before the call */
	wait_results(acc);
	unsigned long before[3][3];
	mbp_stage_stats rs[3][MAXREP];
	for (unsigned k = 0; k < 3; k++) {
		for (unsigned j = 0; j < reps[k]; j++)
			before[k][j] = calls_of(k, j);
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, rs[k], MAXREP), (int)reps[k]);
	}
	/* a second producer's batch: replica 0 of each stage computes all of it */
	struct producer pr = {.p = p, .id = 1, .n = n};
	produce(&pr);
	acc += pr.accepted;
	wait_results(acc);
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[3];
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, 3), 3);
	for (unsigned k = 0; k < 3; k++) {
		ck_assert_uint_eq(ss[k].replicas, reps[k]);
		ck_assert_uint_eq(ss[k].active, 1);
		mbp_stage_stats now[MAXREP];
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, now, MAXREP), (int)reps[k]);
		ck_assert_uint_eq(now[0].active, 1);
		unsigned long extras = 0;
		for (unsigned j = 1; j < reps[k]; j++) {
			/* a replica that read "active" just before the call and was then preempted for the
			 * whole first batch still claims the one micro-batch it was about to (pipeline.h: at
			 * most one more); one that did not park computes about n / r of this batch */
			unsigned long extra = calls_of(k, j) - before[k][j];
			extras += extra;
			ck_assert_msg(extra <= 1, "stage %u replica %u computed %lu while inactive", k, j,
				      extra);
			ck_assert_uint_eq(now[j].mbs, rs[k][j].mbs + extra);
			if (!extra)
				ck_assert_uint_eq(now[j].busy_ns, rs[k][j].busy_ns);
			ck_assert_uint_eq(now[j].active, 0);
		}
		ck_assert_uint_eq(calls_of(k, 0), before[k][0] + n - extras); /* replica 0: the rest */
	}
	/* every replica again: each takes work (whichever is free, and the stages sleep) */
	for (unsigned k = 0; k < 3; k++)
		ck_assert_int_eq(mbp_pipeline_replicas_set(p, k, reps[k]), 0);
	pr = (struct producer){.p = p, .id = 2, .n = n};
	produce(&pr);
	acc += pr.accepted;
	ck_assert_uint_eq(acc, 3ul * n);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	for (unsigned k = 0; k < 3; k++)
		for (unsigned j = 0; j < reps[k]; j++) {
			ck_assert_msg(calls_of(k, j) > before[k][j] + (j ? 0 : n),
				      "stage %u replica %u took no work once active again", k, j);
			ck_assert_uint_eq(ctx[k].finis[j], 1);
		}
	check_replica_stats(p, 3);
	mbp_pipeline_destroy(p);
}
END_TEST

/* Replicas parked for good do not hold up the end: cancel (work waiting behind a gate) and drain each
 * wake them, every micro-batch is accounted for and every replica's fini runs once. */
START_TEST(cancel_and_drain_end_a_pipeline_whose_replicas_are_parked)
{
	for (int round = 0; round < 2; round++) {
		reset();
		atomic_store(&gate, round ? 1 : 0);
		res.cancelled = round == 0;
		ctx[1].gate = &gate;
		const unsigned reps[3] = {2, 3, 2};
		mbp_pipeline *p = make(3, reps, ctx, &res);
		for (unsigned k = 0; k < 3; k++)
			ck_assert_int_eq(mbp_pipeline_replicas_set(p, k, 1), 0);
		unsigned long acc = produce_all(p, 2, 50);
		if (round == 0) {
			usleep(20000);
			atomic_store(&gate, 1);
			ck_assert_int_eq(mbp_pipeline_cancel(p), 0);
		} else {
			ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
			assert_all_in_order(acc);
		}
		ck_assert_uint_eq(res.got, acc);
		ck_assert_uint_eq(res.wrong_status, 0);
		mbp_pipeline_stats ps;
		mbp_pipeline_stats_get(p, &ps, NULL, 0);
		ck_assert_uint_eq(ps.mbs_accepted, acc);
		ck_assert_uint_eq(ps.mbs_completed + ps.mbs_failed, acc);
		for (unsigned k = 0; k < 3; k++)
			for (unsigned j = 0; j < reps[k]; j++)
				ck_assert_uint_eq(ctx[k].finis[j], 1);
		mbp_pipeline_destroy(p);
	}
}
END_TEST

/* The four times of each stage summed over its replicas, and its time parked. */
static void times_of(const mbp_stage_stats *s, uint64_t *all, uint64_t *parked)
{
	*all = s->busy_ns + s->starved_ns + s->blocked_ns + s->parked_ns;
	*parked = s->parked_ns;
}

/* One window of an idle pipeline (a 2 ms sleep between two snapshots): whether, for each stage, busy +
 * starved + blocked + parked grew by exactly its threads times the window and parked by its inactive
 * ones' (r - 1) times it. It holds once every thread sits in one state through the window (replica 0
 * waiting for input, the others parked): the engine counts each state from its start while it lasts,
 * so the window's counts are its length exactly, not an estimate. */
static bool idle_window_adds_up(mbp_pipeline *p, unsigned S, const unsigned *reps)
{
	mbp_pipeline_stats a, b;
	mbp_stage_stats sa[4], sb[4];
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &a, sa, S), (int)S);
	usleep(2000);
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &b, sb, S), (int)S);
	const uint64_t w = b.now_ns - a.now_ns;
	for (unsigned k = 0; k < S; k++) {
		uint64_t all_a, all_b, pk_a, pk_b;
		times_of(&sa[k], &all_a, &pk_a);
		times_of(&sb[k], &all_b, &pk_b);
		if (all_b - all_a != reps[k] * w || pk_b - pk_a != (reps[k] - 1) * w)
			return false;
	}
	return true;
}

/* Whether every inactive replica (1 .. r - 1 of each stage) has parked. */
static bool all_inactive_parked(mbp_pipeline *p, unsigned S, const unsigned *reps)
{
	for (unsigned k = 0; k < S; k++) {
		mbp_stage_stats rs[MAXREP];
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, rs, MAXREP), (int)reps[k]);
		for (unsigned j = 1; j < reps[k]; j++)
			if (rs[j].parked_ns == 0)
				return false;
	}
	return true;
}

/* Replicas made inactive (a replicated stage 0, middle and last stage) count their time parked, from
 * when they park: once the work is done and the pipeline idles, each stage's busy + starved + blocked +
 * parked grows by exactly its threads times the window, its parked by its inactive replicas' share,
 * and an inactive replica's busy, starved and blocked stand still. Without the count (or with an
 * estimate) no window adds up exactly, and the bounded wait for one fails. */
START_TEST(parked_time_is_counted_and_every_threads_states_add_up_to_the_window)
{
	const unsigned reps[3] = {2, 3, 2};
	mbp_pipeline *p = make(3, reps, ctx, &res);
	for (unsigned k = 0; k < 3; k++)
		ck_assert_int_eq(mbp_pipeline_replicas_set(p, k, 1), 0);
	unsigned long acc = produce_all(p, 1, (uint32_t)mbp_iters(200, 60));
	wait_results(acc);
	/* waits for a condition: every inactive replica parked, every thread in one state (bounded) */
	for (unsigned t = 0; t < 5000 && !all_inactive_parked(p, 3, reps); t++)
		usleep(1000);
	ck_assert(all_inactive_parked(p, 3, reps));
	mbp_stage_stats before[3][MAXREP];
	for (unsigned k = 0; k < 3; k++)
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, before[k], MAXREP), (int)reps[k]);
	unsigned t = 0;
	while (t < 500 && !idle_window_adds_up(p, 3, reps))
		t++;
	ck_assert_msg(t < 500, "no idle window of 2 ms in 500 added up to the threads' time exactly");
	for (unsigned k = 0; k < 3; k++) {
		mbp_stage_stats now[MAXREP];
		ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, now, MAXREP), (int)reps[k]);
		ck_assert_uint_eq(now[0].parked_ns, 0); /* replica 0 is always active */
		for (unsigned j = 1; j < reps[k]; j++) {
			ck_assert_uint_gt(now[j].parked_ns, before[k][j].parked_ns);
			ck_assert_uint_eq(now[j].busy_ns, before[k][j].busy_ns);
			ck_assert_uint_eq(now[j].starved_ns, before[k][j].starved_ns);
			ck_assert_uint_eq(now[j].blocked_ns, before[k][j].blocked_ns);
		}
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_all_in_order(acc);
	mbp_pipeline_destroy(p);
}
END_TEST

/* After drain and cancel, which wake every parked replica to finish the stream, the statistics say what
 * is true and documented: active stays the count last set (the stage's, mbp_pipeline_replicas_active's,
 * each replica's own 1 or 0), and parked time stopped at the wake: two snapshots after the join agree
 * to the nanosecond, in every time. */
START_TEST(after_shutdown_active_is_the_count_last_set_and_parked_time_stops_at_the_wake)
{
	for (int round = 0; round < 2; round++) {
		reset();
		const unsigned reps[3] = {2, 3, 2};
		mbp_pipeline *p = make(3, reps, ctx, &res);
		for (unsigned k = 0; k < 3; k++)
			ck_assert_int_eq(mbp_pipeline_replicas_set(p, k, 1), 0);
		unsigned long acc = produce_all(p, 1, 50);
		wait_results(acc);
		for (unsigned t = 0; t < 5000 && !all_inactive_parked(p, 3, reps); t++)
			usleep(1000);
		ck_assert(all_inactive_parked(p, 3, reps));
		ck_assert_int_eq(round ? mbp_pipeline_cancel(p) : mbp_pipeline_drain(p, -1), 0);
		assert_all_in_order(acc);
		mbp_pipeline_stats ps;
		mbp_stage_stats a[3], b[3];
		ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, a, 3), 3);
		mbp_stage_stats ra[3][MAXREP], rb[3][MAXREP];
		for (unsigned k = 0; k < 3; k++)
			ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, ra[k], MAXREP), (int)reps[k]);
		usleep(2000);
		ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, b, 3), 3);
		for (unsigned k = 0; k < 3; k++) {
			ck_assert_int_eq(mbp_pipeline_replicas_active(p, k), 1);
			ck_assert_uint_eq(a[k].active, 1);
			ck_assert_uint_eq(b[k].parked_ns, a[k].parked_ns);
			ck_assert_uint_eq(b[k].busy_ns, a[k].busy_ns);
			ck_assert_uint_eq(b[k].starved_ns, a[k].starved_ns);
			ck_assert_uint_eq(b[k].blocked_ns, a[k].blocked_ns);
			ck_assert_int_eq(mbp_pipeline_replica_stats(p, k, rb[k], MAXREP), (int)reps[k]);
			uint64_t parked = 0;
			for (unsigned j = 0; j < reps[k]; j++) {
				ck_assert_uint_eq(rb[k][j].active, j == 0);
				ck_assert_uint_eq(rb[k][j].parked_ns, ra[k][j].parked_ns);
				ck_assert(j == 0 ? rb[k][j].parked_ns == 0 : rb[k][j].parked_ns > 0);
				parked += rb[k][j].parked_ns;
			}
			ck_assert_uint_eq(parked, b[k].parked_ns); /* the replicas' sum is the stage's */
		}
		mbp_pipeline_destroy(p);
	}
}
END_TEST

/* The counts are checked: 1 .. the stage's replicas, a stage in range; before start too; a pipeline
 * without replicas takes 1 for each stage and nothing else. */
START_TEST(active_replica_counts_are_checked)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.on_result = check_result;
	o.on_result_arg = &res;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = rep_fn, .ctx = &ctx[0]};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	d.replicas = 3;
	d.ctx = &ctx[1];
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_replicas_set(NULL, 0, 1), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_replicas_active(NULL, 0), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 2, 1), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_active(p, 2), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 0, 2), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 0, 0), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 0, 1), 0);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 1, 4), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 1, 0), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_active(p, 1), 3); /* refusals change nothing */
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 1, 2), 0); /* before start: kept */
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	ck_assert_int_eq(mbp_pipeline_replicas_active(p, 1), 2);
	mbp_stage_stats ss[2];
	mbp_pipeline_stats ps;
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, 2), 2);
	ck_assert_uint_eq(ss[0].active, 1);
	ck_assert_uint_eq(ss[1].active, 2);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_destroy(p);
	/* no replicas anywhere: the rings of before; 1 is the only count */
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	d = (mbp_stage_desc){.fn = rep_fn, .ctx = &ctx[0]};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 0, 1), 0);
	ck_assert_int_eq(mbp_pipeline_replicas_set(p, 0, 2), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_replicas_active(p, 0), 1);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_destroy(p);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("replicas");
	TCase *tc = tcase_create("replicas");
	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, reset, NULL);
	tcase_add_test(tc, stamped_items_pass_a_replicated_middle_stage_in_submission_order_with_their_bits);
	tcase_add_loop_test(tc, every_arrangement_of_replicas_keeps_order_and_bits, 0,
			    (int)(sizeof(shape_stages) / sizeof(shape_stages[0])));
	tcase_add_test(tc, jobs_through_replicated_stages_complete_with_every_row_in_place);
	tcase_add_test(tc, an_error_in_a_replica_fails_its_micro_batch_only_and_in_order);
	tcase_add_test(tc, a_job_failing_in_replicas_reports_its_first_failure);
	tcase_add_test(tc, cancel_with_work_in_replicas_accounts_for_every_micro_batch);
	tcase_add_test(tc, a_replicated_stage_reports_the_occupancy_of_its_window);
	tcase_add_test(tc, destroy_with_work_in_replicas_completes_every_micro_batch);
	tcase_add_test(tc, more_replicas_than_cpus_completes);
	tcase_add_test(tc, replicas_are_pinned_each_on_its_own_cpu_where_cpus_allow);
	tcase_add_test(tc, oversubscribed_replicas_of_a_stage_take_different_cpus);
	tcase_add_test(tc, replica_limits_are_refused_with_their_errors);
	tcase_add_test(tc, the_replica_index_is_zero_off_the_pipeline);
	tcase_add_test(tc, a_trace_has_a_track_per_replica);
	tcase_add_test(tc, inactive_replicas_claim_nothing_and_reactivated_ones_take_work_again_in_order);
	tcase_add_test(tc, cancel_and_drain_end_a_pipeline_whose_replicas_are_parked);
	tcase_add_test(tc, active_replica_counts_are_checked);
	tcase_add_test(tc, parked_time_is_counted_and_every_threads_states_add_up_to_the_window);
	tcase_add_test(tc, after_shutdown_active_is_the_count_last_set_and_parked_time_stops_at_the_wake);
	suite_add_tcase(s, tc);
	return s;
}
