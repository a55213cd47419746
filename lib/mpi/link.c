/*
 * A credit-windowed link: one direction of one hop between two ranks, for the pipeline across ranks and
 * the trainer across ranks alike (mpi_internal.h has the shape; the owner's run_ops say what an item is).
 *
 * The receiver keeps W receives posted: the 32-byte header through a persistent request, the payload
 * straight into a buffer of its pool. Arrivals are taken in posting order (MPI matches messages of one
 * source and tag in order, so the k-th header and the k-th payload land in the same slot); each goes to
 * the owner, which takes the buffer (the slot gets a new one from the pool), keeps it waiting at the head,
 * or gives it back at once. Every receive posted again is a credit owed to the sender, sent back as one
 * word. The sender starts with W credits and spends one per item, sending its header and payload straight
 * from the owner's buffer, and gives the item back to the owner once both sends are done. A slow receiver
 * therefore back-pressures its sender as a full ring does, and no buffer is copied on either side.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include "common.h"
#include "mpi_internal.h"

/* a run has a communicator of its own: the other tags of it are the channel's and the trainer's */
enum { TAG_HDR = 1, TAG_PAYLOAD, TAG_CREDIT };

int mbp__link_alloc(struct mbp__link *l, uint32_t W)
{
	l->W = W;
	l->slot = calloc(W, sizeof(*l->slot));
	l->rq = calloc(2 * (size_t)W + 1, sizeof(*l->rq));
	l->done = calloc(2 * (size_t)W + 1, sizeof(*l->done));
	l->fifo = calloc(W, sizeof(*l->fifo));
	return l->slot && l->rq && l->done && l->fifo ? 0 : -ENOMEM;
}

void mbp__link_free(struct mbp__link *l)
{
	free(l->slot);
	free(l->rq);
	free(l->done);
	free(l->fifo);
}

/* Post receive slot i: its header and its payload, straight into its buffer. */
static void post(struct mbp__run *r, struct mbp__link *l, uint32_t i)
{
	struct mbp__slot *s = &l->slot[i];
	size_t cap = s->mb->capacity < INT_MAX ? s->mb->capacity : INT_MAX;
	MPI_Start(&l->rq[2 * i]);
	MPI_Irecv(s->mb->data, (int)cap, MPI_BYTE, l->peer, TAG_PAYLOAD, r->comm, &l->rq[2 * i + 1]);
	s->out = 3;
	s->used = true;
	s->in = false;
	l->fifo[(l->fhead + l->fn++) % l->W] = (int)i;
}

/* Free receive slots get a buffer and are posted; `credit`: each is a credit for the sender. */
static bool refill(struct mbp__run *r, struct mbp__link *l, bool credit)
{
	bool act = false;
	for (uint32_t i = 0; i < l->W; i++) {
		if (l->slot[i].used)
			continue;
		if (mbp_pool_get(l->pool, l->cache, &l->slot[i].mb, 0) != 0)
			break; /* the owner holds them all: again next pass */
		post(r, l, i);
		l->owed += credit;
		act = true;
	}
	return act;
}

void mbp__link_open(struct mbp__run *r, struct mbp__link *l)
{
	for (uint32_t i = 0; i < 2 * l->W + 1; i++)
		l->rq[i] = MPI_REQUEST_NULL;
	MPI_Request *cred = &l->rq[2 * l->W];
	if (l->send) {
		l->credits = l->W;
		MPI_Recv_init(&l->cred, 1, MPI_UINT32_T, l->peer, TAG_CREDIT, r->comm, cred);
		MPI_Start(cred);
		return;
	}
	for (uint32_t i = 0; i < l->W; i++)
		MPI_Recv_init(&l->slot[i].h, sizeof(l->slot[i].h), MPI_BYTE, l->peer, TAG_HDR, r->comm,
			      &l->rq[2 * i]);
	refill(r, l, false);
}

/* Sender: items go out while credits and free slots last. */
static bool send_more(struct mbp__run *r, struct mbp__link *l)
{
	bool act = false;
	for (uint32_t i = 0; i < l->W; i++) {
		struct mbp__slot *s = &l->slot[i];
		if (s->used)
			continue;
		if (l->credits == 0) {
			if (!l->stalled && r->ops->waiting(r, l)) {
				l->stalled = true;
				mbp__counter_add(&l->credit_waits, 1);
			}
			break;
		}
		mbp_mb *mb = NULL;
		if (!r->ops->next(r, l, &s->h, &mb, &s->item))
			break;
		l->stalled = false;
		size_t bytes = s->h.status ? 0 : (size_t)s->h.rows * s->h.row_bytes;
		MPI_Isend(&s->h, sizeof(s->h), MPI_BYTE, l->peer, TAG_HDR, r->comm, &l->rq[2 * i]);
		MPI_Isend(bytes ? mb->data : (void *)&s->h, (int)bytes, MPI_BYTE, l->peer, TAG_PAYLOAD,
			  r->comm, &l->rq[2 * i + 1]);
		s->out = 3;
		s->used = true;
		l->credits--;
		mbp__counter_add(&l->sent, 1);
		act = true;
	}
	return act;
}

