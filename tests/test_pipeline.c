/*
 * Pipeline engine tests: results in order and correct, every micro-batch accounted for in every path
 * (normal, stage errors, drain, cancel, destroy with work in flight, blocked submitters), every invalid
 * argument rejected with its documented error.
 *
 * Rows are arrays of uint32_t words. Stage k maps each word w to w * 3 + k + 1 (mod 2^32), so the expected
 * output of any row is computable on the side, and a row that went through the stages in the wrong order,
 * twice, or not at all is caught.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <mbpipe.h>

#include "affinity.h"
#include "pipeline_internal.h"

#include "check_main.h"
#include "pipeline_rig.h"

struct stage_ctx {
	unsigned k;	       /* stage index */
	unsigned max_delay_ns; /* random busy delay per micro-batch, 0..max */
	unsigned fail_mod;     /* fail micro-batches whose first word % fail_mod == fail_rem (0: never) */
	unsigned fail_rem;
	int fail_err;
	unsigned out_words; /* words per output row (0: same as input) */
	unsigned in_words;
	_Atomic unsigned *gate; /* if set, wait while *gate == 0 */
	_Atomic unsigned long done_calls;
	_Atomic unsigned long inits, finis;
	int init_err;
	unsigned seed;
	/* the threads that ran init, fn and fini, and the order of init and fini among all stages */
	pthread_t init_tid, fini_tid;
	_Atomic unsigned long fn_elsewhere; /* fn calls on another thread than init's */
	unsigned long init_order, fini_order;
};

static _Atomic unsigned long order_clock;

static uint32_t map(uint32_t w, unsigned k)
{
	return w * 3u + k + 1u;
}

static void busy_ns(unsigned ns)
{
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	do {
		clock_gettime(CLOCK_MONOTONIC, &b);
	} while ((b.tv_sec - a.tv_sec) * 1000000000L + (b.tv_nsec - a.tv_nsec) < (long)ns);
}

static int stage_fn(void *ctxp, const mbp_mb *in, mbp_mb *out)
{
	struct stage_ctx *c = ctxp;
	if (!pthread_equal(pthread_self(), c->init_tid))
		atomic_fetch_add(&c->fn_elsewhere, 1);
	if (c->gate)
		while (!atomic_load(c->gate))
			usleep(100);
	if (c->max_delay_ns)
		busy_ns((unsigned)rand_r(&c->seed) % c->max_delay_ns);
	const uint32_t *src = in->data;
	uint32_t *dst = out->data;
	unsigned iw = in->row_bytes / 4, ow = out->row_bytes / 4;
	ck_assert_uint_eq(out->rows, in->rows);
	ck_assert_uint_le((size_t)out->rows * out->row_bytes, out->capacity);
	if (c->fail_mod && src[0] % c->fail_mod == c->fail_rem)
		return c->fail_err;
	for (uint32_t r = 0; r < in->rows; r++)
		for (unsigned j = 0; j < ow; j++) /* narrower output: sum pairs; same width: map */
			dst[r * ow + j] = ow == iw ? map(src[r * iw + j], c->k)
						   : map(src[r * iw + 2 * j] + src[r * iw + 2 * j + 1], c->k);
	return 0;
}

static int stage_init(void *ctxp, unsigned idx)
{
	struct stage_ctx *c = ctxp;
	ck_assert_uint_eq(idx, c->k);
	atomic_fetch_add(&c->inits, 1);
	c->init_tid = pthread_self();
	c->init_order = atomic_fetch_add(&order_clock, 1);
	return c->init_err;
}

static void stage_fini(void *ctxp)
{
	struct stage_ctx *c = ctxp;
	atomic_fetch_add(&c->finis, 1);
	c->fini_tid = pthread_self();
	c->fini_order = atomic_fetch_add(&order_clock, 1);
}

static void stage_done(void *ctxp, mbp_mb *mb)
{
	struct stage_ctx *c = ctxp;
	atomic_fetch_add(&c->done_calls, 1);
}

static struct stage_ctx ctxs[MBP_MAX_STAGES];

/* Tests registered with tcase_add_loop_test run once per thread mode: opts.threads = the default (which
 * depends on the CPUs), one thread per stage, two threads, one thread running every stage. */
static const uint32_t thread_modes[] = {0, MBP_MAX_STAGES, 2, 1};
#define NMODES (int)(sizeof(thread_modes) / sizeof(thread_modes[0]))
static uint32_t g_threads; /* opts.threads for make(); reset before every test (CK_FORK=no runs them in
			     one process) */
#define THREAD_MODE() (g_threads = thread_modes[_i])

static void reset_thread_mode(void)
{
	g_threads = 0;
}

/* A pipeline of S mapping stages over WORDS-word rows. */
static mbp_pipeline *make(unsigned S, unsigned max_delay_ns, mbp_opts *extra)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.spin_ns = 2000;
	o.yield_ns = 20000;
	if (extra)
		o = *extra;
	if (!o.threads)
		o.threads = g_threads;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (unsigned k = 0; k < S; k++) {
		ctxs[k] = (struct stage_ctx){.k = k, .max_delay_ns = max_delay_ns, .seed = 1234 + k};
		mbp_stage_desc d = {.fn = stage_fn,
				    .init = stage_init,
				    .fini = stage_fini,
				    .done = stage_done,
				    .ctx = &ctxs[k]};
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	}
	return p;
}

static uint32_t expect_word(uint32_t w, unsigned S)
{
	for (unsigned k = 0; k < S; k++)
		w = map(w, k);
	return w;
}

static void fill(uint32_t *in, size_t rows, uint32_t base)
{
	for (size_t i = 0; i < rows * WORDS; i++)
		in[i] = base + (uint32_t)i;
}

static void check_out(const uint32_t *in, const uint32_t *out, size_t rows, unsigned S)
{
	for (size_t i = 0; i < rows * WORDS; i++)
		if (out[i] != expect_word(in[i], S))
			ck_abort_msg("word %zu: got %u, want %u", i, out[i], expect_word(in[i], S));
}

/* accepted = completed + failed, and nothing is still in flight. */
static void assert_conserved(mbp_pipeline *p)
{
	mbp_pipeline_stats ps;
	ck_assert_int_ge(mbp_pipeline_stats_get(p, &ps, NULL, 0), 1);
	ck_assert_uint_eq(ps.mbs_accepted, ps.mbs_completed + ps.mbs_failed);
	ck_assert_uint_eq(ps.jobs_accepted, ps.jobs_completed + ps.jobs_failed);
	ck_assert_uint_eq(ps.pool.in_use, 0);
}

/* mbp_run of `rows` rows (filled from `base`) in micro-batches of 4 through the started pipeline p of S
 * stages, the output checked; then drain, conservation, destroy. */
static void run_checked_and_destroy(mbp_pipeline *p, unsigned S, size_t rows, uint32_t base)
{
	uint32_t *in = malloc(rows * WORDS * 4), *out = calloc(rows * WORDS, 4);
	fill(in, rows, base);
	ck_assert_int_eq(mbp_run(p, in, out, rows, 4), 0);
	check_out(in, out, rows, S);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
	free(in);
	free(out);
}

/* ---- results ---- */

START_TEST(job_results_in_order_with_random_delays_and_short_last_mb)
{
	THREAD_MODE();
	const unsigned S = 3;
	mbp_pipeline *p = make(S, 20000, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	size_t rows = 1001; /* 143 micro-batches of 7 rows, the last one short */
	uint32_t *in = malloc(rows * WORDS * 4), *out = calloc(rows * WORDS, 4);
	fill(in, rows, 17);
	mbp_job job;
	mbp_job_init(&job, in, out, rows, 7);
	ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
	ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
	ck_assert_int_eq(job.status, 0);
	ck_assert_uint_eq(job.mbs, 143);
	ck_assert_uint_eq(job.mbs_failed, 0);
	ck_assert(job.done_ns >= job.submit_ns);
	check_out(in, out, rows, S);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_conserved(p);
	for (unsigned k = 0; k < S; k++) {
		ck_assert_uint_eq(ctxs[k].done_calls, 143 * S / S); /* each stage's done runs once per mb */
		ck_assert_uint_eq(ctxs[k].inits, 1);
		ck_assert_uint_eq(ctxs[k].finis, 1);
	}
	mbp_pipeline_destroy(p);
	free(in);
	free(out);
}
END_TEST

START_TEST(one_to_eight_stages_on_two_cores_in_every_thread_mode_give_exact_results)
{
	THREAD_MODE();
	for (unsigned S = 1; S <= 8; S++) {
		mbp_pipeline *p = make(S, 3000, NULL);
		ck_assert_int_eq(mbp_pipeline_start(p), 0);
		run_checked_and_destroy(p, S, 300, S * 1000);
	}
}
END_TEST

static int sum_pairs_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	const uint32_t *s = in->data;
	uint32_t *d = out->data;
	unsigned iw = in->row_bytes / 4, ow = out->row_bytes / 4;
	for (uint32_t r = 0; r < in->rows; r++)
		for (unsigned j = 0; j < ow; j++)
			d[r * ow + j] = s[r * iw + 2 * j] + s[r * iw + 2 * j + 1];
	return 0;
}

