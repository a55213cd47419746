/*
 * Tests of the SPSC ring (lib/ring.h) and its waits (lib/wait.h).
 *
 * Single thread: capacity checks, empty, full, wrap-around of the free-running indices (rings started near
 * UINT32_MAX), partial bursts, close. Two threads: a stamped stream of at least 10 million items verified in
 * order and counted, in non-blocking, burst and blocking modes; both sides parking on a ring of two slots;
 * timeouts; close while the peer is parked. Oversubscription: a ring of rings with more threads than CPUs,
 * tokens restamped at every hop and every one accounted for at the end.
 *
 * Stress counts go through mbp_iters(): MBP_TEST_SCALE=10 shrinks them for sanitizer builds.
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "ring.h"

#include "check_main.h"

/* ----------------------------------------------------------------------------------------------------- */
/* Helpers                                                                                               */
/* ----------------------------------------------------------------------------------------------------- */

#define MS 1000000ll

/* Items are stamped integers carried as pointers; +1 keeps them non-NULL so a zeroed slot never matches. */
static void *stamp(uint64_t v)
{
	return (void *)(uintptr_t)(v + 1);
}

static uint64_t unstamp(void *p)
{
	return (uint64_t)(uintptr_t)p - 1;
}

/* The receiving end of a stamped stream 0, 1, 2, ...: counts items and remembers the first one out of
 * place. Written by the consumer thread only, checked after it is joined. */
struct seq_check {
	uint64_t next;
	uint64_t bad; /* first stamp out of place + 1; 0 when none */
};

static void seq_check_item(struct seq_check *c, void *p)
{
	if (unstamp(p) != c->next && !c->bad)
		c->bad = unstamp(p) + 1;
	c->next++;
}

static void seq_check_done(const struct seq_check *c, uint64_t n)
{
	ck_assert_msg(c->bad == 0, "out of order: got stamp %llu", (unsigned long long)(c->bad - 1));
	ck_assert_uint_eq(c->next, n);
}

static struct mbp__ring *ring_make(uint32_t capacity, const struct mbp__wait_opts *wo, uint32_t start)
{
	struct mbp__ring *r = NULL;
	int rc = mbp__ring_new(&r, capacity, wo, start);
	ck_assert_int_eq(rc, 0);
	ck_assert_ptr_nonnull(r);
	return r;
}

/* Budgets that make a waiter park almost at once, so the futex path runs often. */
static const struct mbp__wait_opts tiny_wait = {.spin_ns = 1000, .yield_ns = 1000, .no_spin = false};
static const struct mbp__wait_opts park_now = {.spin_ns = 0, .yield_ns = 0, .no_spin = true};

static void sleep_ns(long ns)
{
	struct timespec ts = {.tv_sec = ns / 1000000000l, .tv_nsec = ns % 1000000000l};
	while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
		;
}

/* The CPUs this process may run on (never "CPU i": the allowed set may be anything). */
static int allowed_cpus(int *cpus, int max)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	ck_assert_int_eq(sched_getaffinity(0, sizeof(set), &set), 0);
	int n = 0;
	for (int c = 0; c < CPU_SETSIZE && n < max; c++)
		if (CPU_ISSET(c, &set))
			cpus[n++] = c;
	return n;
}

/* Pin the calling thread to the k-th allowed CPU (modulo their count); a failure is a test failure. */
static void pin_self(int k)
{
	int cpus[CPU_SETSIZE];
	int n = allowed_cpus(cpus, CPU_SETSIZE);
	if (n < 2)
		return; /* nothing to spread over */
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpus[k % n], &set);
	int rc = pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
	ck_assert_msg(rc == 0, "pinning to cpu %d failed: %s", cpus[k % n], strerror(rc));
}

static uint64_t thread_cpu_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Voluntary context switches of the calling thread: a thread that slept on the futex has some. */
static long thread_nvcsw(void)
{
	struct rusage ru;
	ck_assert_int_eq(getrusage(RUSAGE_THREAD, &ru), 0);
	return ru.ru_nvcsw;
}

/* Spin until `flag` reads 1 (a peer has raised its parker flag) or fail after `limit_ms`. */
static void await_parked(_Atomic uint32_t *flag, long limit_ms)
{
	uint64_t end = mbp__now_ns() + (uint64_t)limit_ms * MS;
	while (!atomic_load_explicit(flag, memory_order_relaxed)) {
		ck_assert_msg(mbp__now_ns() < end, "the peer never parked");
		sleep_ns(100000);
	}
	sleep_ns(2 * MS); /* let it reach the futex, not just the flag */
}

static pthread_t spawn(void *(*fn)(void *), void *arg)
{
	pthread_t t;
	int rc = pthread_create(&t, NULL, fn, arg);
	ck_assert_msg(rc == 0, "pthread_create: %s", strerror(rc));
	return t;
}

static void *join(pthread_t t)
{
	void *ret = NULL;
	ck_assert_int_eq(pthread_join(t, &ret), 0);
	return ret;
}

/*
 * Blocking push and pop as a caller writes them over the ring's one wait (ring.h): the non-blocking form,
 * then mbp__ring_wait_push/_pop, until done, closed (-EPIPE) or the timeout (< 0: none; 0: just look,
 * -EAGAIN). The worker's link_push/link_pop are the same loops with time accounting.
 */
static uint64_t deadline_of(int64_t timeout_ns)
{
	return timeout_ns == 0 ? 0 : mbp__deadline(timeout_ns); /* 0: already past, the wait only looks */
}

static int push_wait(struct mbp__ring *r, void *item, int64_t timeout_ns)
{
	uint64_t deadline = deadline_of(timeout_ns);
	while (!mbp__ring_push_sp(r, item)) {
		int rc = mbp__ring_wait_push(r, NULL, NULL, deadline);
		if (rc)
			return rc == -ETIMEDOUT && timeout_ns == 0 ? -EAGAIN : rc;
	}
	return 0;
}

static int pop_burst_wait(struct mbp__ring *r, void **items, unsigned n, int64_t timeout_ns)
{
	uint64_t deadline = deadline_of(timeout_ns);
	unsigned got;
	while ((got = mbp__ring_pop_burst_sc(r, items, n)) == 0) {
		int rc = mbp__ring_wait_pop(r, NULL, NULL, deadline);
		if (rc)
			return rc == -ETIMEDOUT && timeout_ns == 0 ? -EAGAIN : rc;
	}
	return (int)got;
}

static int pop_wait(struct mbp__ring *r, void **item, int64_t timeout_ns)
{
	int rc = pop_burst_wait(r, item, 1, timeout_ns);
	return rc > 0 ? 0 : rc;
}

/* Run a consumer and a producer on one argument to the end. */
static void run_both(void *(*consumer)(void *), void *(*producer)(void *), void *arg)
{
	pthread_t c = spawn(consumer, arg);
	pthread_t p = spawn(producer, arg);
	join(p);
	join(c);
}

/* Start values for the indices: plain, and just below the wrap at 2^32 so every test crosses it. */
static const uint32_t starts[] = {0, UINT32_MAX - 2, UINT32_MAX, UINT32_MAX - 100, 0x7fffffffu};

