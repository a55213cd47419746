/*
 * The pipeline across MPI ranks: run under `mpirun -np R` (tests/mpi.sh runs it with R = 2 and 4). Every
 * rank runs the same tests in the same order; rank 0 submits and checks results, the others serve
 * (mbp_mpi_wait) and check what their own stages saw.
 *
 * Rows are stamped: words [producer, sequence, hops, check]. Every stage checks that each producer's
 * sequence numbers reach it in increasing order (counting violations; a replicated one, whose threads
 * take them in any order, does not), adds one hop and folds its global stage index into check; the last
 * stage of the last rank widens the row with a fifth word (producer << 32 | sequence), so the last rank's
 * output width differs from the first rank's input width. Rank 0 knows
 * the expected output of every row, and conservation (accepted = completed + failed) is checked on rank 0
 * over all ranks and on every rank for its own pipeline.
 *
 * Check runs without fork here (CK_FORK=no is forced): forking an MPI process is not supported. A failed
 * assertion fails its rank's run; the other ranks then stop hearing from it and fail too, by the engine's
 * timeout, instead of hanging.
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

#include <mpi.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include <check.h>

#include "mpi/mpi_internal.h" /* mbp__mpi_test_reserving */

#define STAGES_PER_RANK 2
#define MAX_PRODUCERS	4
#define IN_WORDS	4
#define OUT_WORDS	5
#define SEC		((int64_t)1000000000)

static int rank, size;

struct tstage {
	unsigned g; /* global stage index */
	bool widen; /* the very last stage: adds the fifth word */
	unsigned delay_us;
	bool gated;		     /* waits while gate_closed (rank 0's first stage, when cfg.gate0) */
	bool replicated;	     /* runs on several threads: in any order, so it checks none */
	unsigned fail_mod, fail_rem; /* fail a micro-batch whose first row's sequence % mod == rem */
	uint64_t last[MAX_PRODUCERS];
	bool seen[MAX_PRODUCERS];
	_Atomic unsigned long violations, calls, failed;
};

static struct tstage st[STAGES_PER_RANK];
static _Atomic bool gate_closed;
static _Atomic unsigned gate_passes; /* micro-batches the closed gate lets through, one each */

/* One pass through the closed gate, if one is left. */
static bool take_pass(void)
{
	unsigned n = atomic_load(&gate_passes);
	while (n && !atomic_compare_exchange_weak(&gate_passes, &n, n - 1))
		;
	return n != 0;
}

static uint64_t fold(uint64_t check, unsigned g)
{
	return check * 1000003u + g + 1;
}

static int stage_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct tstage *s = ctx;
	atomic_fetch_add(&s->calls, 1);
	while (s->gated && atomic_load(&gate_closed) && !take_pass())
		usleep(100);
	if (s->delay_us)
		usleep(s->delay_us);
	const uint64_t *src = in->data;
	uint64_t *dst = out->data;
	unsigned iw = in->row_bytes / 8, ow = out->row_bytes / 8;
	for (uint32_t r = 0; r < in->rows && !s->replicated; r++) {
		const uint64_t *a = src + (size_t)r * iw;
		uint64_t p = a[0];
		if (p < MAX_PRODUCERS) {
			if (s->seen[p] && a[1] <= s->last[p])
				atomic_fetch_add(&s->violations, 1);
			s->seen[p] = true;
			s->last[p] = a[1];
		}
	}
	if (s->fail_mod && src[1] % s->fail_mod == s->fail_rem) {
		atomic_fetch_add(&s->failed, 1);
		return -EDOM;
	}
	for (uint32_t r = 0; r < in->rows; r++) {
		const uint64_t *a = src + (size_t)r * iw;
		uint64_t *b = dst + (size_t)r * ow;
		uint64_t row[OUT_WORDS] = {a[0], a[1], a[2] + 1, fold(a[3], s->g), 0};
		if (s->widen)
			row[4] = a[0] << 32 | a[1];
		memcpy(b, row, ow * 8);
	}
	return 0;
}

struct cfg {
	unsigned delay_us[64]; /* per global stage */
	unsigned fail_stage, fail_mod, fail_rem;
	uint32_t window;
	uint32_t inflight;
	uint32_t mb_buffers;
	size_t in_bytes_rank1; /* 0: the right width */
	bool no_stages_rank1;
	bool pin;	    /* pin the stages (by default the tests do not: ranks share 2 CPUs) */
	bool gate0;	    /* the first stage waits while gate_closed */
	unsigned replicas0; /* rank 0's first stage runs on this many threads (0: one) */
	mbp_result_fn on_result;
	void *on_result_arg;
};

static int make(mbp_mpi **mp, const struct cfg *c)
{
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = IN_WORDS * 8;
	if (rank == 1 && c->in_bytes_rank1)
		o.in_row_bytes = c->in_bytes_rank1;
	o.max_mb_rows = 16;
	o.pinning = c->pin ? MBP_PIN_PLAN : MBP_PIN_NONE; /* ranks share 2 CPUs */
	if (c->mb_buffers)
		o.mb_buffers = c->mb_buffers;
	if (rank == 0) {
		o.on_result = c->on_result;
		o.on_result_arg = c->on_result_arg;
	}
	mbp_mpi_opts mo;
	mbp_mpi_opts_init(&mo);
	mo.peer_timeout_ns = 20 * SEC;
	if (c->window)
		mo.window = c->window;
	if (c->inflight)
		mo.inflight = c->inflight;
	int rc = mbp_mpi_new(mp, &o, &mo);
	if (rc)
		return rc;
	for (unsigned i = 0; i < STAGES_PER_RANK && !(rank == 1 && c->no_stages_rank1); i++) {
		struct tstage *s = &st[i];
		memset(s, 0, sizeof(*s));
		s->g = (unsigned)rank * STAGES_PER_RANK + i;
		s->widen = rank == size - 1 && i == STAGES_PER_RANK - 1;
		s->delay_us = c->delay_us[s->g];
		s->gated = c->gate0 && s->g == 0;
		s->replicated = s->g == 0 && c->replicas0 > 1;
		if (c->fail_mod && c->fail_stage == s->g) {
			s->fail_mod = c->fail_mod;
			s->fail_rem = c->fail_rem;
		}
		mbp_stage_desc d = {.fn = stage_fn, .ctx = s, .replicas = s->g == 0 ? c->replicas0 : 0};
		if (s->widen)
			d.out_row_bytes = OUT_WORDS * 8;
		rc = mbp_mpi_add_stage(*mp, &d);
		if (rc)
			return rc;
	}
	return 0;
}

