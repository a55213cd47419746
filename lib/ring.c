/*
 * mbp__ring: creation, close, and the one way to wait on a ring (mbp__ring_wait_pop/_push: the
 * spin-yield-park backoff of wait.h on the side's parker, until the fast path of ring_pvt.h can proceed).
 */
#include "config.h"

#include <errno.h>

#include "ring.h"

int mbp__ring_new(struct mbp__ring **rp, uint32_t capacity, const struct mbp__wait_opts *wopts,
		  uint32_t start)
{
	if (!rp)
		return -EINVAL;
	*rp = NULL;
	if (capacity < 2 || capacity > MBP__RING_MAX_CAPACITY || !mbp__is_pow2(capacity))
		return -EINVAL;
	mbp__wait_global_init();
	/* Zeroed (every slot NULL: empty) by calloc, which leaves fresh pages of a large ring untouched
	 * where a memset would commit them all; aligned by hand, the block's start kept for destroy. */
	size_t bytes = sizeof(struct mbp__ring) + (size_t)capacity * sizeof(void *);
	void *block = calloc(1, bytes + MBP_CACHELINE);
	if (!block)
		return -ENOMEM;
	struct mbp__ring *r =
	    (struct mbp__ring *)(((uintptr_t)block + MBP_CACHELINE - 1) & ~(uintptr_t)(MBP_CACHELINE - 1));
	r->block = block;
	r->mask = capacity - 1;
	r->capacity = capacity;
	if (wopts)
		r->wopts = *wopts;
	else
		r->wopts = (struct mbp__wait_opts){.spin_ns = MBP__SPIN_NS_DEFAULT,
						   .yield_ns = MBP__YIELD_NS_DEFAULT};
	atomic_init(&r->head, start);
	atomic_init(&r->limit, start + capacity);
	atomic_init(&r->tail, start);
	r->tail_cache = start;
	*rp = r;
	return 0;
}

void mbp__ring_destroy(struct mbp__ring *r)
{
	if (r)
		free(r->block);
}

/* limit is closed: 2^31 or more past head (open: head .. head + capacity). */
static bool limit_shut(uint32_t limit, uint32_t head)
{
	return limit - head >= 1u << 31;
}

void mbp__ring_close(struct mbp__ring *r)
{
	/* First shut the producer's fast path: move limit 2^31 past where it is, unless a closer did
	 * already (twice would reopen it). With head at most limit and at least limit - capacity, the push
	 * fast path's room becomes 2^31 or more, which it never takes. The exchange fails when the producer
	 * refilled meanwhile: look again. */
	/* relaxed: the exchange below decides; the re-read after head's checks it */
	uint32_t limit = atomic_load_explicit(&r->limit, memory_order_relaxed);
	for (;;) {
		/* acquire; partner: the producer's release store of head: the limit it set before that push
		 * is visible to the re-read below, so an unchanged limit is one that head has not passed */
		uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
		uint32_t again =
		    atomic_load_explicit(&r->limit, memory_order_relaxed); /* relaxed: as above */
		if (again != limit) {
			limit = again;
			continue;
		}
		if (limit_shut(limit, head))
			break;
		/* relaxed: limit carries no data; the release store of closed below publishes the move */
		if (atomic_compare_exchange_weak_explicit(&r->limit, &limit, limit + (1u << 31),
							  memory_order_relaxed, memory_order_relaxed))
			break;
	}
	/* release; partner: the acquire load in mbp__ring_closed(). Everything pushed before the close is
	 * visible to a consumer that sees the flag, and a producer that sees it sees the shut limit: its
	 * pushes fail from then on. */
	atomic_store_explicit(&r->closed, 1, memory_order_release);
	mbp__ring_wake(r);
}

uint32_t mbp__ring_refill_sp(struct mbp__ring *r, uint32_t head)
{
	uint32_t open = r->tail_cache + r->capacity; /* the limit this thread set last */
	/* acquire; partner: the consumer's release store of tail in mbp__ring_pop_burst_sc(). After it, the
	 * slots below the new tail have been read and may be overwritten. */
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_acquire);
	if (tail != r->tail_cache) {
		r->tail_cache = tail;
		/* relaxed: limit carries no data. Failing, close() moved it: shut for good. */
		if (!atomic_compare_exchange_strong_explicit(&r->limit, &open, tail + r->capacity,
							     memory_order_relaxed, memory_order_relaxed))
			return 0;
		open = tail + r->capacity;
	} else if (atomic_load_explicit(&r->limit, memory_order_relaxed) != open) {
		return 0; /* relaxed: as above; moved, so shut */
	}
	return open - head;
}

void mbp__ring_wake(struct mbp__ring *r)
{
	mbp__parker_wake(&r->cons_park);
	mbp__parker_wake(&r->prod_park);
}

/* What a blocked side waits for: its condition, or the close. */
static bool room_or_closed(void *arg)
{
	struct mbp__ring *r = arg;
	/* acquire; partner: the consumer's release store of tail (see ring_pvt.h). relaxed head: only this
	 * thread (the producer) writes it. */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
	uint32_t used = head - atomic_load_explicit(&r->tail, memory_order_acquire);
	/* relaxed: a shut limit with the flag not yet up is a close() under way: not ready, and the close
	 * wakes this side once the flag is up */
	bool shut = limit_shut(atomic_load_explicit(&r->limit, memory_order_relaxed), head);
	return (used < r->capacity && !shut) || mbp__ring_closed(r);
}

/* Items there: the consumer's look. */
static bool has_items(const struct mbp__ring *r)
{
	/* acquire; partner: the producer's release store of head (see ring_pvt.h). relaxed tail: only this
	 * thread (the consumer) writes it. The consumer's pop may have taken items whose head store has not
	 * landed yet (it reads the slots): then tail is ahead of head, and there is nothing. */
	uint32_t head = atomic_load_explicit(&((struct mbp__ring *)r)->head, memory_order_acquire);
	return (int32_t)(head - atomic_load_explicit(&((struct mbp__ring *)r)->tail, memory_order_relaxed)) >
	       0;
}

static bool items_or_closed(void *arg)
{
	struct mbp__ring *r = arg;
	return has_items(r) || mbp__ring_closed(r);
}

int mbp__ring_wait_pop(struct mbp__ring *r, void (*idle)(void *), void *arg, uint64_t deadline)
{
	int rc = mbp__wait_for(&r->cons_park, &r->wopts, items_or_closed, r, idle, arg, deadline);
	if (rc)
		return rc;
	/* Ready: items, or closed. The close is published after the last push, so this look, after the
	 * acquire load of closed, sees every item: empty now is the end of the stream. */
	return has_items(r) ? 0 : -EPIPE;
}

int mbp__ring_wait_push(struct mbp__ring *r, void (*idle)(void *), void *arg, uint64_t deadline)
{
	int rc = mbp__wait_for(&r->prod_park, &r->wopts, room_or_closed, r, idle, arg, deadline);
	if (rc)
		return rc;
	return mbp__ring_closed(r) ? -EPIPE : 0;
}