/* ----------------------------------------------------------------------------------------------------- */
/* Single thread                                                                                         */
/* ----------------------------------------------------------------------------------------------------- */

START_TEST(new_rejects_capacities_that_are_not_powers_of_two_in_range)
{
	static const uint32_t bad[] = {0, 1, 3, 6, 100, 1000, (1u << 30) + 1, 1u << 31, UINT32_MAX};
	for (size_t i = 0; i < MBP_ARRAY_SIZE(bad); i++) {
		struct mbp__ring *r = (struct mbp__ring *)&r; /* non-NULL junk: must be reset to NULL */
		ck_assert_msg(mbp__ring_new(&r, bad[i], NULL, 0) == -EINVAL, "capacity %u accepted", bad[i]);
		ck_assert_ptr_null(r);
	}
	ck_assert_int_eq(mbp__ring_new(NULL, 8, NULL, 0), -EINVAL);

	static const uint32_t good[] = {2, 4, 64, 1u << 16};
	for (size_t i = 0; i < MBP_ARRAY_SIZE(good); i++) {
		struct mbp__ring *r = ring_make(good[i], NULL, 0);
		ck_assert_uint_eq(r->capacity, good[i]);
		ck_assert_uint_eq(mbp__ring_count(r), 0);
		mbp__ring_destroy(r);
	}
	mbp__ring_destroy(NULL);
}
END_TEST

START_TEST(new_lays_out_the_ring_on_separate_cache_lines)
{
	struct mbp__ring *r = ring_make(8, NULL, 0);
	ck_assert_uint_eq((uintptr_t)r % MBP_CACHELINE, 0);
	ck_assert_uint_eq((uintptr_t)&r->head % MBP_CACHELINE, 0);
	ck_assert_uint_eq((uintptr_t)&r->tail % MBP_CACHELINE, 0);
	ck_assert_uint_eq((uintptr_t)&r->slots[0] % MBP_CACHELINE, 0);
	/* the wake check after each push or pop reads the peer's parker on the caller's own line: no line
	 * beyond its own, the slots and the read-mostly one is touched per item */
	ck_assert_uint_eq((uintptr_t)&r->cons_park / MBP_CACHELINE, (uintptr_t)&r->head / MBP_CACHELINE);
	ck_assert_uint_eq((uintptr_t)&r->limit / MBP_CACHELINE, (uintptr_t)&r->head / MBP_CACHELINE);
	ck_assert_uint_eq((uintptr_t)&r->prod_park / MBP_CACHELINE, (uintptr_t)&r->tail / MBP_CACHELINE);
	/* default budgets when no options are given */
	ck_assert_uint_eq(r->wopts.spin_ns, MBP__SPIN_NS_DEFAULT);
	ck_assert_uint_eq(r->wopts.yield_ns, MBP__YIELD_NS_DEFAULT);
	ck_assert(!r->wopts.no_spin);
	mbp__ring_destroy(r);
}
END_TEST

/* Every slot starts NULL (empty), zeroed by the allocator: a large ring commits no memory for slots it
 * has not used yet (a memset would touch every page). */
START_TEST(a_large_ring_commits_no_memory_until_its_slots_are_used)
{
	struct rusage before, after;
	ck_assert_int_eq(getrusage(RUSAGE_SELF, &before), 0);
	struct mbp__ring *r = ring_make(1u << 26, NULL, 0); /* 512 MiB of slots */
	ck_assert(mbp__ring_push_sp(r, stamp(7)));
	void *p = NULL;
	ck_assert(mbp__ring_pop_sc(r, &p));
	ck_assert_uint_eq(unstamp(p), 7);
	ck_assert(!mbp__ring_pop_sc(r, &p));
	ck_assert_int_eq(getrusage(RUSAGE_SELF, &after), 0);
#if !defined(MBP_TSAN) && !defined(__SANITIZE_ADDRESS__) /* their allocators zero what they hand out */
	ck_assert_msg(after.ru_maxrss - before.ru_maxrss < 64 * 1024, "the ring committed %ld KiB",
		      after.ru_maxrss - before.ru_maxrss);
#endif
	mbp__ring_destroy(r);
}
END_TEST

START_TEST(empty_ring_pops_nothing_and_does_not_block_with_timeout_zero)
{
	struct mbp__ring *r = ring_make(4, NULL, starts[_i]);
	void *items[4] = {0};
	void *one = NULL;
	ck_assert(!mbp__ring_pop_sc(r, &one));
	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, items, 4), 0);
	ck_assert_int_eq(pop_wait(r, &one, 0), -EAGAIN);
	ck_assert_int_eq(pop_burst_wait(r, items, 4, 0), -EAGAIN);
	ck_assert_uint_eq(mbp__ring_count(r), 0);
	ck_assert(!mbp__ring_closed(r));
	/* after one item in and out, empty again */
	ck_assert(mbp__ring_push_sp(r, stamp(7)));
	ck_assert_uint_eq(mbp__ring_count(r), 1);
	ck_assert(mbp__ring_pop_sc(r, &one));
	ck_assert_uint_eq(unstamp(one), 7);
	ck_assert(!mbp__ring_pop_sc(r, &one));
	ck_assert_uint_eq(mbp__ring_count(r), 0);
	mbp__ring_destroy(r);
}
END_TEST

START_TEST(full_ring_refuses_push_until_a_pop_frees_a_slot)
{
	enum { CAP = 8 };
	struct mbp__ring *r = ring_make(CAP, NULL, starts[_i]);
	for (uint64_t i = 0; i < CAP; i++)
		ck_assert(mbp__ring_push_sp(r, stamp(i)));
	ck_assert_uint_eq(mbp__ring_count(r), CAP);
	ck_assert(!mbp__ring_push_sp(r, stamp(99)));
	void *extra[2] = {stamp(98), stamp(99)};
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, extra, 2), 0);
	ck_assert_int_eq(push_wait(r, stamp(99), 0), -EAGAIN);
	ck_assert_uint_eq(mbp__ring_count(r), CAP);

	void *p = NULL;
	ck_assert(mbp__ring_pop_sc(r, &p));
	ck_assert_uint_eq(unstamp(p), 0);
	ck_assert_int_eq(push_wait(r, stamp(CAP), 0), 0); /* the freed slot */
	ck_assert(!mbp__ring_push_sp(r, stamp(99)));
	for (uint64_t i = 1; i <= CAP; i++) {
		ck_assert(mbp__ring_pop_sc(r, &p));
		ck_assert_uint_eq(unstamp(p), i);
	}
	ck_assert(!mbp__ring_pop_sc(r, &p));
	mbp__ring_destroy(r);
}
END_TEST