static unsigned total_stages(void)
{
	return (unsigned)size * STAGES_PER_RANK;
}

static uint64_t expect_check(void)
{
	uint64_t c = 0;
	for (unsigned g = 0; g < total_stages(); g++)
		c = fold(c, g);
	return c;
}

static void fill_rows(uint64_t *in, uint64_t producer, uint64_t seq0, size_t rows)
{
	for (size_t r = 0; r < rows; r++) {
		uint64_t *a = in + r * IN_WORDS;
		a[0] = producer;
		a[1] = seq0 + r;
		a[2] = 0;
		a[3] = 0;
	}
}

static void check_row(const uint64_t *b, uint64_t producer, uint64_t seq)
{
	ck_assert_uint_eq(b[0], producer);
	ck_assert_uint_eq(b[1], seq);
	ck_assert_uint_eq(b[2], total_stages());
	ck_assert_uint_eq(b[3], expect_check());
	ck_assert_uint_eq(b[4], producer << 32 | seq);
}

/* Every rank's own pipeline: nothing lost, and its stages saw each producer in order. */
static void check_local(mbp_mpi *mp)
{
	mbp_mpi_stats s;
	ck_assert_int_eq(mbp_mpi_stats_get(mp, &s), 0);
	const mbp_mpi_rank_stats *me = &s.rank[rank];
	ck_assert_uint_eq(me->mbs_accepted, me->mbs_completed + me->mbs_failed);
	for (unsigned i = 0; i < STAGES_PER_RANK; i++)
		ck_assert_uint_eq(atomic_load(&st[i].violations), 0);
}

/* Rank 0 after the end of the run: conservation over all ranks. */
static void check_global(mbp_mpi *mp, mbp_mpi_stats *s)
{
	ck_assert_int_eq(mbp_mpi_stats_get(mp, s), 0);
	ck_assert_uint_eq(s->reported, (uint32_t)size);
	ck_assert_uint_eq(s->mbs_accepted, s->mbs_completed + s->mbs_failed);
	ck_assert_uint_eq(s->jobs_accepted, s->jobs_completed + s->jobs_failed);
	for (int r = 0; r < size; r++) {
		const mbp_mpi_rank_stats *x = &s->rank[r];
		ck_assert_uint_eq(x->mbs_accepted, x->mbs_completed + x->mbs_failed);
		/* what entered a rank is what left it: its pipeline's, plus those passed on */
		ck_assert_uint_eq(x->sent, x->mbs_completed + x->mbs_failed + x->passed);
		if (r > 0)
			ck_assert_uint_eq(x->received, x->mbs_accepted + x->passed);
	}
	ck_assert_uint_eq(s->rank[0].received, s->mbs_completed + s->mbs_failed);
}

/* Ranks > 0: serve one run; @return mbp_mpi_wait's result. */
static int serve(mbp_mpi *mp)
{
	int rc = mbp_mpi_wait(mp, 120 * SEC);
	check_local(mp);
	return rc;
}

/* Ranks > 0: serve the run, expecting `expect` from mbp_mpi_wait, and destroy. @return true there. */
static bool served(mbp_mpi *mp, int expect)
{
	if (rank == 0)
		return false;
	ck_assert_int_eq(serve(mp), expect);
	mbp_mpi_destroy(mp);
	return true;
}

/* n jobs of `rows` stamped rows (producer p, sequence numbers from 0 on), submitted in order. */
struct jobset {
	uint64_t *in, *out;
	mbp_job *jobs;
	unsigned n;
	size_t rows;
};

static void jobs_submit(mbp_mpi *mp, struct jobset *js, unsigned n, size_t rows, uint32_t mb_rows, uint64_t p)
{
	js->n = n;
	js->rows = rows;
	js->in = calloc((size_t)n * rows * IN_WORDS, 8);
	js->out = calloc((size_t)n * rows * OUT_WORDS, 8);
	js->jobs = calloc(n, sizeof(*js->jobs));
	ck_assert(js->in && js->out && js->jobs);
	for (unsigned j = 0; j < n; j++) {
		uint64_t *in = js->in + (size_t)j * rows * IN_WORDS;
		fill_rows(in, p, (uint64_t)j * rows, rows);
		mbp_job_init(&js->jobs[j], in, js->out + (size_t)j * rows * OUT_WORDS, rows, mb_rows);
		ck_assert_int_eq(mbp_mpi_job_submit(mp, &js->jobs[j], -1), 0);
	}
}

static void jobs_free(struct jobset *js)
{
	free(js->in);
	free(js->out);
	free(js->jobs);
}

/* ---- jobs from several producers ---- */

struct producer {
	mbp_mpi *mp;
	unsigned id, jobs;
	size_t rows;
	uint32_t mb_rows;
	uint64_t *in, *out;
	mbp_job *job;
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	for (unsigned j = 0; j < p->jobs; j++) {
		uint64_t *in = p->in + (size_t)j * p->rows * IN_WORDS;
		fill_rows(in, p->id, (uint64_t)j * p->rows, p->rows);
		mbp_job_init(&p->job[j], in, p->out + (size_t)j * p->rows * OUT_WORDS, p->rows, p->mb_rows);
		ck_assert_int_eq(mbp_mpi_job_submit(p->mp, &p->job[j], -1), 0);
	}
	return NULL;
}

START_TEST(jobs_from_two_producers_arrive_in_order_stamped_and_conserved)
{
	struct cfg c = {0};
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (served(mp, 0))
		return;
	enum { P = 2, JOBS = 60, ROWS = 37 };
	struct producer pr[P];
	pthread_t t[P];
	for (unsigned i = 0; i < P; i++) {
		pr[i] =
		    (struct producer){.mp = mp, .id = i, .jobs = JOBS, .rows = ROWS, .mb_rows = i ? 16 : 5};
		pr[i].in = calloc((size_t)JOBS * ROWS * IN_WORDS, 8);
		pr[i].out = calloc((size_t)JOBS * ROWS * OUT_WORDS, 8);
		pr[i].job = calloc(JOBS, sizeof(mbp_job));
		pthread_create(&t[i], NULL, produce, &pr[i]);
	}
	uint64_t mbs = 0;
	for (unsigned i = 0; i < P; i++) {
		pthread_join(t[i], NULL);
		for (unsigned j = 0; j < JOBS; j++) {
			mbp_job *job = &pr[i].job[j];
			ck_assert_int_eq(mbp_mpi_job_wait(mp, job, 60 * SEC), 0);
			ck_assert_int_eq(job->status, 0);
			ck_assert_uint_eq(job->mbs_failed, 0);
			mbs += job->mbs;
			for (size_t r = 0; r < ROWS; r++)
				check_row(pr[i].out + ((size_t)j * ROWS + r) * OUT_WORDS, i,
					  (uint64_t)j * ROWS + r);
		}
	}
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.mbs_accepted, mbs);
	ck_assert_uint_eq(s.mbs_failed, 0);
	ck_assert_uint_eq(s.jobs_completed, P * JOBS);
	ck_assert_uint_eq(s.rows_completed, (uint64_t)P * JOBS * ROWS);
	check_local(mp);
	mbp_mpi_destroy(mp);
	for (unsigned i = 0; i < P; i++) {
		free(pr[i].in);
		free(pr[i].out);
		free(pr[i].job);
	}
}
END_TEST