START_TEST(stage_may_change_row_width)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	ctxs[0] = (struct stage_ctx){.k = 0};
	mbp_stage_desc a = {.fn = stage_fn, .ctx = &ctxs[0]};
	mbp_stage_desc b = {.fn = sum_pairs_fn, .out_row_bytes = WORDS / 2 * 4}; /* 4 -> 2 words */
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &a), 0);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &b), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	size_t rows = 50;
	uint32_t in[50 * WORDS], out[50 * WORDS / 2];
	fill(in, rows, 5);
	ck_assert_int_eq(mbp_run(p, in, out, rows, 8), 0);
	for (size_t r = 0; r < rows; r++)
		for (unsigned j = 0; j < WORDS / 2; j++)
			ck_assert_uint_eq(out[r * 2 + j],
					  map(in[r * WORDS + 2 * j], 0) + map(in[r * WORDS + 2 * j + 1], 0));
	mbp_pipeline_destroy(p);
}
END_TEST

/* ---- many producers ---- */

#define PRODUCERS 4

struct producer {
	mbp_pipeline *p;
	unsigned id;
	unsigned jobs;
	unsigned S;
	unsigned long verified;
};

static void *producer_main(void *arg)
{
	struct producer *pr = arg;
	enum { ROWS = 40, INFLIGHT = 4 };
	mbp_job job[INFLIGHT];
	uint32_t in[INFLIGHT][ROWS * WORDS], out[INFLIGHT][ROWS * WORDS];
	for (unsigned j = 0; j < pr->jobs + INFLIGHT; j++) {
		unsigned slot = j % INFLIGHT;
		if (j >= INFLIGHT) { /* collect the job submitted INFLIGHT ago */
			ck_assert_int_eq(mbp_job_wait(&job[slot], -1), 0);
			ck_assert_int_eq(job[slot].status, 0);
			check_out(in[slot], out[slot], ROWS, pr->S);
			pr->verified++;
		}
		if (j >= pr->jobs)
			continue;
		/* stamp: producer id in the top byte, job sequence in the next 16 bits */
		fill(in[slot], ROWS, (pr->id << 24) | (j << 8));
		mbp_job_init(&job[slot], in[slot], out[slot], ROWS, 1 + (j % 9));
		ck_assert_int_eq(mbp_job_submit(pr->p, &job[slot], -1), 0);
	}
	return NULL;
}