/* A stream of items at every fill level crosses the wrap of the 32-bit indices and stays in order. */
START_TEST(indices_wrap_past_uint32_max_keeping_order_and_count)
{
	enum { CAP = 16, ROUNDS = 400 };
	uint32_t start = starts[_i];
	struct mbp__ring *r = ring_make(CAP, NULL, start);
	uint64_t in = 0, out = 0;
	for (unsigned round = 0; round < ROUNDS; round++) {
		unsigned fill = round % (CAP + 1); /* 0 .. CAP items in flight */
		while (in - out < fill)
			ck_assert(mbp__ring_push_sp(r, stamp(in++)));
		ck_assert_uint_eq(mbp__ring_count(r), in - out);
		if (fill == CAP)
			ck_assert(!mbp__ring_push_sp(r, stamp(0)));
		unsigned drain = (round * 7) % (fill + 1);
		for (unsigned k = 0; k < drain; k++) {
			void *p = NULL;
			ck_assert(mbp__ring_pop_sc(r, &p));
			ck_assert_uint_eq(unstamp(p), out++);
		}
	}
	void *p = NULL;
	while (mbp__ring_pop_sc(r, &p))
		ck_assert_uint_eq(unstamp(p), out++);
	ck_assert_uint_eq(in, out);
	ck_assert_uint_gt(in, 1000);
	/* the free-running indices moved by exactly the item count, modulo 2^32 */
	ck_assert_uint_eq(atomic_load(&r->head), (uint32_t)(start + in));
	ck_assert_uint_eq(atomic_load(&r->tail), (uint32_t)(start + in));
	if (start > UINT32_MAX - 1000)
		ck_assert_uint_lt(atomic_load(&r->head), start); /* it really wrapped */
	mbp__ring_destroy(r);
}
END_TEST

START_TEST(bursts_move_what_fits_when_nearly_full_or_nearly_empty)
{
	enum { CAP = 16 };
	struct mbp__ring *r = ring_make(CAP, NULL, starts[_i]);
	void *in[CAP * 2], *out[CAP * 2];
	for (uint64_t i = 0; i < CAP * 2; i++)
		in[i] = stamp(i);
	uint64_t next_in = 0, next_out = 0;

	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in, 0), 0); /* empty burst: no effect */
	ck_assert_uint_eq(mbp__ring_count(r), 0);
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in, 13), 13);
	next_in = 13;
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in + next_in, 8), 3); /* nearly full: 3 of 8 */
	next_in += 3;
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in + next_in, 8), 0); /* full */
	ck_assert_uint_eq(mbp__ring_count(r), CAP);

	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, out, 0), 0);
	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, out, 5), 5);
	for (unsigned k = 0; k < 5; k++)
		ck_assert_uint_eq(unstamp(out[k]), next_out++);
	/* 5 free: a burst of 8 moves 5 (the producer's cached tail is stale and must be refreshed) */
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in + next_in, 8), 5);
	next_in += 5;
	/* a burst larger than the ring is clipped to what is there */
	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, out, CAP * 2), CAP);
	for (unsigned k = 0; k < CAP; k++)
		ck_assert_uint_eq(unstamp(out[k]), next_out++);
	ck_assert_uint_eq(next_in, next_out);

	/* nearly empty: 4 available, a burst of 10 gets 4, the next gets 0 */
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in + next_in, 4), 4);
	next_in += 4;
	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, out, 10), 4);
	for (unsigned k = 0; k < 4; k++)
		ck_assert_uint_eq(unstamp(out[k]), next_out++);
	ck_assert_uint_eq(mbp__ring_pop_burst_sc(r, out, 10), 0);
	/* the blocking burst pop returns what is there without waiting for n */
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in + next_in, 3), 3);
	next_in += 3;
	ck_assert_int_eq(pop_burst_wait(r, out, 10, -1), 3);
	for (unsigned k = 0; k < 3; k++)
		ck_assert_uint_eq(unstamp(out[k]), next_out++);
	/* a burst larger than the ring into an empty ring is clipped to the capacity */
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, in, CAP * 2), CAP);
	ck_assert_uint_eq(mbp__ring_count(r), CAP);
	mbp__ring_destroy(r);
}
END_TEST

START_TEST(close_lets_the_consumer_drain_then_reports_end_of_stream)
{
	struct mbp__ring *r = ring_make(8, NULL, starts[_i]);
	for (uint64_t i = 0; i < 3; i++)
		ck_assert(mbp__ring_push_sp(r, stamp(i)));
	mbp__ring_close(r);
	mbp__ring_close(r); /* idempotent */
	ck_assert(mbp__ring_closed(r));

	/* every push form fails, though there is room */
	void *more[2] = {stamp(10), stamp(11)};
	ck_assert(!mbp__ring_push_sp(r, stamp(10)));
	ck_assert_uint_eq(mbp__ring_push_burst_sp(r, more, 2), 0);
	ck_assert_int_eq(push_wait(r, stamp(10), 0), -EPIPE);
	ck_assert_int_eq(push_wait(r, stamp(10), -1), -EPIPE);
	ck_assert_int_eq(push_wait(r, stamp(10), 10 * MS), -EPIPE);
	ck_assert_uint_eq(mbp__ring_count(r), 3);

	/* the consumer drains, in order, then sees end-of-stream on every blocking form without waiting */
	void *p = NULL, *burst[8];
	ck_assert_int_eq(pop_wait(r, &p, -1), 0);
	ck_assert_uint_eq(unstamp(p), 0);
	ck_assert_int_eq(pop_burst_wait(r, burst, 8, -1), 2);
	ck_assert_uint_eq(unstamp(burst[0]), 1);
	ck_assert_uint_eq(unstamp(burst[1]), 2);
	ck_assert_int_eq(pop_wait(r, &p, -1), -EPIPE);
	ck_assert_int_eq(pop_wait(r, &p, 0), -EPIPE);
	ck_assert_int_eq(pop_burst_wait(r, burst, 8, -1), -EPIPE);
	ck_assert(!mbp__ring_pop_sc(r, &p));
	ck_assert_uint_eq(mbp__ring_count(r), 0);
	mbp__ring_destroy(r);
}
END_TEST

/* close() shuts the producer's fast path by moving its limit; closing again must not move it back, at any
 * fill level, whether the consumer has moved since the producer's last look (the refill path) or not. */
START_TEST(closing_again_never_reopens_the_ring_at_any_fill_level)
{
	enum { CAP = 8 };
	for (unsigned fill = 0; fill <= CAP; fill++) {
		for (unsigned closes = 1; closes <= 4; closes++) {
			for (unsigned popped = 0; popped <= fill; popped += fill ? fill : 1) {
				struct mbp__ring *r = ring_make(CAP, NULL, starts[_i]);
				uint64_t next_in = 0, next_out = 0;
				for (unsigned k = 0; k < fill; k++)
					ck_assert(mbp__ring_push_sp(r, stamp(next_in++)));
				void *p = NULL;
				for (unsigned k = 0; k < popped; k++) {
					ck_assert(mbp__ring_pop_sc(r, &p));
					ck_assert_uint_eq(unstamp(p), next_out++);
				}
				for (unsigned c = 0; c < closes; c++) {
					mbp__ring_close(r);
					void *two[2] = {stamp(100), stamp(101)};
					ck_assert_msg(!mbp__ring_push_sp(r, stamp(100)),
						      "fill %u popped %u: a push landed after close %u", fill,
						      popped, c + 1);
					ck_assert_uint_eq(mbp__ring_push_burst_sp(r, two, 2), 0);
					ck_assert_int_eq(push_wait(r, stamp(100), 0), -EPIPE);
				}
				ck_assert_uint_eq(mbp__ring_count(r), fill - popped);
				while (mbp__ring_pop_sc(r, &p))
					ck_assert_uint_eq(unstamp(p), next_out++);
				ck_assert_uint_eq(next_out, next_in);
				ck_assert_int_eq(pop_wait(r, &p, 0), -EPIPE);
				mbp__ring_destroy(r);
			}
		}
	}
}
END_TEST

