/*
 * mbp_pool: fixed-size, aligned buffers that are recycled most-recently-released first.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * Each thread that gets and puts buffers often owns an mbp_pool_cache, a small LIFO stack: a buffer it
 * releases is the next one it gets, still hot in its cache. Caches refill from and flush to the central
 * depot in batches; the depot is the one multi-party structure (multi-producer, multi-consumer) and is
 * guarded by a mutex that the hot path takes once per batch. Memory comes from a dedicated jemalloc arena
 * (the libc allocator in sanitizer builds), grows lazily up to a bound in buffers and in bytes, and is
 * returned only when the pool is destroyed. Nothing is allocated in steady state.
 *
 * Exhaustion and idle owners: a getter that finds the pool at its bound waits for a release. While a getter
 * waits, releases bypass caches and go to the depot, taking the releasing cache's content with them. A
 * thread that owns a cache must call mbp_pool_cache_flush() before it goes idle (blocks on anything else),
 * or the buffers in its cache stay out of reach of a waiting getter.
 *
 * Checks (always on): releasing a pointer that is not a held buffer of this pool (a foreign pointer, a
 * double release) prints a message and aborts. Debug builds (--enable-debug) also poison a released payload
 * and abort at the next get of that buffer if it was written after its release; AddressSanitizer builds
 * make a released payload unaddressable.
 *
 * Thread safety:
 *   operation                          | concurrency
 *   mbp_pool_get/put with a cache      | only the cache's owner thread, one at a time
 *   mbp_pool_get/put with cache NULL   | any thread, concurrently (goes to the depot)
 *   mbp_pool_cache_new, _stats_get     | any thread
 *   mbp_pool_cache_destroy, _flush     | the cache's owner thread
 *   mbp_pool_destroy                   | one thread, once nothing else uses the pool
 * A buffer may be got on one thread and put on another, through the releasing thread's cache or with cache
 * NULL. A cache serves one thread at a time; its ownership may pass to another thread with a
 * happens-before edge (the old owner joined, or a hand-off through a lock).
 */
#ifndef MBPIPE_POOL_H
#define MBPIPE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbp_pool mbp_pool;
typedef struct mbp_pool_cache mbp_pool_cache;

/** Options of a pool. A zeroed struct with buf_bytes set is complete: every other field's 0 is its
 * default. */
typedef struct mbp_pool_opts {
	size_t buf_bytes;     /**< payload bytes of every buffer (required, > 0) */
	size_t align;	      /**< payload alignment, a power of two >= 64; 0: 64 */
	uint32_t max_buffers; /**< bound in buffers; 0: 1024 */
	size_t max_bytes;     /**< bound in bytes of payloads (rounded up to the alignment) and headers;
				   0: 1 GiB */
	uint32_t cache_size;  /**< buffers a per-thread cache holds; 0: 8 */
	bool huge_pages;      /**< buffers of 2 MiB or more: align payloads to 2 MiB, round their size up to
				   a multiple of it and madvise(MADV_HUGEPAGE) them (advice: without THP the
				   pool still works, on 4 KiB pages); ignored for smaller buffers */
} mbp_pool_opts;

typedef struct mbp_pool_stats {
	uint64_t gets;	      /**< successful gets */
	uint64_t puts;	      /**< releases */
	uint64_t cache_hits;  /**< gets served by the caller's cache */
	uint64_t refills;     /**< batches moved from the depot to a cache */
	uint64_t flushes;     /**< batches moved from a cache to the depot */
	uint64_t grows;	      /**< buffers allocated (the pool grows only when the depot is empty) */
	uint64_t waits;	      /**< gets that had to wait for a release */
	uint64_t in_use;      /**< buffers held by callers now: gets - puts (not those sitting in caches) */
	uint64_t high_water;  /**< most buffers held by callers at once, as sampled at every get that goes
				   to the depot and every stats read: a peak reached and left between two
				   samples (gets from a cache) can be missed, by at most cache_size per cache */
	uint64_t allocated;   /**< buffers allocated now (the pool never shrinks) */
	uint64_t bytes;	      /**< bytes allocated now, headers included (what max_bytes bounds) */
	uint64_t max_buffers; /**< the effective bound in buffers: min(max_buffers, what max_bytes holds) */
} mbp_pool_stats;
/* While other threads run, counters are read one after another, not at one instant: in_use and
 * high_water are then approximate (in_use is clamped to [0, allocated]); they are exact when the pool is
 * quiet, and always for a pool that no cache uses (every get and put without a cache is counted under
 * the depot's lock). */

/** Fill `o` with the defaults above, what a zeroed struct means (buf_bytes 0: the caller must set it). */
void mbp_pool_opts_init(mbp_pool_opts *o);

/**
 * Create a pool.
 *
 * Pair with mbp_pool_destroy(). Allocates no buffer yet; reserves address space for the headers of the
 * effective bound in buffers (128 bytes each, touched only as the pool grows).
 *
 * @return 0, -EINVAL (NULL, buf_bytes 0, alignment not a power of two or below 64, max_bytes too small
 *         for one buffer), -EOVERFLOW (sizes overflow), -ENOMEM (or the header reservation failed).
 */
int mbp_pool_new(mbp_pool **pool, const mbp_pool_opts *o);

/**
 * Destroy a pool and return its memory.
 *
 * Accepts NULL. Destroys the caches that are still registered (their owners must have stopped); buffers in
 * those caches count as released.
 *
 * @return 0, or -EBUSY when buffers are still held by callers: then nothing is freed, the pool stays valid
 *         and the call can be repeated once they are released (mbp_pool_stats_get() tells how many).
 */
int mbp_pool_destroy(mbp_pool *pool);

/**
 * Create a per-thread cache. Pair with mbp_pool_cache_destroy().
 * @return 0, -EINVAL, -ENOMEM.
 */
int mbp_pool_cache_new(mbp_pool *pool, mbp_pool_cache **cache);

/** Flush the cache to the depot and destroy it. Accepts NULL. Owner thread only. */
void mbp_pool_cache_destroy(mbp_pool_cache *cache);

/** Move every buffer of the cache to the depot (an owner about to go idle). Owner thread only. */
void mbp_pool_cache_flush(mbp_pool_cache *cache);

/**
 * Get a buffer.
 *
 * Served from `cache` (most recently released first) when it has one, else from the depot, else by growing
 * the pool; when the pool is at its bound, waits for a release.
 *
 * @param cache      the calling thread's cache, or NULL to go to the depot directly
 * @param timeout_ns 0: do not wait; < 0: wait without limit; > 0: wait at most this long
 * @return 0 with *mb set (data and capacity as allocated, stage UINT32_MAX, every other field 0 or NULL),
 *         -EAGAIN (exhausted and timeout 0), -ETIMEDOUT, -ENOMEM (the allocator failed), -EINVAL (NULL
 *         pool or mb, a cache of another pool).
 */
int mbp_pool_get(mbp_pool *pool, mbp_pool_cache *cache, mbp_mb **mb, int64_t timeout_ns);

/**
 * Release a buffer into `cache` (or the depot when NULL). Cannot fail; aborts with a message on a double
 * release or a pointer that did not come from this pool (data corruption otherwise).
 */
void mbp_pool_put(mbp_pool *pool, mbp_pool_cache *cache, mbp_mb *mb);

/** Statistics, readable at any time from any thread (takes the depot lock briefly). */
void mbp_pool_stats_get(mbp_pool *pool, mbp_pool_stats *st);

/** Payload bytes of every buffer. */
size_t mbp_pool_buf_bytes(const mbp_pool *pool);

#ifdef __cplusplus
}
#endif
#endif
