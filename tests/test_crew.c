/*
 * The crew on its own (lib/crew.h): a variant of test stages whose init, fini and run record what ran
 * where and when. The start handshake (every init before any run; after a failure no run, every init
 * still, each successful init's fini on its thread in reverse order), the threads' names, their pool
 * caches, a pin that fails (reported, its claim given back; fatal only where the CPU was asked for), the
 * CPUs given back at stop, and the barrier.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include <mbpipe.h>

#include "affinity.h"
#include "crew.h"

#include "check_main.h"

enum { MAXS = 8 };

/* A stage's context: the record and its index. */
struct probe {
	struct rec *r;
	unsigned s;
};

/* What the test variant saw, per stage. */
struct rec {
	struct probe probes[MAXS];			       /* each stage's context */
	int init_err[MAXS];				       /* what each stage's init returns */
	_Atomic unsigned inits[MAXS], finis[MAXS], runs[MAXS]; /* runs: per thread's first stage */
	pthread_t init_tid[MAXS], fini_tid[MAXS];
	unsigned long init_at[MAXS], fini_at[MAXS]; /* order among all inits and finis */
	_Atomic unsigned long clock;
	_Atomic unsigned inits_total;
	_Atomic unsigned inits_seen_by_run; /* the fewest inits any run saw at its start */
	char name[MAXS][16];		    /* each thread's name, read inside run */
	mbp_pool_cache *cache[MAXS];	    /* each thread's cache, seen by its run */
	unsigned nstages;
	/* the barrier round */
	struct mbp__crew *crew;
	struct mbp__crew_barrier bar;
	unsigned rounds;
	_Atomic unsigned arrivals;
	unsigned lasts, seen_at_last[64];
	unsigned wrote[MAXS];	    /* per thread, written before each arrival */
	_Atomic unsigned bad_reads; /* a thread that read another's write from before the barrier stale */
};

static int rec_init(void *ctx, unsigned stage)
{
	struct probe *pr = ctx;
	struct rec *r = pr->r;
	ck_assert_uint_eq(stage, pr->s);
	atomic_fetch_add(&r->inits[stage], 1);
	r->init_tid[stage] = pthread_self();
	r->init_at[stage] = atomic_fetch_add(&r->clock, 1);
	atomic_fetch_add(&r->inits_total, 1);
	return r->init_err[stage];
}

static void rec_fini(void *ctx)
{
	struct rec *r = ((struct probe *)ctx)->r;
	unsigned stage = ((struct probe *)ctx)->s;
	atomic_fetch_add(&r->finis[stage], 1);
	r->fini_tid[stage] = pthread_self();
	r->fini_at[stage] = atomic_fetch_add(&r->clock, 1);
}

static void rec_run(void *arg, struct mbp__crew_thread *th)
{
	struct rec *r = arg;
	unsigned seen = atomic_load(&r->inits_total);
	unsigned low = atomic_load(&r->inits_seen_by_run);
	while (seen < low && !atomic_compare_exchange_weak(&r->inits_seen_by_run, &low, seen))
		;
	atomic_fetch_add(&r->runs[th->first], 1);
	pthread_getname_np(pthread_self(), r->name[th->idx], sizeof(r->name[th->idx]));
	r->cache[th->idx] = th->cache;
	for (unsigned s = th->first; s <= th->last; s++) /* run on the thread of its stages' init */
		ck_assert(pthread_equal(r->init_tid[s], pthread_self()));
}

static void rec_reset(struct rec *r, unsigned S)
{
	memset(r, 0, sizeof(*r));
	r->nstages = S;
	atomic_store(&r->inits_seen_by_run, ~0u);
}

/* A crew of S probed stages on `threads` threads (0: the plan's default), pinned per the plan or not. */
static void plan(struct mbp__crew *c, struct rec *r, unsigned S, unsigned threads, bool pin,
		 mbp__crew_run_fn run)
{
	mbp__crew_init(c, "test", run, r);
	for (unsigned s = 0; s < S; s++) {
		r->probes[s] = (struct probe){r, s};
		c->stage[s] =
		    (struct mbp__crew_stage){.init = rec_init, .fini = rec_fini, .ctx = &r->probes[s]};
	}
	int none[MAXS];
	for (unsigned i = 0; i < MAXS; i++)
		none[i] = -1;
	struct mbp__placement_req rq = {.nstages = S, .threads = threads, .pin = pin, .named = none};
	ck_assert_int_eq(mbp__crew_plan(c, &rq, 0, 0), 0);
}