START_TEST(close_of_an_empty_ring_ends_a_blocking_pop_at_once)
{
	struct mbp__ring *r = ring_make(2, &park_now, starts[_i]);
	mbp__ring_close(r);
	void *p = NULL;
	ck_assert_int_eq(pop_wait(r, &p, -1), -EPIPE);
	ck_assert_int_eq(pop_wait(r, &p, 50 * MS), -EPIPE);
	mbp__ring_destroy(r);
}
END_TEST

/* ----------------------------------------------------------------------------------------------------- */
/* Timeouts and the backoff                                                                              */
/* ----------------------------------------------------------------------------------------------------- */

static const struct mbp__wait_opts *const timeout_opts[] = {&park_now, &tiny_wait, NULL};

START_TEST(blocking_pop_times_out_on_an_empty_ring)
{
	const int64_t timeout = 30 * MS;
	struct mbp__ring *r = ring_make(4, timeout_opts[_i], UINT32_MAX);
	void *p = NULL;
	uint64_t t0 = mbp__now_ns();
	ck_assert_int_eq(pop_wait(r, &p, timeout), -ETIMEDOUT);
	uint64_t waited = mbp__now_ns() - t0;
	ck_assert_uint_ge(waited, (uint64_t)timeout); /* never early */
	ck_assert_uint_lt(waited, 5000 * MS);	      /* and not lost: a sane bound on a loaded machine */
	ck_assert_uint_eq(atomic_load(&r->cons_park.parked), 0); /* the flag is down after a timeout */
	mbp__ring_destroy(r);
}
END_TEST

static void count_idle(void *arg)
{
	(*(unsigned *)arg)++;
}

/* The ring's wait hands its idle hook the caller's own argument (the worker passes its stage, to flush its
 * pool cache) before it parks, and looks at the ring, not at that argument, to decide. */
START_TEST(wait_runs_the_idle_hook_with_its_own_argument_before_parking)
{
	struct mbp__ring *r = ring_make(2, &park_now, 0);
	unsigned idles = 0;
	ck_assert_int_eq(mbp__ring_wait_pop(r, count_idle, &idles, mbp__deadline(20 * MS)), -ETIMEDOUT);
	ck_assert_uint_ge(idles, 1);
	ck_assert(mbp__ring_push_sp(r, stamp(1)));
	ck_assert(mbp__ring_push_sp(r, stamp(2)));
	idles = 0;
	ck_assert_int_eq(mbp__ring_wait_pop(r, count_idle, &idles, UINT64_MAX), 0); /* items: at once */
	ck_assert_int_eq(mbp__ring_wait_push(r, count_idle, &idles, mbp__deadline(20 * MS)), -ETIMEDOUT);
	ck_assert_uint_ge(idles, 1);
	mbp__ring_close(r);
	ck_assert_int_eq(mbp__ring_wait_push(r, NULL, NULL, UINT64_MAX), -EPIPE);
	ck_assert_int_eq(mbp__ring_wait_pop(r, NULL, NULL, UINT64_MAX), 0); /* closed, not yet drained */
	mbp__ring_destroy(r);
}
END_TEST

START_TEST(blocking_push_times_out_on_a_full_ring)
{
	const int64_t timeout = 30 * MS;
	struct mbp__ring *r = ring_make(2, timeout_opts[_i], UINT32_MAX);
	ck_assert(mbp__ring_push_sp(r, stamp(0)));
	ck_assert(mbp__ring_push_sp(r, stamp(1)));
	uint64_t t0 = mbp__now_ns();
	ck_assert_int_eq(push_wait(r, stamp(2), timeout), -ETIMEDOUT);
	uint64_t waited = mbp__now_ns() - t0;
	ck_assert_uint_ge(waited, (uint64_t)timeout);
	ck_assert_uint_lt(waited, 5000 * MS);
	ck_assert_uint_eq(atomic_load(&r->prod_park.parked), 0);
	ck_assert_uint_eq(mbp__ring_count(r), 2); /* the timed-out item did not land */
	mbp__ring_destroy(r);
}
END_TEST

/* The spin step ends when its time budget is spent (overrunning by a few pauses at most) and the yield step
 * after it; then the backoff says PARK. The budgets are milliseconds: a thread descheduled for longer than
 * both during its first few pauses would see them spent at its first clock read (this failed once under
 * TSan with 0.2 + 0.3 ms, the other suites running beside it). */
START_TEST(backoff_spins_then_yields_for_their_budgets_then_parks)
{
	struct mbp__wait_opts o = {.spin_ns = 2000000, .yield_ns = 3000000, .no_spin = false};
	struct mbp__backoff b;
	mbp__backoff_init(&b);
	uint64_t t0 = mbp__now_ns();
	uint32_t steps = 0;
	while (mbp__backoff_step(&b, &o) == MBP__BACKOFF_AGAIN) {
		steps++;
		ck_assert_msg(mbp__now_ns() - t0 < 5000 * MS, "the backoff never said PARK");
	}
	uint64_t took = mbp__now_ns() - t0;
	ck_assert_uint_ge(took, o.spin_ns + o.yield_ns);
	ck_assert_uint_gt(steps, MBP__SPIN_STEPS_PER_CLOCK); /* many short steps, each a re-check */
	/* once PARK, it stays PARK */
	ck_assert_int_eq(mbp__backoff_step(&b, &o), MBP__BACKOFF_PARK);
}
END_TEST

/* no_spin skips the spin step whatever its budget: with no yield budget the first step is already PARK. */
START_TEST(no_spin_skips_the_spin_step)
{
	struct mbp__wait_opts spin = {.spin_ns = 10000 * MS, .yield_ns = 0, .no_spin = false};
	struct mbp__wait_opts nospin = {.spin_ns = 10000 * MS, .yield_ns = 0, .no_spin = true};
	struct mbp__backoff b;
	mbp__backoff_init(&b);
	ck_assert_int_eq(mbp__backoff_step(&b, &spin), MBP__BACKOFF_AGAIN);
	mbp__backoff_init(&b);
	ck_assert_int_eq(mbp__backoff_step(&b, &nospin), MBP__BACKOFF_PARK);

	/* and the yield step still runs under no_spin until its own budget is spent */
	struct mbp__wait_opts yield = {.spin_ns = 10000 * MS, .yield_ns = 10000 * MS, .no_spin = true};
	mbp__backoff_init(&b);
	ck_assert_int_eq(mbp__backoff_step(&b, &yield), MBP__BACKOFF_AGAIN);

	/* a blocking pop under no_spin parks instead of spinning out its huge spin budget: the thread uses
	 * little CPU over the timeout (a spinning thread would use about all of it) */
	struct mbp__ring *r = ring_make(4, &nospin, 0);
	void *p = NULL;
	uint64_t cpu0 = thread_cpu_ns();
	ck_assert_int_eq(pop_wait(r, &p, 100 * MS), -ETIMEDOUT);
	uint64_t cpu = thread_cpu_ns() - cpu0;
	ck_assert_msg(cpu < 20 * MS, "no_spin waiter used %llu ns of CPU in 100 ms", (unsigned long long)cpu);
	mbp__ring_destroy(r);
}
END_TEST