START_TEST(four_producers_submit_jobs_at_once_and_each_gets_its_own_results)
{
	THREAD_MODE();
	const unsigned S = 3;
	mbp_pipeline *p = make(S, 0, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	pthread_t t[PRODUCERS];
	struct producer pr[PRODUCERS];
	unsigned jobs = (unsigned)mbp_iters(400, 40);
	for (unsigned i = 0; i < PRODUCERS; i++) {
		pr[i] = (struct producer){.p = p, .id = i + 1, .jobs = jobs, .S = S};
		pthread_create(&t[i], NULL, producer_main, &pr[i]);
	}
	for (unsigned i = 0; i < PRODUCERS; i++) {
		pthread_join(t[i], NULL);
		ck_assert_uint_eq(pr[i].verified, jobs);
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.jobs_accepted, (uint64_t)PRODUCERS * jobs);
	ck_assert_uint_eq(ps.jobs_completed, (uint64_t)PRODUCERS * jobs);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}
END_TEST

/* ---- failures ---- */

START_TEST(stage_failure_fails_its_job_with_first_error_and_pipeline_goes_on)
{
	THREAD_MODE();
	const unsigned S = 4;
	mbp_pipeline *p = make(S, 0, NULL);
	/* stage 2 fails micro-batches whose first input word (after two maps) is even */
	ctxs[2].fail_mod = 2;
	ctxs[2].fail_rem = 0;
	ctxs[2].fail_err = -EIO;
	ctxs[1].fail_mod = 7;
	ctxs[1].fail_rem = 3;
	ctxs[1].fail_err = -EDOM;
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	unsigned long failed_total = 0, mbs_total = 0;
	for (unsigned j = 0; j < 50; j++) {
		size_t rows = 64;
		uint32_t in[64 * WORDS], out[64 * WORDS];
		memset(out, 0xee, sizeof(out));
		fill(in, rows, j * 977);
		mbp_job job;
		mbp_job_init(&job, in, out, rows, 4);
		ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
		ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
		/* expected: walk the micro-batches like the stages do */
		int first_err = 0;
		unsigned failed = 0;
		for (unsigned m = 0; m < 16; m++) {
			uint32_t w0 = in[m * 4 * WORDS];
			int err = 0;
			if (map(w0, 0) % 7 == 3)
				err = -EDOM;
			else if (map(map(w0, 0), 1) % 2 == 0)
				err = -EIO;
			if (err) {
				failed++;
				if (!first_err)
					first_err = err;
			} else {
				check_out(in + m * 4 * WORDS, out + m * 4 * WORDS, 4, S);
			}
		}
		ck_assert_int_eq(job.status, first_err);
		ck_assert_uint_eq(job.mbs_failed, failed);
		failed_total += failed;
		mbs_total += 16;
	}
	ck_assert_uint_gt(failed_total, 0);
	ck_assert_uint_lt(failed_total, mbs_total);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_failed, failed_total);
	ck_assert_uint_eq(ps.mbs_completed, mbs_total - failed_total);
	assert_conserved(p);
	/* done hooks ran for every micro-batch, failed ones too */
	ck_assert_uint_eq(ctxs[0].done_calls, mbs_total);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(random_injected_failures_keep_accounting_exact)
{
	THREAD_MODE();
	const unsigned S = 3;
	mbp_pipeline *p = make(S, 2000, NULL);
	for (unsigned k = 0; k < S; k++) {
		ctxs[k].fail_mod = 5 + k;
		ctxs[k].fail_rem = k;
		ctxs[k].fail_err = -(int)(EIO + k);
	}
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { J = 30, ROWS = 33 };
	static mbp_job job[J];
	static uint32_t in[J][ROWS * WORDS], out[J][ROWS * WORDS];
	for (unsigned j = 0; j < J; j++) {
		fill(in[j], ROWS, (uint32_t)rand());
		mbp_job_init(&job[j], in[j], out[j], ROWS, 1 + j % 5);
		ck_assert_int_eq(mbp_job_submit(p, &job[j], -1), 0);
	}
	uint64_t failed = 0, mbs = 0;
	for (unsigned j = 0; j < J; j++) {
		ck_assert_int_eq(mbp_job_wait(&job[j], -1), 0);
		ck_assert_int_eq(job[j].status != 0, job[j].mbs_failed != 0);
		failed += job[j].mbs_failed;
		mbs += job[j].mbs;
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, mbs);
	ck_assert_uint_eq(ps.mbs_failed, failed);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(failing_init_makes_start_fail_and_runs_fini_where_init_succeeded)
{
	THREAD_MODE();
	mbp_pipeline *p = make(4, 0, NULL);
	ctxs[2].init_err = -EIO;
	ck_assert_int_eq(mbp_pipeline_start(p), -EIO);
	for (unsigned k = 0; k < 4; k++) {
		ck_assert_uint_eq(ctxs[k].inits, 1);
		ck_assert_uint_eq(ctxs[k].finis, k == 2 ? 0 : 1);
	}
	uint32_t in[WORDS], out[WORDS];
	mbp_job job;
	mbp_job_init(&job, in, out, 1, 1);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -ESHUTDOWN);
	ck_assert_int_eq(mbp_pipeline_start(p), -EALREADY);
	mbp_pipeline_destroy(p);
}
END_TEST

/* ---- shutdown paths ---- */

static _Atomic unsigned long cb_count;
static void count_cb(mbp_job *job, void *arg)
{
	(void)job;
	(void)arg;
	atomic_fetch_add(&cb_count, 1);
}

START_TEST(cancel_with_work_in_flight_fails_what_has_not_started)
{
	THREAD_MODE();
	const unsigned S = 3;
	mbp_pipeline *p = make(S, 200000, NULL); /* up to 200 us per micro-batch and stage */
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { J = 40, ROWS = 16 };
	static mbp_job job[J];
	static uint32_t in[J][ROWS * WORDS], out[J][ROWS * WORDS];
	for (unsigned j = 0; j < J; j++) {
		fill(in[j], ROWS, j);
		mbp_job_init(&job[j], in[j], out[j], ROWS, 2);
		ck_assert_int_eq(mbp_job_submit(p, &job[j], -1), 0);
	}
	usleep(3000);
	ck_assert_int_eq(mbp_pipeline_cancel(p), 0);
	unsigned ok = 0, cancelled = 0;
	for (unsigned j = 0; j < J; j++) {
		ck_assert(mbp_job_done(&job[j]));
		ck_assert_int_eq(mbp_job_wait(&job[j], 0), 0);
		if (job[j].status == 0) {
			ok++;
			check_out(in[j], out[j], ROWS, S);
		} else {
			ck_assert_int_eq(job[j].status, -ECANCELED);
			cancelled++;
		}
	}
	ck_assert_uint_gt(cancelled, 0);
	assert_conserved(p);
	ck_assert_int_eq(mbp_job_submit(p, &job[0], 0), -ESHUTDOWN);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(destroy_with_work_in_flight_completes_every_job)
{
	THREAD_MODE();
	mbp_pipeline *p = make(4, 100000, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { J = 64, ROWS = 8 };
	static mbp_job job[J];
	static uint32_t in[J][ROWS * WORDS], out[J][ROWS * WORDS];
	atomic_store(&cb_count, 0);
	for (unsigned j = 0; j < J; j++) {
		mbp_job_init(&job[j], in[j], out[j], ROWS, 1);
		job[j].cb = count_cb;
		ck_assert_int_eq(mbp_job_submit(p, &job[j], -1), 0);
	}
	mbp_pipeline_destroy(p);
	ck_assert_uint_eq(atomic_load(&cb_count), J);
}
END_TEST

START_TEST(drain_finishes_everything_accepted)
{
	THREAD_MODE();
	mbp_pipeline *p = make(3, 50000, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { J = 30, ROWS = 10 };
	static mbp_job job[J];
	static uint32_t in[J][ROWS * WORDS], out[J][ROWS * WORDS];
	for (unsigned j = 0; j < J; j++) {
		fill(in[j], ROWS, j * 31);
		mbp_job_init(&job[j], in[j], out[j], ROWS, 3);
		ck_assert_int_eq(mbp_job_submit(p, &job[j], -1), 0);
	}
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	for (unsigned j = 0; j < J; j++) {
		ck_assert(mbp_job_done(&job[j]));
		ck_assert_int_eq(job[j].status, 0);
		check_out(in[j], out[j], ROWS, 3);
	}
	assert_conserved(p);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0); /* idempotent */
	ck_assert_int_eq(mbp_job_submit(p, &job[0], 0), -ESHUTDOWN);
	mbp_pipeline_destroy(p);
}
END_TEST

static _Atomic unsigned gate;

/* What a callback job tells the test: its status and outputs, copied before the callback frees it. */
struct cb_report {
	_Atomic int fired; /* release in the callback; acquire in the test */
	int status;
	uint32_t out[8 * WORDS];
};

static void report_and_free_cb(mbp_job *job, void *arg)
{
	struct cb_report *r = arg;
	r->status = job->status;
	memcpy(r->out, job->out, sizeof(r->out));
	free(job->out);
	free(job); /* the callback may free the job: the engine never touches it again */
	atomic_store_explicit(&r->fired, 1, memory_order_release);
}

/* The contract of pipeline.h ("Completion"): a job with a callback completes through the callback alone;
 * waiting on it is refused at once (-EINVAL, not a timeout) and done stays false; the callback sees the
 * results and may free the job. */
START_TEST(job_with_callback_completes_through_it_and_refuses_wait)
{
	mbp_pipeline *p = make(2, 0, NULL);
	atomic_store(&gate, 0);
	ctxs[0].gate = &gate; /* keep the job in flight while the test looks */
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { ROWS = 8 };
	static uint32_t in[ROWS * WORDS];
	fill(in, ROWS, 7);
	static struct cb_report r;
	atomic_store(&r.fired, 0);
	mbp_job *job = malloc(sizeof(*job));
	mbp_job_init(job, in, malloc(ROWS * WORDS * 4), ROWS, 3);
	job->cb = report_and_free_cb;
	job->cb_arg = &r;
	ck_assert_int_eq(mbp_job_wait(job, 0), -EINVAL); /* also before submit */
	ck_assert_int_eq(mbp_job_submit(p, job, -1), 0);
	ck_assert_int_eq(mbp_job_wait(job, 5 * 1000000000LL), -EINVAL); /* at once, not -ETIMEDOUT */
	ck_assert(!mbp_job_done(job));
	atomic_store(&gate, 1);
	while (!atomic_load_explicit(&r.fired, memory_order_acquire))
		usleep(100);
	ck_assert_int_eq(r.status, 0);
	check_out(in, r.out, ROWS, 2);
	/* a job without a callback is still waited for and reported done */
	mbp_job plain;
	static uint32_t out2[ROWS * WORDS];
	mbp_job_init(&plain, in, out2, ROWS, 3);
	ck_assert_int_eq(mbp_job_submit(p, &plain, -1), 0);
	ck_assert_int_eq(mbp_job_wait(&plain, -1), 0);
	ck_assert(mbp_job_done(&plain));
	check_out(in, out2, ROWS, 2);
	ck_assert(!mbp_job_done(NULL));
	ck_assert_int_eq(mbp_job_wait(NULL, 0), -EINVAL);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(timeouts_on_wait_submit_and_drain)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.ingress_depth = 1;
	mbp_pipeline *p = make(2, 0, &o);
	atomic_store(&gate, 0);
	ctxs[0].gate = &gate; /* stage 0 holds its first micro-batch until the gate opens */
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	uint32_t in[3][WORDS] = {{1}, {2}, {3}}, out[3][WORDS];
	mbp_job a, b, c;
	mbp_job_init(&a, in[0], out[0], 1, 1);
	mbp_job_init(&b, in[1], out[1], 1, 1);
	mbp_job_init(&c, in[2], out[2], 1, 1);
	ck_assert_int_eq(mbp_job_submit(p, &a, -1), 0);
	usleep(20000); /* stage 0 takes a from the ingress and blocks on the gate */
	ck_assert_int_eq(mbp_job_submit(p, &b, -1), 0); /* fills the ingress (depth 1) */
	ck_assert_int_eq(mbp_job_submit(p, &c, 0), -EAGAIN);
	ck_assert_int_eq(mbp_job_submit(p, &c, 5000000), -ETIMEDOUT);
	ck_assert_int_eq(mbp_job_wait(&a, 0), -ETIMEDOUT);
	ck_assert_int_eq(mbp_job_wait(&a, 2000000), -ETIMEDOUT);
	ck_assert(!mbp_job_done(&a));
	ck_assert_int_eq(mbp_pipeline_drain(p, 2000000), -ETIMEDOUT);
	ck_assert_int_eq(mbp_job_submit(p, &c, 0), -ESHUTDOWN); /* draining: no new work */
	atomic_store(&gate, 1);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_int_eq(mbp_job_wait(&a, 0), 0);
	ck_assert_int_eq(mbp_job_wait(&b, 0), 0);
	ck_assert_int_eq(a.status, 0);
	ck_assert_uint_eq(out[1][0], expect_word(2, 2));
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}
END_TEST

struct blocked_submitter {
	mbp_pipeline *p;
	mbp_job job;
	uint32_t in[WORDS], out[WORDS];
	int rc;
};

static void *blocked_submit_main(void *arg)
{
	struct blocked_submitter *b = arg;
	mbp_job_init(&b->job, b->in, b->out, 1, 1);
	b->rc = mbp_job_submit(b->p, &b->job, -1);
	return NULL;
}

START_TEST(cancel_releases_submitters_blocked_on_a_full_ingress)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.ingress_depth = 2;
	mbp_pipeline *p = make(2, 0, &o);
	atomic_store(&gate, 0);
	ctxs[0].gate = &gate;
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	enum { B = 6 };
	static struct blocked_submitter bs[B];
	pthread_t t[B];
	for (unsigned i = 0; i < B; i++) {
		bs[i] = (struct blocked_submitter){.p = p, .in = {i}};
		pthread_create(&t[i], NULL, blocked_submit_main, &bs[i]);
	}
	usleep(30000);		/* one in stage 0, two in the ingress, the others blocked */
	atomic_store(&gate, 1); /* let the gated stage finish what it holds once cancel starts */
	ck_assert_int_eq(mbp_pipeline_cancel(p), 0);
	unsigned accepted = 0, refused = 0;
	for (unsigned i = 0; i < B; i++) {
		pthread_join(t[i], NULL);
		if (bs[i].rc == 0) {
			accepted++;
			ck_assert(mbp_job_done(&bs[i].job)); /* accepted: completed or failed, never lost */
		} else {
			ck_assert_int_eq(bs[i].rc, -ESHUTDOWN);
			refused++;
		}
	}
	ck_assert_uint_eq(accepted + refused, B);
	ck_assert_uint_ge(accepted, 1);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}
END_TEST

/* ---- micro-batches one by one ---- */

struct results {
	mbp_pipeline *p;
	_Atomic unsigned long got, failed;
	_Atomic unsigned long next_seq[PRODUCERS];
	unsigned S;
	_Atomic int order_ok;
	unsigned fail_mod, fail_rem; /* stage 1 fails inputs whose first word % fail_mod == fail_rem */
	int fail_err;
};

/* Whether stage 1 fails a micro-batch whose first input word is w0 (struct stage_ctx's predicate). */
static bool fails_at_stage1(uint32_t w0, unsigned mod, unsigned rem)
{
	return mod && map(w0, 0) % mod == rem;
}

static void on_result(void *arg, mbp_mb *mb)
{
	struct results *r = arg;
	uintptr_t prod = (uintptr_t)mb->user;
	/* one producer's micro-batches come back in its submission order */
	if (mb->seq != atomic_load(&r->next_seq[prod]))
		atomic_store(&r->order_ok, 0);
	atomic_store(&r->next_seq[prod], mb->seq + 1);
	uint32_t stamp = (uint32_t)(prod << 24 | mb->seq);
	if (fails_at_stage1(stamp, r->fail_mod, r->fail_rem) != (mb->status != 0) ||
	    (mb->status && mb->status != r->fail_err))
		atomic_store(&r->order_ok, 0); /* failed without cause, or not failed with one */
	if (mb->status) {
		atomic_fetch_add(&r->failed, 1);
	} else {
		const uint32_t *d = mb->data;
		for (unsigned i = 0; i < mb->rows * WORDS; i++)
			if (d[i] != expect_word(stamp + i, r->S))
				atomic_store(&r->order_ok, 0);
	}
	atomic_fetch_add(&r->got, 1);
	mbp_mb_release(r->p, mb);
}

struct mb_producer {
	struct results *r;
	unsigned id, n;
};

static void *mb_producer_main(void *arg)
{
	struct mb_producer *mp = arg;
	for (unsigned s = 0; s < mp->n; s++) {
		mbp_mb *mb;
		ck_assert_int_eq(mbp_mb_acquire(mp->r->p, &mb, -1), 0);
		ck_assert_uint_ge(mb->capacity, 5 * WORDS * 4);
		mb->rows = 1 + s % 5;
		mb->seq = s;
		mb->user = (void *)(uintptr_t)mp->id;
		uint32_t *d = mb->data;
		for (unsigned i = 0; i < mb->rows * WORDS; i++)
			d[i] = (uint32_t)(mp->id << 24 | s) + i;
		ck_assert_int_eq(mbp_mb_submit(mp->r->p, mb, -1), 0);
	}
	return NULL;
}

/* A pipeline of S stages whose single micro-batches come back to fn(arg). */
static mbp_pipeline *make_with_results(unsigned S, mbp_result_fn fn, void *arg)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.max_mb_rows = 8;
	o.mb_buffers = 16;
	o.on_result = fn;
	o.on_result_arg = arg;
	return make(S, 0, &o);
}

static mbp_pipeline *make_for_single_mbs(unsigned S, struct results *r)
{
	return make_with_results(S, on_result, r);
}

static void run_single_mbs(unsigned S)
{
	static struct results r;
	memset(&r, 0, sizeof(r));
	atomic_store(&r.order_ok, 1);
	r.S = S;
	mbp_pipeline *p = make_for_single_mbs(S, &r);
	r.p = p;
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	pthread_t t[2];
	struct mb_producer mp[2];
	unsigned n = (unsigned)mbp_iters(3000, 300);
	for (unsigned i = 0; i < 2; i++) {
		mp[i] = (struct mb_producer){.r = &r, .id = i, .n = n};
		pthread_create(&t[i], NULL, mb_producer_main, &mp[i]);
	}
	for (unsigned i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	ck_assert_uint_eq(atomic_load(&r.got), 2 * n);
	ck_assert_uint_eq(atomic_load(&r.failed), 0);
	ck_assert_int_eq(atomic_load(&r.order_ok), 1);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, 2 * n);
	ck_assert_uint_eq(ps.mb_pool.in_use, 0);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}

START_TEST(single_micro_batches_come_back_in_order_with_their_tags)
{
	THREAD_MODE();
	run_single_mbs(3);
}
END_TEST

/* Jobs from one thread while two threads submit single micro-batches, stage 1 failing some of both: every
 * job gets its own rows and exactly its failures, every single micro-batch its own result or error. */
struct job_thread {
	mbp_pipeline *p;
	unsigned jobs, S, mod, rem;
	int err;
	unsigned long failed, mbs;
};

static void *job_thread_main(void *arg)
{
	struct job_thread *jt = arg;
	enum { ROWS = 37 };
	uint32_t in[ROWS * WORDS], out[ROWS * WORDS];
	for (unsigned j = 0; j < jt->jobs; j++) {
		fill(in, ROWS, 0x40000000u + j * 1000u);
		uint32_t m = 1 + j % 6;
		mbp_job job;
		mbp_job_init(&job, in, out, ROWS, m);
		ck_assert_int_eq(mbp_job_submit(jt->p, &job, -1), 0);
		ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
		unsigned failed = 0;
		for (size_t row0 = 0; row0 < ROWS; row0 += m) {
			size_t rows = ROWS - row0 < m ? ROWS - row0 : m;
			if (fails_at_stage1(in[row0 * WORDS], jt->mod, jt->rem))
				failed++;
			else
				check_out(in + row0 * WORDS, out + row0 * WORDS, rows, jt->S);
		}
		ck_assert_uint_eq(job.mbs_failed, failed);
		ck_assert_int_eq(job.status, failed ? jt->err : 0);
		jt->failed += failed;
		jt->mbs += job.mbs;
	}
	return NULL;
}

START_TEST(jobs_and_single_micro_batches_mixed_with_failures_end_as_expected)
{
	THREAD_MODE();
	const unsigned S = 4;
	static struct results r;
	memset(&r, 0, sizeof(r));
	atomic_store(&r.order_ok, 1);
	r.S = S;
	r.fail_mod = 7;
	r.fail_rem = 3;
	r.fail_err = -EDOM;
	mbp_pipeline *p = make_for_single_mbs(S, &r);
	ctxs[1].fail_mod = r.fail_mod;
	ctxs[1].fail_rem = r.fail_rem;
	ctxs[1].fail_err = r.fail_err;
	r.p = p;
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	unsigned n = (unsigned)mbp_iters(2000, 200);
	struct job_thread jt = {
	    .p = p, .jobs = n / 10, .S = S, .mod = r.fail_mod, .rem = r.fail_rem, .err = r.fail_err};
	pthread_t t[3];
	struct mb_producer mp[2];
	for (unsigned i = 0; i < 2; i++) {
		mp[i] = (struct mb_producer){.r = &r, .id = i, .n = n};
		pthread_create(&t[i], NULL, mb_producer_main, &mp[i]);
	}
	pthread_create(&t[2], NULL, job_thread_main, &jt);
	for (unsigned i = 0; i < 3; i++)
		pthread_join(t[i], NULL);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	unsigned long want_failed = 0;
	for (unsigned id = 0; id < 2; id++)
		for (unsigned seq = 0; seq < n; seq++)
			want_failed += fails_at_stage1((uint32_t)(id << 24 | seq), r.fail_mod, r.fail_rem);
	ck_assert_uint_gt(want_failed, 0);
	ck_assert_uint_gt(jt.failed, 0);
	ck_assert_uint_eq(atomic_load(&r.got), 2 * n);
	ck_assert_uint_eq(atomic_load(&r.failed), want_failed);
	ck_assert_int_eq(atomic_load(&r.order_ok), 1);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, 2 * n + jt.mbs);
	ck_assert_uint_eq(ps.mbs_failed, want_failed + jt.failed);
	ck_assert_uint_eq(ps.jobs_accepted, jt.jobs);
	ck_assert_uint_eq(ps.mb_pool.in_use, 0);
	assert_conserved(p);
	mbp_pipeline_destroy(p);
}
END_TEST