/* Every thread is inited before any thread runs, and each runs once; stop runs every fini, on the
 * thread of its init, in reverse stage order. */
START_TEST(every_thread_is_inited_before_any_runs_and_fini_runs_on_its_thread_in_reverse)
{
	for (unsigned T = 1; T <= 4; T++) {
		static struct rec r;
		struct mbp__crew c;
		rec_reset(&r, 4);
		plan(&c, &r, 4, T, false, rec_run);
		ck_assert_uint_eq(c.nthreads, T);
		ck_assert_int_eq(mbp__crew_start(&c), 0);
		mbp__crew_stop(&c);
		ck_assert_uint_eq(r.inits_seen_by_run, 4); /* no run began before the last init */
		for (unsigned s = 0; s < 4; s++) {
			const struct mbp__crew_thread *th = mbp__crew_thread_of(&c, s);
			ck_assert_uint_eq(th->idx, s * T / 4);
			ck_assert_uint_eq(r.inits[s], 1);
			ck_assert_uint_eq(r.finis[s], 1);
			ck_assert_uint_eq(r.runs[s], s == th->first ? 1 : 0);
			ck_assert(pthread_equal(r.init_tid[s], r.fini_tid[s]));
			if (s > th->first) { /* later stages of a thread: init after, fini before */
				ck_assert_uint_gt(r.init_at[s], r.init_at[s - 1]);
				ck_assert_uint_lt(r.fini_at[s], r.fini_at[s - 1]);
				ck_assert(pthread_equal(r.init_tid[s], r.init_tid[s - 1]));
			}
		}
		mbp__crew_destroy(&c);
	}
}
END_TEST

/* An init that fails: start returns its error and no thread runs, but every other init still runs (on
 * its thread, also after the failure on the same one) and each successful one's fini. */
START_TEST(a_failing_init_aborts_the_start_and_every_other_init_and_its_fini_still_run)
{
	for (unsigned T = 1; T <= 4; T++) {
		static struct rec r;
		struct mbp__crew c;
		rec_reset(&r, 4);
		r.init_err[1] = -EIO;
		r.init_err[2] = 7; /* not an errno: counts as -EPROTO, after the first error */
		plan(&c, &r, 4, T, false, rec_run);
		ck_assert_int_eq(mbp__crew_start(&c), -EIO);
		for (unsigned s = 0; s < 4; s++) {
			ck_assert_uint_eq(r.inits[s], 1);
			ck_assert_uint_eq(r.finis[s], s == 1 || s == 2 ? 0 : 1);
			ck_assert_uint_eq(r.runs[s], 0);
		}
		ck_assert(!c.claimed); /* stopped already: nothing held */
		mbp__crew_stop(&c);    /* idempotent */
		mbp__crew_destroy(&c);
	}
	/* a positive init alone: -EPROTO */
	static struct rec r;
	struct mbp__crew c;
	rec_reset(&r, 2);
	r.init_err[0] = 1;
	plan(&c, &r, 2, 2, false, rec_run);
	ck_assert_int_eq(mbp__crew_start(&c), -EPROTO);
	ck_assert_uint_eq(r.finis[1], 1);
	mbp__crew_destroy(&c);
}
END_TEST

/* Each thread is named for its engine and its stages, within the kernel's 15 characters, the longest
 * name included (two stages numbered 62 and 63 of the trainer). */