/* ----------------------------------------------------------------------------------------------------- */
/* Two threads: a stamped stream                                                                         */
/* ----------------------------------------------------------------------------------------------------- */

enum stream_mode {
	STREAM_SPIN_ONE,   /* non-blocking single push/pop, spinning */
	STREAM_SPIN_BURST, /* non-blocking bursts of varying size on a small ring: partial bursts */
	STREAM_BLOCKING,   /* push_wait / pop_burst_wait with the default budgets */
	STREAM_MODES
};

struct stream {
	struct mbp__ring *r;
	enum stream_mode mode;
	uint64_t n;
	pthread_barrier_t go;
	/* results, each written by its own thread */
	struct seq_check got;
	int end_rc;
	uint64_t counts_out_of_range; /* the consumer's own count() outside 0 .. capacity */
};

/* Politely spin on a failed non-blocking attempt: the machine is shared, so yield now and then. */
static void spin_wait(unsigned *misses)
{
	if (++*misses % 256 == 0)
		sched_yield();
	else
		mbp__cpu_relax();
}

static void *stream_producer(void *arg)
{
	struct stream *s = arg;
	pin_self(0);
	pthread_barrier_wait(&s->go);
	uint64_t seq = 0;
	unsigned misses = 0;
	uint32_t rnd = 12345;
	void *burst[64];
	while (seq < s->n) {
		switch (s->mode) {
		case STREAM_SPIN_ONE:
			if (mbp__ring_push_sp(s->r, stamp(seq)))
				seq++;
			else
				spin_wait(&misses);
			break;
		case STREAM_SPIN_BURST: {
			rnd = rnd * 1103515245u + 12345u;
			unsigned want = 1 + (rnd >> 16) % 64;
			if (want > s->n - seq)
				want = (unsigned)(s->n - seq);
			for (unsigned k = 0; k < want; k++)
				burst[k] = stamp(seq + k);
			unsigned got = mbp__ring_push_burst_sp(s->r, burst, want);
			if (got)
				seq += got;
			else
				spin_wait(&misses);
			break;
		}
		default: {
			int rc = push_wait(s->r, stamp(seq), -1);
			if (rc != 0)
				return (void *)(intptr_t)rc;
			seq++;
		}
		}
	}
	mbp__ring_close(s->r);
	return NULL;
}

static void *stream_consumer(void *arg)
{
	struct stream *s = arg;
	pin_self(1);
	pthread_barrier_wait(&s->go);
	unsigned misses = 0;
	uint32_t rnd = 54321;
	void *burst[64];
	for (;;) {
		int got;
		if (s->mode == STREAM_BLOCKING) {
			got = pop_burst_wait(s->r, burst, 32, -1);
			if (got < 0) {
				s->end_rc = got;
				break;
			}
		} else {
			rnd = rnd * 1103515245u + 12345u;
			unsigned want = s->mode == STREAM_SPIN_ONE ? 1 : 1 + (rnd >> 16) % 64;
			got = (int)mbp__ring_pop_burst_sc(s->r, burst, want);
			if (!got) {
				if (mbp__ring_closed(s->r)) {
					/* the close came after the last push: look once more, then stop */
					got = (int)mbp__ring_pop_burst_sc(s->r, burst, want);
					if (!got) {
						s->end_rc = -EPIPE;
						break;
					}
				} else {
					spin_wait(&misses);
					continue;
				}
			}
		}
		for (int k = 0; k < got; k++)
			seq_check_item(&s->got, burst[k]);
		/* the consumer pops what the slots hold and may run ahead of a head store that has not
		 * landed: its count stays in range all the same (every 8th time, not to slow the stream) */
		if ((s->got.next & 7) < (uint64_t)got && mbp__ring_count(s->r) > s->r->capacity)
			s->counts_out_of_range++;
	}
	return NULL;
}

START_TEST(two_threads_pass_ten_million_stamped_items_in_order)
{
	struct stream s = {.mode = (enum stream_mode)_i, .n = mbp_iters(10000000, 1000000)};
	static const uint32_t caps[STREAM_MODES] = {1024, 64, 256};
	/* start so that the indices cross 2^32 in the middle of the stream */
	s.r = ring_make(caps[_i], NULL, UINT32_MAX - (uint32_t)(s.n / 2));
	pthread_barrier_init(&s.go, NULL, 2);
	pthread_t c = spawn(stream_consumer, &s);
	pthread_t p = spawn(stream_producer, &s);
	/* meanwhile a third thread's count snapshots stay within 0 .. capacity (never "negative") */
	while (!mbp__ring_closed(s.r)) {
		uint32_t count = mbp__ring_count(s.r);
		ck_assert_uint_le(count, caps[_i]);
		sleep_ns(200000);
	}
	ck_assert_ptr_null(join(p));
	join(c);
	seq_check_done(&s.got, s.n);
	ck_assert_int_eq(s.end_rc, -EPIPE);
	ck_assert_uint_eq(s.counts_out_of_range, 0);
	ck_assert_uint_eq(mbp__ring_count(s.r), 0);
	pthread_barrier_destroy(&s.go);
	mbp__ring_destroy(s.r);
}
END_TEST

/* ----------------------------------------------------------------------------------------------------- */
/* Two threads: parking                                                                                  */
/* ----------------------------------------------------------------------------------------------------- */

struct parkers {
	struct mbp__ring *r;
	uint64_t n;
	bool same_cpu;
	pthread_barrier_t go;
	long prod_sleeps, cons_sleeps; /* voluntary context switches during the run */
	struct seq_check got;
	int prod_rc, cons_rc;
};

static void *park_producer(void *arg)
{
	struct parkers *s = arg;
	pin_self(0);
	pthread_barrier_wait(&s->go);
	long cs0 = thread_nvcsw();
	for (uint64_t i = 0; i < s->n; i++) {
		int rc = push_wait(s->r, stamp(i), -1);
		if (rc) {
			s->prod_rc = rc;
			break;
		}
	}
	s->prod_sleeps = thread_nvcsw() - cs0;
	mbp__ring_close(s->r);
	return NULL;
}

static void *park_consumer(void *arg)
{
	struct parkers *s = arg;
	pin_self(s->same_cpu ? 0 : 1);
	pthread_barrier_wait(&s->go);
	long cs0 = thread_nvcsw();
	void *p = NULL;
	int rc;
	while ((rc = pop_wait(s->r, &p, -1)) == 0)
		seq_check_item(&s->got, p);
	s->cons_rc = rc;
	s->cons_sleeps = thread_nvcsw() - cs0;
	return NULL;
}

/* A ring of two slots and budgets of zero: both sides park on nearly every item. A lost wake-up hangs
 * the test (no timeouts here), so Check's timeout catches it. */