/* Results of keep_result_cb: how many came back and the last one, which the test releases. */
struct kept {
	_Atomic unsigned n;
	_Atomic(mbp_mb *) last;
};

static void keep_result_cb(void *arg, mbp_mb *mb)
{
	struct kept *k = arg;
	atomic_store(&k->last, mb);
	atomic_fetch_add(&k->n, 1); /* seq_cst: after `last` */
}

static void wait_results(struct kept *k, unsigned n)
{
	while (atomic_load(&k->n) < n)
		usleep(100);
}

/* mbp_mb_submit refuses, without writing anything, a pointer that mbp_mb_acquire() did not give (on the
 * stack, or inside the pool's headers but not at one), a buffer already submitted whose result is not back,
 * and a released buffer; what was accepted still completes once. */
START_TEST(mb_submit_refuses_foreign_and_twice_submitted_buffers)
{
	static struct kept k;
	atomic_store(&k.n, 0);
	mbp_pipeline *p = make_with_results(2, keep_result_cb, &k);
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_submit(p, (mbp_mb *)&k, 0), -ENOTCONN); /* not started */
	atomic_store(&gate, 0);
	ctxs[0].gate = &gate;
	ck_assert_int_eq(mbp_pipeline_start(p), 0);

	mbp_mb foreign = {.rows = 1, .row_bytes = 16}, copy = foreign;
	ck_assert_int_eq(mbp_mb_submit(p, &foreign, 0), -EINVAL);
	ck_assert_mem_eq(&foreign, &copy, sizeof(foreign));

	ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
	mb->rows = 1;
	((uint32_t *)mb->data)[0] = 5;
	mbp_mb *inside = (mbp_mb *)((char *)mb + 8);
	ck_assert_int_eq(mbp_mb_submit(p, inside, 0), -EINVAL);
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), 0);
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), -EINVAL); /* in flight: held at stage 0's gate */
	ck_assert_int_eq(mbp_mb_submit(p, mb, -1), -EINVAL);
	atomic_store(&gate, 1);
	wait_results(&k, 1);
	ck_assert_ptr_eq(atomic_load(&k.last), mb);
	ck_assert_int_eq(mb->status, 0);
	/* back with its result: the caller's again, to submit once more */
	mb->rows = 1;
	ck_assert_int_eq(mbp_mb_submit(p, mb, -1), 0);
	wait_results(&k, 2);
	mbp_mb_release(p, mb);
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), -EINVAL); /* released */

	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	mbp_pipeline_stats ps;
	mbp_pipeline_stats_get(p, &ps, NULL, 0);
	ck_assert_uint_eq(ps.mbs_accepted, 2);
	ck_assert_uint_eq(ps.mbs_completed, 2);
	ck_assert_uint_eq(atomic_load(&k.n), 2);
	ck_assert_uint_eq(ps.mb_pool.in_use, 0);
	mbp_pipeline_destroy(p);
}
END_TEST

