/*
 * Tests of mbp_pool: waits and wake-ups on an exhausted pool, timeouts, buffers crossing threads, LIFO
 * recycling, conservation at destroy, the bounds, alignment, argument checks, the always-on abort checks,
 * debug poisoning, no allocation in steady state (jemalloc builds) and a stamped multi-thread stress.
 *
 * The abort tests expect SIGABRT in Check's forked child: run them with fork mode on (the default).
 */
#include "config.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef MBP_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include <mbpipe.h>

#include "check_main.h"
#include "pool_internal.h" /* mbp__pool_trust: the engine's own pools */

/* ---------------------------------------------------------------------------------------------------- */
/* Helpers */

/* For loops that measure or stress: a passing ck_assert records its line through a pipe to the runner
 * (a system call and an allocation), which would both distort the test and show up in jemalloc's
 * counters. This one costs nothing unless it fails. */
#define HOT_ASSERT(expr)                                                                                     \
	do {                                                                                                 \
		if (__builtin_expect(!(expr), 0))                                                            \
			ck_abort_msg("assertion '%s' failed", #expr);                                        \
	} while (0)

static mbp_pool *pool_make(size_t buf_bytes, uint32_t max_buffers, uint32_t cache_size)
{
	mbp_pool_opts o;
	mbp_pool_opts_init(&o);
	o.buf_bytes = buf_bytes;
	o.max_buffers = max_buffers;
	o.cache_size = cache_size;
	mbp_pool *p = NULL;
	int rc = mbp_pool_new(&p, &o);
	ck_assert_msg(rc == 0, "mbp_pool_new: %s", mbp_strerror(rc));
	return p;
}

static mbp_pool_cache *cache_make(mbp_pool *p)
{
	mbp_pool_cache *c = NULL;
	ck_assert_int_eq(mbp_pool_cache_new(p, &c), 0);
	return c;
}

static mbp_mb *get_now(mbp_pool *p, mbp_pool_cache *c)
{
	mbp_mb *mb = NULL;
	int rc = mbp_pool_get(p, c, &mb, 0);
	ck_assert_msg(rc == 0, "mbp_pool_get: %s", mbp_strerror(rc));
	ck_assert_ptr_nonnull(mb);
	return mb;
}

static mbp_pool_stats stats_of(mbp_pool *p)
{
	mbp_pool_stats st;
	mbp_pool_stats_get(p, &st);
	return st;
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

/* Wait until the pool has counted `n` waits: a getter counts its wait and registers as a waiter in one
 * critical section of the depot lock, which stats also take, so it is then asleep or about to be. */
static void wait_for_waits(mbp_pool *p, uint64_t n)
{
	for (int i = 0; i < 10000 && stats_of(p).waits < n; i++)
		sleep_ms(1);
	ck_assert_uint_eq(stats_of(p).waits, n);
}

static void assert_quiet_and_destroy(mbp_pool *p)
{
	mbp_pool_stats st = stats_of(p);
	ck_assert_uint_eq(st.gets, st.puts);
	ck_assert_uint_eq(st.in_use, 0);
	ck_assert_uint_le(st.allocated, st.max_buffers);
	ck_assert_int_eq(mbp_pool_destroy(p), 0);
}

/* A getter on its own thread: with its own cache or none, with a timeout. */
struct getter {
	mbp_pool *pool;
	bool with_cache;
	int64_t timeout_ns;
	int rc;
	mbp_mb *got;
	mbp_pool_cache *cache; /* destroyed by the getter before it exits */
};

static void *getter_main(void *arg)
{
	struct getter *g = arg;
	if (g->with_cache)
		ck_assert_int_eq(mbp_pool_cache_new(g->pool, &g->cache), 0);
	g->rc = mbp_pool_get(g->pool, g->cache, &g->got, g->timeout_ns);
	mbp_pool_cache_destroy(g->cache);
	g->cache = NULL;
	return NULL;
}

static void getter_start(pthread_t *t, struct getter *g, mbp_pool *p, bool with_cache, int64_t timeout_ns)
{
	*g = (struct getter){.pool = p, .with_cache = with_cache, .timeout_ns = timeout_ns, .rc = 1};
	ck_assert_int_eq(pthread_create(t, NULL, getter_main, g), 0);
}

/* Start a getter on an exhausted pool and return once it waits. */
static void getter_start_blocked(pthread_t *t, struct getter *g, mbp_pool *p, bool with_cache,
				 int64_t timeout_ns)
{
	uint64_t waits = stats_of(p).waits;
	getter_start(t, g, p, with_cache, timeout_ns);
	wait_for_waits(p, waits + 1);
}

/* Join a getter and return what it got, which it must have got. */
static mbp_mb *getter_join(pthread_t t, struct getter *g)
{
	pthread_join(t, NULL);
	ck_assert_msg(g->rc == 0, "getter: %s", mbp_strerror(g->rc));
	return g->got;
}

/* Single-producer single-consumer queue of buffers for the cross-thread tests. */
#define QCAP 64u
struct spsc {
	_Alignas(64) _Atomic size_t head; /* written by the consumer */
	_Alignas(64) _Atomic size_t tail; /* written by the producer */
	_Alignas(64) mbp_mb *slot[QCAP];
};

static bool spsc_push(struct spsc *q, mbp_mb *mb)
{
	size_t t = atomic_load_explicit(&q->tail, memory_order_relaxed); /* only the producer writes tail */
	/* acquire: pairs with the consumer's release of head, after it read the slot we overwrite */
	if (t - atomic_load_explicit(&q->head, memory_order_acquire) == QCAP)
		return false;
	q->slot[t % QCAP] = mb;
	/* release: pairs with the consumer's acquire of tail, publishes the slot and the buffer's content */
	atomic_store_explicit(&q->tail, t + 1, memory_order_release);
	return true;
}

static mbp_mb *spsc_pop(struct spsc *q)
{
	size_t h = atomic_load_explicit(&q->head, memory_order_relaxed); /* only the consumer writes head */
	/* acquire: pairs with the producer's release of tail */
	if (h == atomic_load_explicit(&q->tail, memory_order_acquire))
		return NULL;
	mbp_mb *mb = q->slot[h % QCAP];
	/* release: pairs with the producer's acquire of head: the slot may be reused */
	atomic_store_explicit(&q->head, h + 1, memory_order_release);
	return mb;
}

/* ---------------------------------------------------------------------------------------------------- */
/* Exhaustion, waits and wake-ups */

START_TEST(blocked_getter_is_woken_by_release_without_cache)
{
	mbp_pool *p = pool_make(4096, 2, 4);
	mbp_mb *a = get_now(p, NULL), *b = get_now(p, NULL);
	pthread_t t;
	struct getter g;
	getter_start_blocked(&t, &g, p, false, -1);
	mbp_pool_put(p, NULL, a);
	ck_assert_ptr_eq(getter_join(t, &g), a);
	mbp_pool_put(p, NULL, g.got);
	mbp_pool_put(p, NULL, b);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(blocked_getter_with_cache_is_woken_by_release_into_a_cache)
{
	mbp_pool *p = pool_make(4096, 2, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *b = get_now(p, c);
	pthread_t t;
	struct getter g;
	getter_start_blocked(&t, &g, p, true, 10 * 1000000000LL);
	/* the release sees the waiter and bypasses c: it must not strand the buffer in c */
	mbp_pool_put(p, c, a);
	ck_assert_ptr_eq(getter_join(t, &g), a);
	mbp_pool_put(p, c, g.got);
	mbp_pool_put(p, c, b);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(flush_of_an_idle_cache_wakes_a_blocked_getter)
{
	mbp_pool *p = pool_make(4096, 2, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *b = get_now(p, c);
	mbp_pool_put(p, c, a); /* no waiter yet: a stays in c, out of the depot's reach */
	pthread_t t;
	struct getter g;
	getter_start_blocked(&t, &g, p, false, -1);
	sleep_ms(20);
	ck_assert_int_eq(g.rc, 1); /* still waiting: a is stranded in c until its owner flushes */
	mbp_pool_cache_flush(c);   /* the owner goes idle */
	ck_assert_ptr_eq(getter_join(t, &g), a);
	mbp_pool_put(p, NULL, g.got);
	mbp_pool_put(p, c, b);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(release_during_a_wait_moves_the_whole_cache_to_the_depot)
{
	mbp_pool *p = pool_make(4096, 3, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *b = get_now(p, c), *d = get_now(p, c);
	mbp_pool_put(p, c, a); /* stays in c */
	pthread_t t;
	struct getter g;
	getter_start_blocked(&t, &g, p, false, -1);
	mbp_pool_put(p, c, b);
	getter_join(t, &g);
	ck_assert(g.got == a || g.got == b);
	/* the other one went to the depot with it: a get without cache finds it at once */
	mbp_mb *other = get_now(p, NULL);
	ck_assert(other == (g.got == a ? b : a));
	mbp_pool_put(p, NULL, other);
	mbp_pool_put(p, NULL, g.got);
	mbp_pool_put(p, c, d);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(exhausted_get_returns_eagain_or_times_out)
{
	mbp_pool *p = pool_make(4096, 1, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *x = NULL;
	ck_assert_int_eq(mbp_pool_get(p, c, &x, 0), -EAGAIN);
	ck_assert_int_eq(mbp_pool_get(p, NULL, &x, 0), -EAGAIN);
	ck_assert_uint_eq(stats_of(p).waits, 0); /* timeout 0 never waits */
	const int64_t timeout = 20 * 1000000LL;
	for (int with_cache = 0; with_cache < 2; with_cache++) {
		struct timespec t0, t1;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ck_assert_int_eq(mbp_pool_get(p, with_cache ? c : NULL, &x, timeout), -ETIMEDOUT);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		int64_t waited = (t1.tv_sec - t0.tv_sec) * 1000000000LL + (t1.tv_nsec - t0.tv_nsec);
		ck_assert_int_ge(waited, timeout); /* a timed wait is not cut short */
	}
	ck_assert_ptr_null(x);
	ck_assert_uint_eq(stats_of(p).waits, 2);
	mbp_pool_put(p, c, a);
	ck_assert_ptr_eq(get_now(p, c), a); /* usable again */
	mbp_pool_put(p, c, a);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------- */
/* Buffers crossing threads */

START_TEST(buffer_got_on_one_thread_is_released_on_another)
{
	mbp_pool *p = pool_make(4096, 8, 4);
	mbp_pool_cache *mine = cache_make(p);
	pthread_t t;
	struct getter g;

	/* through its own cache, released through mine: mine hands it out next */
	getter_start(&t, &g, p, true, 0);
	getter_join(t, &g);
	mbp_pool_put(p, mine, g.got);
	ck_assert_uint_eq(stats_of(p).in_use, 0);
	ck_assert_ptr_eq(get_now(p, mine), g.got);
	mbp_pool_put(p, mine, g.got);

	/* without cache, released through mine */
	getter_start(&t, &g, p, false, 0);
	getter_join(t, &g);
	mbp_pool_put(p, mine, g.got);
	ck_assert_uint_eq(stats_of(p).in_use, 0);

	/* through its own cache, released without cache: the depot hands it out next */
	mbp_pool_cache_flush(mine);
	getter_start(&t, &g, p, true, 0);
	getter_join(t, &g);
	mbp_pool_put(p, NULL, g.got);
	ck_assert_uint_eq(stats_of(p).in_use, 0);
	ck_assert_ptr_eq(get_now(p, NULL), g.got);
	mbp_pool_put(p, NULL, g.got);

	mbp_pool_cache_destroy(mine);
	assert_quiet_and_destroy(p);
}
END_TEST

/* A cache whose ownership passes to the releasing thread (the getter thread is joined first). */
struct cache_getter {
	mbp_pool *pool;
	mbp_pool_cache *cache;
	mbp_mb *got;
};

static void *cache_getter_main(void *arg)
{
	struct cache_getter *g = arg;
	ck_assert_int_eq(mbp_pool_cache_new(g->pool, &g->cache), 0);
	g->got = get_now(g->pool, g->cache);
	return NULL;
}

START_TEST(buffer_is_released_into_the_getters_cache_after_ownership_passes)
{
	mbp_pool *p = pool_make(4096, 8, 4);
	struct cache_getter g = {.pool = p};
	pthread_t t;
	ck_assert_int_eq(pthread_create(&t, NULL, cache_getter_main, &g), 0);
	pthread_join(t, NULL); /* the happens-before edge that passes the cache to this thread */
	mbp_pool_put(p, g.cache, g.got);
	ck_assert_uint_eq(stats_of(p).in_use, 0);
	ck_assert_ptr_eq(get_now(p, g.cache), g.got);
	mbp_pool_put(p, g.cache, g.got);
	mbp_pool_cache_destroy(g.cache);
	assert_quiet_and_destroy(p);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------- */
/* Recycling order */

START_TEST(cache_hands_out_the_last_released_first)
{
	mbp_pool *p = pool_make(4096, 8, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *b = get_now(p, c);
	ck_assert_ptr_ne(a, b);
	uint64_t hits = stats_of(p).cache_hits;
	mbp_pool_put(p, c, a);
	mbp_pool_put(p, c, b);
	ck_assert_ptr_eq(get_now(p, c), b);
	ck_assert_ptr_eq(get_now(p, c), a);
	ck_assert_uint_eq(stats_of(p).cache_hits, hits + 2);
	mbp_pool_put(p, c, b);
	mbp_pool_put(p, c, a);
	ck_assert_ptr_eq(get_now(p, c), a);
	ck_assert_ptr_eq(get_now(p, c), b);
	mbp_pool_put(p, c, a);
	mbp_pool_put(p, c, b);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(full_cache_moves_its_coldest_half_to_the_depot)
{
	mbp_pool *p = pool_make(4096, 8, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *b[6];
	for (int i = 0; i < 6; i++)
		b[i] = get_now(p, c); /* empty cache, empty depot: six grows */
	mbp_pool_stats st = stats_of(p);
	ck_assert_uint_eq(st.grows, 6);
	ck_assert_uint_eq(st.high_water, 6);
	for (int i = 0; i < 6; i++)
		mbp_pool_put(p, c, b[i]); /* the fifth put finds the cache full: b0, b1 go to the depot */
	st = stats_of(p);
	ck_assert_uint_eq(st.flushes, 1);
	ck_assert_uint_eq(st.in_use, 0);
	for (int i = 5; i >= 2; i--)
		ck_assert_ptr_eq(get_now(p, c), b[i]);
	ck_assert_ptr_eq(get_now(p, c), b[1]); /* a refill: the most recently released of the depot */
	ck_assert_ptr_eq(get_now(p, c), b[0]); /* the rest of the refill, from the cache */
	st = stats_of(p);
	ck_assert_uint_eq(st.refills, 1);
	ck_assert_uint_eq(st.cache_hits, 5);
	ck_assert_uint_eq(st.grows, 6);
	for (int i = 0; i < 6; i++)
		mbp_pool_put(p, c, b[i]);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------- */
/* Conservation, bounds, alignment, arguments */

START_TEST(destroy_with_a_buffer_out_is_busy_and_the_pool_stays_usable)
{
	mbp_pool *p = pool_make(4096, 8, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c), *b = get_now(p, c), *d = get_now(p, NULL);
	mbp_pool_put(p, c, a);
	mbp_pool_put(p, NULL, d);
	ck_assert_int_eq(mbp_pool_destroy(p), -EBUSY);
	mbp_pool_stats st = stats_of(p);
	ck_assert_uint_eq(st.in_use, 1);
	ck_assert_uint_eq(st.gets, 3);
	ck_assert_uint_eq(st.puts, 2);
	ck_assert_uint_eq(st.high_water, 3);
	mbp_mb *e = get_now(p, c); /* still usable */
	ck_assert_ptr_eq(e, a);
	mbp_pool_put(p, c, e);
	ck_assert_int_eq(mbp_pool_destroy(p), -EBUSY);
	mbp_pool_put(p, c, b);
	st = stats_of(p);
	ck_assert_uint_eq(st.in_use, 0);
	ck_assert_uint_eq(st.gets, st.puts);
	ck_assert_uint_eq(st.allocated, 3);
	/* buffers left in a live cache count as released: destroy frees them and the cache */
	ck_assert_int_eq(mbp_pool_destroy(p), 0);
}
END_TEST

START_TEST(bound_in_buffers_limits_allocation)
{
	mbp_pool *p = pool_make(4096, 3, 2);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *b[3], *x = NULL;
	for (int i = 0; i < 3; i++)
		b[i] = get_now(p, i % 2 ? c : NULL);
	ck_assert_int_eq(mbp_pool_get(p, c, &x, 0), -EAGAIN);
	ck_assert_int_eq(mbp_pool_get(p, NULL, &x, 0), -EAGAIN);
	mbp_pool_stats st = stats_of(p);
	ck_assert_uint_eq(st.allocated, 3);
	ck_assert_uint_eq(st.grows, 3);
	ck_assert_uint_eq(st.max_buffers, 3);
	for (int i = 0; i < 3; i++)
		mbp_pool_put(p, c, b[i]);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST

START_TEST(bound_in_bytes_limits_allocation)
{
	/* learn the bytes one buffer costs (payload and header) from a probe pool */
	mbp_pool *probe = pool_make(5000, 1, 1);
	mbp_mb *x = get_now(probe, NULL);
	uint64_t per_buf = stats_of(probe).bytes;
	ck_assert_uint_ge(per_buf, 5000);
	mbp_pool_put(probe, NULL, x);
	ck_assert_int_eq(mbp_pool_destroy(probe), 0);

	mbp_pool_opts o;
	mbp_pool_opts_init(&o);
	o.buf_bytes = 5000;
	o.max_buffers = 100;
	o.max_bytes = 3 * per_buf - 1; /* room for two */
	mbp_pool *p = NULL;
	ck_assert_int_eq(mbp_pool_new(&p, &o), 0);
	ck_assert_uint_eq(stats_of(p).max_buffers, 2);
	mbp_mb *a = get_now(p, NULL), *b = get_now(p, NULL);
	ck_assert_int_eq(mbp_pool_get(p, NULL, &x, 0), -EAGAIN);
	mbp_pool_stats st = stats_of(p);
	ck_assert_uint_eq(st.allocated, 2);
	ck_assert_uint_le(st.bytes, o.max_bytes);
	mbp_pool_put(p, NULL, a);
	mbp_pool_put(p, NULL, b);
	assert_quiet_and_destroy(p);

	o.max_bytes = per_buf - 1; /* not even one */
	ck_assert_int_eq(mbp_pool_new(&p, &o), -EINVAL);
	ck_assert_ptr_null(p);
}
END_TEST

static void check_alignment(size_t buf_bytes, size_t align)
{
	mbp_pool_opts o;
	mbp_pool_opts_init(&o);
	o.buf_bytes = buf_bytes;
	o.align = align;
	o.max_buffers = 4;
	mbp_pool *p = NULL;
	ck_assert_int_eq(mbp_pool_new(&p, &o), 0);
	ck_assert_uint_eq(mbp_pool_buf_bytes(p), buf_bytes);
	mbp_mb *b[4];
	for (int i = 0; i < 4; i++) {
		b[i] = get_now(p, NULL);
		ck_assert_msg((uintptr_t)b[i]->data % align == 0, "payload %p not aligned to %zu", b[i]->data,
			      align);
		ck_assert_uint_eq(b[i]->capacity, buf_bytes);
		ck_assert_uint_eq(b[i]->rows, 0);
		ck_assert_uint_eq(b[i]->stage, UINT32_MAX);
		memset(b[i]->data, 0x5a, b[i]->capacity); /* the whole capacity is ours (ASan checks) */
	}
	for (int i = 0; i < 4; i++)
		mbp_pool_put(p, NULL, b[i]);
	assert_quiet_and_destroy(p);
}

START_TEST(payloads_are_aligned)
{
	check_alignment(1000, 64);
	check_alignment(64, 64);
	check_alignment(5000, 4096);
	check_alignment(4096, 4096);
}
END_TEST

/* Whether the mapping that holds addr carries `flag` in its VmFlags (/proc/self/smaps). */
static bool vm_has_flag(const void *addr, const char *flag)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	ck_assert_ptr_nonnull(f);
	char line[512];
	bool inside = false, found = false;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
		} else if (inside && strncmp(line, "VmFlags:", 8) == 0) {
			found = strstr(line + 8, flag) != NULL;
			break;
		}
	}
	fclose(f);
	return found;
}

START_TEST(huge_page_buffers_are_aligned_and_advised)
{
	mbp_pool_opts o;
	mbp_pool_opts_init(&o);
	o.buf_bytes = (2u << 20) + 4096; /* rounds up to two huge pages */
	o.huge_pages = true;
	o.max_buffers = 2;
	mbp_pool *p = NULL;
	ck_assert_int_eq(mbp_pool_new(&p, &o), 0);
	mbp_mb *a = get_now(p, NULL);
	ck_assert_uint_eq((uintptr_t)a->data % (2u << 20), 0);
	ck_assert_uint_eq(stats_of(p).bytes / (2u << 20), 2); /* payload rounded to 4 MiB, + header */
	if (access("/sys/kernel/mm/transparent_hugepage/enabled", F_OK) == 0) {
		ck_assert_msg(vm_has_flag(a->data, " hg"), "MADV_HUGEPAGE not applied to %p", a->data);
	}
	mbp_pool_put(p, NULL, a);
	assert_quiet_and_destroy(p);

	/* smaller buffers ignore the flag: ordinary alignment */
	o.buf_bytes = 1 << 20;
	o.align = 64;
	ck_assert_int_eq(mbp_pool_new(&p, &o), 0);
	a = get_now(p, NULL);
	ck_assert_uint_lt(stats_of(p).bytes, (2u << 20));
	mbp_pool_put(p, NULL, a);
	assert_quiet_and_destroy(p);
}
END_TEST

/* A zeroed mbp_pool_opts with its buffer size set is the defaults of mbp_pool_opts_init: 64-byte
 * alignment, 1024 buffers (then a get without waiting finds it exhausted), caches of 8 (the ninth release
 * into a full cache moves half of it to the depot). */
START_TEST(a_zeroed_opts_with_its_buffer_size_is_the_defaults)
{
	mbp_pool_opts zero = {.buf_bytes = 1000}, init;
	mbp_pool_opts_init(&init);
	init.buf_bytes = 1000;
	mbp_pool *p, *q;
	ck_assert_int_eq(mbp_pool_new(&p, &zero), 0);
	ck_assert_int_eq(mbp_pool_new(&q, &init), 0);
	ck_assert_uint_eq(stats_of(p).max_buffers, 1024);
	ck_assert_uint_eq(stats_of(p).max_buffers, stats_of(q).max_buffers);
	static mbp_mb *held[1024];
	for (unsigned i = 0; i < 1024; i++) {
		ck_assert_int_eq(mbp_pool_get(p, NULL, &held[i], 0), 0);
		ck_assert_uint_eq((uintptr_t)held[i]->data % 64, 0);
	}
	mbp_mb *one;
	ck_assert_int_eq(mbp_pool_get(p, NULL, &one, 0), -EAGAIN);
	mbp_pool_cache *c;
	ck_assert_int_eq(mbp_pool_cache_new(p, &c), 0);
	for (unsigned i = 0; i < 8; i++)
		mbp_pool_put(p, c, held[i]);
	ck_assert_uint_eq(stats_of(p).flushes, 0);
	mbp_pool_put(p, c, held[8]);
	ck_assert_uint_eq(stats_of(p).flushes, 1);
	for (unsigned i = 9; i < 1024; i++)
		mbp_pool_put(p, NULL, held[i]);
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
	assert_quiet_and_destroy(q);
}
END_TEST

START_TEST(invalid_arguments_are_rejected)
{
	mbp_pool_opts o;
	mbp_pool *p = (mbp_pool *)&o;
	mbp_pool_opts_init(&o);
	ck_assert_int_eq(mbp_pool_new(&p, &o), -EINVAL); /* buf_bytes 0 */
	ck_assert_ptr_null(p);
	ck_assert_int_eq(mbp_pool_new(NULL, &o), -EINVAL);
	ck_assert_int_eq(mbp_pool_new(&p, NULL), -EINVAL);
	const size_t bad_align[] = {1, 32, 63, 96, 4097}; /* 0 is the default, 64 */
	for (size_t i = 0; i < sizeof(bad_align) / sizeof(bad_align[0]); i++) {
		mbp_pool_opts_init(&o);
		o.buf_bytes = 4096;
		o.align = bad_align[i];
		ck_assert_int_eq(mbp_pool_new(&p, &o), -EINVAL);
	}
	mbp_pool_opts_init(&o);
	o.buf_bytes = SIZE_MAX - 10;
	ck_assert_int_eq(mbp_pool_new(&p, &o), -EOVERFLOW);
	ck_assert_ptr_null(p);

	p = pool_make(4096, 2, 2);
	mbp_pool *q = pool_make(4096, 2, 2);
	mbp_pool_cache *cq = cache_make(q), *c = NULL;
	mbp_mb *x = NULL;
	ck_assert_int_eq(mbp_pool_get(p, cq, &x, 0), -EINVAL); /* a cache of another pool */
	ck_assert_int_eq(mbp_pool_get(p, NULL, NULL, 0), -EINVAL);
	ck_assert_int_eq(mbp_pool_get(NULL, NULL, &x, 0), -EINVAL);
	ck_assert_int_eq(mbp_pool_cache_new(NULL, &c), -EINVAL);
	ck_assert_int_eq(mbp_pool_cache_new(p, NULL), -EINVAL);
	ck_assert_ptr_null(x);
	mbp_pool_cache_destroy(NULL);
	mbp_pool_cache_flush(NULL);
	ck_assert_int_eq(mbp_pool_destroy(NULL), 0);
	ck_assert_uint_eq(stats_of(p).gets, 0);
	mbp_pool_cache_destroy(cq);
	assert_quiet_and_destroy(q);
	assert_quiet_and_destroy(p);
}
END_TEST

/* ---------------------------------------------------------------------------------------------------- */
/* Always-on checks: each of these must end in abort() (SIGABRT) */

START_TEST(double_release_through_a_cache_aborts)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c);
	mbp_pool_put(p, c, a);
	mbp_pool_put(p, c, a);
}
END_TEST

START_TEST(double_release_without_cache_aborts)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_mb *a = get_now(p, NULL);
	mbp_pool_put(p, NULL, a);
	mbp_pool_put(p, NULL, a);
}
END_TEST

START_TEST(release_of_a_foreign_pointer_aborts)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_mb fake = {0};
	mbp_pool_put(p, NULL, &fake);
}
END_TEST

START_TEST(release_into_the_wrong_pool_aborts)
{
	mbp_pool *p = pool_make(4096, 4, 4), *q = pool_make(4096, 4, 4);
	mbp_mb *a = get_now(q, NULL);
	mbp_pool_put(p, NULL, a);
}
END_TEST

START_TEST(release_of_a_never_allocated_slot_aborts)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_mb *a = get_now(p, NULL);
	/* the next header in the pool's array: inside its range, but never handed out */
	mbp_mb *next = (mbp_mb *)((char *)a + ((char *)get_now(p, NULL) - (char *)a) * 2);
	mbp_pool_put(p, NULL, next);
}
END_TEST

#ifndef MBP_DEBUG
/* The engine's hop pool: a buffer that crosses to another core and is released there must leave its
 * first header line (the pool's bookkeeping) as the getter wrote it, so that the line never moves. */
START_TEST(trusted_pool_release_and_get_leave_the_bookkeeping_line_untouched)
{
	for (int trusted = 0; trusted < 2; trusted++) {
		mbp_pool *p = pool_make(4096, 4, 4);
		if (trusted)
			mbp__pool_trust(p);
		mbp_pool_cache *c = cache_make(p);
		mbp_mb *a = get_now(p, c);
		struct mbp__buf *b = mbp__buf_of(a);
		ck_assert_uint_eq((uintptr_t)a % MBP_CACHELINE, 0); /* mb has a line of its own */
		b->link[0] = a;					    /* the engine's scratch */
		unsigned char line[MBP_CACHELINE];
		memcpy(line, b, sizeof(line));
		mbp_pool_put(p, c, a);
		ck_assert_ptr_eq(get_now(p, c), a); /* LIFO: the same buffer */
		/* untrusted: put marked it free and get cleared the scratch */
		ck_assert_int_eq(memcmp(line, b, sizeof(line)) == 0, trusted);
		ck_assert_ptr_eq(a->data, b->payload); /* the public line is still reset */
		ck_assert_uint_eq(a->stage, UINT32_MAX);
		mbp_pool_put(p, c, a);
		mbp_pool_cache_destroy(c);
		assert_quiet_and_destroy(p);
	}
}
END_TEST

START_TEST(trusted_pool_still_rejects_a_foreign_pointer)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp__pool_trust(p);
	mbp_mb fake = {0};
	mbp_pool_put(p, NULL, &fake);
}
END_TEST
#endif

#if defined(MBP_DEBUG) && !defined(__SANITIZE_ADDRESS__)
START_TEST(write_after_release_is_caught_at_the_next_get)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_pool_cache *c = cache_make(p);
	mbp_mb *a = get_now(p, c);
	unsigned char *data = a->data;
	mbp_pool_put(p, c, a);
	data[1234] = 0; /* a stale user writes into the middle of the released payload */
	get_now(p, c);	/* LIFO: the same buffer, found written: abort */
}
END_TEST

START_TEST(untouched_released_buffers_pass_the_poison_check)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_pool_cache *c = cache_make(p);
	for (int i = 0; i < 100; i++) {
		mbp_mb *a = get_now(p, i % 3 ? c : NULL);
		memset(a->data, i, a->capacity);
		mbp_pool_put(p, i % 2 ? c : NULL, a);
	}
	mbp_pool_cache_destroy(c);
	assert_quiet_and_destroy(p);
}
END_TEST
#endif

#ifdef __SANITIZE_ADDRESS__
START_TEST(use_after_release_is_reported_by_asan)
{
	mbp_pool *p = pool_make(4096, 4, 4);
	mbp_mb *a = get_now(p, NULL);
	volatile unsigned char *data = a->data;
	mbp_pool_put(p, NULL, a);
	fprintf(stderr, "test_pool: an AddressSanitizer report is expected next (use after release)\n");
	data[100] = 1; /* the payload is poisoned while released: ASan reports and exits with 1 */
}
END_TEST
#endif

/* ---------------------------------------------------------------------------------------------------- */
/* No allocation in steady state: producer gets, consumer puts, jemalloc's counters unchanged. */

#ifdef MBP_HAVE_JEMALLOC
struct steady {
	mbp_pool *pool;
	struct spsc q;
	unsigned long warmup, cycles;
	pthread_barrier_t bar;
	uint64_t alloc_delta[2], dealloc_delta[2]; /* producer, consumer */
	_Atomic int failed;
};

static void jemalloc_thread_counters(uint64_t **alloc, uint64_t **dealloc)
{
	size_t sz = sizeof(*alloc);
	ck_assert_int_eq(mallctl("thread.allocatedp", alloc, &sz, NULL, 0), 0);
	sz = sizeof(*dealloc);
	ck_assert_int_eq(mallctl("thread.deallocatedp", dealloc, &sz, NULL, 0), 0);
}

/* Bytes allocated by the whole process. This thread's tcache is flushed first: objects cached there count
 * as allocated, so a flush by tcache GC between two readings would otherwise show up as a difference. */
static uint64_t jemalloc_total_allocated(void)
{
	HOT_ASSERT(mallctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0);
	uint64_t epoch = 1;
	size_t sz = sizeof(epoch);
	HOT_ASSERT(mallctl("epoch", &epoch, &sz, &epoch, sz) == 0);
	size_t allocated;
	sz = sizeof(allocated);
	HOT_ASSERT(mallctl("stats.allocated", &allocated, &sz, NULL, 0) == 0);
	return allocated;
}

static void steady_side(struct steady *s, int side, unsigned long n, mbp_pool_cache *c)
{
	bool idle = false;
	for (unsigned long i = 0; i < n;) {
		if (side == 0) {
			mbp_mb *mb;
			HOT_ASSERT(mbp_pool_get(s->pool, c, &mb, -1) == 0);
			*(volatile unsigned long *)mb->data = i;
			while (!spsc_push(&s->q, mb))
				sched_yield();
			i++;
			continue;
		}
		mbp_mb *mb = spsc_pop(&s->q);
		if (!mb) {
			if (!idle)
				mbp_pool_cache_flush(c); /* going idle: no buffer stranded here */
			idle = true;
			sched_yield();
			continue;
		}
		idle = false;
		mbp_pool_put(s->pool, c, mb);
		i++;
	}
}

static void *steady_main(void *arg, int side)
{
	struct steady *s = arg;
	uint64_t *alloc, *dealloc;
	jemalloc_thread_counters(&alloc, &dealloc);
	mbp_pool_cache *c = cache_make(s->pool);
	steady_side(s, side, s->warmup, c);
	pthread_barrier_wait(&s->bar); /* 1: warm */
	uint64_t a0 = *alloc, d0 = *dealloc;
	pthread_barrier_wait(&s->bar); /* 2: go */
	steady_side(s, side, s->cycles, c);
	s->alloc_delta[side] = *alloc - a0;
	s->dealloc_delta[side] = *dealloc - d0;
	pthread_barrier_wait(&s->bar); /* 3: measured */
	pthread_barrier_wait(&s->bar); /* 4: the main thread has read the process's total: now free */
	mbp_pool_cache_destroy(c);
	return NULL;
}

static void *steady_producer(void *arg)
{
	return steady_main(arg, 0);
}

static void *steady_consumer(void *arg)
{
	return steady_main(arg, 1);
}

START_TEST(steady_state_allocates_nothing)
{
	static struct steady s; /* large: the queue */
	memset(&s, 0, sizeof(s));
	s.pool = pool_make(4096, 64, 8);
	s.warmup = 10000;
	s.cycles = mbp_iters(100000, 10000);
	/* grow the pool to its bound first: growth is the one place the pool allocates */
	mbp_mb *all[64];
	for (int i = 0; i < 64; i++)
		all[i] = get_now(s.pool, NULL);
	for (int i = 0; i < 64; i++)
		mbp_pool_put(s.pool, NULL, all[i]);
	pthread_barrier_init(&s.bar, NULL, 3);
	pthread_t tp, tc;
	ck_assert_int_eq(pthread_create(&tp, NULL, steady_producer, &s), 0);
	ck_assert_int_eq(pthread_create(&tc, NULL, steady_consumer, &s), 0);
	pthread_barrier_wait(&s.bar); /* 1 */
	uint64_t total0 = jemalloc_total_allocated();
	uint64_t gets0 = stats_of(s.pool).gets;
	pthread_barrier_wait(&s.bar); /* 2 */
	pthread_barrier_wait(&s.bar); /* 3 */
	uint64_t total1 = jemalloc_total_allocated();
	mbp_pool_stats st = stats_of(s.pool);
	pthread_barrier_wait(&s.bar); /* 4 */
	pthread_join(tp, NULL);
	pthread_join(tc, NULL);
	pthread_barrier_destroy(&s.bar);
	ck_assert_uint_eq(st.gets - gets0, s.cycles);
	ck_assert_uint_eq(st.grows, 64);
	ck_assert_msg(s.alloc_delta[0] == 0 && s.dealloc_delta[0] == 0,
		      "producer thread: %llu bytes allocated, %llu freed during %lu cycles",
		      (unsigned long long)s.alloc_delta[0], (unsigned long long)s.dealloc_delta[0], s.cycles);
	ck_assert_msg(s.alloc_delta[1] == 0 && s.dealloc_delta[1] == 0,
		      "consumer thread: %llu bytes allocated, %llu freed during %lu cycles",
		      (unsigned long long)s.alloc_delta[1], (unsigned long long)s.dealloc_delta[1], s.cycles);
	ck_assert_uint_eq(total1, total0);
	assert_quiet_and_destroy(s.pool);
}
END_TEST
#endif

/* ---------------------------------------------------------------------------------------------------- */
/* Stress: a ring of threads, each with its own cache, passes stamped buffers to the next. */

#define RING_THREADS 4
#define RING_BUFFERS 32 /* fewer than the threads can hold in caches and queues: waits happen */

struct ring_stress {
	mbp_pool *pool;
	struct spsc q[RING_THREADS]; /* q[i]: from thread i-1 to thread i */
	unsigned long quota;
	pthread_barrier_t start;
	_Atomic uint64_t timeouts;
};

struct ring_thread {
	struct ring_stress *s;
	unsigned id;
	unsigned long received;
};

struct stamp {
	uint32_t producer;
	uint32_t check;
	uint64_t seq;
};

static unsigned char stamp_byte(uint32_t producer, uint64_t seq, size_t i)
{
	return (unsigned char)(producer * 131u + seq * 31u + i);
}

static void stamp_write(mbp_mb *mb, uint32_t producer, uint64_t seq)
{
	struct stamp st = {.producer = producer, .check = ~producer, .seq = seq};
	memcpy(mb->data, &st, sizeof(st));
	unsigned char *d = mb->data;
	for (size_t i = sizeof(st); i < mb->capacity; i++)
		d[i] = stamp_byte(producer, seq, i);
}

static void stamp_verify(const mbp_mb *mb, uint32_t producer, uint64_t seq)
{
	struct stamp st;
	memcpy(&st, mb->data, sizeof(st));
	if (st.producer != producer || st.check != ~producer || st.seq != seq)
		ck_abort_msg("expected (%u, %llu), got (%u, %llu) check %08x", producer,
			     (unsigned long long)seq, st.producer, (unsigned long long)st.seq, st.check);
	const unsigned char *d = mb->data;
	for (size_t i = sizeof(st); i < mb->capacity; i++)
		if (d[i] != stamp_byte(producer, seq, i))
			ck_abort_msg("payload byte %zu of (%u, %llu) is corrupt", i, producer,
				     (unsigned long long)seq);
}

static void *ring_thread_main(void *arg)
{
	struct ring_thread *t = arg;
	struct ring_stress *s = t->s;
	unsigned from = (t->id + RING_THREADS - 1) % RING_THREADS;
	struct spsc *in = &s->q[t->id], *out = &s->q[(t->id + 1) % RING_THREADS];
	mbp_pool_cache *c = cache_make(s->pool);
	unsigned long sent = 0;
	pthread_barrier_wait(&s->start);
	while (sent < s->quota || t->received < s->quota) {
		bool worked = false;
		mbp_mb *mb;
		while ((mb = spsc_pop(in))) {
			stamp_verify(mb, from, t->received++);
			mbp_pool_put(s->pool, c, mb);
			worked = true;
		}
		if (sent < s->quota) {
			int rc = mbp_pool_get(s->pool, c, &mb, 0);
			if (rc == -EAGAIN && worked)
				continue; /* we released some: try again before sleeping */
			/* Then wait, with a short timeout: the buffers may all sit in queues, this thread's own
			 * included, and only this loop drains it. */
			if (rc == -EAGAIN)
				rc = mbp_pool_get(s->pool, c, &mb, 1000000);
			if (rc == -ETIMEDOUT) {
				atomic_fetch_add_explicit(&s->timeouts, 1, memory_order_relaxed);
				continue;
			}
			HOT_ASSERT(rc == 0);
			stamp_write(mb, t->id, sent++);
			HOT_ASSERT(spsc_push(out, mb)); /* a queue holds every buffer of the pool */
			worked = true;
		}
		if (!worked) {
			mbp_pool_cache_flush(c); /* going idle */
			sched_yield();
		}
	}
	mbp_pool_cache_destroy(c);
	return NULL;
}

START_TEST(threads_with_caches_pass_stamped_buffers_and_conserve_them)
{
	static struct ring_stress s;
	memset(&s, 0, sizeof(s));
	s.pool = pool_make(256, RING_BUFFERS, 4);
	s.quota = mbp_iters(40000, 500);
	ck_assert_uint_ge(QCAP, RING_BUFFERS);
	pthread_barrier_init(&s.start, NULL, RING_THREADS);
	pthread_t tid[RING_THREADS];
	struct ring_thread t[RING_THREADS];
	for (unsigned i = 0; i < RING_THREADS; i++) {
		t[i] = (struct ring_thread){.s = &s, .id = i};
		ck_assert_int_eq(pthread_create(&tid[i], NULL, ring_thread_main, &t[i]), 0);
	}
	for (unsigned i = 0; i < RING_THREADS; i++)
		pthread_join(tid[i], NULL);
	pthread_barrier_destroy(&s.start);
	for (unsigned i = 0; i < RING_THREADS; i++)
		ck_assert_uint_eq(t[i].received, s.quota);
	mbp_pool_stats st = stats_of(s.pool);
	ck_assert_uint_eq(st.gets, RING_THREADS * s.quota);
	ck_assert_uint_eq(st.puts, RING_THREADS * s.quota);
	ck_assert_uint_eq(st.in_use, 0);
	ck_assert_uint_le(st.allocated, RING_BUFFERS);
	ck_assert_uint_le(st.high_water, RING_BUFFERS);
	ck_assert_uint_le(st.cache_hits + st.refills + st.grows, st.gets);
	fprintf(stderr,
		"stress: %lu per thread, cache hits %llu, refills %llu, flushes %llu, waits %llu "
		"(timed out %llu), high water %llu\n",
		s.quota, (unsigned long long)st.cache_hits, (unsigned long long)st.refills,
		(unsigned long long)st.flushes, (unsigned long long)st.waits,
		(unsigned long long)atomic_load(&s.timeouts), (unsigned long long)st.high_water);
	ck_assert_int_eq(mbp_pool_destroy(s.pool), 0);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("pool");

	TCase *tc = tcase_create("waits");
	tcase_add_test(tc, blocked_getter_is_woken_by_release_without_cache);
	tcase_add_test(tc, blocked_getter_with_cache_is_woken_by_release_into_a_cache);
	tcase_add_test(tc, flush_of_an_idle_cache_wakes_a_blocked_getter);
	tcase_add_test(tc, release_during_a_wait_moves_the_whole_cache_to_the_depot);
	tcase_add_test(tc, exhausted_get_returns_eagain_or_times_out);
	suite_add_tcase(s, tc);

	tc = tcase_create("core");
	tcase_add_test(tc, buffer_got_on_one_thread_is_released_on_another);
	tcase_add_test(tc, buffer_is_released_into_the_getters_cache_after_ownership_passes);
	tcase_add_test(tc, cache_hands_out_the_last_released_first);
	tcase_add_test(tc, full_cache_moves_its_coldest_half_to_the_depot);
	tcase_add_test(tc, destroy_with_a_buffer_out_is_busy_and_the_pool_stays_usable);
	tcase_add_test(tc, bound_in_buffers_limits_allocation);
	tcase_add_test(tc, bound_in_bytes_limits_allocation);
	tcase_add_test(tc, payloads_are_aligned);
	tcase_add_test(tc, huge_page_buffers_are_aligned_and_advised);
	tcase_add_test(tc, invalid_arguments_are_rejected);
	tcase_add_test(tc, a_zeroed_opts_with_its_buffer_size_is_the_defaults);
	suite_add_tcase(s, tc);

	tc = tcase_create("checks");
	tcase_add_test_raise_signal(tc, double_release_through_a_cache_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, double_release_without_cache_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, release_of_a_foreign_pointer_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, release_into_the_wrong_pool_aborts, SIGABRT);
	tcase_add_test_raise_signal(tc, release_of_a_never_allocated_slot_aborts, SIGABRT);
#ifndef MBP_DEBUG /* debug builds keep every check, trusted or not */
	tcase_add_test(tc, trusted_pool_release_and_get_leave_the_bookkeeping_line_untouched);
	tcase_add_test_raise_signal(tc, trusted_pool_still_rejects_a_foreign_pointer, SIGABRT);
#endif
#if defined(MBP_DEBUG) && !defined(__SANITIZE_ADDRESS__)
	tcase_add_test_raise_signal(tc, write_after_release_is_caught_at_the_next_get, SIGABRT);
	tcase_add_test(tc, untouched_released_buffers_pass_the_poison_check);
#else
	fprintf(stderr, "test_pool: write_after_release_is_caught_at_the_next_get skipped: poisoning needs "
			"--enable-debug (and ASan builds check this their own way)\n");
#endif
#ifdef __SANITIZE_ADDRESS__
	tcase_add_exit_test(tc, use_after_release_is_reported_by_asan, 1);
#endif
	suite_add_tcase(s, tc);

	tc = tcase_create("threads");
	tcase_set_timeout(tc, 60);
#ifdef MBP_HAVE_JEMALLOC
	tcase_add_test(tc, steady_state_allocates_nothing);
#else
	fprintf(stderr, "test_pool: steady_state_allocates_nothing skipped: this build uses the libc "
			"allocator (sanitizer builds), jemalloc's counters are not available\n");
#endif
	tcase_add_test(tc, threads_with_caches_pass_stamped_buffers_and_conserve_them);
	suite_add_tcase(s, tc);
	return s;
}
