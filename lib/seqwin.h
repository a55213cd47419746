/*
 * mbp__seqwin: the hand-off around a replicated stage, a window of slots indexed by a micro-batch's place
 * in the stream (its sequence number, free-running uint32_t), for the pipeline's replicas (worker.c).
 * Not installed.
 *
 * Each micro-batch passes every stage (a failed one travels on with its status), so the k-th micro-batch
 * that enters a stage is the k-th to enter every stage: one numbering serves every hop. Slot k & mask holds
 * micro-batch k; its stamp says whose turn it is (Vyukov's bounded queue, DPDK's soring): stamp == k, free
 * for k; stamp == k + 1, k is there. Whoever takes k stores k + capacity (free for the next round's k).
 * Equality of free-running stamps is exact across the wrap at 2^32 because capacity divides 2^32 and
 * is at least 2 (k + 1 != k + capacity).
 *
 *   producers  each puts micro-batch k at its own k: a stage of one thread numbers its outputs itself, a
 *              replica puts the k it took from its input. Putting waits while the slot still holds
 *              k - capacity (the window is full that far ahead).
 *   consumers  a stage of one thread takes 0, 1, 2, ... in order (that is the ordered merge: whatever
 *              order the replicas upstream finished in); replicas each claim the next k with one atomic
 *              increment and wait for it (whichever replica is free takes the next micro-batch).
 *   completion the window after a replicated last stage has no consumer thread: whoever puts a micro-batch
 *              then tries to become the completer (one flag) and completes, in order, every micro-batch
 *              that is there from the next one on (the serial-in-order filter of oneTBB, run by whichever
 *              thread arrives).
 *   end        every producer says once that it is done (seqwin_producer_done) with its count; the last
 *              one sets the stream's length, and a consumer whose k is at or beyond it sees the end.
 *
 * Waits: the backoff of wait.h (spin, yield), then a futex on one generation word shared by every waiter
 * of the window. The Dekker pair: a waiter raises `sleepers` (seq_cst) and re-checks the stamp (seq_cst)
 * before sleeping; a publisher stores the stamp (seq_cst) and then reads `sleepers` (seq_cst): one of the
 * two sees the other. Nobody asleep: no syscall.
 *
 *   operation                          | thread
 *   new, destroy                       | the controlling thread
 *   put, take, claim, producer_done    | the stage threads on either side
 *   count                              | any thread (a statistic)
 */
#ifndef MBP__SEQWIN_H
#define MBP__SEQWIN_H

#include <mbpipe.h>

#include "common.h"
#include "wait.h"

/* What a replicated last stage leaves for the completer: the result as the done hooks and completion see
 * it, the hop buffer to give back (or NULL) and the caller's buffer (single micro-batches; NULL: a job's). */
struct mbp__seqwin_rec {
	mbp_mb res;
	mbp_mb *hop;
	mbp_mb *x;
};

struct mbp__seqwin_slot {
	_Atomic uint32_t stamp;
	void *item;		    /* ordered by the stamp's release/acquire */
	struct mbp__seqwin_rec rec; /* completion windows only */
};

struct mbp__seqwin {
	/* Read-mostly. */
	uint32_t mask, capacity;
	struct mbp__wait_opts wopts;
	_Atomic uint32_t producers; /* producers not done yet */
	_Atomic uint32_t total;	    /* micro-batches the done producers put */
	_Atomic uint32_t end;	    /* the stream's length, valid once `closed` */
	_Atomic uint32_t closed;
	/* The consumers' claim (replicas), and the completer's flag and its next micro-batch. */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t claim;
	_Atomic uint32_t completer;
	uint32_t next_done; /* the completer's, handed on by the flag */
	/* The waiters. */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t gen;
	_Atomic uint32_t sleepers;
	MBP_CACHELINE_ALIGNED struct mbp__seqwin_slot slots[];
};

/* A window of at least `capacity` slots (rounded up to a power of two, at least 2) fed by `producers`
 * threads. Pair with mbp__seqwin_destroy(). 0, -ENOMEM, -EINVAL (capacity above 2^30). */
int mbp__seqwin_new(struct mbp__seqwin **wp, uint32_t capacity, uint32_t producers,
		    const struct mbp__wait_opts *wopts);
void mbp__seqwin_destroy(struct mbp__seqwin *w);

/* A waiter's hooks: idle(arg) runs before it parks (hand back cached buffers); its time is counted by the
 * caller. */
struct mbp__seqwin_waiter {
	void (*idle)(void *);
	void *arg;
};

/* Put micro-batch k (waiting for its slot). For a completion window, also its record (else NULL). */
void mbp__seqwin_put(struct mbp__seqwin *w, uint32_t k, void *item, const struct mbp__seqwin_rec *rec,
		     const struct mbp__seqwin_waiter *wt);

/* Whether slot k holds micro-batch k, or the stream ended before k: the consumer's condition. */
bool mbp__seqwin_ready(struct mbp__seqwin *w, uint32_t k);

/* Wait until mbp__seqwin_ready(w, k). */
void mbp__seqwin_wait(struct mbp__seqwin *w, uint32_t k, const struct mbp__seqwin_waiter *wt);

/* Take micro-batch k once ready (mbp__seqwin_ready): the item, or NULL at the end of the stream. */
void *mbp__seqwin_take(struct mbp__seqwin *w, uint32_t k);

/* A replica's claim of the next micro-batch: one atomic increment. */
static inline uint32_t mbp__seqwin_claim(struct mbp__seqwin *w)
{
	/* relaxed: the claim only hands out numbers; the slot's stamp orders the item */
	return atomic_fetch_add_explicit(&w->claim, 1, memory_order_relaxed);
}

/* The micro-batches waiting in the window now (put and not yet taken or completed): a statistic, each
 * slot read once, as mbp__ring_count() is for a ring. */
uint32_t mbp__seqwin_count(struct mbp__seqwin *w);

/* A producer is done, having put `count` micro-batches; the last one ends the stream. */
void mbp__seqwin_producer_done(struct mbp__seqwin *w, uint32_t count);

/* The completer: after putting into a completion window, complete in order every record that is there,
 * unless another thread is doing it (it will see this one). complete(arg, rec) runs for each, in order. */
void mbp__seqwin_complete(struct mbp__seqwin *w, void (*complete)(void *, const struct mbp__seqwin_rec *),
			  void *arg);

#endif
