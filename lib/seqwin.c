/*
 * mbp__seqwin: the sequenced window around a replicated stage (seqwin.h has the design).
 */
#include "config.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "seqwin.h"

int mbp__seqwin_new(struct mbp__seqwin **wp, uint32_t capacity, uint32_t producers,
		    const struct mbp__wait_opts *wopts)
{
	*wp = NULL;
	if (capacity > (1u << 30) || producers == 0)
		return -EINVAL;
	uint32_t cap = 2;
	while (cap < capacity)
		cap <<= 1;
	size_t bytes = sizeof(struct mbp__seqwin) + (size_t)cap * sizeof(struct mbp__seqwin_slot);
	struct mbp__seqwin *w =
	    aligned_alloc(MBP_CACHELINE, (bytes + MBP_CACHELINE - 1) & ~(size_t)(MBP_CACHELINE - 1));
	if (!w)
		return -ENOMEM;
	memset(w, 0, bytes);
	w->mask = cap - 1;
	w->capacity = cap;
	if (wopts)
		w->wopts = *wopts;
	else
		w->wopts = (struct mbp__wait_opts){.spin_ns = MBP__SPIN_NS_DEFAULT,
						   .yield_ns = MBP__YIELD_NS_DEFAULT};
	atomic_init(&w->producers, producers);
	for (uint32_t i = 0; i < cap; i++)
		atomic_init(&w->slots[i].stamp, i); /* free for micro-batch i */
	*wp = w;
	return 0;
}

void mbp__seqwin_destroy(struct mbp__seqwin *w)
{
	free(w);
}

/* After a store that may satisfy a waiter: wake them all if any sleeps. The caller's store was seq_cst;
 * seq_cst here too: the publisher's half of the Dekker pair with park() (seqwin.h). */
static void wake(struct mbp__seqwin *w)
{
	if (MBP_UNLIKELY(atomic_load_explicit(&w->sleepers, memory_order_seq_cst))) {
		/* release; partner: the acquire load of gen in park(): a sleeper that read the old
		 * generation either sees the new one or is woken */
		atomic_fetch_add_explicit(&w->gen, 1, memory_order_release);
		mbp__futex_wake(&w->gen, INT32_MAX);
	}
}

/* Wait until cond(w, k) with the backoff, then asleep on the generation word. */
static void wait_for(struct mbp__seqwin *w, uint32_t k, bool (*cond)(struct mbp__seqwin *, uint32_t),
		     const struct mbp__seqwin_waiter *wt)
{
	struct mbp__backoff b;
	mbp__backoff_init(&b);
	while (!cond(w, k)) {
		if (mbp__backoff_step(&b, &w->wopts) == MBP__BACKOFF_AGAIN)
			continue;
		if (wt && wt->idle)
			wt->idle(wt->arg);
		/* acquire; partner: the release increment in wake() */
		uint32_t g = atomic_load_explicit(&w->gen, memory_order_acquire);
		/* seq_cst: the waiter's half of the Dekker pair with wake() (the re-check is seq_cst too) */
		atomic_fetch_add_explicit(&w->sleepers, 1, memory_order_seq_cst);
		if (!cond(w, k))
			mbp__futex_wait(&w->gen, g, UINT64_MAX); /* returns at once if gen moved */
		/* relaxed: a waker that still sees us only wakes in vain */
		atomic_fetch_sub_explicit(&w->sleepers, 1, memory_order_relaxed);
	}
}

static bool slot_free(struct mbp__seqwin *w, uint32_t k)
{
	/* seq_cst (so also acquire); partner: the seq_cst store of k in take()/complete: the previous round's
	 * item was read before the slot is written again; and the re-check of the Dekker pair */
	return atomic_load_explicit(&w->slots[k & w->mask].stamp, memory_order_seq_cst) == k;
}

bool mbp__seqwin_ready(struct mbp__seqwin *w, uint32_t k)
{
	/* seq_cst (so also acquire); partner: the seq_cst store of k + 1 in put(): the item is visible */
	if (atomic_load_explicit(&w->slots[k & w->mask].stamp, memory_order_seq_cst) == k + 1)
		return true;
	/* seq_cst; partner: the seq_cst store of closed in producer_done(), after `end` */
	if (!atomic_load_explicit(&w->closed, memory_order_seq_cst))
		return false;
	/* relaxed: ordered by the load of closed; k - end as a signed distance: k at or beyond the end */
	uint32_t end = atomic_load_explicit(&w->end, memory_order_relaxed);
	return (int32_t)(k - end) >= 0;
}