/* ---- single micro-batches ---- */

struct results {
	pthread_mutex_t lock;
	uint64_t next; /* the caller's seq expected next */
	unsigned order_errors, bad_rows, failed;
	mbp_mpi *mp;
	bool no_handle; /* release each result with mbp_mpi_mb_release(NULL, ...) */
};

static void collect(void *arg, mbp_mb *mb)
{
	struct results *r = arg;
	pthread_mutex_lock(&r->lock);
	if (mb->seq != r->next || (uint64_t)(uintptr_t)mb->user != mb->seq * 7)
		r->order_errors++;
	r->next = mb->seq + 1;
	if (mb->status) {
		r->failed++;
	} else {
		const uint64_t *b = mb->data;
		if (mb->row_bytes != OUT_WORDS * 8)
			r->bad_rows++;
		for (uint32_t i = 0; i < mb->rows; i++) {
			const uint64_t *x = b + (size_t)i * OUT_WORDS;
			if (x[0] != 3 || x[1] != mb->seq * 16 + i || x[2] != total_stages() ||
			    x[3] != expect_check() || x[4] != (3ull << 32 | x[1]))
				r->bad_rows++;
		}
	}
	pthread_mutex_unlock(&r->lock);
	mbp_mpi_mb_release(r->no_handle ? NULL : r->mp, mb);
}

/* Rank 0: single micro-batch k of `rows` stamped rows (producer 3, sequence 16k on), tagged k * 7. */
static int submit_single(mbp_mpi *mp, uint64_t k, uint32_t rows, int64_t timeout_ns)
{
	mbp_mb *mb;
	ck_assert_int_eq(mbp_mpi_mb_acquire(mp, &mb, -1), 0);
	fill_rows(mb->data, 3, k * 16, rows);
	mb->rows = rows;
	mb->seq = k;
	mb->user = (void *)(uintptr_t)(k * 7);
	return mbp_mpi_mb_submit(mp, mb, timeout_ns);
}

/* A run of single micro-batches into `res` (reset here; no_handle as given): NULL on ranks > 0, which
 * served it. */
static mbp_mpi *singles_start(struct results *res, bool no_handle, struct cfg *c)
{
	memset(&res->next, 0, sizeof(*res) - offsetof(struct results, next));
	res->no_handle = no_handle;
	c->on_result = collect;
	c->on_result_arg = res;
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, c), 0);
	res->mp = mp;
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	return served(mp, 0) ? NULL : mp;
}

/* Rank 0 after n single micro-batches: drain, every result back once, in order, intact; `failed` of them
 * failed; conservation; then destroy. */
static void singles_end(mbp_mpi *mp, const struct results *res, uint64_t n, unsigned failed)
{
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	ck_assert_uint_eq(res->next, n);
	ck_assert_uint_eq(res->order_errors, 0);
	ck_assert_uint_eq(res->bad_rows, 0);
	ck_assert_uint_eq(res->failed, failed);
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.mbs_accepted, n);
	ck_assert_uint_eq(s.mbs_failed, failed);
	ck_assert_uint_eq(s.mbs_completed, n - failed);
	check_local(mp);
	mbp_mpi_destroy(mp);
}

START_TEST(single_micro_batches_return_in_submission_order_with_their_tags)
{
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	/* stage 1 fails micro-batch k when its first row's sequence 16k % 160 == 48: k % 10 == 3 */
	struct cfg c = {.fail_stage = 1, .fail_mod = 160, .fail_rem = 48};
	mbp_mpi *mp = singles_start(&res, false, &c);
	if (!mp)
		return;
	enum { N = 400 };
	for (uint64_t k = 0; k < N; k++)
		ck_assert_int_eq(submit_single(mp, k, (uint32_t)(k % 16) + 1, -1), 0);
	singles_end(mp, &res, N, N / 10);
}
END_TEST

/* With rank 0's first stage held (by `c`, gate0 set), single micro-batches of one row submitted without
 * waiting until one is refused: how many were accepted (the refusal's code in *rc). The gate is left
 * closed. */
static uint64_t fill_held(mbp_mpi *mp, int *rc)
{
	uint64_t n = 0;
	*rc = 0;
	while (*rc == 0 && n < 64) {
		mbp_mb *mb;
		if ((*rc = mbp_mpi_mb_acquire(mp, &mb, -1)) != 0)
			break;
		fill_rows(mb->data, 3, n * 16, 1);
		mb->rows = 1;
		mb->seq = n;
		mb->user = (void *)(uintptr_t)(n * 7);
		if ((*rc = mbp_mpi_mb_submit(mp, mb, 0)) == 0)
			n++;
		else
			mbp_mpi_mb_release(mp, mb);
	}
	return n;
}

/* A rank holds at most two windows and one micro-batch a local thread, also where mb_buffers allows more
 * (those beyond would only wait for the link): with rank 0's first stage held, single micro-batches are
 * accepted until rank 0's carriers are taken, then refused at once; once the stage goes on, every
 * accepted one comes back intact. `replicas`: of that first stage (each of its threads holds one). The
 * gate opens, and the run ends on every rank, before the count is asserted: a wrong count then fails the
 * test instead of hanging the run (a stage held for ever, or rank 0 on to the next test while the others
 * still serve this run). */
static void holds_at_most(unsigned replicas)
{
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct cfg c = {.window = 2, .inflight = 64, .mb_buffers = 64, .gate0 = true, .replicas0 = replicas};
	atomic_store(&gate_closed, true);
	mbp_mpi *mp = singles_start(&res, false, &c);
	if (!mp) {
		atomic_store(&gate_closed, false);
		return;
	}
	int rc;
	uint64_t n = fill_held(mp, &rc);
	atomic_store(&gate_closed, false);
	singles_end(mp, &res, n, 0);
	ck_assert_int_eq(rc, -EAGAIN);
	ck_assert_uint_eq(n, 2 * 2 + STAGES_PER_RANK - 1 + (replicas ? replicas : 1));
}

