/*
 * The control channel of a run: fixed-size commands (struct mbp__ctl_msg) between pairs of ranks, one
 * persistent receive and at most one send in flight per peer, all tested in one MPI_Testsome per pass.
 * The peers are rank 0 and every other rank, or every pair (mesh: the trainer's ABORT reaches every
 * rank). A command waits as a bit of its peer's `pending` word, set by any thread (mbp__ctl_post), and
 * goes out in a fixed order of urgency; the flow fills in its content as it goes (ops->fill) and reads
 * each one that comes in (ops->on_ctl), both under the run's lock.
 *
 * Liveness: heartbeats go between rank 0 and every other rank each peer_timeout_ns / 4; anything heard
 * from a peer counts (a command, a credit); a watched peer silent for peer_timeout_ns ends the run
 * (-ETIMEDOUT, then mbp_mpi_finalize aborts every rank). The quiet stop: rank 0 sends STOP once its flow
 * may end the run; every other rank answers STOPPED and leaves once that is out, sending nothing after it
 * (a message still on the wire as the communicator is freed could reach the next run's: MPI reuses its
 * context); rank 0 leaves once every STOPPED is in and its own sends are done (loop.c). From the stop on
 * (rank 0: STOP posted; the others: STOP in) only its two words go out: the channel drops every other
 * command and the links send no item and no credit (`quiet`). A credit for a late arrival sent after
 * STOPPED landed in the next run's communicator, which has the freed one's context: there it took the
 * sequence number of one of that run's messages (a vote, a gradient), which was then never matched.
 */
#include "config.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mpi_internal.h"

#define TAG_CTL 40

static const uint32_t order[] = {MBP__CTL_STOPPED, MBP__CTL_CANCEL, MBP__CTL_ABORT, MBP__CTL_LEAVE,
				 MBP__CTL_STEP,	   MBP__CTL_STOP,   MBP__CTL_HB};

int mbp__ctl_alloc(struct mbp__run *r, bool mesh)
{
	struct mbp__ctl *c = &r->ctl;
	unsigned n = r->size <= 1 ? 0 : mesh || r->rank == 0 ? (unsigned)r->size - 1 : 1;
	c->peer = calloc(n + 1, sizeof(*c->peer));
	c->rq = calloc(2 * (size_t)n + 1, sizeof(*c->rq));
	c->done = calloc(2 * (size_t)n + 1, sizeof(*c->done));
	if (!c->peer || !c->rq || !c->done)
		return -ENOMEM;
	for (int p = 0; p < r->size && n; p++)
		if (p != r->rank && (mesh || r->rank == 0 || p == 0))
			c->peer[c->n++] = (struct mbp__peer){.rank = p, .watch = r->rank == 0 || p == 0};
	return 0;
}

void mbp__ctl_free(struct mbp__ctl *c)
{
	free(c->peer);
	free(c->rq);
	free(c->done);
}

void mbp__ctl_post(struct mbp__run *r, int rank, uint32_t cmd)
{
	for (unsigned i = 0; i < r->ctl.n; i++)
		if (rank < 0 || r->ctl.peer[i].rank == rank)
			/* relaxed: the kick below publishes it (release) */
			atomic_fetch_or_explicit(&r->ctl.peer[i].pending, 1u << cmd, memory_order_relaxed);
	mbp__run_kick(r);
}

void mbp__ctl_open(struct mbp__run *r, uint64_t now)
{
	struct mbp__ctl *c = &r->ctl;
	for (unsigned i = 0; i < c->n; i++) {
		struct mbp__peer *p = &c->peer[i];
		p->last_heard = p->last_sent = now;
		MPI_Recv_init(&p->in, sizeof(p->in), MPI_BYTE, p->rank, TAG_CTL, r->comm, &c->rq[2 * i]);
		MPI_Start(&c->rq[2 * i]);
		c->rq[2 * i + 1] = MPI_REQUEST_NULL;
	}
}

void mbp__ctl_heard(struct mbp__run *r, int rank, uint64_t now)
{
	for (unsigned i = 0; i < r->ctl.n; i++)
		if (r->ctl.peer[i].rank == rank)
			r->ctl.peer[i].last_heard = now;
}

static uint32_t pending(struct mbp__peer *p)
{
	/* relaxed: its poster's kick was an acquire for this pass */
	return atomic_load_explicit(&p->pending, memory_order_relaxed);
}