START_TEST(both_sides_park_on_a_tiny_ring_and_lose_no_wakeup)
{
	struct parkers s = {.n = mbp_iters(30000, 3000), .same_cpu = _i & 1};
	s.r = ring_make(2, (_i & 2) ? &tiny_wait : &park_now, UINT32_MAX - 1000);
	/* bit 2: the fallback heavy fence (the mprotect shootdown) used where membarrier is missing */
	bool membarrier_was = mbp__membarrier_ok;
	if (_i & 4)
		mbp__membarrier_ok = false;
	pthread_barrier_init(&s.go, NULL, 2);
	run_both(park_consumer, park_producer, &s);
	ck_assert_int_eq(s.prod_rc, 0);
	ck_assert_int_eq(s.cons_rc, -EPIPE);
	seq_check_done(&s.got, s.n);
	/* With no budget at all, both really slept on the futex (a yield is not a voluntary switch). With
	 * the 2 us budgets a fast peer on the other CPU can keep one side from ever running out of them, so
	 * whether it slept there depends on the scheduler, not on the code (seen once in CI's clone). */
	if (!(_i & 2)) {
		ck_assert_int_gt(s.prod_sleeps, 0);
		ck_assert_int_gt(s.cons_sleeps, 0);
	}
	mbp__membarrier_ok = membarrier_was;
	pthread_barrier_destroy(&s.go);
	mbp__ring_destroy(s.r);
}
END_TEST

struct closer {
	struct mbp__ring *r;
	int rc;
	struct seq_check got;
};

static void *pop_until_end(void *arg)
{
	struct closer *c = arg;
	void *p = NULL;
	while ((c->rc = pop_wait(c->r, &p, -1)) == 0)
		seq_check_item(&c->got, p);
	return NULL;
}

/* The consumer parks on an empty ring between items; the producer's close wakes it, it has drained every
 * item and sees end-of-stream. */
START_TEST(close_wakes_a_consumer_parked_on_an_empty_ring)
{
	struct closer c = {.r = ring_make(4, _i ? &tiny_wait : &park_now, UINT32_MAX)};
	pthread_t t = spawn(pop_until_end, &c);
	enum { ITEMS = 5 };
	for (uint64_t i = 0; i < ITEMS; i++) {
		await_parked(&c.r->cons_park.parked, 10000);
		ck_assert(mbp__ring_push_sp(c.r, stamp(i))); /* wakes it */
	}
	await_parked(&c.r->cons_park.parked, 10000);
	mbp__ring_close(c.r);
	join(t);
	ck_assert_int_eq(c.rc, -EPIPE);
	seq_check_done(&c.got, ITEMS);
	mbp__ring_destroy(c.r);
}
END_TEST

struct blocked_push {
	struct mbp__ring *r;
	int rc;
};

static void *push_one_more(void *arg)
{
	struct blocked_push *b = arg;
	b->rc = push_wait(b->r, stamp(2), -1);
	return NULL;
}

/* The producer parks on a full ring; a close (here by the consumer) wakes it with -EPIPE, its item does
 * not land, and what was in the ring is still there to drain. */
START_TEST(close_wakes_a_producer_parked_on_a_full_ring)
{
	struct blocked_push b = {.r = ring_make(2, _i ? &tiny_wait : &park_now, UINT32_MAX - 1), .rc = 1};
	ck_assert(mbp__ring_push_sp(b.r, stamp(0)));
	ck_assert(mbp__ring_push_sp(b.r, stamp(1)));
	pthread_t t = spawn(push_one_more, &b);
	await_parked(&b.r->prod_park.parked, 10000);
	mbp__ring_close(b.r);
	join(t);
	ck_assert_int_eq(b.rc, -EPIPE);
	ck_assert_uint_eq(mbp__ring_count(b.r), 2);
	void *p = NULL;
	ck_assert_int_eq(pop_wait(b.r, &p, -1), 0);
	ck_assert_uint_eq(unstamp(p), 0);
	ck_assert_int_eq(pop_wait(b.r, &p, -1), 0);
	ck_assert_uint_eq(unstamp(p), 1);
	ck_assert_int_eq(pop_wait(b.r, &p, -1), -EPIPE);
	mbp__ring_destroy(b.r);
}
END_TEST

/* The ring's wopts may name an abort word (the trainer's step): raising it and waking the ring ends a
 * consumer's wait on an empty ring, parked or not, with -ECANCELED instead of an item or the end of the
 * stream; the ring itself is untouched (still open, a later push lands and pops). A raised word does not
 * hide an item that is there. */
struct aborted_pop {
	struct mbp__ring *r;
	int rc;
};

static void *wait_for_an_item(void *arg)
{
	struct aborted_pop *a = arg;
	a->rc = mbp__ring_wait_pop(a->r, NULL, NULL, UINT64_MAX);
	return NULL;
}

START_TEST(an_abort_word_ends_a_parked_wait_with_ecanceled)
{
	static _Atomic uint32_t abort_word;
	atomic_store(&abort_word, 0);
	struct mbp__wait_opts wo = _i ? tiny_wait : park_now;
	wo.abort = &abort_word;
	struct aborted_pop a = {.r = ring_make(4, &wo, 0), .rc = 1};
	pthread_t t = spawn(wait_for_an_item, &a);
	await_parked(&a.r->cons_park.parked, 10000);
	atomic_store_explicit(&abort_word, 1, memory_order_release);
	mbp__ring_wake(a.r);
	join(t);
	ck_assert_int_eq(a.rc, -ECANCELED);
	ck_assert(!mbp__ring_closed(a.r));
	ck_assert(mbp__ring_push_sp(a.r, stamp(7)));
	ck_assert_int_eq(mbp__ring_wait_pop(a.r, NULL, NULL, UINT64_MAX), 0); /* an item wins */
	void *p = NULL;
	ck_assert(mbp__ring_pop_sc(a.r, &p));
	ck_assert_uint_eq(unstamp(p), 7);
	ck_assert_int_eq(mbp__ring_wait_pop(a.r, NULL, NULL, UINT64_MAX), -ECANCELED); /* raised: at once */
	mbp__ring_destroy(a.r);
}
END_TEST

/* A pop frees a slot and wakes a producer parked on a full ring (the wake path, not the close path). */
START_TEST(pop_wakes_a_producer_parked_on_a_full_ring)
{
	struct blocked_push b = {.r = ring_make(2, _i ? &tiny_wait : &park_now, UINT32_MAX - 1), .rc = 1};
	ck_assert(mbp__ring_push_sp(b.r, stamp(0)));
	ck_assert(mbp__ring_push_sp(b.r, stamp(1)));
	pthread_t t = spawn(push_one_more, &b);
	await_parked(&b.r->prod_park.parked, 10000);
	void *p = NULL;
	ck_assert(mbp__ring_pop_sc(b.r, &p));
	ck_assert_uint_eq(unstamp(p), 0);
	join(t);
	ck_assert_int_eq(b.rc, 0);
	ck_assert(mbp__ring_pop_sc(b.r, &p));
	ck_assert_uint_eq(unstamp(p), 1);
	ck_assert(mbp__ring_pop_sc(b.r, &p));
	ck_assert_uint_eq(unstamp(p), 2);
	mbp__ring_destroy(b.r);
}
END_TEST

/* The producer pushes one item and closes at once, over and over, while the consumer waits: a consumer that
 * sees the close must still find the item published just before it (the drain after close). */
struct close_race {
	struct mbp__ring **rings;
	uint64_t n;
	pthread_barrier_t go;
	uint64_t lost, extra; /* rings where the consumer got 0 items, or more than 1 */
	int bad_rc;
};