START_TEST(a_rank_holds_at_most_two_windows_and_a_micro_batch_a_stage)
{
	holds_at_most(0);
}
END_TEST

/* 1 stage x 8 replicas at window 2: counting stages would give it 2 * 2 + 2 carriers, and 7 of its 8
 * threads would have nothing to work on. */
START_TEST(a_rank_holds_a_micro_batch_for_each_replica_of_a_stage)
{
	holds_at_most(8);
}
END_TEST

/* A submitter that waits with a deadline for one of rank 0's carriers, every one taken (the first stage
 * held by the gate): the gate lets one micro-batch through, so one carrier comes free. `quiet`: freed
 * carriers wake nobody (mbp__mpi_test_quiet_free). Its submit's result and the seconds it waited after
 * the carrier was let free; then the run ends with every accepted micro-batch intact and in order. */
struct timed_submit {
	mbp_mpi *mp;
	uint64_t k;
	int64_t timeout_ns;
	int rc;
	struct timespec done;
};

static void *timed_submit_main(void *arg)
{
	struct timed_submit *w = arg;
	w->rc = submit_single(w->mp, w->k, 1, w->timeout_ns);
	clock_gettime(CLOCK_MONOTONIC, &w->done);
	return NULL;
}

static bool wait_for_a_carrier(bool quiet, int64_t timeout_ns, int *rc, double *waited)
{
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct cfg c = {.window = 8, .inflight = 64, .mb_buffers = 64, .gate0 = true};
	atomic_store(&gate_closed, true);
	atomic_store(&gate_passes, 0);
	mbp_mpi *mp = singles_start(&res, false, &c);
	if (!mp) {
		atomic_store(&gate_closed, false);
		return false;
	}
	int full;
	uint64_t n = fill_held(mp, &full); /* every carrier taken */
	mbp__mpi_test_quiet_free(mp, quiet);
	struct timed_submit w = {.mp = mp, .k = n, .timeout_ns = timeout_ns};
	pthread_t th;
	ck_assert_int_eq(pthread_create(&th, NULL, timed_submit_main, &w), 0);
	while (mbp__mpi_test_reserving(mp) == 0)
		usleep(1000);
	struct timespec t0;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	atomic_store(&gate_passes, 1); /* one micro-batch on: one carrier comes free */
	pthread_join(th, NULL);
	mbp__mpi_test_quiet_free(mp, false);
	atomic_store(&gate_closed, false);
	singles_end(mp, &res, n + (w.rc == 0), 0);
	ck_assert_int_eq(full, -EAGAIN);
	ck_assert_uint_eq(n, 2 * 8 + STAGES_PER_RANK); /* two windows and a micro-batch a local thread */
	*rc = w.rc;
	*waited = (double)(w.done.tv_sec - t0.tv_sec) + (double)(w.done.tv_nsec - t0.tv_nsec) * 1e-9;
	return true;
}

/* Woken as soon as one carrier comes free, not when a quarter of them have (the rule for a submitter
 * without a deadline: 18 carriers here) nor at its deadline: the submit returns 0 long before its 30 s. */
START_TEST(a_submitter_with_a_deadline_takes_the_first_carrier_that_comes_free)
{
	int rc;
	double waited;
	if (!wait_for_a_carrier(false, 30 * SEC, &rc, &waited))
		return;
	ck_assert_int_eq(rc, 0);
	ck_assert_msg(waited < 15.0, "the submitter waited %.1f s of its 30 s for a free carrier", waited);
}
END_TEST

/* A carrier that comes free while nothing wakes the submitter: its wait times out, and its one more look
 * before -ETIMEDOUT finds the carrier, so the submit succeeds. */
START_TEST(a_submitter_whose_wait_timed_out_takes_a_carrier_freed_meanwhile)
{
	int rc;
	double waited;
	if (!wait_for_a_carrier(true, 2 * SEC, &rc, &waited))
		return;
	ck_assert_msg(rc == 0, "the submit returned %d after %.1f s, with a carrier free", rc, waited);
}
END_TEST

START_TEST(a_result_released_without_a_handle_goes_back_to_its_run)
{
	/* An on_result has no handle (mbp_result_fn gets its arg only): mbp_mpi_mb_release(NULL, mb) must
	 * find the run. Ten times more results than rank 0 keeps buffers for (inflight + window): each one
	 * not given back would leave the run a buffer short, and the last results could not land. */
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	struct cfg c = {.inflight = 8, .window = 2};
	mbp_mpi *mp = singles_start(&res, true, &c);
	if (!mp)
		return;
	enum { N = 100 };
	int rc = 0;
	for (uint64_t k = 0; k < N && rc == 0; k++)
		rc = submit_single(mp, k, 1, 20 * SEC);
	if (rc || mbp_mpi_drain(mp, 20 * SEC) != 0) {
		/* results stuck for want of buffers hold their table entries: no drain or cancel can end this
		 * run, so end every rank (a hang otherwise) */
		fprintf(stderr, "test_mpi: results released without a handle did not come back\n");
		mbp_mpi_abort(1);
	}
	singles_end(mp, &res, N, 0);
}
END_TEST

/* The submitter of single micro-batches, one at a time (each waits for its result). */
struct lagger {
	mbp_mpi *mp;
	struct results *res;
	int cpu;
	unsigned n;
};

static void *lag_submit(void *arg)
{
	struct lagger *l = arg;
	cpu_set_t cs;
	CPU_ZERO(&cs);
	CPU_SET(l->cpu, &cs);
	ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof(cs), &cs), 0);
	struct sched_param sp = {0};
	ck_assert_int_eq(pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp), 0);
	for (uint64_t k = 0; k < l->n; k++) {
		ck_assert_int_eq(submit_single(l->mp, k, 1, -1), 0);
		for (;;) {
			pthread_mutex_lock(&l->res->lock);
			bool back = l->res->next > k;
			pthread_mutex_unlock(&l->res->lock);
			if (back)
				break;
			usleep(50);
		}
	}
	return NULL;
}