START_TEST(threads_are_named_for_their_engine_and_stages)
{
	static struct rec r;
	struct mbp__crew c;
	rec_reset(&r, 5);
	plan(&c, &r, 5, 2, false, rec_run); /* stages 0-2, 3-4 */
	ck_assert_int_eq(mbp__crew_start(&c), 0);
	mbp__crew_stop(&c);
	ck_assert_str_eq(r.name[0], "mbp-test-0-2");
	ck_assert_str_eq(r.name[1], "mbp-test-3-4");
	mbp__crew_destroy(&c);

	rec_reset(&r, 2);
	plan(&c, &r, 2, 2, false, rec_run);
	c.engine = "train";
	ck_assert_int_eq(mbp__crew_start(&c), 0);
	mbp__crew_stop(&c);
	ck_assert_str_eq(r.name[0], "mbp-train-0");
	ck_assert_str_eq(r.name[1], "mbp-train-1");
	mbp__crew_destroy(&c);
	char longest[32];
	snprintf(longest, sizeof(longest), "mbp-%s-%u-%u", "train", MBP_MAX_STAGES - 2, MBP_MAX_STAGES - 1);
	ck_assert_uint_le(strlen(longest), 15);
}
END_TEST

/* With a pool, each thread has a cache of its own while it runs, destroyed as it exits. */
START_TEST(each_thread_has_its_own_pool_cache_shared_by_its_stages)
{
	mbp_pool *pool;
	mbp_pool_opts po;
	mbp_pool_opts_init(&po);
	po.buf_bytes = 64;
	ck_assert_int_eq(mbp_pool_new(&pool, &po), 0);
	static struct rec r;
	struct mbp__crew c;
	rec_reset(&r, 4);
	plan(&c, &r, 4, 2, false, rec_run);
	c.pool = pool;
	ck_assert_int_eq(mbp__crew_start(&c), 0);
	mbp__crew_stop(&c);
	ck_assert_ptr_nonnull(r.cache[0]);
	ck_assert_ptr_nonnull(r.cache[1]);
	ck_assert_ptr_ne(r.cache[0], r.cache[1]);
	ck_assert_ptr_null(c.th[0].cache); /* destroyed by its thread */
	mbp__crew_destroy(&c);
	ck_assert_int_eq(mbp_pool_destroy(pool), 0);
}
END_TEST

/* A pin that fails is reported by place() (cpu -1 and the error), gives its claim back at once, and the
 * crew runs unpinned; where the CPU was asked for (named), it fails the start instead. */
START_TEST(a_failed_pin_is_reported_and_fails_the_start_only_where_the_cpu_was_asked_for)
{
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	static struct rec r;
	struct mbp__crew c;
	rec_reset(&r, 1);
	plan(&c, &r, 1, 0, true, rec_run);
	ck_assert_int_eq(c.th[0].cpu, allowed[0]);
	mbp_placement pl = mbp__crew_place(&c, 0, true);
	ck_assert_int_eq(pl.cpu, allowed[0]); /* planned: known before start */
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 1);
	mbp__pin_fail_set(-EPERM);
	ck_assert_int_eq(mbp__crew_start(&c), 0);
	mbp__pin_fail_set(0);
	pl = mbp__crew_place(&c, 0, true);
	ck_assert_int_eq(pl.cpu, -1);
	ck_assert_int_eq(pl.pin_error, -EPERM);
	ck_assert_uint_eq(pl.sharing, 0);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0); /* given back at the failed pin */
	mbp__crew_stop(&c);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0); /* not twice */
	ck_assert_uint_eq(r.runs[0], 1);
	mbp__crew_destroy(&c);

	/* a named CPU: the pin is required */
	rec_reset(&r, 1);
	mbp__crew_init(&c, "test", rec_run, &r);
	r.probes[0] = (struct probe){&r, 0};
	c.stage[0] = (struct mbp__crew_stage){.init = rec_init, .fini = rec_fini, .ctx = &r.probes[0]};
	int named[1] = {allowed[0]};
	struct mbp__placement_req rq = {.nstages = 1, .pin = true, .named = named};
	ck_assert_int_eq(mbp__crew_plan(&c, &rq, 0, 0), 0);
	ck_assert(c.th[0].pin_required);
	mbp__pin_fail_set(-EPERM);
	ck_assert_int_eq(mbp__crew_start(&c), -EPERM);
	mbp__pin_fail_set(0);
	ck_assert_uint_eq(r.inits[0], 0); /* no init on a thread whose required pin failed */
	ck_assert_uint_eq(r.runs[0], 0);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0);
	mbp__crew_destroy(&c);
}
END_TEST

/* The CPUs a crew holds count in place()'s sharing while it holds them, and go back at stop; a crew that
 * was planned and never started gives them back too. */
