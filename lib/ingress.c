/*
 * The ingress in front of stage 0: its bound with sleeping waiters, put, pop, the consumer's wait and the
 * two-step close. See ingress.h for the concurrency table.
 */
#include "config.h"

#include <errno.h>

#include "ingress.h"

/* ---- bound with sleepers ---- */

void mbp__bound_init(struct mbp__bound *b, uint32_t limit)
{
	atomic_init(&b->used, 0);
	b->limit = limit;
	atomic_init(&b->seq, 0);
	atomic_init(&b->sleepers, 0);
	atomic_init(&b->closed, 0);
}

static bool bound_try(struct mbp__bound *b)
{
	/* relaxed, the load and the exchange: the unit carries no data; the entry it admits is published
	 * by the queue */
	uint32_t u = atomic_load_explicit(&b->used, memory_order_relaxed);
	while (u < b->limit) {
		if (atomic_compare_exchange_weak_explicit(&b->used, &u, u + 1, memory_order_relaxed,
							  memory_order_relaxed))
			return true;
	}
	return false;
}

int mbp__bound_take(struct mbp__bound *b, int64_t timeout_ns)
{
	uint64_t deadline = 0;
	for (;;) {
		/* relaxed: a flag; the seq_cst loads below re-check it before sleeping */
		if (atomic_load_explicit(&b->closed, memory_order_relaxed))
			return -ESHUTDOWN;
		if (bound_try(b))
			return 0;
		if (timeout_ns == 0)
			return -EAGAIN;
		if (deadline == 0)
			deadline = mbp__deadline(timeout_ns);
		/* seq_cst RMW and loads: a Dekker pair with give(), which decrements `used` and then reads
		 * `sleepers`; one of the two sides sees the other */
		uint32_t seq = atomic_load_explicit(&b->seq, memory_order_seq_cst);
		atomic_fetch_add_explicit(&b->sleepers, 1, memory_order_seq_cst);
		int rc = 0;
		if (!atomic_load_explicit(&b->closed, memory_order_seq_cst) &&
		    atomic_load_explicit(&b->used, memory_order_seq_cst) >= b->limit)
			rc = mbp__futex_wait(&b->seq, seq, deadline);
		atomic_fetch_sub_explicit(&b->sleepers, 1, memory_order_seq_cst); /* seq_cst: as above */
		if (rc == -ETIMEDOUT)
			return -ETIMEDOUT;
	}
}

void mbp__bound_give(struct mbp__bound *b, uint32_t n)
{
	/* seq_cst, the three: the Dekker pair with take()'s sleepers increment and its load of `used` */
	atomic_fetch_sub_explicit(&b->used, n, memory_order_seq_cst);
	if (atomic_load_explicit(&b->sleepers, memory_order_seq_cst)) {
		atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
		mbp__futex_wake(&b->seq, INT32_MAX);
	}
}

void mbp__bound_close(struct mbp__bound *b)
{
	/* seq_cst: the sleeper's seq_cst load of closed after its sleepers increment sees it, or its futex
	 * wait sees seq moved */
	atomic_store_explicit(&b->closed, 1, memory_order_seq_cst);
	atomic_fetch_add_explicit(&b->seq, 1, memory_order_seq_cst);
	mbp__futex_wake(&b->seq, INT32_MAX);
}

/* ---- the queue ---- */

void mbp__ingress_init(struct mbp__ingress_mpsc *q, uint32_t depth)
{
	__cds_wfcq_init(&q->head, &q->tail);
	mbp__bound_init(&q->room, depth);
	atomic_init(&q->cons_park.parked, 0);
	atomic_init(&q->closed, 0);
}

int mbp__ingress_put(struct mbp__ingress_mpsc *q, struct mbp__item *it, uint32_t kind, int64_t timeout_ns)
{
	int rc = mbp__bound_take(&q->room, timeout_ns);
	if (rc)
		return rc;
	it->kind = kind;
	struct cds_wfcq_node *node = (struct cds_wfcq_node *)(void *)it->link;
	cds_wfcq_node_init(node);
	MBP_TSAN_RELEASE(node); /* partner: MBP_TSAN_ACQUIRE after the dequeue in mbp__ingress_pop() */
	cds_wfcq_enqueue(&q->head, &q->tail, node); /* a full barrier (xchg) */
	mbp__parker_wake(&q->cons_park);
	return 0;
}

struct mbp__item *mbp__ingress_pop(struct mbp__ingress_mpsc *q)
{
	/* single consumer: this thread alone dequeues, so the lock-free variant is safe */
	struct cds_wfcq_node *node = __cds_wfcq_dequeue_blocking(&q->head, &q->tail);
	if (!node)
		return NULL;
	MBP_TSAN_ACQUIRE(node); /* partner: MBP_TSAN_RELEASE before the enqueue in mbp__ingress_put() */
	mbp__bound_give(&q->room, 1);
	return (struct mbp__item *)(void *)node;
}

static bool closed(const struct mbp__ingress_mpsc *q)
{
	/* acquire; partner: the release store in mbp__ingress_close(), made after every accepted put
	 * finished: a consumer that sees the flag sees every entry put before it */
	return atomic_load_explicit(&((struct mbp__ingress_mpsc *)q)->closed, memory_order_acquire) != 0;
}

static bool ready(void *arg)
{
	struct mbp__ingress_mpsc *q = arg;
	return !cds_wfcq_empty(&q->head, &q->tail) || closed(q);
}

int mbp__ingress_wait(struct mbp__ingress_mpsc *q, const struct mbp__wait_opts *o, void (*idle)(void *),
		      void *arg)
{
	mbp__wait_for(&q->cons_park, o, ready, q, idle, arg, UINT64_MAX);
	/* ready: an entry, or closed. After the acquire load of closed, empty is final. */
	return closed(q) && cds_wfcq_empty(&q->head, &q->tail) ? -EPIPE : 0;
}

void mbp__ingress_refuse(struct mbp__ingress_mpsc *q)
{
	mbp__bound_close(&q->room);
}

void mbp__ingress_close(struct mbp__ingress_mpsc *q)
{
	/* release; partner: the acquire load in closed() */
	atomic_store_explicit(&q->closed, 1, memory_order_release);
	mbp__parker_wake(&q->cons_park);
}

uint32_t mbp__ingress_queued(const struct mbp__ingress_mpsc *q)
{
	/* relaxed: a statistic */
	return atomic_load_explicit(&((struct mbp__ingress_mpsc *)q)->room.used, memory_order_relaxed);
}

uint32_t mbp__ingress_depth(const struct mbp__ingress_mpsc *q)
{
	return q->room.limit;
}