START_TEST(a_result_back_before_its_submitter_resumes_is_delivered_once_in_order)
{
	/* Rank 0's submitter runs at SCHED_IDLE on the CPU of rank 0's workers: waking stage 0 preempts it
	 * inside mbp_mpi_mb_submit, and it resumes only once the workers go quiet, by when the micro-batch
	 * has usually crossed every rank and been retired (this used to fail an invariant). */
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	memset(&res.next, 0, sizeof(res) - offsetof(struct results, next));
	struct cfg c = {.on_result = collect, .on_result_arg = &res};
	cpu_set_t all, one;
	ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof(all), &all), 0);
	int cpu = 0;
	while (!CPU_ISSET(cpu, &all))
		cpu++;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	if (rank == 0) /* the workers inherit the starting thread's CPU */
		ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof(one), &one), 0);
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	res.mp = mp;
	int rc = mbp_mpi_start(mp);
	if (rank == 0)
		ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof(all), &all), 0);
	ck_assert_int_eq(rc, 0);
	if (served(mp, 0))
		return;
	enum { N = 200 };
	struct lagger l = {.mp = mp, .res = &res, .cpu = cpu, .n = N};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, lag_submit, &l), 0);
	pthread_join(t, NULL);
	singles_end(mp, &res, N, 0);
}
END_TEST

/* ---- injected stage errors ---- */

static void stage_errors_on(unsigned fail_stage)
{
	struct cfg c = {.fail_stage = fail_stage, .fail_mod = 7 * 4, .fail_rem = 3 * 4};
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (rank != 0) {
		ck_assert_int_eq(serve(mp), 0);
		if ((unsigned)rank == fail_stage / STAGES_PER_RANK)
			ck_assert_uint_gt(atomic_load(&st[fail_stage % STAGES_PER_RANK].failed), 0);
		mbp_mpi_destroy(mp);
		return;
	}
	/* jobs of 3 micro-batches of 4 rows: micro-batch m (global) starts at row 4m and fails when m % 7 == 3 */
	enum { JOBS = 50, ROWS = 12, MBR = 4 };
	struct jobset js;
	jobs_submit(mp, &js, JOBS, ROWS, MBR, 1);
	mbp_job *jobs = js.jobs;
	uint64_t *out = js.out;
	unsigned expect_failed = 0;
	for (unsigned j = 0; j < JOBS; j++) {
		ck_assert_int_eq(mbp_mpi_job_wait(mp, &jobs[j], 60 * SEC), 0);
		unsigned f = 0;
		for (unsigned k = 0; k < ROWS / MBR; k++) {
			unsigned m = j * (ROWS / MBR) + k;
			if (m % 7 == 3) {
				f++;
				continue;
			}
			for (unsigned r = 0; r < MBR; r++) {
				uint64_t seq = (uint64_t)m * MBR + r;
				check_row(out + seq * OUT_WORDS, 1, seq);
			}
		}
		ck_assert_uint_eq(jobs[j].mbs_failed, f);
		ck_assert_int_eq(jobs[j].status, f ? -EDOM : 0);
		expect_failed += f;
	}
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.mbs_failed, expect_failed);
	ck_assert_uint_eq(s.mbs_accepted, JOBS * (ROWS / MBR));
	/* the ranks after the failing one passed the failed micro-batches on past their stages */
	for (int r = (int)(fail_stage / STAGES_PER_RANK) + 1; r < size; r++)
		ck_assert_uint_eq(s.rank[r].passed, expect_failed);
	if (fail_stage / STAGES_PER_RANK == 0)
		ck_assert_uint_gt(atomic_load(&st[fail_stage % STAGES_PER_RANK].failed), 0);
	check_local(mp);
	mbp_mpi_destroy(mp);
	jobs_free(&js);
}

START_TEST(a_stage_error_on_rank_0_fails_only_its_micro_batches)
{
	stage_errors_on(0);
}
END_TEST

START_TEST(a_stage_error_on_the_last_rank_fails_only_its_micro_batches)
{
	stage_errors_on(total_stages() - 2);
}
END_TEST

/* ---- a job across ranks completes as a local job does ---- */

static void count_cb(mbp_job *job, void *arg)
{
	(void)job;
	atomic_fetch_add((atomic_uint *)arg, 1);
}

START_TEST(a_job_across_ranks_completes_as_a_local_job_does)
{
	struct cfg c = {.fail_stage = 1, .fail_mod = 160, .fail_rem = 48}; /* micro-batch k % 10 == 3 fails */
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (served(mp, 0))
		return;
	enum { ROWS = 160, MBR = 16 };
	struct jobset js;
	jobs_submit(mp, &js, 1, ROWS, MBR, 1);
	/* waited for: done as mbp_job_done() says; its status is its first failed micro-batch's */
	ck_assert_int_eq(mbp_mpi_job_wait(mp, &js.jobs[0], 60 * SEC), 0);
	ck_assert(mbp_job_done(&js.jobs[0]));
	ck_assert_int_eq(js.jobs[0].status, -EDOM);
	ck_assert_uint_eq(js.jobs[0].mbs, ROWS / MBR);
	ck_assert_uint_eq(js.jobs[0].mbs_failed, 1);
	ck_assert_uint_ge(js.jobs[0].done_ns, js.jobs[0].submit_ns);
	/* with a callback: the callback is its completion, once; waiting on it is refused */
	static atomic_uint calls;
	atomic_store(&calls, 0);
	static uint64_t in2[ROWS * IN_WORDS], out2[ROWS * OUT_WORDS];
	fill_rows(in2, 2, 0, ROWS); /* another producer: each one's rows reach every stage in order */
	mbp_job cb_job;
	mbp_job_init(&cb_job, in2, out2, ROWS, MBR);
	cb_job.cb = count_cb;
	cb_job.cb_arg = &calls;
	ck_assert_int_eq(mbp_mpi_job_submit(mp, &cb_job, -1), 0);
	ck_assert_int_eq(mbp_mpi_job_wait(mp, &cb_job, 0), -EINVAL);
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	ck_assert_uint_eq(atomic_load(&calls), 1);
	ck_assert(!mbp_job_done(&cb_job));
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.jobs_accepted, 2);
	ck_assert_uint_eq(s.jobs_failed, 2);
	check_local(mp);
	mbp_mpi_destroy(mp);
	jobs_free(&js);
}
END_TEST

/* ---- drain and cancel from rank 0 ---- */

START_TEST(drain_from_rank_0_finishes_everything_accepted_on_every_rank)
{
	struct cfg c = {0};
	for (unsigned g = 0; g < 64; g++)
		c.delay_us[g] = 100;
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (served(mp, 0))
		return;
	enum { JOBS = 40, ROWS = 32 };
	struct jobset js;
	jobs_submit(mp, &js, JOBS, ROWS, 4, 2);
	mbp_job *jobs = js.jobs;
	uint64_t *out = js.out;
	/* drain at once: nothing waited for yet */
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	mbp_job late;
	mbp_job_init(&late, js.in, out, 1, 1);
	ck_assert_int_eq(mbp_mpi_job_submit(mp, &late, 0), -ESHUTDOWN);
	for (unsigned j = 0; j < JOBS; j++) {
		ck_assert_int_eq(mbp_mpi_job_wait(mp, &jobs[j], 0), 0);
		ck_assert_int_eq(jobs[j].status, 0);
	}
	for (size_t r = 0; r < (size_t)JOBS * ROWS; r++)
		check_row(out + r * OUT_WORDS, 2, r);
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.mbs_completed, JOBS * ROWS / 4);
	ck_assert_int_eq(mbp_mpi_drain(mp, 0), 0); /* idempotent */
	check_local(mp);
	mbp_mpi_destroy(mp);
	jobs_free(&js);
}
END_TEST

