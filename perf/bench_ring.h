/*
 * bench_ring: the interface between the C driver (bench_ring.c: mbpipe's ring and ck_ring, threads, timing,
 * the table) and the C++ peers (bench_ring_peers.cc: boost::lockfree::spsc_queue and moodycamel's queues).
 * mbpipe's ring.h uses C11 _Atomic, which C++ does not compile, hence two files.
 *
 * Every implementation runs the same loops, written once here as always-inline functions that take the
 * queue's push and pop as function pointers: each caller passes constants, so the compiler inlines the
 * queue's own fast path into a loop specialised for it (C and C++ alike, same -O2).
 *
 * Items are stamped pointers 1, 2, 3, ...: the consumer checks each one is the next expected.
 */
#ifndef MBP_BENCH_RING_H
#define MBP_BENCH_RING_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#ifdef __cplusplus
extern "C" {
#endif

#define BENCH_BURST_MAX 32

/* Push or pop up to n items without blocking (or blocking, for the waiting forms); return how many moved. */
typedef unsigned (*bench_push_fn)(void *q, void *const *items, unsigned n);
typedef unsigned (*bench_pop_fn)(void *q, void **items, unsigned n);

/* One implementation under test. Each function runs a whole loop on the calling thread. */
struct bench_impl {
	const char *name;
	const char *what; /* one line for the table's legend */
	unsigned burst;	  /* items per push/pop call in the throughput test */
	bool blocking;	  /* uses the library's own waiting, not the caller's spin */
	void *(*create)(unsigned capacity);
	void (*destroy)(void *q);
	/* producer: push items 1..n; consumer: pop n items, return how many were not the next expected */
	void (*produce)(void *q, uint64_t n);
	uint64_t (*consume)(void *q, uint64_t n);
	/* ping-pong over rings a (lead -> echo) and b (echo -> lead); lead returns the mismatches. NULL when
	 * the row has no latency test (bursts). */
	uint64_t (*lead)(void *a, void *b, uint64_t n);
	void (*echo)(void *a, void *b, uint64_t n);
};

/* The C++ peers, defined in bench_ring_peers.cc. */
extern const struct bench_impl bench_boost, bench_boost_b32, bench_rwq, bench_rwcb_wait;

#define BENCH_INLINE static inline __attribute__((always_inline))

BENCH_INLINE void bench_relax(void)
{
	__builtin_ia32_pause();
}

static inline void *bench_stamp(uint64_t i)
{
	return (void *)(uintptr_t)i;
}

BENCH_INLINE void bench_produce(void *q, uint64_t n, unsigned burst, bench_push_fn push)
{
	void *buf[BENCH_BURST_MAX];
	uint64_t next = 1;
	while (next <= n) {
		/* burst is a constant in each caller: for 1 the queue's push sees a constant n of 1 */
		unsigned want = burst == 1 ? 1 : (n - next + 1 < burst ? (unsigned)(n - next + 1) : burst);
		for (unsigned k = 0; k < want; k++)
			buf[k] = bench_stamp(next + k);
		unsigned got = push(q, buf, want);
		if (got) {
			next += got;
			/* a partial burst: the rest is re-stamped and retried */
		} else {
			bench_relax();
		}
	}
}

/*
 * The consumer's clock, read once every BENCH_CHUNK items: the rate of each chunk goes to bench_chunks (the
 * driver's, one consumer at a time). On this shared 2-CPU machine a run's overall rate is mostly how long
 * the scheduler kept one of the two spinning threads off its CPU; a chunk that ran with both on theirs
 * gives the queue's own rate, so the driver also reports the median chunk.
 */
#define BENCH_CHUNK	 8192u
#define BENCH_MAX_CHUNKS 16384u
extern double bench_chunks[BENCH_MAX_CHUNKS];
extern unsigned bench_nchunks;

static inline uint64_t bench_clock_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline void bench_chunk_done(uint64_t *t)
{
	uint64_t now = bench_clock_ns();
	if (bench_nchunks < BENCH_MAX_CHUNKS)
		bench_chunks[bench_nchunks++] = (double)BENCH_CHUNK / ((double)(now - *t) / 1e9) / 1e6;
	*t = now;
}

BENCH_INLINE uint64_t bench_consume(void *q, uint64_t n, unsigned burst, bench_pop_fn pop)
{
	void *buf[BENCH_BURST_MAX];
	uint64_t next = 1, bad = 0, t = bench_clock_ns(), chunk_end = BENCH_CHUNK;
	while (next <= n) {
		if (next > chunk_end) {
			bench_chunk_done(&t);
			chunk_end += BENCH_CHUNK;
		}
		unsigned got = pop(q, buf, burst);
		if (!got) {
			bench_relax();
			continue;
		}
		for (unsigned k = 0; k < got; k++)
			bad += buf[k] != bench_stamp(next + k);
		next += got;
	}
	return bad + (next != n + 1);
}

BENCH_INLINE uint64_t bench_lead(void *a, void *b, uint64_t n, bench_push_fn push, bench_pop_fn pop)
{
	uint64_t bad = 0;
	for (uint64_t i = 1; i <= n; i++) {
		void *item = bench_stamp(i), *back = 0;
		while (!push(a, &item, 1))
			bench_relax();
		while (!pop(b, &back, 1))
			bench_relax();
		bad += back != item;
	}
	return bad;
}

BENCH_INLINE void bench_echo(void *a, void *b, uint64_t n, bench_push_fn push, bench_pop_fn pop)
{
	for (uint64_t i = 1; i <= n; i++) {
		void *item = 0;
		while (!pop(a, &item, 1))
			bench_relax();
		while (!push(b, &item, 1))
			bench_relax();
	}
}

/* Defines the four loop functions of one implementation from its push and pop. BURST is a constant, so
 * the single-item loops lose their inner loops. */
#define BENCH_LOOPS(prefix, BURST, push, pop)                                                                \
	static __attribute__((unused)) void prefix##_produce(void *q, uint64_t n)                            \
	{                                                                                                    \
		bench_produce(q, n, BURST, push);                                                            \
	}                                                                                                    \
	static __attribute__((unused)) uint64_t prefix##_consume(void *q, uint64_t n)                        \
	{                                                                                                    \
		return bench_consume(q, n, BURST, pop);                                                      \
	}                                                                                                    \
	static __attribute__((unused)) uint64_t prefix##_lead(void *a, void *b, uint64_t n)                  \
	{                                                                                                    \
		return bench_lead(a, b, n, push, pop);                                                       \
	}                                                                                                    \
	static __attribute__((unused)) void prefix##_echo(void *a, void *b, uint64_t n)                      \
	{                                                                                                    \
		bench_echo(a, b, n, push, pop);                                                              \
	}

#ifdef __cplusplus
}
#endif

#endif
