/*
 * The ingress: the multi-producer, single-consumer queue in front of stage 0, its bound and its close.
 * Not installed.
 *
 * Callers (any threads) put jobs and single micro-batches; stage 0's thread alone takes them, in order.
 * The queue is liburcu's wfcqueue (wait-free enqueue from any thread; dequeue by one consumer), bounded
 * by `room`: a put first takes a unit of room (failing with -EAGAIN, waiting, or -ESHUTDOWN once the
 * ingress refuses), a pop gives it back. Shutdown is two steps: refuse() stops admitting (and wakes
 * callers blocked on a full ingress); close(), once no put is still on its way, is the end of the stream
 * for the consumer, which drains what was put before it and then sees -EPIPE.
 *
 *   operation                  | concurrency
 *   put                        | any threads, concurrently
 *   pop, wait                  | the consumer (stage 0's thread) only
 *   refuse, close              | the controlling thread
 *   queued, depth              | any thread (relaxed: a statistic)
 */
#ifndef MBP__INGRESS_H
#define MBP__INGRESS_H

/* Inline wfcqueue fast paths, except under TSan: liburcu's atomics are volatile accesses and inline
 * barriers that TSan cannot see, so TSan builds call the (uninstrumented) library instead and annotate the
 * hand-off of each node (MBP_TSAN_RELEASE/ACQUIRE). */
#ifndef MBP_TSAN
#define _LGPL_SOURCE 1
#endif
#include <urcu/wfcqueue.h>

#include "common.h"
#include "wait.h"

/* What an ingress entry is. The entry is the first members of both a job's priv and a pool buffer's
 * header: { void *link[2]; uint32_t kind; }. */
enum { MBP__ITEM_JOB = 1, MBP__ITEM_MB = 2 };

struct mbp__item {
	void *link[2]; /* struct cds_wfcq_node while queued */
	uint32_t kind;
};
_Static_assert(sizeof(struct cds_wfcq_node) <= 2 * sizeof(void *), "ingress link too small");

/*
 * A bound with sleeping waiters, for callers that may block (the ingress depth). take() reserves one unit
 * or waits; give() returns units and wakes sleepers only when there are any.
 */
struct mbp__bound {
	_Atomic uint32_t used;
	uint32_t limit;
	_Atomic uint32_t seq; /* futex word: bumped by give() when sleepers exist */
	_Atomic uint32_t sleepers;
	_Atomic uint32_t closed; /* take() fails with -ESHUTDOWN once set */
};

void mbp__bound_init(struct mbp__bound *b, uint32_t limit);
/* 0, -EAGAIN (full, timeout 0), -ETIMEDOUT, -ESHUTDOWN (closed). timeout_ns < 0: no limit. */
int mbp__bound_take(struct mbp__bound *b, int64_t timeout_ns);
void mbp__bound_give(struct mbp__bound *b, uint32_t n);
void mbp__bound_close(struct mbp__bound *b);

struct mbp__ingress_mpsc {
	struct __cds_wfcq_head head;
	MBP_CACHELINE_ALIGNED struct cds_wfcq_tail tail;
	MBP_CACHELINE_ALIGNED struct mbp__bound room;
	MBP_CACHELINE_ALIGNED struct mbp__parker cons_park; /* stage 0 sleeps here when empty */
	_Atomic uint32_t closed;
};

/* An empty ingress of `depth` entries. Nothing to destroy: entries belong to their callers. */
void mbp__ingress_init(struct mbp__ingress_mpsc *q, uint32_t depth);

/* Take a unit of room (see mbp__bound_take for timeout_ns and the errors), tag the entry with `kind`,
 * enqueue it and wake the consumer. On error nothing was enqueued. */
int mbp__ingress_put(struct mbp__ingress_mpsc *q, struct mbp__item *it, uint32_t kind, int64_t timeout_ns);

/* The next entry, giving its room back; NULL when empty (look again after a close: see wait). */
struct mbp__item *mbp__ingress_pop(struct mbp__ingress_mpsc *q);

/* Wait (the backoff and park of wait.h; idle(arg), if not NULL, before each park) until an entry is
 * there (0) or the ingress is closed and empty (-EPIPE: the end of the stream). */
int mbp__ingress_wait(struct mbp__ingress_mpsc *q, const struct mbp__wait_opts *o, void (*idle)(void *),
		      void *arg);

/* Stop admitting: puts blocked on a full ingress and later ones fail with -ESHUTDOWN. */
void mbp__ingress_refuse(struct mbp__ingress_mpsc *q);

/* End of the stream for the consumer. Call once no put is still on its way (after refuse, when every
 * caller that passed admission has returned). */
void mbp__ingress_close(struct mbp__ingress_mpsc *q);

/* Entries waiting now, and the bound. */
uint32_t mbp__ingress_queued(const struct mbp__ingress_mpsc *q);
uint32_t mbp__ingress_depth(const struct mbp__ingress_mpsc *q);

#endif