START_TEST(cancel_from_rank_0_fails_the_rest_on_every_rank_and_loses_nothing)
{
	struct cfg c = {0};
	for (unsigned g = 0; g < 64; g++)
		c.delay_us[g] = 2000; /* slow: most work is still waiting when cancel comes */
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (served(mp, -ECANCELED))
		return;
	enum { JOBS = 30, ROWS = 16 };
	struct jobset js;
	jobs_submit(mp, &js, JOBS, ROWS, 2, 0);
	mbp_job *jobs = js.jobs;
	uint64_t *out = js.out;
	ck_assert_int_eq(mbp_mpi_job_wait(mp, &jobs[0], 60 * SEC), 0);
	ck_assert_int_eq(mbp_mpi_cancel(mp), 0);
	unsigned failed = 0, completed = 0;
	for (unsigned j = 0; j < JOBS; j++) {
		ck_assert_int_eq(mbp_mpi_job_wait(mp, &jobs[j], 0), 0);
		ck_assert(jobs[j].status == 0 || jobs[j].status == -ECANCELED);
		failed += jobs[j].mbs_failed;
		completed += jobs[j].mbs - jobs[j].mbs_failed;
		for (unsigned k = 0; jobs[j].status == 0 && k < ROWS; k++)
			check_row(out + ((size_t)j * ROWS + k) * OUT_WORDS, 0, (uint64_t)j * ROWS + k);
	}
	ck_assert_uint_gt(failed, 0);
	ck_assert_uint_gt(completed, 0);
	mbp_mpi_stats s;
	check_global(mp, &s);
	ck_assert_uint_eq(s.mbs_failed, failed);
	ck_assert_uint_eq(s.mbs_completed, completed);
	check_local(mp);
	mbp_mpi_destroy(mp);
	jobs_free(&js);
}
END_TEST

/* ---- back-pressure ---- */

START_TEST(a_slow_last_rank_back_pressures_its_upstream_through_credits)
{
	struct cfg c = {.window = 2, .inflight = 64, .mb_buffers = 8};
	c.delay_us[total_stages() - 1] = 1000;
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (served(mp, 0))
		return;
	enum { JOBS = 4, ROWS = 64 };
	struct jobset js;
	jobs_submit(mp, &js, JOBS, ROWS, 1, 1);
	mbp_job *jobs = js.jobs;
	uint64_t *out = js.out;
	for (unsigned j = 0; j < JOBS; j++) {
		ck_assert_int_eq(mbp_mpi_job_wait(mp, &jobs[j], 60 * SEC), 0);
		ck_assert_int_eq(jobs[j].status, 0);
	}
	for (size_t r = 0; r < (size_t)JOBS * ROWS; r++)
		check_row(out + r * OUT_WORDS, 1, r);
	ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	mbp_mpi_stats s;
	check_global(mp, &s);
	/* the slow rank's upstream ran out of credits: it waited instead of flooding the slow rank */
	ck_assert_uint_gt(s.rank[size - 2].credit_waits, 0);
	mbp_mpi_destroy(mp);
	jobs_free(&js);
}
END_TEST

/* ---- the model split over the ranks ---- */

START_TEST(a_model_split_over_the_ranks_gives_the_single_process_output_bit_for_bit)
{
	/* two layers per rank, each rank loading only its own from its copy of the same file (same seed) */
	char path[64];
	snprintf(path, sizeof(path), "/tmp/mbp-test-mpi-%d-%d.safetensors", (int)getpid(), rank);
	mbp_model_spec sp = {.layers = 2 * (unsigned)size,
			     .in = 40,
			     .hidden = 72,
			     .out = 24,
			     .act = MBP_ACT_GELU,
			     .norm = true,
			     .seed = 16};
	ck_assert_int_eq(mbp_model_write_random(path, &sp), 0);
	mbp_model *part;
	mbp_model_error e;
	ck_assert_msg(mbp_model_load_layers(&part, path, 2 * (unsigned)rank, 2, &e) == 0, "%s", e.msg);
	const double cost[2] = {1, 1};
	mbp_model_plan plan;
	ck_assert_int_eq(mbp_model_partition(cost, NULL, 2, 2, &plan), 0);
	mbp_model_stages *ms;
	ck_assert_int_eq(mbp_model_stages_new(&ms, part, &plan, 16), 0);
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = mbp_model_in_width(part) * sizeof(float);
	o.max_mb_rows = 16;
	o.pinning = MBP_PIN_NONE;
	mbp_mpi *mp;
	ck_assert_int_eq(mbp_mpi_new(&mp, &o, NULL), 0);
	for (unsigned i = 0; i < mbp_model_stages_count(ms); i++) {
		mbp_stage_desc d;
		ck_assert_int_eq(mbp_model_stage_desc(ms, i, &d), 0);
		ck_assert_int_eq(mbp_mpi_add_stage(mp, &d), 0);
	}
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	if (rank == 0) {
		enum { ROWS = 203, MBR = 16 };
		mbp_model *whole;
		ck_assert_int_eq(mbp_model_load(&whole, path, &e), 0);
		float *x = malloc(ROWS * 40 * sizeof(float)), *out = calloc(ROWS * 24, sizeof(float)),
		      *ref = calloc(ROWS * 24, sizeof(float));
		for (size_t i = 0; i < ROWS * 40; i++)
			x[i] = (float)((i * 2654435761u) % 1000) / 500.0f - 1.0f;
		/* the reference: the same layers in one process, micro-batch by micro-batch */
		ck_assert_int_eq(mbp_model_forward(whole, x, ref, ROWS, MBR), 0);
		ck_assert_int_eq(mbp_mpi_run(mp, x, out, ROWS, MBR), 0);
		ck_assert_mem_eq(out, ref, ROWS * 24 * sizeof(float));
		ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
		mbp_model_destroy(whole);
		free(x);
		free(out);
		free(ref);
	} else {
		ck_assert_int_eq(mbp_mpi_wait(mp, 120 * SEC), 0);
	}
	mbp_mpi_destroy(mp);
	mbp_model_stages_destroy(ms);
	mbp_model_destroy(part);
	unlink(path);
}
END_TEST