void mbp__seqwin_put(struct mbp__seqwin *w, uint32_t k, void *item, const struct mbp__seqwin_rec *rec,
		     const struct mbp__seqwin_waiter *wt)
{
	if (!slot_free(w, k))
		wait_for(w, k, slot_free, wt);
	struct mbp__seqwin_slot *sl = &w->slots[k & w->mask];
	sl->item = item;
	if (rec)
		sl->rec = *rec;
	/* seq_cst (so also release); partner: the acquire in ready()/complete: the item and record are
	 * visible to whoever takes k; and the publisher's half of the Dekker pair with wait_for() */
	atomic_store_explicit(&sl->stamp, k + 1, memory_order_seq_cst);
	wake(w);
}

void mbp__seqwin_wait(struct mbp__seqwin *w, uint32_t k, const struct mbp__seqwin_waiter *wt)
{
	if (!mbp__seqwin_ready(w, k))
		wait_for(w, k, mbp__seqwin_ready, wt);
}

void *mbp__seqwin_take(struct mbp__seqwin *w, uint32_t k)
{
	struct mbp__seqwin_slot *sl = &w->slots[k & w->mask];
	/* relaxed: ready() read the stamp with acquire on this thread just before */
	if (atomic_load_explicit(&sl->stamp, memory_order_relaxed) != k + 1)
		return NULL; /* the end of the stream */
	void *item = sl->item;
	/* seq_cst (so also release); partner: slot_free()'s load: the item was read before k + capacity's
	 * producer writes the slot */
	atomic_store_explicit(&sl->stamp, k + w->capacity, memory_order_seq_cst);
	wake(w);
	return item;
}

uint32_t mbp__seqwin_count(struct mbp__seqwin *w)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i <= w->mask; i++) {
		/* relaxed: a statistic. Slot i serves the micro-batches k = i mod capacity: it holds k when its
		 * stamp is k + 1, and is free with k or k + capacity, both i mod capacity */
		uint32_t stamp = atomic_load_explicit(&w->slots[i].stamp, memory_order_relaxed);
		n += ((stamp - i) & w->mask) == 1;
	}
	return n;
}

void mbp__seqwin_producer_done(struct mbp__seqwin *w, uint32_t count)
{
	/* acq_rel, both; partner: the other producers' same increments and decrements: the last producer's
	 * decrement comes after every other's, so its load of total below sees every count */
	atomic_fetch_add_explicit(&w->total, count, memory_order_acq_rel);
	/* acq_rel; partner: as above */
	if (atomic_fetch_sub_explicit(&w->producers, 1, memory_order_acq_rel) != 1)
		return;
	/* relaxed load (ordered by the acq_rel above) and store (published by closed's seq_cst store) */
	atomic_store_explicit(&w->end, atomic_load_explicit(&w->total, memory_order_relaxed),
			      memory_order_relaxed);
	/* seq_cst; partner: the seq_cst load of closed in ready() */
	atomic_store_explicit(&w->closed, 1, memory_order_seq_cst);
	/* every sleeper re-checks: wake them whether or not wake() would see them (closing is rare) */
	atomic_fetch_add_explicit(&w->gen, 1, memory_order_release);
	mbp__futex_wake(&w->gen, INT32_MAX);
}

void mbp__seqwin_complete(struct mbp__seqwin *w, void (*complete)(void *, const struct mbp__seqwin_rec *),
			  void *arg)
{
	for (;;) {
		uint32_t idle = 0;
		/* seq_cst (so acquire): takes next_done from the previous completer's release; and the
		 * Dekker pair with the re-check below: a putter whose CAS fails was seen by the holder's
		 * re-check, or this CAS sees the holder gone */
		if (!atomic_compare_exchange_strong_explicit(&w->completer, &idle, 1, memory_order_seq_cst,
							     memory_order_seq_cst))
			return;
		uint32_t n = w->next_done;
		while (mbp__seqwin_ready(w, n)) {
			struct mbp__seqwin_slot *sl = &w->slots[n & w->mask];
			struct mbp__seqwin_rec rec = sl->rec;
			/* seq_cst (so release); partner: slot_free()'s load in put() */
			atomic_store_explicit(&sl->stamp, n + w->capacity, memory_order_seq_cst);
			wake(w);
			complete(arg, &rec);
			n++;
		}
		w->next_done = n;
		/* seq_cst (so release): next_done to the next completer; the Dekker pair with put()'s stamp */
		atomic_store_explicit(&w->completer, 0, memory_order_seq_cst);
		if (!mbp__seqwin_ready(w, n))
			return;
	}
}