/* A result callback gives back what it received without the pipeline's handle, which did not exist when
 * its options were filled in (a user passed the handle by value and crashed): mbp_mb_release(NULL, mb)
 * finds the pool from the buffer, with two pipelines live at once, each buffer into its own pool. */
struct counted {
	_Atomic unsigned n;
};

static void release_without_handle(void *arg, mbp_mb *mb)
{
	struct counted *c = arg;
	ck_assert_int_eq(mb->status, 0);
	mbp_mb_release(NULL, mb);
	atomic_fetch_add(&c->n, 1);
}

START_TEST(a_result_callback_gives_back_its_buffer_without_the_pipeline)
{
	static struct counted got[2];
	mbp_pipeline *p[2];
	for (unsigned i = 0; i < 2; i++) {
		atomic_store(&got[i].n, 0);
		p[i] = make_with_results(1 + i, release_without_handle, &got[i]); /* no handle in arg */
		ck_assert_int_eq(mbp_pipeline_start(p[i]), 0);
	}
	const unsigned n = 100; /* more than mb_buffers (16): the pools run dry unless they come back */
	for (unsigned k = 0; k < n; k++)
		for (unsigned i = 0; i < 2; i++) {
			mbp_mb *mb;
			ck_assert_int_eq(mbp_mb_acquire(p[i], &mb, 10 * 1000000000LL), 0);
			mb->rows = 1;
			memset(mb->data, 0, WORDS * 4);
			ck_assert_int_eq(mbp_mb_submit(p[i], mb, -1), 0);
		}
	for (unsigned i = 0; i < 2; i++) {
		ck_assert_int_eq(mbp_pipeline_drain(p[i], -1), 0);
		ck_assert_uint_eq(atomic_load(&got[i].n), n);
		mbp_pipeline_stats ps;
		mbp_pipeline_stats_get(p[i], &ps, NULL, 0);
		ck_assert_uint_eq(ps.mb_pool.in_use, 0);
		ck_assert_uint_eq(ps.mb_pool.puts, n);
	}
	/* outside a callback too, and after the pipeline stopped (it is not destroyed yet) */
	mbp_pipeline_destroy(p[1]);
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_acquire(p[0], &mb, 0), -ESHUTDOWN);
	mbp_pipeline_destroy(p[0]);
}
END_TEST

/* Without the handle the buffer must still be one a caller holds from a pipeline that exists: a foreign
 * pointer aborts with a message, as the pool's own release does (mbp_mb_submit refuses one the same way). */
START_TEST(releasing_a_foreign_pointer_without_the_pipeline_aborts)
{
	static struct counted got;
	mbp_pipeline *p = make_with_results(1, release_without_handle, &got);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_mb foreign = {.rows = 1};
	mbp_mb_release(NULL, &foreign);
}
END_TEST

START_TEST(releasing_a_buffer_of_a_destroyed_pipeline_without_it_aborts)
{
	static struct counted got;
	mbp_pipeline *p = make_with_results(1, release_without_handle, &got);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
	mbp_pipeline_destroy(p); /* says it leaks the buffer still held */
	mbp_mb_release(NULL, mb);
}
END_TEST

START_TEST(single_micro_batches_through_one_stage)
{
	run_single_mbs(1);
}
END_TEST

/* ---- invalid arguments ---- */