/* ---- one stage per rank ---- */

struct lone {
	uint64_t next;			/* the global number expected next */
	unsigned not_job, out_of_order; /* in the carry's absence: not a local job, numbers out of order */
	unsigned carried;		/* the carried one seen as itself, with its carry */
};
static struct lone lone;
static int lone_marker;

/* Each row + 1. A micro-batch is a local job of one micro-batch read in place (in->seq 0); only a caller's
 * carried one on rank 0 comes as itself. */
static int lone_fn(void *ctx, const mbp_mb *in, mbp_mb *out)
{
	struct lone *l = ctx;
	uint64_t k = mbp_mpi_mb_seq(in);
	if (in->carry == &lone_marker)
		l->carried += !in->job && in->seq == k;
	else
		l->not_job += !in->job || in->seq != 0;
	l->out_of_order += k != l->next;
	l->next = k + 1;
	for (uint32_t r = 0; r < in->rows; r++)
		((uint64_t *)out->data)[r] = ((const uint64_t *)in->data)[r] + 1;
	return 0;
}

static void lone_result(void *arg, mbp_mb *mb)
{
	struct results *r = arg;
	pthread_mutex_lock(&r->lock);
	if (mb->seq != r->next++ || mb->status ||
	    ((const uint64_t *)mb->data)[0] != mb->seq * 10 + (uint64_t)size)
		r->bad_rows++;
	pthread_mutex_unlock(&r->lock);
	mbp_mpi_mb_release(NULL, mb);
}

START_TEST(one_stage_per_rank_reads_each_micro_batch_in_place_as_a_local_job)
{
	/* With one stage a rank's local pipeline has a stage that is first and last: a single micro-batch of
	 * mbp_mb_submit would come back in its submitter's buffer, so the stage would compute elsewhere and
	 * copy back. The link hands every micro-batch in as a local job of one micro-batch instead (read
	 * where it lies, written where it is sent), and mbp_mpi_mb_seq gives the stage its global number. */
	static struct results res = {.lock = PTHREAD_MUTEX_INITIALIZER};
	memset(&res.next, 0, sizeof(res) - offsetof(struct results, next));
	memset(&lone, 0, sizeof(lone));
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = 8;
	o.max_mb_rows = 4;
	o.pinning = MBP_PIN_NONE;
	if (rank == 0) {
		o.on_result = lone_result;
		o.on_result_arg = &res;
	}
	mbp_mpi *mp;
	mbp_stage_desc d = {.fn = lone_fn, .ctx = &lone};
	ck_assert_int_eq(mbp_mpi_new(&mp, &o, NULL), 0);
	ck_assert_int_eq(mbp_mpi_add_stage(mp, &d), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	enum { N = 200, CARRIED = 7 };
	if (rank == 0) {
		for (uint64_t k = 0; k < N; k++) {
			mbp_mb *mb;
			ck_assert_int_eq(mbp_mpi_mb_acquire(mp, &mb, -1), 0);
			for (uint32_t r = 0; r < 4; r++)
				((uint64_t *)mb->data)[r] = k * 10 + r;
			mb->rows = 4;
			mb->seq = k;
			mb->carry = k == CARRIED ? &lone_marker : NULL;
			ck_assert_int_eq(mbp_mpi_mb_submit(mp, mb, -1), 0);
		}
		ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
		ck_assert_uint_eq(res.next, N);
		ck_assert_uint_eq(res.bad_rows, 0);
		ck_assert_uint_eq(lone.carried, 1);
	} else {
		ck_assert_int_eq(mbp_mpi_wait(mp, 120 * SEC), 0);
		ck_assert_uint_eq(lone.carried, 0); /* the carry stays on rank 0 */
	}
	ck_assert_uint_eq(lone.next, N);
	ck_assert_uint_eq(lone.out_of_order, 0);
	ck_assert_uint_eq(lone.not_job, 0);
	mbp_mpi_destroy(mp);
}
END_TEST

/* ---- placement: the ranks of one node ---- */

/* Where a rank's stages ran, gathered from every rank after the run. */
struct where {
	char host[64];
	cpu_set_t allowed; /* the CPUs its pipeline could use */
	int cpu[STAGES_PER_RANK], pin_error[STAGES_PER_RANK];
	unsigned sharing[STAGES_PER_RANK];
};
static struct where here, everyone[64];

static int gather_where(void *arg)
{
	(void)arg;
	return MPI_Allgather(&here, (int)sizeof(here), MPI_BYTE, everyone, (int)sizeof(here), MPI_BYTE,
			     MPI_COMM_WORLD) == MPI_SUCCESS
		   ? 0
		   : -EIO;
}

/* Two ranks of one node that may both use every CPU (mpirun --bind-to none: here each rank widens its
 * own mask, whatever binding mpirun gave) pin disjoint CPUs while there are enough (both pinned stage 0 to
 * CPU 0), and with fewer CPUs than ranks share them evenly, saying so. */
START_TEST(ranks_of_one_node_pin_disjoint_cpus_while_there_are_enough)
{
	cpu_set_t given, every;
	ck_assert_int_eq(sched_getaffinity(0, sizeof(given), &given), 0);
	CPU_ZERO(&every);
	for (int c = 0; c < CPU_SETSIZE; c++)
		CPU_SET(c, &every);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(every), &every), 0); /* the kernel keeps the allowed */
	memset(&here, 0, sizeof(here));
	ck_assert_int_eq(gethostname(here.host, sizeof(here.host) - 1), 0);
	ck_assert_int_eq(sched_getaffinity(0, sizeof(here.allowed), &here.allowed), 0);
	struct cfg c = {.pin = true};
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), 0);
	mbp_placement pl[STAGES_PER_RANK];
	ck_assert_int_eq(mbp_pipeline_placement(mbp_mpi_pipeline(mp), pl, STAGES_PER_RANK), STAGES_PER_RANK);
	for (unsigned i = 0; i < STAGES_PER_RANK; i++) {
		here.cpu[i] = pl[i].cpu;
		here.pin_error[i] = pl[i].pin_error;
		here.sharing[i] = pl[i].sharing;
	}
	if (rank == 0)
		ck_assert_int_eq(mbp_mpi_drain(mp, 60 * SEC), 0);
	else
		ck_assert_int_eq(serve(mp), 0);
	mbp_mpi_destroy(mp);
	ck_assert_int_eq(sched_setaffinity(0, sizeof(given), &given), 0);
	ck_assert_int_le(size, 64);
	ck_assert_int_eq(mbp_mpi_exec(gather_where, NULL), 0);

	/* the ranks of this rank's node with the same CPUs, and how many CPUs they share */
	int node[64], L = 0;
	for (int r = 0; r < size; r++)
		if (strcmp(everyone[r].host, here.host) == 0 &&
		    CPU_EQUAL(&everyone[r].allowed, &here.allowed))
			node[L++] = r;
	const int n = CPU_COUNT(&here.allowed);
	unsigned ranks_on[CPU_SETSIZE] = {0}; /* ranks of the node pinned to each CPU */
	for (int k = 0; k < L; k++) {
		const struct where *w = &everyone[node[k]];
		cpu_set_t mine;
		CPU_ZERO(&mine);
		for (unsigned i = 0; i < STAGES_PER_RANK; i++) {
			ck_assert_int_eq(w->pin_error[i], 0);
			ck_assert_int_ge(w->cpu[i], 0);
			ck_assert(CPU_ISSET(w->cpu[i], &here.allowed));
			CPU_SET(w->cpu[i], &mine);
		}
		for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
			ranks_on[cpu] += CPU_ISSET(cpu, &mine) != 0;
	}
	for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
		ck_assert_msg(ranks_on[cpu] <= (unsigned)(n >= L ? 1 : (L + n - 1) / n),
			      "CPU %d: %u of %d ranks on %d CPUs", cpu, ranks_on[cpu], L, n);
	/* each stage says how many other ranks of the node share its CPU */
	for (unsigned i = 0; i < STAGES_PER_RANK; i++)
		ck_assert_uint_ge(here.sharing[i], ranks_on[here.cpu[i]] - 1);
	if (n >= L)
		for (unsigned i = 0; i < STAGES_PER_RANK; i++)
			ck_assert_uint_eq(here.sharing[i], 0); /* a thread per CPU: nobody else there */
}
END_TEST