/* Lock held: peer i's most urgent pending command that the flow can fill in now, sent. */
static bool send_next(struct mbp__run *r, unsigned i, uint64_t now)
{
	struct mbp__peer *p = &r->ctl.peer[i];
	for (unsigned o = 0; o < MBP_ARRAY_SIZE(order); o++) {
		if (!(pending(p) & (1u << order[o])))
			continue;
		bool last = order[o] == MBP__CTL_STOP || order[o] == MBP__CTL_STOPPED;
		memset(&p->out, 0, sizeof(p->out));
		p->out.cmd = order[o];
		if (r->ctl.quiet && !last) {
			/* relaxed: as below; after the stop no step is open, and the command says nothing */
			atomic_fetch_and_explicit(&p->pending, ~(1u << order[o]), memory_order_relaxed);
			continue;
		}
		if (!r->ops->fill(r, p->rank, &p->out))
			continue; /* not yet: it stays pending */
		/* relaxed: a pending bit carries no data (the message is what fill() just wrote on this
		 * thread); a caller that sets it again after this clear is seen at the next pass, which its kick
		 * starts */
		atomic_fetch_and_explicit(&p->pending, ~(1u << order[o]), memory_order_relaxed);
		MPI_Isend(&p->out, sizeof(p->out), MPI_BYTE, p->rank, TAG_CTL, r->comm,
			  &r->ctl.rq[2 * i + 1]);
		p->busy = true;
		p->last_sent = now;
		return true;
	}
	return false;
}

bool mbp__ctl_pass(struct mbp__run *r, uint64_t now, bool *leave)
{
	struct mbp__ctl *c = &r->ctl;
	int n = 0;
	if (!c->n)
		return false;
	MPI_Testsome(2 * (int)c->n, c->rq, &n, c->done, MPI_STATUSES_IGNORE);
	if (n == MPI_UNDEFINED)
		n = 0;
	uint64_t hb = r->mo.peer_timeout_ns > 0 ? (uint64_t)r->mo.peer_timeout_ns / 4 : 0;
	bool work = n > 0;
	for (unsigned i = 0; i < c->n; i++) {
		struct mbp__peer *p = &c->peer[i];
		if (hb && p->watch && !c->quiet && now - p->last_sent >= hb)
			/* relaxed: the loop's request to itself, read back below on this thread */
			atomic_fetch_or_explicit(&p->pending, 1u << MBP__CTL_HB, memory_order_relaxed);
		work |= !p->busy && pending(p);
	}
	if (!work)
		return false; /* the common pass: no lock taken */
	bool act = n > 0;
	pthread_mutex_lock(&r->lock);
	for (int k = 0; k < n; k++) {
		struct mbp__peer *p = &c->peer[c->done[k] / 2];
		if (c->done[k] % 2) { /* a send done */
			p->busy = false;
			*leave |= p->out.cmd == MBP__CTL_STOPPED; /* this rank's last word */
			continue;
		}
		p->last_heard = now;
		struct mbp__ctl_msg m = p->in;
		MPI_Start(&c->rq[c->done[k]]);
		if (m.cmd == MBP__CTL_STOP) {
			c->quiet = true; /* nothing but STOPPED after this */
			/* relaxed: the loop's request to itself (the answer to STOP), sent from this thread */
			atomic_fetch_or_explicit(&p->pending, 1u << MBP__CTL_STOPPED, memory_order_relaxed);
		}
		c->stopped += m.cmd == MBP__CTL_STOPPED;
		if (m.cmd == MBP__CTL_CANCEL) {
			r->cancelled = true;
			pthread_cond_broadcast(&r->cond);
		}
		r->ops->on_ctl(r, p->rank, &m);
	}
	for (unsigned i = 0; i < c->n && !*leave; i++)
		if (!c->peer[i].busy)
			act |= send_next(r, i, now);
	pthread_mutex_unlock(&r->lock);
	return act;
}

bool mbp__ctl_watchdog(struct mbp__run *r, uint64_t now)
{
	if (r->mo.peer_timeout_ns < 0)
		return false;
	for (unsigned i = 0; i < r->ctl.n; i++) {
		struct mbp__peer *p = &r->ctl.peer[i];
		if (!p->watch || now - p->last_heard <= (uint64_t)r->mo.peer_timeout_ns)
			continue;
		pthread_mutex_lock(&r->lock);
		r->dead = true;
		r->err = -ETIMEDOUT;
		mbp__run_fail(r, 0, "rank %d stopped answering: nothing heard from it for %.1f s", p->rank,
			      (double)(now - p->last_heard) / 1e9);
		r->ops->dead(r);
		pthread_cond_broadcast(&r->cond);
		pthread_mutex_unlock(&r->lock);
		fprintf(stderr, "mbpipe-mpi: rank %d: %s\n", r->rank, r->msg);
		mbp__mpi_abort_at_end();
		return true;
	}
	return false;
}

void mbp__ctl_close(struct mbp__run *r, uint64_t deadline)
{
	struct mbp__ctl *c = &r->ctl;
	for (unsigned i = 0; i < c->n; i++) {
		mbp__mpi_finish(&c->rq[2 * i], true, deadline);
		MPI_Request_free(&c->rq[2 * i]);
		if (c->peer[i].busy)
			mbp__mpi_finish(&c->rq[2 * i + 1], false, deadline);
	}
}
