/*
 * Internal view of a pool buffer's header, shared by pool.c and the pipeline. Not installed.
 *
 * The headers of a pool sit in one array reserved at creation (so that "is this a buffer of this pool" is a
 * range check that never dereferences a foreign pointer); each header owns one payload allocated when the
 * pool grows. A header fills whole cache lines of its own: two buffers owned by two stages must not share a
 * line, or every header update of one stage would steal the line from the other.
 *
 * Two lines: the pool's bookkeeping, then the public mbp_mb. In a trusted pool (mbp__pool_trust) a job's
 * micro-batch crossing cores moves the second line (and its payload) only: the consumer reads mb and its
 * release writes nothing, so the first line stays in the cache of the thread that gets the buffer next
 * (a single micro-batch's consumer also reads link[0], its origin).
 */
#ifndef MBP__POOL_INTERNAL_H
#define MBP__POOL_INTERNAL_H

#include <assert.h>
#include <stdbool.h>

#include <mbpipe/mb.h>

#include "common.h"

struct mbp__buf {
	MBP_CACHELINE_ALIGNED uint32_t magic;
	uint32_t state; /* pool.c's BUF_*: held by a caller, or free in a cache or the depot */
	struct mbp_pool *pool;
	void *payload; /* the pool's own copy of mb.data: what it frees, poisons and restores at get */
	void *link[2]; /* scratch for the current owner: the pipeline's ingress link */
	uint32_t kind; /* the current owner's tag for what is in link */
	MBP_CACHELINE_ALIGNED mbp_mb mb;
};

static_assert(sizeof(struct mbp__buf) % MBP_CACHELINE == 0, "a buffer header fills whole cache lines");

static inline struct mbp__buf *mbp__buf_of(mbp_mb *mb)
{
	return mbp__container_of(mb, struct mbp__buf, mb);
}

/*
 * Mark a pool as the engine's own (its buffers never reach a caller, and the engine itself pairs every get
 * with one put): get and put then skip the header's state (double release, corrupt free list) and leave
 * link and kind as they were, so that a release does not write the buffer's first line.
 * Pointers put are still range-checked. Debug builds (--enable-debug) keep every check. Before any get.
 */
void mbp__pool_trust(struct mbp_pool *p);

/* Whether `mb` points at one of p's buffers (by address, never dereferenced; held or not). */
bool mbp__pool_owns(const struct mbp_pool *p, const mbp_mb *mb);

/*
 * Lend a caller's held buffer of `p` to the pipeline (mbp_mb_submit): 0, or -EINVAL when `mb` is not one of
 * p's buffers (checked by address, never dereferenced), or is not held by a caller (never got, released,
 * or already lent). Until mbp__pool_unlend() gives it back (its result reaches the caller), a second lend
 * fails and a put aborts. Any thread; not for trusted pools.
 */
int mbp__pool_lend(struct mbp_pool *p, mbp_mb *mb);
void mbp__pool_unlend(mbp_mb *mb);

/*
 * Publish a pool (on) or take it back: its buffers may come back without its owner's handle, through
 * mbp__pool_put_published() (mbp_mb_release(NULL, mb): a started pipeline's buffers, rank 0's results
 * across MPI ranks). mbp_pool_destroy() takes it back first. Any thread.
 */
void mbp__pool_publish(struct mbp_pool *p, bool on);
/* Give `mb` back to the published pool that owns it, as mbp_pool_put(pool, NULL, mb); false: none does. */
bool mbp__pool_put_published(mbp_mb *mb);

/*
 * Grow the pool now until it has allocated `n` buffers (at most its bound), each new one free in the depot:
 * for an owner that knows the most it will hold at once (the trainer, from its schedule), so that no get
 * allocates later, whatever the timing. Counted in grows and allocated, not in gets. 0, -ENOMEM (what was
 * allocated before the failure stays).
 */
int mbp__pool_reserve(struct mbp_pool *p, uint32_t n);

#endif
