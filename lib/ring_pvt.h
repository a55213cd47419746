/*
 * Inline fast path of mbp__ring. Not for direct inclusion: include "ring.h".
 *
 * Memory ordering, one pair per direction:
 *   producer: store each slot with release                -> consumer: load the slot with acquire
 *   consumer: read and clear slots, then store tail with release
 *                                                          -> producer: load tail with acquire, write slots
 * The consumer's tail store is the producer's licence to overwrite the slots it covers. The producer still
 * stores head after its slots (release) for count() and the waits; the consumer's fast path never reads
 * it: a slot is empty when NULL (items are never NULL), as in FastForward (Giacomoni et al., PPoPP 2008),
 * so when the consumer runs right behind the producer only the slot line moves between them, not also a
 * line of indices.
 *
 * What a push pays beyond a plain ring: one compare of head against limit (the cached room and the closed
 * flag at once: close() moves limit out of the range the compare accepts), and after the head store the
 * wake check, a compiler barrier and one load of the consumer's parker word from the producer's own line
 * (wait.h: the parking side's heavy fence is the other half). A pop: clearing the slot it read, and the
 * same wake check on its line.
 */
#ifndef MBP__RING_H
#error "ring_pvt.h is not for direct inclusion; include ring.h"
#endif
#ifndef MBP__RING_PVT_H
#define MBP__RING_PVT_H

/* Push up to n items (none NULL) without waiting; returns how many moved (0 when full or closed).
 * Producer only. */
static inline unsigned mbp__ring_push_burst_sp(struct mbp__ring *r, void *const *items, unsigned n)
{
	/* relaxed: only this thread writes head */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
	/* relaxed: this thread wrote limit last, or close() moved it; a push racing with close() may still
	 * land (ring.h), and a producer that has seen the closed flag (acquire) sees the moved limit */
	uint32_t room = atomic_load_explicit(&r->limit, memory_order_relaxed) - head;
	/* open: room is 0 .. capacity; closed: 2^31 or more. The first compare takes 1 .. capacity (one
	 * compare for all when n is 1); the second, written so that it folds away then, wants n of them. */
	if (MBP_UNLIKELY(room - 1 > r->mask || room - 1 < n - 1)) {
		room = mbp__ring_refill_sp(r, head);
		if (room == 0)
			return 0;
		if (n > room)
			n = room;
	}
	/* release; partner: the consumer's acquire load of the slot in mbp__ring_pop_burst_sc() */
	for (unsigned i = 0; i < n; i++) {
		MBP_ASSERT(items[i] != NULL);
		atomic_store_explicit(&r->slots[(head + i) & r->mask], items[i], memory_order_release);
	}
	/* release; partner: the acquire loads of head in ring.c's waits and in mbp__ring_count(): the
	 * slots below it are written. The consumer's pop looks at the slots themselves. */
	atomic_store_explicit(&r->head, head + n, memory_order_release);
	mbp__parker_wake(&r->cons_park);
	return n;
}

static inline bool mbp__ring_push_sp(struct mbp__ring *r, void *item)
{
	return mbp__ring_push_burst_sp(r, &item, 1) == 1;
}

/* Pop up to n items without waiting; returns how many moved (0 when empty). Consumer only. */
static inline unsigned mbp__ring_pop_burst_sc(struct mbp__ring *r, void **items, unsigned n)
{
	/* relaxed: only this thread writes tail */
	uint32_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
	unsigned k = 0;
	for (; k < n; k++) {
		_Atomic(void *) *slot = &r->slots[(tail + k) & r->mask];
		/* acquire; partner: the producer's release store of the slot in mbp__ring_push_burst_sp():
		 * what the item points to is visible. NULL: not pushed yet (the slot line is the only line
		 * of the producer's that this reads). */
		void *item = atomic_load_explicit(slot, memory_order_acquire);
		if (!item)
			break;
		items[k] = item;
		/* relaxed: ordered before the producer's next store to the slot by the tail store below */
		atomic_store_explicit(slot, NULL, memory_order_relaxed);
	}
	if (k == 0)
		return 0;
	/* release; partner: the producer's acquire load of tail. The producer's licence to overwrite. */
	atomic_store_explicit(&r->tail, tail + k, memory_order_release);
	mbp__parker_wake(&r->prod_park);
	return k;
}

static inline bool mbp__ring_pop_sc(struct mbp__ring *r, void **item)
{
	return mbp__ring_pop_burst_sc(r, item, 1) == 1;
}

/* Items in the ring; exact for either side, a snapshot (0 .. capacity) for other threads. */
static inline uint32_t mbp__ring_count(const struct mbp__ring *r)
{
	for (;;) {
		/* acquire on tail only to keep the two loads in order (no partner needed beyond the
		 * consumer's release store of tail); relaxed on head, a statistic */
		uint32_t tail = atomic_load_explicit(&((struct mbp__ring *)r)->tail, memory_order_acquire);
		uint32_t head = atomic_load_explicit(&((struct mbp__ring *)r)->head, memory_order_relaxed);
		uint32_t used = head - tail;
		if (MBP_LIKELY(used <= r->capacity))
			return used;
		/* The consumer pops what a slot holds, so its tail may pass a head whose store has not
		 * landed yet, by one burst at most: those items are gone, 0 is left. */
		if (used >= 0u - r->capacity)
			return 0;
		/* A third thread delayed between the two loads: the consumer moved on since its tail (and
		 * the producer refilled the ring). Look again; each retry needs the consumer to move. */
	}
}

static inline bool mbp__ring_closed(const struct mbp__ring *r)
{
	/* acquire; partner: the release store in mbp__ring_close(). The consumer that sees closed and then
	 * re-reads head sees every push that preceded the close. */
	return atomic_load_explicit(&((struct mbp__ring *)r)->closed, memory_order_acquire) != 0;
}

#endif
