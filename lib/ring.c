/*
 * mbp__ring: creation, close and the blocking forms, which wrap the inline fast path of ring_pvt.h in the
 * spin-yield-park backoff of wait.h.
 */
#include "config.h"

#include <errno.h>
#include <string.h>

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
	size_t bytes = sizeof(struct mbp__ring) + (size_t)capacity * sizeof(void *);
	struct mbp__ring *r =
	    aligned_alloc(MBP_CACHELINE, (bytes + MBP_CACHELINE - 1) & ~(size_t)(MBP_CACHELINE - 1));
	if (!r)
		return -ENOMEM;
	memset(r, 0, sizeof(*r));
	r->mask = capacity - 1;
	r->capacity = capacity;
	if (wopts)
		r->wopts = *wopts;
	else
		r->wopts = (struct mbp__wait_opts){.spin_ns = MBP__SPIN_NS_DEFAULT,
						   .yield_ns = MBP__YIELD_NS_DEFAULT};
	atomic_init(&r->head, start);
	atomic_init(&r->tail, start);
	r->tail_cache = start;
	r->head_cache = start;
	*rp = r;
	return 0;
}

void mbp__ring_destroy(struct mbp__ring *r)
{
	free(r);
}

void mbp__ring_close(struct mbp__ring *r)
{
	/* release; partner: the acquire load in mbp__ring_closed(). Everything pushed before the close is
	 * visible to a consumer that sees the flag. */
	atomic_store_explicit(&r->closed, 1, memory_order_release);
	mbp__parker_wake(&r->cons_park);
	mbp__parker_wake(&r->prod_park);
}

/* What a blocked side waits for: its condition, or the close (the caller then reports -EPIPE). */
static bool room_or_closed(void *arg)
{
	struct mbp__ring *r = arg;
	/* acquire; partner: the consumer's release store of tail (see ring_pvt.h). Relaxed head: only this
	 * thread (the producer) writes it. */
	uint32_t used = atomic_load_explicit(&r->head, memory_order_relaxed) -
			atomic_load_explicit(&r->tail, memory_order_acquire);
	return used < r->capacity || mbp__ring_closed(r);
}

static bool items_or_closed(void *arg)
{
	struct mbp__ring *r = arg;
	/* acquire; partner: the producer's release store of head (see ring_pvt.h). Relaxed tail: only this
	 * thread (the consumer) writes it. */
	uint32_t head = atomic_load_explicit(&r->head, memory_order_acquire);
	return head != atomic_load_explicit(&r->tail, memory_order_relaxed) || mbp__ring_closed(r);
}

int mbp__ring_push_wait_sp(struct mbp__ring *r, void *item, int64_t timeout_ns)
{
	uint64_t deadline = 0;
	for (;;) {
		if (mbp__ring_closed(r))
			return -EPIPE;
		if (mbp__ring_push_sp(r, item))
			return 0;
		if (mbp__ring_closed(r)) /* closed between the check above and the push */
			return -EPIPE;
		if (timeout_ns == 0)
			return -EAGAIN;
		if (deadline == 0)
			deadline = mbp__deadline(timeout_ns);
		int rc = mbp__wait_until(&r->prod_park, &r->wopts, room_or_closed, r, NULL, deadline);
		if (rc)
			return rc;
	}
}

int mbp__ring_pop_burst_wait_sc(struct mbp__ring *r, void **items, unsigned n, int64_t timeout_ns)
{
	uint64_t deadline = 0;
	if (n == 0)
		return -EINVAL; /* nothing could ever satisfy the wait: it would spin forever */
	for (;;) {
		unsigned got = mbp__ring_pop_burst_sc(r, items, n);
		if (got)
			return (int)got;
		if (mbp__ring_closed(r)) {
			/* the close was published after the last push: one more look drains it */
			got = mbp__ring_pop_burst_sc(r, items, n);
			return got ? (int)got : -EPIPE;
		}
		if (timeout_ns == 0)
			return -EAGAIN;
		if (deadline == 0)
			deadline = mbp__deadline(timeout_ns);
		int rc = mbp__wait_until(&r->cons_park, &r->wopts, items_or_closed, r, NULL, deadline);
		if (rc == -ETIMEDOUT)
			return rc;
		/* 0 or -EPIPE: loop to pop, and to drain before reporting end-of-stream */
	}
}

int mbp__ring_pop_wait_sc(struct mbp__ring *r, void **item, int64_t timeout_ns)
{
	int rc = mbp__ring_pop_burst_wait_sc(r, item, 1, timeout_ns);
	return rc > 0 ? 0 : rc;
}