static void *close_race_producer(void *arg)
{
	struct close_race *s = arg;
	pin_self(0);
	pthread_barrier_wait(&s->go);
	for (uint64_t k = 0; k < s->n; k++) {
		int rc = push_wait(s->rings[k], stamp(k), -1);
		if (rc && !s->bad_rc)
			s->bad_rc = rc;
		mbp__ring_close(s->rings[k]);
	}
	return NULL;
}

static void *close_race_consumer(void *arg)
{
	struct close_race *s = arg;
	pin_self(1);
	pthread_barrier_wait(&s->go);
	for (uint64_t k = 0; k < s->n; k++) {
		void *p = NULL;
		unsigned got = 0;
		int rc;
		while ((rc = pop_wait(s->rings[k], &p, -1)) == 0)
			got += unstamp(p) == k;
		if (rc != -EPIPE && !s->bad_rc)
			s->bad_rc = rc;
		s->lost += got == 0;
		s->extra += got > 1;
	}
	return NULL;
}

START_TEST(close_right_after_the_last_push_loses_no_item)
{
	struct close_race s = {.n = mbp_iters(20000, 2000)};
	s.rings = calloc(s.n, sizeof(*s.rings));
	ck_assert_ptr_nonnull(s.rings);
	for (uint64_t k = 0; k < s.n; k++)
		s.rings[k] = ring_make(2, &tiny_wait, UINT32_MAX);
	pthread_barrier_init(&s.go, NULL, 2);
	run_both(close_race_consumer, close_race_producer, &s);
	ck_assert_int_eq(s.bad_rc, 0);
	ck_assert_uint_eq(s.lost, 0);
	ck_assert_uint_eq(s.extra, 0);
	for (uint64_t k = 0; k < s.n; k++)
		mbp__ring_destroy(s.rings[k]);
	free(s.rings);
	pthread_barrier_destroy(&s.go);
}
END_TEST

/* The consumer closes (abandons) the ring while the producer pushes into it, at a different point each
 * round, on a ring small enough that the producer refills its cached room on nearly every push, racing with
 * the close's move of its limit. Once the producer has seen the flag, no push of its lands; every push that
 * did land is popped (the consumer pops again once the producer has stopped, as ring.h asks). */
struct abandon {
	struct mbp__ring *r;
	uint64_t close_after;
	_Atomic bool producer_done;
	uint64_t pushed, popped, after_seen, order_bad;
};

static void *abandon_producer(void *arg)
{
	struct abandon *a = arg;
	pin_self(0);
	for (;;) {
		bool seen = mbp__ring_closed(a->r);
		bool ok;
		while (!(ok = mbp__ring_push_sp(a->r, stamp(a->pushed))) && !mbp__ring_closed(a->r))
			;
		if (ok) {
			a->pushed++;
			a->after_seen += seen;
		} else if (seen) {
			break;
		}
	}
	/* release; partner: the consumer's acquire load: it pops what this thread pushed */
	atomic_store_explicit(&a->producer_done, true, memory_order_release);
	return NULL;
}

static void *abandon_consumer(void *arg)
{
	struct abandon *a = arg;
	pin_self(1);
	void *p = NULL;
	for (;;) {
		/* acquire; partner: the producer's release store of producer_done */
		bool done = atomic_load_explicit(&a->producer_done, memory_order_acquire);
		if (!mbp__ring_pop_sc(a->r, &p)) {
			if (done)
				break;
			continue;
		}
		a->order_bad += unstamp(p) != a->popped;
		if (++a->popped == a->close_after)
			mbp__ring_close(a->r);
	}
	return NULL;
}

START_TEST(a_close_racing_with_pushes_stops_them_once_the_producer_sees_it)
{
	uint64_t rounds = mbp_iters(2000, 200);
	for (uint64_t k = 0; k < rounds; k++) {
		struct abandon a = {.r = ring_make(4, NULL, UINT32_MAX - (uint32_t)(k % 7)),
				    .close_after = 1 + k % 61};
		run_both(abandon_consumer, abandon_producer, &a);
		ck_assert_uint_eq(a.after_seen, 0);
		ck_assert_uint_eq(a.order_bad, 0);
		ck_assert_uint_eq(a.popped, a.pushed);
		ck_assert_uint_ge(a.popped, a.close_after);
		mbp__ring_destroy(a.r);
	}
}
END_TEST

/* ----------------------------------------------------------------------------------------------------- */
/* Oversubscription: a ring of rings                                                                      */
/* ----------------------------------------------------------------------------------------------------- */

/* Thread i pops from ring i and pushes to ring i+1 (mod n). Tokens start two per thread, travel `hops`
 * hops each and are then retired by whoever pops them; the thread that retires the last one closes every
 * ring so the others see end-of-stream. Every token is restamped at each hop with its sender and the
 * sender's push count on that ring, which the receiver checks: per-ring FIFO order, no loss, no
 * duplicate. */
enum { TOKENS_PER_THREAD = 2, RING_OF_RINGS_CAP = 4 };

struct token {
	uint32_t id;
	uint32_t hops;
	uint32_t sender; /* thread that pushed it last */
	uint64_t seq;	 /* sender's push count on that ring */
	uint32_t retired_by;
};

struct circle {
	unsigned n;
	uint64_t hops;
	struct mbp__ring **rings;
	struct token *tokens;
	pthread_barrier_t go;
	_Atomic uint64_t retired;
	struct circle_thread {
		struct circle *c;
		unsigned idx;
		uint64_t retired, forwarded;
		uint64_t errors; /* stamp mismatches seen */
		int end_rc;
	} * t;
};

static int circle_push(struct circle_thread *me, struct token *tok, uint64_t *pushes)
{
	tok->sender = me->idx;
	tok->seq = (*pushes)++;
	return push_wait(me->c->rings[(me->idx + 1) % me->c->n], tok, -1);
}

static void *circle_thread(void *arg)
{
	struct circle_thread *me = arg;
	struct circle *c = me->c;
	unsigned prev = (me->idx + c->n - 1) % c->n;
	uint64_t pushes = 0, pops = 0;
	pin_self((int)me->idx);
	pthread_barrier_wait(&c->go);
	for (unsigned k = 0; k < TOKENS_PER_THREAD; k++) {
		int rc = circle_push(me, &c->tokens[me->idx * TOKENS_PER_THREAD + k], &pushes);
		if (rc) {
			me->end_rc = rc;
			return NULL;
		}
	}
	for (;;) {
		void *p = NULL;
		int rc = pop_wait(c->rings[me->idx], &p, -1);
		if (rc) {
			me->end_rc = rc;
			return NULL;
		}
		struct token *tok = p;
		if (tok->sender != prev || tok->seq != pops)
			me->errors++;
		pops++;
		if (++tok->hops == c->hops) {
			tok->retired_by = me->idx;
			me->retired++;
			/* acq_rel: the last retirer closes the rings after every other retirement */
			if (atomic_fetch_add_explicit(&c->retired, 1, memory_order_acq_rel) + 1 ==
			    (uint64_t)c->n * TOKENS_PER_THREAD) {
				for (unsigned i = 0; i < c->n; i++)
					mbp__ring_close(c->rings[i]);
			}
			continue;
		}
		rc = circle_push(me, tok, &pushes);
		if (rc) {
			me->end_rc = rc;
			return NULL;
		}
		me->forwarded++;
	}
}