START_TEST(invalid_arguments_return_documented_errors)
{
	mbp_opts o;
	mbp_opts_init(&o);
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(NULL, &o), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_new(&p, NULL), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), -EINVAL); /* row width 0 */
	o.in_row_bytes = 16;
	o.ring_capacity = 3;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), -EINVAL);
	o.ring_capacity = 16;
	o.pinning = (mbp_pin_mode)2;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), -EINVAL);
	o.pinning = MBP_PIN_PLAN;
	o.max_mb_rows = 8;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);

	mbp_stage_desc d = {.fn = NULL};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, NULL), -EINVAL);
	d.fn = stage_fn;
	d.pin_cpu = MBP_PIN_CPU(CPU_SETSIZE);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -ERANGE);
	d.pin_cpu = UINT_MAX;
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -ERANGE);
	ck_assert_int_eq(mbp_pipeline_start(p), -EINVAL); /* no stages */
	ck_assert_int_eq(mbp_pipeline_drain(p, 0), -ENOTCONN);
	ck_assert_int_eq(mbp_pipeline_cancel(p), -ENOTCONN);
	ck_assert_int_eq(mbp_pipeline_placement(p, NULL, 0), -ENOTCONN);

	uint32_t in[16 * WORDS], out[16 * WORDS];
	mbp_job job;
	mbp_job_init(&job, in, out, 16, 4);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -ENOTCONN); /* before start */
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_acquire(p, &mb, 0), -ENOTCONN);

	ctxs[0] = (struct stage_ctx){.k = 0};
	d.pin_cpu = 0;
	d.ctx = &ctxs[0];
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -EINVAL); /* after start */

	mbp_job_init(&job, in, out, 16, 0);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -EINVAL); /* m = 0 */
	mbp_job_init(&job, in, out, 0, 4);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -EINVAL); /* N = 0 */
	mbp_job_init(&job, NULL, out, 16, 4);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -EINVAL);
	mbp_job_init(&job, in, NULL, 16, 4);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -EINVAL);
	mbp_job_init(&job, in, out, 16, 9);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -E2BIG); /* m > max_mb_rows */
	ck_assert_int_eq(mbp_job_submit(NULL, &job, 0), -EINVAL);
	ck_assert_int_eq(mbp_job_wait(NULL, 0), -EINVAL);

	ck_assert_int_eq(mbp_mb_acquire(p, &mb, 0), 0);
	mb->rows = 1;
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), -EINVAL); /* no on_result */
	mbp_mb_release(p, mb);

	ck_assert_int_eq(mbp_pipeline_cancel(p), 0);
	mbp_job_init(&job, in, out, 16, 4);
	ck_assert_int_eq(mbp_job_submit(p, &job, 0), -ESHUTDOWN); /* after cancel */
	ck_assert_int_eq(mbp_mb_acquire(p, &mb, 0), -ESHUTDOWN);
	mbp_pipeline_destroy(p);
	mbp_pipeline_destroy(NULL);
}
END_TEST

/* Where the pipeline placed each stage's thread, and its waits' budgets, against a pinning and a spin
 * and yield budget (0 the default, MBP_SPIN_NONE none). */
static void placed_and_waiting(mbp_pipeline *p, unsigned S, bool pinned, uint64_t spin, uint64_t yield)
{
	mbp_placement pl[MBP_MAX_STAGES];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, S), (int)S);
	for (unsigned i = 0; i < S; i++)
		ck_assert_msg(pinned ? pl[i].cpu >= 0 : pl[i].cpu == -1, "stage %u on cpu %d", i, pl[i].cpu);
	ck_assert_uint_eq(p->crew.wopts.spin_ns, spin);
	ck_assert_uint_eq(p->crew.wopts.yield_ns, yield);
}

/* A zeroed mbp_opts with its one required field set is complete: every 0 is the default that
 * mbp_opts_init gives (pinned per the plan, 20 us of spin, 200 us of yield, ...), and a job runs. The
 * string's 0 means what it says: spin_us=0 and yield_us=0 are none, pin=0 is unpinned. */
START_TEST(a_zeroed_opts_with_its_row_width_runs_a_job_on_every_default)
{
	mbp_opts zero = {.in_row_bytes = WORDS * 4}, init;
	mbp_opts_init(&init);
	ck_assert_int_eq(mbp_opts_check(&zero, NULL), 0);
	const unsigned S = 2;
	mbp_pipeline *p = make(S, 0, &zero);
	ck_assert_uint_eq(p->o.max_mb_rows, init.max_mb_rows);
	ck_assert_uint_eq(p->o.ring_capacity, init.ring_capacity);
	ck_assert_uint_eq(p->o.ingress_depth, init.ingress_depth);
	ck_assert_uint_eq(p->o.mb_buffers, init.mb_buffers);
	ck_assert_uint_eq(p->o.pool_bytes, init.pool_bytes);
	ck_assert_uint_eq(p->o.cache_size, init.cache_size);
	ck_assert_uint_eq(p->o.spin_ns, init.spin_ns);
	ck_assert_uint_eq(p->o.yield_ns, init.yield_ns);
	ck_assert_int_eq(p->o.pinning, init.pinning);
	ck_assert_int_eq(init.pinning, MBP_PIN_PLAN);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	placed_and_waiting(p, S, true, MBP__SPIN_NS_DEFAULT, MBP__YIELD_NS_DEFAULT);
	run_checked_and_destroy(p, S, 100, 3);

	ck_assert_int_eq(mbp_opts_parse(&zero, "spin_us=0,yield_us=0,pin=0", NULL), 0);
	ck_assert_uint_eq(zero.spin_ns, MBP_SPIN_NONE);
	ck_assert_uint_eq(zero.yield_ns, MBP_YIELD_NONE);
	ck_assert_int_eq(zero.pinning, MBP_PIN_NONE);
	p = make(S, 0, &zero);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	placed_and_waiting(p, S, false, 0, 0);
	run_checked_and_destroy(p, S, 100, 3);
}
END_TEST

/* A call refused for a limit says which limit and its value (mbp_pipeline_error): a micro-batch of 128
 * rows against the default max_mb_rows of 64 said only "too large (E2BIG)". */
static mbp_pipeline_refusal refusal_of(mbp_pipeline *p)
{
	mbp_pipeline_refusal rf;
	ck_assert_int_eq(mbp_pipeline_error(p, &rf), 0);
	return rf;
}

START_TEST(a_refused_submit_or_start_names_the_limit_and_its_value)
{
	static struct counted got;
	mbp_opts o;
	mbp_opts_init(&o); /* max_mb_rows 64 */
	o.in_row_bytes = WORDS * 4;
	o.on_result = release_without_handle;
	o.on_result_arg = &got;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	ck_assert_int_eq(refusal_of(p).err, 0);
	ck_assert_str_eq(refusal_of(p).what, "");
	ck_assert_int_eq(mbp_pipeline_start(p), -EINVAL);
	ck_assert_int_eq(refusal_of(p).err, -EINVAL);
	ck_assert_ptr_nonnull(strstr(refusal_of(p).what, "no stages"));
	mbp_pipeline_destroy(p);

	p = started(1, 0);
	static uint32_t in[128 * WORDS], out[128 * WORDS];
	ck_assert_int_eq(mbp_run(p, in, out, 128, 128), -E2BIG);
	mbp_pipeline_refusal rf = refusal_of(p);
	ck_assert_int_eq(rf.err, -E2BIG);
	ck_assert_str_eq(rf.what, "micro-batches of 128 rows: above max_mb_rows (64)");
	ck_assert_int_eq(mbp_run(p, in, out, 128, 64), 0); /* a success leaves it */
	ck_assert_int_eq(refusal_of(p).err, -E2BIG);
	mbp_pipeline_destroy(p);

	/* a single micro-batch too large, and one of no rows */
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = copy_fn};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mb_acquire(p, &mb, -1), 0);
	mb->rows = 128;
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), -EINVAL);
	rf = refusal_of(p);
	ck_assert_int_eq(rf.err, -EINVAL);
	ck_assert_str_eq(rf.what, "a micro-batch of 128 rows: 1 to max_mb_rows (64)");
	mb->rows = 0;
	ck_assert_int_eq(mbp_mb_submit(p, mb, 0), -EINVAL);
	ck_assert_str_eq(refusal_of(p).what, "a micro-batch of 0 rows: 1 to max_mb_rows (64)");
	mbp_mb_release(p, mb);
	mbp_pipeline_destroy(p);

	/* a start whose pool cannot hold what full rings need */
	mbp_opts_init(&o);
	o.in_row_bytes = 4096;
	o.pool_bytes = 1 << 20; /* 256 KiB buffers (64 rows of 4 KiB): 4 fit, full rings need 100 */
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_start(p), -ENOSPC);
	rf = refusal_of(p);
	ck_assert_int_eq(rf.err, -ENOSPC);
	ck_assert_msg(strstr(rf.what, "pool_bytes (1048576) holds ") && strstr(rf.what, "need 100"), "%s",
		      rf.what);
	mbp_pipeline_destroy(p);

	/* more stages than the engine takes */
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (int i = 0; i < MBP_MAX_STAGES; i++)
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -E2BIG);
	ck_assert_str_eq(refusal_of(p).what, "more than 64 stages (MBP_MAX_STAGES)");
	ck_assert_int_eq(mbp_pipeline_error(NULL, &rf), -EINVAL);
	ck_assert_int_eq(mbp_pipeline_error(p, NULL), -EINVAL);
	mbp_pipeline_destroy(p);
}
END_TEST

/* ---- statistics, placement, trace ---- */