START_TEST(stop_gives_back_the_cpus_also_of_a_crew_that_never_started)
{
	int allowed[MBP_MAX_CPUS];
	ck_assert_int_ge(mbp_cpus_allowed(allowed, MBP_MAX_CPUS, NULL), 1);
	static struct rec r, r2;
	struct mbp__crew a, b;
	rec_reset(&r, 1);
	rec_reset(&r2, 1);
	plan(&a, &r, 1, 0, true, rec_run);
	ck_assert_int_eq(mbp__crew_start(&a), 0);
	int n = mbp_cpus_allowed(NULL, 0, NULL);
	plan(&b, &r2, 1, 0, true, rec_run);
	ck_assert_int_eq(b.th[0].cpu, allowed[n > 1 ? 1 : 0]);
	ck_assert_uint_eq(mbp__crew_place(&b, 0, true).sharing, n > 1 ? 0 : 1);
	ck_assert_uint_eq(mbp__crew_place(&b, 0, false).sharing, 0);
	mbp__crew_destroy(&b); /* never started */
	ck_assert_uint_eq(mbp__cpu_claims(allowed[n > 1 ? 1 : 0]), n > 1 ? 0 : 1);
	mbp__crew_destroy(&a);
	ck_assert_uint_eq(mbp__cpu_claims(allowed[0]), 0);
}
END_TEST

/* ---- the barrier ---- */

enum { ROUNDS = 200 };

static void at_last(void *arg)
{
	struct rec *r = arg;
	if (r->lasts < 64)
		r->seen_at_last[r->lasts] = atomic_load(&r->arrivals);
	r->lasts++;
}

static void barrier_run(void *arg, struct mbp__crew_thread *th)
{
	struct rec *r = arg;
	for (unsigned k = 1; k <= ROUNDS; k++) {
		r->wrote[th->idx] = k; /* plain write, published by the barrier */
		atomic_fetch_add(&r->arrivals, 1);
		mbp__crew_barrier_wait(r->crew, &r->bar, at_last, r);
		for (unsigned t = 0; t < r->crew->nthreads; t++)
			if (r->wrote[t] < k)
				atomic_fetch_add(&r->bad_reads, 1);
		mbp__crew_barrier_wait(r->crew, &r->bar, NULL, NULL); /* nobody writes round k+1 yet */
	}
}

/* Every thread waits for all at the barrier, the last one runs the callback before any leaves, and what
 * each wrote before arriving is what every thread reads after it. */
START_TEST(the_barrier_lets_no_thread_through_before_all_arrived)
{
	for (unsigned T = 1; T <= 3; T++) {
		static struct rec r;
		struct mbp__crew c;
		rec_reset(&r, T);
		r.crew = &c;
		plan(&c, &r, T, T, false, barrier_run);
		ck_assert_int_eq(mbp__crew_start(&c), 0);
		mbp__crew_stop(&c);
		ck_assert_uint_eq(r.lasts, ROUNDS);
		for (unsigned k = 0; k < 64 && k < ROUNDS;
		     k++) /* all of round k + 1 had arrived, none later */
			ck_assert_uint_eq(r.seen_at_last[k], (k + 1) * T);
		ck_assert_uint_eq(r.bad_reads, 0);
		mbp__crew_destroy(&c);
	}
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("crew");
	TCase *tc = tcase_create("crew");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, every_thread_is_inited_before_any_runs_and_fini_runs_on_its_thread_in_reverse);
	tcase_add_test(tc, a_failing_init_aborts_the_start_and_every_other_init_and_its_fini_still_run);
	tcase_add_test(tc, threads_are_named_for_their_engine_and_stages);
	tcase_add_test(tc, each_thread_has_its_own_pool_cache_shared_by_its_stages);
	tcase_add_test(tc, a_failed_pin_is_reported_and_fails_the_start_only_where_the_cpu_was_asked_for);
	tcase_add_test(tc, stop_gives_back_the_cpus_also_of_a_crew_that_never_started);
	tcase_add_test(tc, the_barrier_lets_no_thread_through_before_all_arrived);
	suite_add_tcase(s, tc);
	return s;
}
