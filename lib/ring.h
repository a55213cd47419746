/*
 * mbp__ring: a bounded single-producer/single-consumer ring of non-NULL pointers.
 *
 * Exactly one producer thread and one consumer thread (the _sp and _sc suffixes say which side may call
 * what). Capacity is a power of two; the indices are free-running uint32_t, so count = head - tail and slot
 * = index & mask hold across the wrap at 2^32 (unsigned arithmetic is modulo 2^32 and capacity divides it).
 * The producer caches the consumer's index and re-reads the shared one only when its cached copy says
 * full; the consumer looks at the next slot itself (NULL: empty; it clears each slot it pops), so in steady
 * state neither side reads the other's line of indices. A push or pop touches its own line, the slots and
 * the read-mostly line, nothing else: the producer's cached room is a limit on its own line (head may run
 * up to it) that close() moves out of reach, so one compare covers both "full" and "closed"; each side's
 * wake check reads the peer's parker, which lives on the checking side's own line. See ring_pvt.h.
 *
 * close() may be called by either side, once or more: the producer's pushes then fail, the consumer drains
 * what is left and then sees end-of-stream (wait_pop's -EPIPE), and any parked peer is woken. The normal close is the
 * producer's ("no more items"). A consumer that closes abandons the ring: a push racing with its close may
 * still land, so it must pop again once the producer has stopped if it needs every item.
 *
 *   operation              | producer thread | consumer thread | any thread
 *   push*_sp, wait_push    |       yes       |                 |
 *   pop*_sc, wait_pop      |                 |       yes       |
 *   close, closed, count   |       yes       |       yes       |    yes
 *
 * The inline fast path is in ring_pvt.h, which is not for direct inclusion.
 */
#ifndef MBP__RING_H
#define MBP__RING_H

#include "common.h"
#include "wait.h"

struct mbp__ring {
	/* Read-mostly: written at init, and the closed flag once. */
	uint32_t mask;
	uint32_t capacity;
	_Atomic uint32_t closed;
	struct mbp__wait_opts wopts;
	void *block; /* what calloc returned (the ring starts at its first cache line) */
	char guard0[MBP_CACHELINE];

	/* Producer line: written by the producer on every push; by another thread only to close the ring
	 * (limit) or when the consumer parks (cons_park). */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t head;
	/* head may run up to limit: tail_cache + capacity while open; close() moves it 2^31 away, out of
	 * the range 1 .. capacity that the push fast path takes for room */
	_Atomic uint32_t limit;
	uint32_t tail_cache;	      /* producer's copy of tail */
	struct mbp__parker cons_park; /* consumer sleeps here when empty; the producer checks it per push */
	char guard1[MBP_CACHELINE];

	/* Consumer line: written by the consumer on every pop; by the producer only when it parks. */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t tail;
	struct mbp__parker prod_park; /* producer sleeps here when full; the consumer checks it per pop */
	char guard2[MBP_CACHELINE];

	MBP_CACHELINE_ALIGNED _Atomic(void *) slots[]; /* NULL: empty */
};

_Static_assert(offsetof(struct mbp__ring, tail) - offsetof(struct mbp__ring, head) >= 2 * MBP_CACHELINE,
	       "producer and consumer fields need a guard line between them");
_Static_assert(offsetof(struct mbp__ring, head) / MBP_CACHELINE -
		       (offsetof(struct mbp__ring, guard0) - 1) / MBP_CACHELINE >=
		   2,
	       "read-mostly line and producer line need a guard line between them");
_Static_assert(offsetof(struct mbp__ring, cons_park) / MBP_CACHELINE ==
		       offsetof(struct mbp__ring, head) / MBP_CACHELINE &&
		   offsetof(struct mbp__ring, prod_park) / MBP_CACHELINE ==
		       offsetof(struct mbp__ring, tail) / MBP_CACHELINE,
	       "each side's wake check reads its own line");

#define MBP__RING_MAX_CAPACITY (1u << 30)

/*
 * Create a ring of `capacity` slots (a power of two, 2 .. 2^30; anything else is -EINVAL). `wopts` may be
 * NULL for the default budgets. `start` is the initial index (0 normally; tests start near UINT32_MAX to
 * cross the wrap). Pair with mbp__ring_destroy().
 */
int mbp__ring_new(struct mbp__ring **rp, uint32_t capacity, const struct mbp__wait_opts *wopts,
		  uint32_t start);
void mbp__ring_destroy(struct mbp__ring *r);

/* Close the ring and wake both sides. Idempotent, any thread. */
void mbp__ring_close(struct mbp__ring *r);

/* The producer's slow path (ring_pvt.h): the cached room ran short, or close() moved the limit. Refreshes
 * the cached tail; returns the room now, 0 when full or closed. Producer only. */
uint32_t mbp__ring_refill_sp(struct mbp__ring *r, uint32_t head);

/* Wake both sides if parked, so that they re-check what they wait for: after raising the abort word of
 * the ring's wopts (the trainer's step failing). Any thread. */
void mbp__ring_wake(struct mbp__ring *r);

/*
 * The one way to wait on a ring (the worker's, and any caller's): wait with the backoff of wait.h (the
 * ring's wopts; idle(arg), if not NULL, runs before each park) until the operation can proceed, the ring
 * is closed, or the deadline (CLOCK_MONOTONIC ns; UINT64_MAX: none; a past one: just look) passes. Then
 * call the non-blocking form again: a blocking push or pop is the loop
 *     while (!mbp__ring_push_sp(r, x)) if ((rc = mbp__ring_wait_push(r, NULL, NULL, deadline))) break;
 *     while (!(n = mbp__ring_pop_burst_sc(r, v, max))) if ((rc = mbp__ring_wait_pop(r, ...))) break;
 * wait_pop (consumer): 0 (items there), -EPIPE (closed and drained: the end of the stream), -ETIMEDOUT.
 * wait_push (producer): 0 (room), -EPIPE (closed: pushes fail), -ETIMEDOUT.
 * Both: -ECANCELED when the ring's wopts name an abort word and it is raised (wait.h) while the operation
 * cannot proceed: the trainer's workers wait for an item or their step's abort this way.
 */
int mbp__ring_wait_pop(struct mbp__ring *r, void (*idle)(void *), void *arg, uint64_t deadline);
int mbp__ring_wait_push(struct mbp__ring *r, void (*idle)(void *), void *arg, uint64_t deadline);

#include "ring_pvt.h"

#endif