START_TEST(stats_placement_and_trace_describe_the_run)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.trace_events = 1000;
	const unsigned S = 3;
	mbp_pipeline *p = make(S, 20000, &o);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl[MBP_MAX_STAGES];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, MBP_MAX_STAGES), (int)S);
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	mbp_pipeline_stats a, b;
	mbp_stage_stats as[3], bs[3];
	mbp_pipeline_stats_get(p, &a, as, S);
	const unsigned T = a.threads; /* min(S, CPUs), CPUs counting a cgroup quota */
	ck_assert_uint_ge(T, 1);
	ck_assert_uint_le(T, S);
	for (unsigned i = 0; i < S; i++) {
		ck_assert_int_eq(pl[i].pin_error, 0);
		/* stage i on thread i * T / S, thread t on the t-th allowed CPU */
		ck_assert_uint_eq(pl[i].thread, i * T / S);
		unsigned t = pl[i].thread;
		ck_assert_int_eq(pl[i].cpu, allowed[T <= (unsigned)n ? t : t * (unsigned)n / T]);
	}
	size_t rows = 120;
	uint32_t *in = malloc(rows * WORDS * 4), *out = malloc(rows * WORDS * 4);
	fill(in, rows, 1);
	ck_assert_int_eq(mbp_run(p, in, out, rows, 4), 0); /* 30 micro-batches */
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &b, bs, S), (int)S);
	mbp_stats_window(&b, bs, &a, as, S);
	ck_assert_uint_eq(b.rows_completed, rows);
	ck_assert_uint_eq(b.mbs_completed, 30);
	ck_assert(b.throughput > 0);
	ck_assert(b.bubble >= 0 && b.bubble <= 1);
	for (unsigned i = 0; i < S; i++) {
		ck_assert_uint_eq(bs[i].mbs, 30);
		ck_assert_uint_eq(bs[i].rows, rows);
		ck_assert_uint_gt(bs[i].busy_ns, 0);
		uint64_t h = 0;
		for (unsigned k = 0; k < MBP_HIST_BUCKETS; k++)
			h += bs[i].hist[k];
		ck_assert_uint_eq(h, 30);
	}
	ck_assert_str_eq(bs[0].name, "stage0");
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	char *buf = trace_text(p);
	ck_assert_ptr_nonnull(strstr(buf, "\"traceEvents\""));
	unsigned events = 0;
	for (char *s = buf; (s = strstr(s, "\"ph\":\"X\"")); s++)
		events++;
	ck_assert_uint_eq(events, 30 * S);
	free(buf);
	mbp_pipeline_destroy(p);
	free(in);
	free(out);
}
END_TEST

/* Five stages on two threads: stages 0-2 on thread 0, 3-4 on thread 1 (i * T / S). */
START_TEST(stages_sharing_a_thread_run_init_fn_and_fini_there_in_order)
{
	enum { S = 5, T = 2 };
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	o.threads = T;
	mbp_pipeline *p = make(S, 0, &o);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl[S];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, S), S);
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	for (unsigned i = 0; i < S; i++) {
		unsigned t = i * T / S;
		ck_assert_uint_eq(pl[i].thread, t);
		ck_assert_int_eq(pl[i].pin_error, 0);
		/* thread t on the t-th allowed CPU, or sharing one when there are fewer CPUs than threads */
		ck_assert_int_eq(pl[i].cpu, allowed[T <= n ? t : t * (unsigned)n / T]);
	}
	size_t rows = 200;
	uint32_t *in = malloc(rows * WORDS * 4), *out = calloc(rows * WORDS, 4);
	fill(in, rows, 99);
	ck_assert_int_eq(mbp_run(p, in, out, rows, 3), 0);
	check_out(in, out, rows, S);
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[S];
	ck_assert_int_eq(mbp_pipeline_stats_get(p, &ps, ss, S), S);
	ck_assert_uint_eq(ps.threads, T);
	ck_assert_uint_eq(ss[1].ring_capacity, 0); /* called by stage 0, no ring */
	ck_assert_uint_eq(ss[2].ring_capacity, 0);
	ck_assert_uint_eq(ss[3].ring_capacity, o.ring_capacity); /* the ring between the threads */
	ck_assert_uint_eq(ss[4].ring_capacity, 0);
	ck_assert_int_eq(mbp_pipeline_drain(p, -1), 0);
	assert_conserved(p);
	for (unsigned i = 0; i < S; i++) {
		struct stage_ctx *c = &ctxs[i];
		ck_assert_uint_eq(c->inits, 1);
		ck_assert_uint_eq(c->finis, 1);
		ck_assert_uint_eq(c->fn_elsewhere, 0);
		ck_assert(pthread_equal(c->fini_tid, c->init_tid));
		/* the same thread as the previous stage exactly when they share one */
		if (i)
			ck_assert_int_eq(pthread_equal(c->init_tid, ctxs[i - 1].init_tid) != 0,
					 pl[i].thread == pl[i - 1].thread);
		/* on one thread: init in stage order, fini in reverse */
		if (i && pl[i].thread == pl[i - 1].thread) {
			ck_assert_uint_gt(c->init_order, ctxs[i - 1].init_order);
			ck_assert_uint_lt(c->fini_order, ctxs[i - 1].fini_order);
		}
	}
	mbp_pipeline_destroy(p);
	free(in);
	free(out);
}
END_TEST

/* By default threads = min(stages, CPUs); with one thread per stage nothing is shared. */
START_TEST(default_threads_share_only_when_stages_outnumber_cpus)
{
	unsigned cpus = usable_cpus(NULL, NULL);
	for (unsigned S = 1; S <= 6; S++) {
		for (int mode = 0; mode < 2; mode++) {
			mbp_opts o;
			mbp_opts_init(&o);
			o.in_row_bytes = WORDS * 4;
			o.threads = mode ? MBP_MAX_STAGES : 0; /* more than stages: one per stage */
			mbp_pipeline *p = make(S, 0, &o);
			ck_assert_int_eq(mbp_pipeline_start(p), 0);
			mbp_pipeline_stats ps;
			mbp_pipeline_stats_get(p, &ps, NULL, 0);
			ck_assert_uint_eq(ps.threads, mode ? S : S < cpus ? S : cpus);
			mbp_placement pl[6];
			ck_assert_int_eq(mbp_pipeline_placement(p, pl, 6), (int)S);
			for (unsigned i = 0; i < S; i++)
				ck_assert_uint_eq(pl[i].thread, (uint64_t)i * ps.threads / S);
			mbp_pipeline_destroy(p);
		}
	}
}
END_TEST

/* Two stages, the first naming `cpu0`, the second `cpu1` (-1: none), with opts.threads = `threads` and
 * the rest of `extra` (NULL: the defaults). */
static mbp_pipeline *named_pair(int cpu0, int cpu1, uint32_t threads, const mbp_opts *extra)
{
	mbp_opts o;
	mbp_opts_init(&o);
	if (extra)
		o = *extra;
	o.in_row_bytes = WORDS * 4;
	o.threads = threads;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (unsigned k = 0; k < 2; k++) {
		ctxs[k] = (struct stage_ctx){.k = k};
		int c = k ? cpu1 : cpu0;
		mbp_stage_desc d = {.fn = stage_fn,
				    .init = stage_init,
				    .ctx = &ctxs[k],
				    .pin_cpu = c >= 0 ? MBP_PIN_CPU(c) : 0};
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	}
	return p;
}

START_TEST(stages_of_one_thread_naming_different_cpus_fail_start)
{
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	if (n >= 2) {
		mbp_pipeline *q = named_pair(allowed[0], allowed[1], 1, NULL);
		ck_assert_int_eq(mbp_pipeline_start(q), -EINVAL);
		ck_assert_uint_eq(ctxs[0].inits + ctxs[1].inits, 0); /* refused before any thread ran */
		mbp_pipeline_destroy(q);
	}
	/* one named CPU, by the thread's second stage: the whole thread runs there */
	mbp_pipeline *p = named_pair(-1, allowed[n - 1], 1, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl[2];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, 2), 2);
	ck_assert_int_eq(pl[0].cpu, allowed[n - 1]);
	ck_assert_int_eq(pl[1].cpu, allowed[n - 1]);
	ck_assert_uint_eq(pl[1].thread, 0);
	uint32_t in[WORDS] = {1, 2, 3, 4}, out[WORDS];
	ck_assert_int_eq(mbp_run(p, in, out, 1, 1), 0);
	check_out(in, out, 1, 2);
	mbp_pipeline_destroy(p);
}
END_TEST

/* A descriptor with only fn set (C users zero their structs) leaves placement to the plan: stage i on the
 * i-th allowed CPU, never every stage on CPU 0. */