/* Receiver: arrivals in posting order to the owner; free slots posted again; the credits owed back. */
static bool receive(struct mbp__run *r, struct mbp__link *l, uint64_t now)
{
	bool act = false;
	while (l->fn) {
		uint32_t i = (uint32_t)l->fifo[l->fhead];
		struct mbp__slot *s = &l->slot[i];
		if (s->out)
			break; /* not in yet: the later ones wait behind it */
		if (!s->in) {
			s->in = true;
			mbp__counter_add(&l->received, 1);
			mbp__ctl_heard(r, l->peer, now);
			act = true;
		}
		int what = r->ops->arrived(r, l, &s->h, s->mb);
		if (what == MBP__KEEP)
			break;
		l->fhead = (l->fhead + 1) % l->W;
		l->fn--;
		act = true;
		if (what == MBP__AGAIN) {
			post(r, l, i);
			l->owed++;
		} else {
			s->mb = NULL;
			s->used = false;
		}
	}
	act |= refill(r, l, true);
	/* relaxed: a test's switch, set once; nothing is published with it */
	bool hold = r->rank != 0 && atomic_load_explicit(&r->test_late, memory_order_relaxed);
	if (hold && !r->ctl.quiet)
		return act;
	if (hold && !r->test_held) {
		r->test_held = true;
		usleep(50000);
	}
	/* none after the stop's handshake began: the peer may have freed the communicator when it lands, and
	 * MPI gives its context to the next run's, where it would take the place of one of its messages */
	if (l->owed && l->rq[2 * l->W] == MPI_REQUEST_NULL && !r->ctl.quiet) {
		l->cred = l->owed;
		l->owed = 0;
		MPI_Isend(&l->cred, 1, MPI_UINT32_T, l->peer, TAG_CREDIT, r->comm, &l->rq[2 * l->W]);
		act = true;
	}
	return act;
}

bool mbp__link_pass(struct mbp__run *r, struct mbp__link *l, uint64_t now)
{
	bool act = false;
	int n = 0;
	MPI_Testsome(2 * (int)l->W + 1, l->rq, &n, l->done, MPI_STATUSES_IGNORE);
	for (int k = 0; n != MPI_UNDEFINED && k < n; k++) {
		uint32_t i = (uint32_t)l->done[k];
		act = true;
		if (i == 2 * l->W) { /* the credit word: in (sender, restarted), or its send done */
			if (l->send) {
				l->credits += l->cred;
				MPI_Start(&l->rq[i]);
				mbp__ctl_heard(r, l->peer, now);
			}
			continue;
		}
		struct mbp__slot *s = &l->slot[i / 2];
		s->out &= ~(1u << (i % 2));
		if (l->send && !s->out) {
			r->ops->sent(r, l, s->item);
			s->item = NULL;
			s->used = false;
		}
	}
	return (l->send ? !r->ctl.quiet && send_more(r, l) : receive(r, l, now)) || act;
}

void mbp__link_close(struct mbp__run *r, struct mbp__link *l, uint64_t deadline)
{
	for (uint32_t i = 0; i < l->W; i++) {
		struct mbp__slot *s = &l->slot[i];
		for (uint32_t b = 0; b < 2; b++)
			if (s->used && (s->out & (1u << b)))
				mbp__mpi_finish(&l->rq[2 * i + b], !l->send, deadline);
		if (l->send) {
			if (s->used)
				r->ops->sent(r, l, s->item);
			continue;
		}
		MPI_Request_free(&l->rq[2 * i]);
		if (s->mb)
			mbp_pool_put(l->pool, l->cache, s->mb);
		s->mb = NULL;
		s->used = false;
	}
	mbp__mpi_finish(&l->rq[2 * l->W], l->send, deadline);
	if (l->send && l->rq[2 * l->W] != MPI_REQUEST_NULL)
		MPI_Request_free(&l->rq[2 * l->W]);
}