/* ---- set-up errors ---- */

START_TEST(widths_that_disagree_between_ranks_fail_start_on_every_rank)
{
	struct cfg c = {.in_bytes_rank1 = 3 * 8};
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), -EINVAL);
	ck_assert_ptr_nonnull(
	    strstr(mbp_mpi_error(mp), "rank 0's output rows are 32 bytes, rank 1's input rows 24"));
	if (rank == 0) {
		mbp_job job;
		uint64_t x[IN_WORDS * 2] = {0};
		mbp_job_init(&job, x, x, 1, 1);
		ck_assert_int_eq(mbp_mpi_job_submit(mp, &job, 0), -ESHUTDOWN);
	}
	mbp_mpi_destroy(mp);
}
END_TEST

START_TEST(a_rank_without_stages_fails_start_on_every_rank_naming_it)
{
	struct cfg c = {.no_stages_rank1 = true};
	mbp_mpi *mp;
	ck_assert_int_eq(make(&mp, &c), 0);
	ck_assert_int_eq(mbp_mpi_start(mp), -EINVAL);
	ck_assert_str_eq(mbp_mpi_error(mp), "rank 1 has no stages");
	ck_assert_int_eq(mbp_mpi_start(mp), -EALREADY); /* a run starts once, failed or not */
	mbp_mpi_destroy(mp);
}
END_TEST

START_TEST(calls_on_the_wrong_rank_or_before_start_are_refused)
{
	struct cfg c = {0};
	mbp_mpi *mp;
	mbp_opts o;
	mbp_opts_init(&o);
	o.in_row_bytes = 8;
	o.on_result = collect;
	ck_assert_int_eq(mbp_mpi_new(NULL, &o, NULL), -EINVAL);
	if (rank != 0) {
		ck_assert_int_eq(mbp_mpi_new(&mp, &o, NULL), -EINVAL); /* on_result belongs to rank 0 */
		ck_assert_ptr_null(mp);
	}
	ck_assert_int_eq(make(&mp, &c), 0);
	mbp_job job;
	uint64_t x[IN_WORDS] = {0};
	mbp_job_init(&job, x, x, 1, 1);
	ck_assert_int_eq(mbp_mpi_job_submit(mp, &job, 0), rank == 0 ? -ENOTCONN : -EPERM);
	ck_assert_int_eq(mbp_mpi_wait(mp, 0), rank == 0 ? -EPERM : -ENOTCONN);
	ck_assert_int_eq(mbp_mpi_drain(mp, 0), rank == 0 ? -ENOTCONN : -EPERM);
	mbp_mpi_destroy(mp);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("mpi");
	TCase *tc = tcase_create("across ranks");
	tcase_set_timeout(tc, 0);
	tcase_add_test(tc, calls_on_the_wrong_rank_or_before_start_are_refused);
	tcase_add_test(tc, jobs_from_two_producers_arrive_in_order_stamped_and_conserved);
	tcase_add_test(tc, single_micro_batches_return_in_submission_order_with_their_tags);
	tcase_add_test(tc, a_result_back_before_its_submitter_resumes_is_delivered_once_in_order);
	tcase_add_test(tc, a_result_released_without_a_handle_goes_back_to_its_run);
	tcase_add_test(tc, a_rank_holds_at_most_two_windows_and_a_micro_batch_a_stage);
	tcase_add_test(tc, a_rank_holds_a_micro_batch_for_each_replica_of_a_stage);
	tcase_add_test(tc, a_submitter_with_a_deadline_takes_the_first_carrier_that_comes_free);
	tcase_add_test(tc, a_submitter_whose_wait_timed_out_takes_a_carrier_freed_meanwhile);
	tcase_add_test(tc, one_stage_per_rank_reads_each_micro_batch_in_place_as_a_local_job);
	tcase_add_test(tc, a_stage_error_on_rank_0_fails_only_its_micro_batches);
	tcase_add_test(tc, a_stage_error_on_the_last_rank_fails_only_its_micro_batches);
	tcase_add_test(tc, a_job_across_ranks_completes_as_a_local_job_does);
	tcase_add_test(tc, drain_from_rank_0_finishes_everything_accepted_on_every_rank);
	tcase_add_test(tc, cancel_from_rank_0_fails_the_rest_on_every_rank_and_loses_nothing);
	tcase_add_test(tc, a_slow_last_rank_back_pressures_its_upstream_through_credits);
	tcase_add_test(tc, widths_that_disagree_between_ranks_fail_start_on_every_rank);
	tcase_add_test(tc, a_rank_without_stages_fails_start_on_every_rank_naming_it);
	tcase_add_test(tc, ranks_of_one_node_pin_disjoint_cpus_while_there_are_enough);
	tcase_add_test(tc, a_model_split_over_the_ranks_gives_the_single_process_output_bit_for_bit);
	suite_add_tcase(s, tc);
	return s;
}

#include "mpi_main.h"