static void run_circle(unsigned n, const struct mbp__wait_opts *wo, uint64_t hops)
{
	struct circle c = {.n = n, .hops = hops};
	c.rings = calloc(n, sizeof(*c.rings));
	c.tokens = calloc((size_t)n * TOKENS_PER_THREAD, sizeof(*c.tokens));
	c.t = calloc(n, sizeof(*c.t));
	ck_assert(c.rings && c.tokens && c.t);
	for (unsigned i = 0; i < n; i++)
		c.rings[i] = ring_make(RING_OF_RINGS_CAP, wo, UINT32_MAX - 3 * i);
	for (unsigned i = 0; i < n * TOKENS_PER_THREAD; i++)
		c.tokens[i].id = i;
	pthread_barrier_init(&c.go, NULL, n);
	pthread_t *th = calloc(n, sizeof(*th));
	for (unsigned i = 0; i < n; i++) {
		c.t[i] = (struct circle_thread){.c = &c, .idx = i};
		th[i] = spawn(circle_thread, &c.t[i]);
	}
	for (unsigned i = 0; i < n; i++)
		join(th[i]);

	uint64_t retired = 0, forwarded = 0;
	for (unsigned i = 0; i < n; i++) {
		ck_assert_msg(c.t[i].errors == 0, "thread %u saw %llu bad stamps", i,
			      (unsigned long long)c.t[i].errors);
		ck_assert_int_eq(c.t[i].end_rc, -EPIPE);
		retired += c.t[i].retired;
		forwarded += c.t[i].forwarded;
	}
	uint64_t ntok = (uint64_t)n * TOKENS_PER_THREAD;
	ck_assert_uint_eq(retired, ntok);
	ck_assert_uint_eq(atomic_load(&c.retired), ntok);
	/* every token made exactly `hops` hops: hops-1 forwards each after the first push */
	ck_assert_uint_eq(forwarded, ntok * (hops - 1));
	for (unsigned i = 0; i < ntok; i++) {
		ck_assert_uint_eq(c.tokens[i].hops, hops);
		/* it retires at the thread `hops` steps after its first owner */
		ck_assert_uint_eq(c.tokens[i].retired_by, (i / TOKENS_PER_THREAD + hops) % n);
	}
	for (unsigned i = 0; i < n; i++) {
		ck_assert_uint_eq(mbp__ring_count(c.rings[i]), 0);
		mbp__ring_destroy(c.rings[i]);
	}
	pthread_barrier_destroy(&c.go);
	free(th);
	free(c.t);
	free(c.tokens);
	free(c.rings);
}

static const struct mbp__wait_opts small_budget = {.spin_ns = 2000, .yield_ns = 20000, .no_spin = false};
static const struct mbp__wait_opts oversubscribed = {.spin_ns = 2000, .yield_ns = 20000, .no_spin = true};

START_TEST(eight_threads_in_a_ring_of_rings_lose_no_token)
{
	run_circle(8, &small_budget, mbp_iters(50000, 5000));
}
END_TEST

START_TEST(sixteen_threads_with_no_spin_lose_no_token)
{
	run_circle(16, &oversubscribed, mbp_iters(20000, 2000));
}
END_TEST

START_TEST(eight_threads_parking_at_once_lose_no_token)
{
	run_circle(8, &park_now, mbp_iters(20000, 2000));
}
END_TEST

/* ----------------------------------------------------------------------------------------------------- */

static Suite *suite(void)
{
	Suite *s = suite_create("ring");
	int nstarts = (int)MBP_ARRAY_SIZE(starts);

	TCase *tc = tcase_create("single_thread");
	tcase_add_test(tc, new_rejects_capacities_that_are_not_powers_of_two_in_range);
	tcase_add_test(tc, new_lays_out_the_ring_on_separate_cache_lines);
	tcase_add_test(tc, a_large_ring_commits_no_memory_until_its_slots_are_used);
	tcase_add_loop_test(tc, empty_ring_pops_nothing_and_does_not_block_with_timeout_zero, 0, nstarts);
	tcase_add_loop_test(tc, full_ring_refuses_push_until_a_pop_frees_a_slot, 0, nstarts);
	tcase_add_loop_test(tc, indices_wrap_past_uint32_max_keeping_order_and_count, 0, nstarts);
	tcase_add_loop_test(tc, bursts_move_what_fits_when_nearly_full_or_nearly_empty, 0, nstarts);
	tcase_add_loop_test(tc, close_lets_the_consumer_drain_then_reports_end_of_stream, 0, nstarts);
	tcase_add_loop_test(tc, close_of_an_empty_ring_ends_a_blocking_pop_at_once, 0, nstarts);
	tcase_add_loop_test(tc, closing_again_never_reopens_the_ring_at_any_fill_level, 0, nstarts);
	suite_add_tcase(s, tc);

	tc = tcase_create("timeouts");
	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, blocking_pop_times_out_on_an_empty_ring, 0,
			    (int)MBP_ARRAY_SIZE(timeout_opts));
	tcase_add_loop_test(tc, blocking_push_times_out_on_a_full_ring, 0, (int)MBP_ARRAY_SIZE(timeout_opts));
	tcase_add_test(tc, wait_runs_the_idle_hook_with_its_own_argument_before_parking);
	tcase_add_test(tc, backoff_spins_then_yields_for_their_budgets_then_parks);
	tcase_add_test(tc, no_spin_skips_the_spin_step);
	suite_add_tcase(s, tc);

	tc = tcase_create("two_threads");
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, two_threads_pass_ten_million_stamped_items_in_order, 0, STREAM_MODES);
	suite_add_tcase(s, tc);

	tc = tcase_create("parking");
	tcase_set_timeout(tc, 60);
	/* bit 0: both threads on one CPU; bit 1: tiny budgets instead of none; bit 2: fallback fences */
	tcase_add_loop_test(tc, both_sides_park_on_a_tiny_ring_and_lose_no_wakeup, 0, 8);
	tcase_add_loop_test(tc, close_wakes_a_consumer_parked_on_an_empty_ring, 0, 2);
	tcase_add_loop_test(tc, close_wakes_a_producer_parked_on_a_full_ring, 0, 2);
	tcase_add_loop_test(tc, pop_wakes_a_producer_parked_on_a_full_ring, 0, 2);
	tcase_add_loop_test(tc, an_abort_word_ends_a_parked_wait_with_ecanceled, 0, 2);
	tcase_add_test(tc, close_right_after_the_last_push_loses_no_item);
	tcase_add_test(tc, a_close_racing_with_pushes_stops_them_once_the_producer_sees_it);
	suite_add_tcase(s, tc);

	tc = tcase_create("oversubscription");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, eight_threads_in_a_ring_of_rings_lose_no_token);
	tcase_add_test(tc, sixteen_threads_with_no_spin_lose_no_token);
	tcase_add_test(tc, eight_threads_parking_at_once_lose_no_token);
	suite_add_tcase(s, tc);
	return s;
}