START_TEST(zeroed_descriptor_leaves_placement_to_the_plan)
{
	int allowed[MBP_MAX_CPUS];
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL);
	ck_assert_int_ge(n, 1);
	unsigned S = n < 4 ? (unsigned)n : 4;
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	for (unsigned k = 0; k < S; k++) {
		ctxs[k] = (struct stage_ctx){.k = k};
		mbp_stage_desc d = {.fn = stage_fn, .ctx = &ctxs[k]};
		ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	}
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl[4];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, S), (int)S);
	for (unsigned k = 0; k < S; k++) {
		ck_assert_int_eq(pl[k].pin_error, 0);
		ck_assert_int_eq(pl[k].cpu, allowed[k]);
		ck_assert_uint_eq(pl[k].thread, k);
	}
	uint32_t in[WORDS] = {1, 2, 3, 4}, out[WORDS];
	ck_assert_int_eq(mbp_run(p, in, out, 1, 1), 0);
	check_out(in, out, 1, S);
	mbp_pipeline_destroy(p);
}
END_TEST

/* A named CPU is checked against the CPUs this process may use when the stage is added: -ERANGE then,
 * not a failed pin at start. */
START_TEST(named_cpu_outside_the_allowed_set_is_refused_at_add_stage)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	int outside = -1;
	for (int c = 0; c < CPU_SETSIZE && outside < 0; c++)
		if (!CPU_ISSET(c, &set))
			outside = c;
	ck_assert_int_ge(outside, 0);
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = WORDS * 4;
	mbp_pipeline *p;
	ck_assert_int_eq(mbp_pipeline_new(&p, &o), 0);
	mbp_stage_desc d = {.fn = stage_fn, .ctx = &ctxs[0], .pin_cpu = MBP_PIN_CPU(outside)};
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), -ERANGE);
	d.pin_cpu = MBP_PIN_CPU(allowed[0]);
	ck_assert_int_eq(mbp_pipeline_add_stage(p, &d), 0);
	mbp_pipeline_destroy(p);
}
END_TEST

/* By default a pipeline whose stages name CPUs keeps one thread per stage (the caller placed them), also
 * on one CPU; unpinned, the names do not count. */
START_TEST(named_cpus_keep_a_thread_per_stage_by_default)
{
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	mbp_pipeline *p = named_pair(allowed[0], allowed[0], 0, NULL);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	mbp_placement pl[2];
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, 2), 2);
	ck_assert_uint_eq(pl[0].thread, 0);
	ck_assert_uint_eq(pl[1].thread, 1);
	ck_assert_int_eq(pl[0].cpu, allowed[0]);
	ck_assert_int_eq(pl[1].cpu, allowed[0]);
	ck_assert(!pthread_equal(ctxs[0].init_tid, ctxs[1].init_tid));
	mbp_pipeline_destroy(p);

	/* unpinned, on a list of one CPU: the names do not count, the two stages share one thread */
	mbp_opts o;
	mbp_opts_init(&o);
	o.pinning = MBP_PIN_NONE;
	o.ncpus = 1;
	o.cpus[0] = allowed[0];
	p = named_pair(allowed[0], allowed[0], 0, &o);
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	ck_assert_int_eq(mbp_pipeline_placement(p, pl, 2), 2);
	ck_assert_uint_eq(pl[1].thread, 0);
	ck_assert_int_eq(pl[0].cpu, -1);
	mbp_pipeline_destroy(p);
}
END_TEST

START_TEST(snapshot_counts_a_computation_while_it_lasts)
{
	mbp_pipeline *p = make(2, 0, NULL);
	atomic_store(&gate, 0);
	ctxs[0].gate = &gate; /* stage 0 stays inside its function until the gate opens */
	ck_assert_int_eq(mbp_pipeline_start(p), 0);
	uint32_t in[WORDS] = {1}, out[WORDS];
	mbp_job job;
	mbp_job_init(&job, in, out, 1, 1);
	ck_assert_int_eq(mbp_job_submit(p, &job, -1), 0);
	usleep(60000);
	mbp_pipeline_stats ps;
	mbp_stage_stats ss[2];
	mbp_pipeline_stats_get(p, &ps, ss, 2);
	ck_assert_uint_eq(ss[0].mbs, 0);	       /* not finished yet ... */
	ck_assert_uint_ge(ss[0].busy_ns, 40000000);    /* ... but its time so far is counted */
	ck_assert_uint_ge(ss[1].starved_ns, 40000000); /* and so is the wait of the stage after it */
	atomic_store(&gate, 1);
	ck_assert_int_eq(mbp_job_wait(&job, -1), 0);
	mbp_pipeline_stats ps2;
	mbp_stage_stats ss2[2];
	mbp_pipeline_stats_get(p, &ps2, ss2, 2);
	ck_assert_uint_ge(ss2[0].busy_ns, ss[0].busy_ns); /* monotonic across the end of the state */
	ck_assert_uint_ge(ss2[1].starved_ns + ss2[1].busy_ns, ss[1].starved_ns);
	mbp_pipeline_destroy(p);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pipeline");
	TCase *tc = tcase_create("pipeline");
	tcase_add_checked_fixture(tc, reset_thread_mode, NULL);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, job_results_in_order_with_random_delays_and_short_last_mb, 0, NMODES);
	tcase_add_loop_test(tc, one_to_eight_stages_on_two_cores_in_every_thread_mode_give_exact_results, 0,
			    NMODES);
	tcase_add_test(tc, stage_may_change_row_width);
	tcase_add_loop_test(tc, four_producers_submit_jobs_at_once_and_each_gets_its_own_results, 0, NMODES);
	tcase_add_loop_test(tc, stage_failure_fails_its_job_with_first_error_and_pipeline_goes_on, 0, NMODES);
	tcase_add_loop_test(tc, random_injected_failures_keep_accounting_exact, 0, NMODES);
	tcase_add_loop_test(tc, failing_init_makes_start_fail_and_runs_fini_where_init_succeeded, 0, NMODES);
	tcase_add_loop_test(tc, cancel_with_work_in_flight_fails_what_has_not_started, 0, NMODES);
	tcase_add_loop_test(tc, destroy_with_work_in_flight_completes_every_job, 0, NMODES);
	tcase_add_loop_test(tc, drain_finishes_everything_accepted, 0, NMODES);
	tcase_add_test(tc, timeouts_on_wait_submit_and_drain);
	tcase_add_test(tc, mb_submit_refuses_foreign_and_twice_submitted_buffers);
	tcase_add_test(tc, job_with_callback_completes_through_it_and_refuses_wait);
	tcase_add_test(tc, cancel_releases_submitters_blocked_on_a_full_ingress);
	tcase_add_loop_test(tc, single_micro_batches_come_back_in_order_with_their_tags, 0, NMODES);
	tcase_add_loop_test(tc, jobs_and_single_micro_batches_mixed_with_failures_end_as_expected, 0, NMODES);
	tcase_add_test(tc, single_micro_batches_through_one_stage);
	tcase_add_test(tc, a_result_callback_gives_back_its_buffer_without_the_pipeline);
	tcase_add_test_raise_signal(tc, releasing_a_foreign_pointer_without_the_pipeline_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, releasing_a_buffer_of_a_destroyed_pipeline_without_it_aborts,
				    SIGABRT);
	tcase_add_test(tc, invalid_arguments_return_documented_errors);
	tcase_add_test(tc, a_refused_submit_or_start_names_the_limit_and_its_value);
	tcase_add_test(tc, a_zeroed_opts_with_its_row_width_runs_a_job_on_every_default);
	tcase_add_test(tc, stats_placement_and_trace_describe_the_run);
	tcase_add_test(tc, stages_sharing_a_thread_run_init_fn_and_fini_there_in_order);
	tcase_add_test(tc, default_threads_share_only_when_stages_outnumber_cpus);
	tcase_add_test(tc, stages_of_one_thread_naming_different_cpus_fail_start);
	tcase_add_test(tc, named_cpus_keep_a_thread_per_stage_by_default);
	tcase_add_test(tc, zeroed_descriptor_leaves_placement_to_the_plan);
	tcase_add_test(tc, named_cpu_outside_the_allowed_set_is_refused_at_add_stage);
	tcase_add_test(tc, snapshot_counts_a_computation_while_it_lasts);
	suite_add_tcase(s, tc);
	return s;
}
