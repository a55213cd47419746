/*
 * Training across MPI ranks: each rank's mbp_trainer holds a contiguous range of the stages and follows
 * the whole pipeline's schedule (train_internal.h); this file is the agent at the far end of its boundary
 * rings, on the communication thread (comm.c), the only code here that calls MPI.
 *
 * Links. Between the last stage of rank r and the first of rank r+1 there are two links: forward
 * (activations, r to r+1) and backward (input gradients, r+1 to r). A link is the forward pipeline's
 * (mpi.c): the receiver keeps W receives pre-posted into buffers of its trainer's pool (a persistent
 * header receive and the payload straight into the buffer), pushes each arrival into the stage's ring
 * and sends a credit back when it re-posts; the sender pops the stage's ring, sends header and payload
 * straight from the buffer while it holds credits, and puts the buffer back in the pool once the send is
 * done. A header carries the step's attempt number (every step rank 0 starts, failed or not): an arrival
 * of a step that this rank has closed is dropped (a failed step leaves some on the wire), one of a step
 * it has not begun waits at the head of the window.
 *
 * A step. Rank 0 sends every rank STEP (attempt, rows, micro-batch rows) and the last rank the step's
 * targets (one message into a buffer kept from start). Each rank runs its trainer's step; a stage that
 * fails makes its rank send ABORT (attempt) to every other rank, which fail their step with it. At the
 * first barrier each rank's trainer votes (train_internal.h): an MPI_Iallgather of (ok, error, the
 * squared gradient norm of each of its stages, the loss on the last rank) gives every rank the same
 * decision: update only if every rank is ok; the gradient norm summed over all stages in stage order
 * (bit for bit the single process's); the step's error is the failing stage with the lowest index (or a
 * cancel, stage -1). Closing the step, the agent stops pushing into the rings and drops what its
 * outgoing rings still hold.
 *
 * Control. Every pair of ranks has a control channel (STEP, ABORT, CANCEL, STOP, STOPPED, heartbeat);
 * heartbeats go between rank 0 and every other rank as in mpi.c, and a rank silent for peer_timeout_ns
 * ends the run with -ETIMEDOUT (then mbp_mpi_finalize aborts every rank). Rank 0 ends the run at destroy:
 * STOP to every rank, which answers STOPPED and leaves.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include "common.h"
#include "mpi_internal.h"
#include "train_internal.h"

#define MAX_RANKS MBP_MAX_STAGES

enum { TAG_FHDR = 21, TAG_FDATA, TAG_FCRED, TAG_BHDR, TAG_BDATA, TAG_BCRED, TAG_CTRL, TAG_TGT };
enum { C_HB = 0, C_STEP, C_ABORT, C_CANCEL, C_STOP, C_STOPPED, C_LEAVE };
enum { S_NEW = 0, S_RUNNING, S_ENDED };
enum { X_FREE = 0, X_POSTED, X_ARRIVED };
enum { V_IDLE = 0, V_PENDING, V_ACTIVE, V_DONE };

struct lhdr {
	uint64_t attempt;
	uint32_t mb, rows, row_bytes;
	uint32_t pad[3];
};
_Static_assert(sizeof(struct lhdr) == 32, "the link header is 32 bytes on the wire");

struct tctrl {
	uint32_t cmd, mb_rows;
	uint64_t attempt, rows;
};

/* One rank's vote on the wire. */
struct vrec {
	int32_t ok, err, stage, mb, op;
	int32_t left; /* the rank's trainer is being destroyed mid-run: it ran no part of this step */
	double loss;
	double grad_sq[MBP_MAX_STAGES];
};

struct xslot {
	struct lhdr h;
	MPI_Request req[2];
	mbp_mb *mb;
	bool busy;
};

struct xrslot {
	struct lhdr h;
	MPI_Request hreq; /* persistent */
	MPI_Request dreq;
	mbp_mb *mb;
	int state;
};

struct link {
	int ring; /* MBP__LINK_* */
	int peer;
	bool send;
	int tag_hdr, tag_data, tag_cred;
	MPI_Request cred_req; /* send: credits in (persistent); receive: credits out */
	uint32_t cred;	      /* the credit message's word */
	bool cred_active;
	uint32_t credits; /* send: sends allowed */
	bool stalled;	  /* send: an item waits for a credit (counted once per wait) */
	struct xslot *ss; /* send: W */
	uint32_t owed;	  /* receive: credits to send back */
	struct xrslot *rs;
	int *fifo;
	uint32_t fhead, fn;
};

struct peer {
	struct tctrl in, out;
	MPI_Request rreq, sreq;
	bool sactive, watch;
	uint32_t pending;
	uint64_t abort_attempt;
	uint64_t last_heard, last_sent;
};

struct mbp_mpi_trainer {
	mbp_trainer *t;
	mbp_train_opts o;
	mbp_mpi_opts mo;
	int rank, size;
	MPI_Comm comm;
	unsigned nstages, stage0, stages;
	unsigned first_of[MAX_RANKS + 1]; /* each rank's first global stage; [size] = stages */
	size_t out_rb;
	uint64_t loop_ticket;
	unsigned char *tgt; /* last rank (size > 1): the step's targets */

	pthread_mutex_t lock;
	pthread_cond_t cond; /* steps, votes, the end of the run */
	pthread_cond_t wake; /* the loop's park */
	atomic_int sleeping;

	/* under lock */
	int state;
	uint64_t attempt;  /* rank 0: the last step started; others: the last received */
	uint64_t cmd_rows; /* the step's rows and micro-batch rows */
	uint32_t cmd_mb_rows;
	bool cmd_ready;	       /* others: a STEP (and its targets) waits to run */
	uint64_t open, closed; /* the step this rank's trainer runs (0: none), the last closed */
	const void *tgt_send;  /* rank 0: targets to send to the last rank */
	size_t tgt_bytes;
	bool tgt_pending;
	uint64_t abort_attempt; /* a step an ABORT named before it began here */
	uint64_t fail_attempt;	/* a local failure to tell the others about */
	bool cancelled, draining, stop_req, stopped, dead;
	bool leaving;	     /* others: destroy mid-run; vote no on every step until rank 0's STOP */
	bool leave_told;     /* LEAVE is queued for rank 0 */
	uint64_t leave_vote; /* the step this leaving rank voted on */
	int left_rank;	     /* the rank that left (run_err -ECONNRESET) */
	int vote_state;
	struct vrec mine;
	struct mbp__train_vote result;
	int run_err;
	char err[192];

	/* the loop's own */
	struct link links[4];
	unsigned nlinks;
	struct peer *peers; /* by rank, self unused */
	struct vrec *all;
	MPI_Request vote_req, tgt_req;
	bool tgt_active;
	uint32_t stopped_peers;
	atomic_uint_least64_t sent, received, credit_waits, dropped;
};

/* ---- hooks from the trainer (its threads) ---- */

static void wake_loop_locked(mbp_mpi_trainer *T)
{
	/* seq_cst: under the lock the loop sleeps with */
	if (atomic_load_explicit(&T->sleeping, memory_order_seq_cst))
		pthread_cond_signal(&T->wake);
}

static void hook_kick(void *arg)
{
	mbp_mpi_trainer *T = arg;
	/* seq_cst: the ring push before this load, against the loop's sleeping store before its ring
	 * check (a Dekker pair): one of the two sees the other */
	atomic_thread_fence(memory_order_seq_cst);
	if (atomic_load_explicit(&T->sleeping, memory_order_seq_cst)) {
		pthread_mutex_lock(&T->lock);
		pthread_cond_signal(&T->wake);
		pthread_mutex_unlock(&T->lock);
	}
}

static void hook_begin(void *arg)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->lock);
	T->open = T->attempt;
	if (T->cancelled || T->dead || T->run_err || T->abort_attempt == T->open)
		mbp__trainer_abort(T->t);
	wake_loop_locked(T);
	pthread_mutex_unlock(&T->lock);
}

static void hook_failed(void *arg)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->lock);
	T->fail_attempt = T->open;
	wake_loop_locked(T);
	pthread_mutex_unlock(&T->lock);
}

static void hook_agree(void *arg, struct mbp__train_vote *v)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->lock);
	if (!T->dead) {
		struct vrec *m = &T->mine;
		memset(m, 0, sizeof(*m));
		m->ok = v->ok;
		m->err = v->err.err;
		m->stage = v->err.stage;
		m->mb = v->err.mb;
		m->op = (int32_t)v->err.op;
		m->loss = v->loss;
		for (unsigned s = T->stage0; s < T->stage0 + T->nstages; s++)
			m->grad_sq[s] = v->grad_sq[s];
		T->vote_state = V_PENDING;
		wake_loop_locked(T);
		while (T->vote_state != V_DONE && !T->dead && T->state == S_RUNNING)
			pthread_cond_wait(&T->cond, &T->lock);
	}
	if (T->vote_state == V_DONE) {
		*v = T->result;
	} else {
		v->ok = false;
		v->err =
		    (mbp_train_error){.err = T->run_err ? T->run_err : -ESHUTDOWN, .stage = -1, .mb = -1};
	}
	T->vote_state = V_IDLE;
	pthread_mutex_unlock(&T->lock);
}

/* ---- construction ---- */

int mbp_mpi_trainer_new(mbp_mpi_trainer **tp, const mbp_train_opts *o, const mbp_mpi_opts *mo)
{
	if (!tp || !o)
		return -EINVAL;
	*tp = NULL;
	if (!mbp__mpi_started())
		return -ENOTCONN;
	if (mbp_mpi_size() > MAX_RANKS)
		return -ERANGE;
	mbp_mpi_trainer *T = calloc(1, sizeof(*T));
	if (!T)
		return -ENOMEM;
	T->o = *o;
	if (!T->o.max_mb_rows)
		T->o.max_mb_rows = 64;
	if (!T->o.max_mbs)
		T->o.max_mbs = 64;
	if (T->o.schedule == MBP_SCHED_DEFAULT)
		T->o.schedule = MBP_SCHED_1F1B;
	if (mo)
		T->mo = *mo;
	mbp__mpi_opts_fill(&T->mo); /* inflight is not used */
	if (T->mo.window > 1024) {
		free(T);
		return -EINVAL;
	}
	T->rank = mbp_mpi_rank();
	T->size = mbp_mpi_size();
	T->comm = MPI_COMM_NULL;
	T->out_rb = o->in_row_bytes;
	mbp__mpi_sync_init(&T->lock, &T->cond, &T->wake);
	int rc = mbp_trainer_new(&T->t, &T->o);
	if (rc) {
		mbp_mpi_trainer_destroy(T);
		return rc;
	}
	*tp = T;
	return 0;
}

int mbp_mpi_trainer_add_stage(mbp_mpi_trainer *T, const mbp_train_stage_desc *d)
{
	if (!T || !d || T->state != S_NEW)
		return -EINVAL;
	if (d->grad_row_bytes && d->grad_row_bytes != d->out_row_bytes)
		return -ENOTSUP;
	int rc = mbp_trainer_add_stage(T->t, d);
	if (rc == 0) {
		T->out_rb = d->out_row_bytes;
		T->nstages++;
	}
	return rc;
}

/* ---- start: two handshakes on the communication thread ---- */

enum { HS_STAGES, HS_IN, HS_OUT, HS_TGT, HS_ROWS, HS_MBS, HS_WINDOW, HS_SCHED, HS_N };

struct hs {
	mbp_mpi_trainer *T;
	uint64_t mine[HS_N];
	uint64_t all[MAX_RANKS * HS_N];
};

static int hs_task(void *arg)
{
	struct hs *h = arg;
	if (h->T->comm == MPI_COMM_NULL && MPI_Comm_dup(MPI_COMM_WORLD, &h->T->comm) != MPI_SUCCESS)
		return -EIO;
	if (MPI_Allgather(h->mine, HS_N, MPI_UINT64_T, h->all, HS_N, MPI_UINT64_T, h->T->comm) != MPI_SUCCESS)
		return -EIO;
	return 0;
}

static int free_comm_task(void *arg)
{
	mbp_mpi_trainer *T = arg;
	if (T->comm != MPI_COMM_NULL)
		MPI_Comm_free(&T->comm);
	return 0;
}

static int check_hs(mbp_mpi_trainer *T, const uint64_t *all)
{
	static const char *const what[HS_N] = {
	    "", "", "", "target_row_bytes", "max_mb_rows", "max_mbs", "window", "schedule"};
	unsigned total = 0;
	for (int r = 0; r < T->size; r++) {
		const uint64_t *v = &all[r * HS_N];
		if (v[HS_STAGES] == 0) {
			snprintf(T->err, sizeof(T->err), "rank %d has no stages", r);
			return -EINVAL;
		}
		for (int k = HS_TGT; k < HS_N; k++)
			if (v[k] != all[k]) {
				snprintf(T->err, sizeof(T->err), "rank %d has %s %llu, rank 0 %llu", r,
					 what[k], (unsigned long long)v[k], (unsigned long long)all[k]);
				return -EINVAL;
			}
		if (r + 1 < T->size && v[HS_OUT] != all[(r + 1) * HS_N + HS_IN]) {
			snprintf(T->err, sizeof(T->err),
				 "rank %d's output rows are %llu bytes, rank %d's input rows %llu", r,
				 (unsigned long long)v[HS_OUT], r + 1,
				 (unsigned long long)all[(r + 1) * HS_N + HS_IN]);
			return -EINVAL;
		}
		/* each product in 64 bits, checked for a wrap (the widths are size_t on the sending rank) */
		uint64_t out_mb, in_mb, tgt_rows, tgt_step;
		if (__builtin_mul_overflow(v[HS_OUT], v[HS_ROWS], &out_mb) || out_mb > INT_MAX ||
		    __builtin_mul_overflow(v[HS_IN], v[HS_ROWS], &in_mb) || in_mb > INT_MAX ||
		    __builtin_mul_overflow(v[HS_TGT], v[HS_ROWS], &tgt_rows) ||
		    __builtin_mul_overflow(tgt_rows, v[HS_MBS], &tgt_step) || tgt_step > INT_MAX) {
			snprintf(T->err, sizeof(T->err),
				 "rank %d's micro-batches or a step's targets exceed 2 GiB", r);
			return -E2BIG;
		}
		T->first_of[r] = total;
		total += (unsigned)v[HS_STAGES];
		if (total > MBP_MAX_STAGES) {
			snprintf(T->err, sizeof(T->err), "more than %d stages over all ranks",
				 MBP_MAX_STAGES);
			return -E2BIG;
		}
	}
	T->first_of[T->size] = total;
	T->stages = total;
	T->stage0 = T->first_of[T->rank];
	return 0;
}

static void link_tags(struct link *l, bool fwd)
{
	l->tag_hdr = fwd ? TAG_FHDR : TAG_BHDR;
	l->tag_data = fwd ? TAG_FDATA : TAG_BDATA;
	l->tag_cred = fwd ? TAG_FCRED : TAG_BCRED;
}

static int alloc_run(mbp_mpi_trainer *T)
{
	uint32_t W = T->mo.window;
	T->peers = calloc((size_t)T->size, sizeof(*T->peers));
	T->all = calloc((size_t)T->size, sizeof(*T->all));
	if (!T->peers || !T->all)
		return -ENOMEM;
	if (T->rank == T->size - 1 && T->size > 1) {
		size_t bytes = (size_t)T->o.max_mbs * T->o.max_mb_rows * T->o.target_row_bytes;
		if (!(T->tgt = malloc(bytes ? bytes : 1)))
			return -ENOMEM;
	}
	/* up: activations in, gradients out; down: activations out, gradients in */
	if (T->rank > 0) {
		T->links[T->nlinks++] = (struct link){.ring = MBP__LINK_UP_FWD, .peer = T->rank - 1};
		T->links[T->nlinks++] =
		    (struct link){.ring = MBP__LINK_UP_BWD, .peer = T->rank - 1, .send = true};
	}
	if (T->rank + 1 < T->size) {
		T->links[T->nlinks++] =
		    (struct link){.ring = MBP__LINK_DOWN_FWD, .peer = T->rank + 1, .send = true};
		T->links[T->nlinks++] = (struct link){.ring = MBP__LINK_DOWN_BWD, .peer = T->rank + 1};
	}
	for (unsigned i = 0; i < T->nlinks; i++) {
		struct link *l = &T->links[i];
		link_tags(l, l->ring == MBP__LINK_UP_FWD || l->ring == MBP__LINK_DOWN_FWD);
		if (l->send ? !(l->ss = calloc(W, sizeof(*l->ss)))
			    : !(l->rs = calloc(W, sizeof(*l->rs))) || !(l->fifo = calloc(W, sizeof(int))))
			return -ENOMEM;
	}
	return 0;
}

static int link_loop(void *arg);

int mbp_mpi_trainer_start(mbp_mpi_trainer *T)
{
	if (!T)
		return -EINVAL;
	if (T->state != S_NEW)
		return -EALREADY;
	struct hs *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	h->T = T;
	h->mine[HS_STAGES] = T->nstages;
	h->mine[HS_IN] = T->o.in_row_bytes;
	h->mine[HS_OUT] = T->out_rb;
	h->mine[HS_TGT] = T->o.target_row_bytes;
	h->mine[HS_ROWS] = T->o.max_mb_rows;
	h->mine[HS_MBS] = T->o.max_mbs;
	h->mine[HS_WINDOW] = T->mo.window;
	h->mine[HS_SCHED] = (uint64_t)T->o.schedule;
	int rc = mbp__mpi_call(hs_task, h);
	if (rc == 0)
		rc = check_hs(T, h->all);
	/* every rank starts its trainer (or says why not); the second handshake shares the results */
	int local_rc = rc;
	if (local_rc == 0) {
		struct mbp__train_remote rem = {.stage0 = T->stage0,
						.stages = T->stages,
						.extra_buffers = 4 * T->mo.window + 8,
						.arg = T,
						.kick = hook_kick,
						.begin = hook_begin,
						.failed = hook_failed,
						.agree = hook_agree};
		/* collective (every rank passed check_hs alike): this rank's part of its node's CPUs */
		local_rc = mbp__mpi_node_share(&rem.node_k, &rem.node_m);
		if (local_rc == 0)
			local_rc = mbp__trainer_set_remote(T->t, &rem);
		if (local_rc == 0)
			local_rc = mbp_trainer_start(T->t);
		if (local_rc == 0)
			local_rc = alloc_run(T);
		memset(h->mine, 0, sizeof(h->mine));
		h->mine[0] = (uint64_t)(int64_t)local_rc;
		rc = mbp__mpi_call(hs_task, h);
		for (int r = 0; rc == 0 && r < T->size; r++) {
			int e = (int)(int64_t)h->all[r * HS_N];
			if (e < 0) {
				mbp_train_error te = {0};
				mbp_trainer_error(T->t, &te);
				if (r == T->rank && te.err)
					snprintf(T->err, sizeof(T->err),
						 "rank %d failed to start (stage %d): %s%s%s", r, te.stage,
						 mbp_strerror(e), te.what ? ": " : "",
						 te.what ? te.what : "");
				else
					snprintf(T->err, sizeof(T->err), "rank %d failed to start: %s", r,
						 mbp_strerror(e));
				rc = e;
			}
		}
	}
	free(h);
	if (rc) {
		mbp__mpi_call(free_comm_task, T);
		T->state = S_ENDED;
		T->run_err = rc;
		return rc;
	}
	T->state = S_RUNNING;
	T->loop_ticket = mbp__mpi_post(link_loop, T);
	return 0;
}

/* ---- the loop (communication thread only) ---- */

static void fifo_push(mbp_mpi_trainer *T, struct link *l, int i)
{
	l->fifo[(l->fhead + l->fn++) % T->mo.window] = i;
}

static int fifo_pop(mbp_mpi_trainer *T, struct link *l)
{
	int i = l->fifo[l->fhead];
	l->fhead = (l->fhead + 1) % T->mo.window;
	l->fn--;
	return i;
}

/* Post receive slot i: the header (persistent) and the payload straight into its buffer. */
static void post_slot(mbp_mpi_trainer *T, struct link *l, int i)
{
	struct xrslot *r = &l->rs[i];
	size_t cap = r->mb->capacity < INT_MAX ? r->mb->capacity : INT_MAX;
	MPI_Start(&r->hreq);
	MPI_Irecv(r->mb->data, (int)cap, MPI_BYTE, l->peer, l->tag_data, T->comm, &r->dreq);
	r->state = X_POSTED;
	fifo_push(T, l, i);
}

/* Give free receive slots a buffer and post them; each re-post is a credit for the sender. */
static bool fill_slots(mbp_mpi_trainer *T, struct link *l, bool credit)
{
	bool act = false;
	for (uint32_t i = 0; i < T->mo.window; i++) {
		struct xrslot *r = &l->rs[i];
		if (r->state != X_FREE)
			continue;
		if (mbp_pool_get(mbp__trainer_pool(T->t), NULL, &r->mb, 0) != 0)
			break;
		post_slot(T, l, (int)i);
		l->owed += credit;
		act = true;
	}
	return act;
}

static void step_window(mbp_mpi_trainer *T, uint64_t *open, uint64_t *closed)
{
	pthread_mutex_lock(&T->lock);
	*open = T->open;
	*closed = T->closed;
	pthread_mutex_unlock(&T->lock);
}

/* Arrivals in posting order: into the stage's ring (the open step's), dropped (a closed step's), or left
 * at the head (a step not begun here yet). */
static bool recv_io(mbp_mpi_trainer *T, struct link *l)
{
	bool act = false;
	uint64_t open, closed;
	step_window(T, &open, &closed);
	while (l->fn) {
		int i = l->fifo[l->fhead], flag = 0;
		struct xrslot *r = &l->rs[i];
		if (r->state == X_POSTED) {
			MPI_Request rq[2] = {r->hreq, r->dreq};
			MPI_Testall(2, rq, &flag, MPI_STATUSES_IGNORE);
			if (!flag)
				break;
			r->dreq = MPI_REQUEST_NULL;
			r->state = X_ARRIVED;
			/* relaxed: a statistic */
			atomic_fetch_add_explicit(&T->received, 1, memory_order_relaxed);
			act = true;
		}
		if (r->h.attempt <= closed) {
			fifo_pop(T, l);
			/* relaxed: a statistic */
			atomic_fetch_add_explicit(&T->dropped, 1, memory_order_relaxed);
			post_slot(T, l, i);
			l->owed++;
			act = true;
			continue;
		}
		if (r->h.attempt != open)
			break;
		mbp_mb *mb = r->mb;
		mb->seq = r->h.mb;
		mb->rows = r->h.rows;
		mb->row_bytes = r->h.row_bytes;
		MBP_VERIFY(mbp__trainer_link_push(T->t, l->ring, mb)); /* the ring holds max_mbs */
		fifo_pop(T, l);
		r->mb = NULL;
		r->state = X_FREE;
		act = true;
	}
	act |= fill_slots(T, l, true);
	int flag = 0;
	if (l->cred_active) {
		MPI_Test(&l->cred_req, &flag, MPI_STATUS_IGNORE);
		l->cred_active = !flag;
	}
	if (!l->cred_active && l->owed) {
		l->cred = l->owed;
		l->owed = 0;
		MPI_Isend(&l->cred, 1, MPI_UINT32_T, l->peer, l->tag_cred, T->comm, &l->cred_req);
		l->cred_active = act = true;
	}
	return act;
}

/* Finished sends give their buffers back; credits come in; the stage's ring is sent on while they last. */
static bool send_io(mbp_mpi_trainer *T, struct link *l)
{
	bool act = false;
	mbp_pool *pool = mbp__trainer_pool(T->t);
	for (uint32_t i = 0; i < T->mo.window; i++) {
		struct xslot *s = &l->ss[i];
		int flag = 0;
		if (!s->busy)
			continue;
		MPI_Testall(2, s->req, &flag, MPI_STATUSES_IGNORE);
		if (!flag)
			continue;
		s->busy = false;
		mbp_pool_put(pool, NULL, s->mb);
		s->mb = NULL;
		act = true;
	}
	int flag = 0;
	MPI_Test(&l->cred_req, &flag, MPI_STATUS_IGNORE);
	if (flag) {
		l->credits += l->cred;
		MPI_Start(&l->cred_req);
		act = true;
	}
	for (uint32_t i = 0; i < T->mo.window; i++) {
		struct xslot *s = &l->ss[i];
		if (s->busy)
			continue;
		if (l->credits == 0) {
			if (!l->stalled && mbp__trainer_link_count(T->t, l->ring)) {
				l->stalled = true;
				/* relaxed: a statistic */
				atomic_fetch_add_explicit(&T->credit_waits, 1, memory_order_relaxed);
			}
			break;
		}
		l->stalled = false;
		mbp_mb *mb;
		if (!mbp__trainer_link_pop(T->t, l->ring, &mb))
			break;
		/* the step the item belongs to: the open one (its push came after the step began here) */
		pthread_mutex_lock(&T->lock);
		s->h = (struct lhdr){.attempt = T->open,
				     .mb = (uint32_t)mb->seq,
				     .rows = mb->rows,
				     .row_bytes = mb->row_bytes};
		pthread_mutex_unlock(&T->lock);
		s->mb = mb;
		s->busy = true;
		MPI_Isend(&s->h, sizeof(s->h), MPI_BYTE, l->peer, l->tag_hdr, T->comm, &s->req[0]);
		MPI_Isend(mb->data, (int)((size_t)mb->rows * mb->row_bytes), MPI_BYTE, l->peer, l->tag_data,
			  T->comm, &s->req[1]);
		l->credits--;
		atomic_fetch_add_explicit(&T->sent, 1, memory_order_relaxed); /* relaxed: a statistic */
		act = true;
	}
	return act;
}

static const uint32_t cmd_order[] = {C_STOPPED, C_CANCEL, C_ABORT, C_LEAVE, C_STEP, C_STOP, C_HB};

/* Rank r left the run (destroyed its trainer while the run went on): the run ends with -ECONNRESET on
 * every rank; rank 0 ends it once the step under way closes (lock held). */
static void left_locked(mbp_mpi_trainer *T, int r)
{
	if (T->run_err)
		return;
	T->run_err = -ECONNRESET;
	T->left_rank = r;
	snprintf(T->err, sizeof(T->err),
		 "rank %d left the run: its trainer was destroyed while the run went on", r);
	if (T->rank == 0)
		T->stop_req = true;
	pthread_cond_broadcast(&T->cond);
}

/* A control message from peer p (lock held). */
static void on_ctrl(mbp_mpi_trainer *T, int p, const struct tctrl *c)
{
	switch (c->cmd) {
	case C_STEP:
		T->attempt = c->attempt;
		T->cmd_rows = c->rows;
		T->cmd_mb_rows = c->mb_rows;
		if (T->tgt) {
			MPI_Irecv(T->tgt, (int)(c->rows * T->o.target_row_bytes), MPI_BYTE, 0, TAG_TGT,
				  T->comm, &T->tgt_req);
			T->tgt_active = true;
		} else {
			T->cmd_ready = true;
			pthread_cond_broadcast(&T->cond);
		}
		break;
	case C_ABORT:
		if (c->attempt == T->open && c->attempt > T->closed)
			mbp__trainer_abort(T->t);
		else if (c->attempt > T->closed)
			T->abort_attempt = c->attempt;
		break;
	case C_CANCEL:
		T->cancelled = true;
		if (T->open > T->closed)
			mbp__trainer_abort(T->t);
		break;
	case C_LEAVE:
		if (!T->stop_req)
			left_locked(T, p);
		if (T->open > T->closed)
			mbp__trainer_abort(T->t);
		break;
	case C_STOP:
		if (c->rows)
			left_locked(T, (int)c->mb_rows); /* the reason rank 0 ends the run */
		T->stopped = true;
		T->peers[p].pending |= 1u << C_STOPPED;
		pthread_cond_broadcast(&T->cond);
		break;
	case C_STOPPED:
		T->stopped_peers++;
		break;
	}
}

static bool ctrl_io(mbp_mpi_trainer *T, bool *leave)
{
	bool act = false;
	uint64_t now = mbp__now_ns();
	uint64_t hb = T->mo.peer_timeout_ns > 0 ? (uint64_t)T->mo.peer_timeout_ns / 4 : 0;
	for (int p = 0; p < T->size; p++) {
		if (p == T->rank)
			continue;
		struct peer *k = &T->peers[p];
		int flag = 0;
		/* the lock: other threads set pending bits (a step, a cancel, the end) */
		pthread_mutex_lock(&T->lock);
		MPI_Test(&k->rreq, &flag, MPI_STATUS_IGNORE);
		if (flag) {
			struct tctrl c = k->in;
			k->last_heard = now;
			MPI_Start(&k->rreq);
			on_ctrl(T, p, &c);
			act = true;
		}
		if (k->sactive) {
			MPI_Test(&k->sreq, &flag, MPI_STATUS_IGNORE);
			if (flag) {
				k->sactive = false;
				if (k->out.cmd == C_STOPPED)
					*leave = true; /* this rank's last word */
			}
		}
		if (hb && k->watch && now - k->last_sent >= hb)
			k->pending |= 1u << C_HB;
		if (k->sactive || !k->pending || *leave) {
			/* after STOPPED nothing more: a message left on the wire as this rank frees the
			 * communicator could reach the next run's (MPI reuses its context) */
			pthread_mutex_unlock(&T->lock);
			continue;
		}
		for (unsigned o = 0; o < MBP_ARRAY_SIZE(cmd_order); o++) {
			uint32_t bit = 1u << cmd_order[o];
			if (!(k->pending & bit))
				continue;
			if (cmd_order[o] == C_STOPPED &&
			    (T->vote_state == V_PENDING || T->vote_state == V_ACTIVE))
				continue; /* the last word waits for this rank's part of the last vote */
			k->pending &= ~bit;
			memset(&k->out, 0, sizeof(k->out));
			k->out.cmd = cmd_order[o];
			if (k->out.cmd == C_ABORT)
				k->out.attempt = k->abort_attempt;
			if (k->out.cmd == C_STOP && T->run_err == -ECONNRESET) {
				/* why the run ends: a rank left */
				k->out.rows = (uint64_t)-T->run_err;
				k->out.mb_rows = (uint32_t)T->left_rank;
			}
			if (k->out.cmd == C_STEP) {
				k->out.attempt = T->attempt;
				k->out.rows = T->cmd_rows;
				k->out.mb_rows = T->cmd_mb_rows;
			}
			MPI_Isend(&k->out, sizeof(k->out), MPI_BYTE, p, TAG_CTRL, T->comm, &k->sreq);
			k->sactive = true;
			k->last_sent = now;
			act = true;
			break;
		}
		pthread_mutex_unlock(&T->lock);
	}
	return act;
}

/* The step closes here: nothing more goes into its rings; what the outgoing rings hold is dropped. */
static void close_step_locked(mbp_mpi_trainer *T)
{
	T->closed = T->open > T->closed ? T->open : T->closed;
	T->open = 0;
	mbp_pool *pool = mbp__trainer_pool(T->t);
	mbp_mb *mb;
	for (unsigned i = 0; i < T->nlinks; i++)
		while (T->links[i].send && mbp__trainer_link_pop(T->t, T->links[i].ring, &mb))
			mbp_pool_put(pool, NULL, mb);
}

/* Everyone's votes in: the same decision on every rank. */
static void tally_locked(mbp_mpi_trainer *T)
{
	struct mbp__train_vote *v = &T->result;
	memset(v, 0, sizeof(*v));
	v->ok = true;
	int pick = -1;
	for (int r = 0; r < T->size; r++) {
		const struct vrec *a = &T->all[r];
		v->ok &= a->ok != 0;
		if (a->left)
			left_locked(T, r);
		for (unsigned s = T->first_of[r]; s < T->first_of[r + 1]; s++)
			v->grad_sq[s] = a->grad_sq[s];
		/* the step's error: the failing stage with the lowest index, else the first rank's */
		if (a->err && (pick < 0 ||
			       (a->stage >= 0 && (T->all[pick].stage < 0 || a->stage < T->all[pick].stage))))
			pick = r;
	}
	v->loss = T->all[T->size - 1].loss;
	v->err = (mbp_train_error){.err = -ECANCELED, .stage = -1, .mb = -1};
	if (pick >= 0)
		v->err = (mbp_train_error){.err = T->all[pick].err,
					   .stage = T->all[pick].stage,
					   .mb = T->all[pick].mb,
					   .op = (mbp_op_kind)T->all[pick].op};
	if (v->ok)
		v->err = (mbp_train_error){0};
}

/* Rank 0's step starts: STEP to every rank, the targets to the last. The vote. */
static bool step_io(mbp_mpi_trainer *T)
{
	bool act = false;
	int flag = 0;
	pthread_mutex_lock(&T->lock);
	if (T->tgt_pending && !T->tgt_active) {
		T->tgt_pending = false;
		MPI_Isend(T->tgt_send, (int)T->tgt_bytes, MPI_BYTE, T->size - 1, TAG_TGT, T->comm,
			  &T->tgt_req);
		T->tgt_active = act = true;
	}
	if (T->tgt_active) {
		MPI_Test(&T->tgt_req, &flag, MPI_STATUS_IGNORE);
		if (flag) {
			T->tgt_active = false;
			if (T->rank != 0)
				T->cmd_ready = true; /* the last rank: the step's targets are in */
			/* the last rank's step may run; rank 0's step may return (the caller's targets are free) */
			pthread_cond_broadcast(&T->cond);
			act = true;
		}
	}
	if (T->fail_attempt) {
		for (int p = 0; p < T->size; p++)
			if (p != T->rank) {
				T->peers[p].pending |= 1u << C_ABORT;
				T->peers[p].abort_attempt = T->fail_attempt;
			}
		T->fail_attempt = 0;
		act = true;
	}
	if (T->vote_state == V_PENDING) {
		MPI_Iallgather(&T->mine, sizeof(T->mine), MPI_BYTE, T->all, sizeof(T->mine), MPI_BYTE,
			       T->comm, &T->vote_req);
		T->vote_state = V_ACTIVE;
		act = true;
	}
	if (T->vote_state == V_ACTIVE) {
		MPI_Test(&T->vote_req, &flag, MPI_STATUS_IGNORE);
		if (flag && T->rank == 0 && T->tgt_active) {
			/* the last rank took this step's targets before it could vote */
			MPI_Wait(&T->tgt_req, MPI_STATUS_IGNORE);
			T->tgt_active = false;
		}
		if (flag) {
			tally_locked(T);
			close_step_locked(T);
			T->vote_state = V_DONE;
			pthread_cond_broadcast(&T->cond);
			act = true;
		}
	}
	pthread_mutex_unlock(&T->lock);
	return act;
}

/* A rank leaving mid-run (lock held): LEAVE to rank 0, and a vote of no, with the ABORT a failing stage
 * sends, on every step rank 0 starts until its STOP (the others wait for this rank's vote). */
static bool leave_io_locked(mbp_mpi_trainer *T)
{
	if (!T->leaving)
		return false;
	bool act = false;
	if (!T->leave_told && !T->stopped) { /* once told to stop, its STOPPED says all */
		T->peers[0].pending |= 1u << C_LEAVE;
		T->leave_told = act = true;
	}
	if (T->vote_state == V_DONE) {
		T->closed = T->leave_vote; /* its arrivals are dropped from now on */
		T->vote_state = V_IDLE;
		act = true;
	}
	if (T->vote_state == V_IDLE && T->attempt > T->closed && !T->tgt_active) {
		memset(&T->mine, 0, sizeof(T->mine));
		T->mine.err = -ECONNRESET;
		T->mine.stage = T->mine.mb = -1;
		T->mine.left = 1;
		T->leave_vote = T->fail_attempt = T->attempt;
		T->vote_state = V_PENDING;
		act = true;
	}
	return act;
}

static bool watchdog(mbp_mpi_trainer *T)
{
	if (T->mo.peer_timeout_ns < 0)
		return false;
	uint64_t now = mbp__now_ns();
	for (int p = 0; p < T->size; p++) {
		struct peer *k = &T->peers[p];
		if (p == T->rank || !k->watch || now - k->last_heard <= (uint64_t)T->mo.peer_timeout_ns)
			continue;
		pthread_mutex_lock(&T->lock);
		T->dead = true;
		T->run_err = -ETIMEDOUT;
		snprintf(T->err, sizeof(T->err),
			 "rank %d stopped answering: nothing heard from it for %.1f s", p,
			 (double)(now - k->last_heard) / 1e9);
		if (T->open > T->closed)
			mbp__trainer_abort(T->t);
		pthread_cond_broadcast(&T->cond);
		pthread_mutex_unlock(&T->lock);
		fprintf(stderr, "mbpipe-mpi: rank %d: %s\n", T->rank, T->err);
		mbp__mpi_abort_at_end();
		return true;
	}
	return false;
}

static void setup_loop(mbp_mpi_trainer *T)
{
	uint64_t now = mbp__now_ns();
	for (unsigned i = 0; i < T->nlinks; i++) {
		struct link *l = &T->links[i];
		if (l->send) {
			l->credits = T->mo.window;
			for (uint32_t j = 0; j < T->mo.window; j++)
				l->ss[j].req[0] = l->ss[j].req[1] = MPI_REQUEST_NULL;
			MPI_Recv_init(&l->cred, 1, MPI_UINT32_T, l->peer, l->tag_cred, T->comm, &l->cred_req);
			MPI_Start(&l->cred_req);
		} else {
			for (uint32_t j = 0; j < T->mo.window; j++) {
				MPI_Recv_init(&l->rs[j].h, sizeof(l->rs[j].h), MPI_BYTE, l->peer, l->tag_hdr,
					      T->comm, &l->rs[j].hreq);
				l->rs[j].dreq = MPI_REQUEST_NULL;
			}
			l->cred_req = MPI_REQUEST_NULL;
			fill_slots(T, l, false);
		}
	}
	for (int p = 0; p < T->size; p++) {
		if (p == T->rank)
			continue;
		struct peer *k = &T->peers[p];
		k->watch = T->rank == 0 || p == 0;
		k->last_heard = k->last_sent = now;
		k->sreq = MPI_REQUEST_NULL;
		MPI_Recv_init(&k->in, sizeof(k->in), MPI_BYTE, p, TAG_CTRL, T->comm, &k->rreq);
		MPI_Start(&k->rreq);
	}
	T->vote_req = T->tgt_req = MPI_REQUEST_NULL;
}

static void teardown_loop(mbp_mpi_trainer *T, bool dead)
{
	uint64_t dl = mbp__now_ns() + (dead ? 100 : 2000) * (uint64_t)1000000;
	mbp_pool *pool = mbp__trainer_pool(T->t);
	for (unsigned i = 0; i < T->nlinks; i++) {
		struct link *l = &T->links[i];
		for (uint32_t j = 0; j < T->mo.window; j++) {
			if (l->send) {
				struct xslot *s = &l->ss[j];
				if (s->busy) {
					mbp__mpi_finish(&s->req[0], false, dl);
					mbp__mpi_finish(&s->req[1], false, dl);
					mbp_pool_put(pool, NULL, s->mb);
					s->busy = false;
				}
				continue;
			}
			struct xrslot *r = &l->rs[j];
			if (r->state == X_POSTED) {
				mbp__mpi_finish(&r->hreq, true, dl);
				mbp__mpi_finish(&r->dreq, true, dl);
			}
			MPI_Request_free(&r->hreq);
			if (r->mb)
				mbp_pool_put(pool, NULL, r->mb);
			r->mb = NULL;
			r->state = X_FREE;
		}
		mbp__mpi_finish(&l->cred_req, l->send, dl);
		if (l->send && l->cred_req != MPI_REQUEST_NULL)
			MPI_Request_free(&l->cred_req);
	}
	for (int p = 0; p < T->size; p++) {
		if (p == T->rank)
			continue;
		struct peer *k = &T->peers[p];
		mbp__mpi_finish(&k->rreq, true, dl);
		MPI_Request_free(&k->rreq);
		if (k->sactive)
			mbp__mpi_finish(&k->sreq, false, dl);
	}
	mbp__mpi_finish(&T->tgt_req, T->rank != 0, dl);
	pthread_mutex_lock(&T->lock);
	T->tgt_pending = T->tgt_active = false;
	close_step_locked(T);
	pthread_mutex_unlock(&T->lock);
	if (!dead && T->comm != MPI_COMM_NULL)
		MPI_Comm_free(&T->comm);
}

static int link_loop(void *arg)
{
	mbp_mpi_trainer *T = arg;
	setup_loop(T);
	uint64_t last_act = mbp__now_ns();
	bool stop_sent = false, leave = false, dead = false;
	while (!leave) {
		mbp__mpi_check_abort();
		bool act = false;
		for (unsigned i = 0; i < T->nlinks; i++)
			act |= T->links[i].send ? send_io(T, &T->links[i]) : recv_io(T, &T->links[i]);
		act |= step_io(T);
		if (T->size > 1)
			act |= ctrl_io(T, &leave);
		if (T->size > 1 && watchdog(T)) {
			dead = true;
			break;
		}
		pthread_mutex_lock(&T->lock);
		act |= leave_io_locked(T);
		if (T->rank == 0) {
			if (T->stop_req && !stop_sent && T->open <= T->closed) {
				for (int p = 1; p < T->size; p++)
					T->peers[p].pending |= 1u << C_STOP;
				stop_sent = act = true;
			}
			if (stop_sent && T->stopped_peers == (uint32_t)T->size - 1) {
				bool quiet = true;
				for (int p = 1; p < T->size; p++)
					quiet &= !T->peers[p].sactive && !T->peers[p].pending;
				leave = quiet;
			}
		}
		uint64_t now = mbp__now_ns();
		if (act) {
			last_act = now;
		} else if (!leave && now - last_act > T->mo.spin_ns) {
			/* seq_cst: partner of the fence in hook_kick() */
			atomic_store_explicit(&T->sleeping, 1, memory_order_seq_cst);
			bool work = T->vote_state == V_PENDING || T->fail_attempt || T->tgt_pending;
			for (int p = 0; p < T->size; p++)
				work |= p != T->rank && T->peers[p].pending && !T->peers[p].sactive;
			for (unsigned i = 0; i < T->nlinks; i++)
				work |= T->links[i].send && T->links[i].credits &&
					mbp__trainer_link_count(T->t, T->links[i].ring);
			if (!work) {
				struct timespec ts;
				mbp__mpi_deadline((int64_t)mbp__mpi_park_ns(now - last_act, T->mo.idle_ns),
						  &ts);
				pthread_cond_timedwait(&T->wake, &T->lock, &ts);
			}
			atomic_store_explicit(&T->sleeping, 0, memory_order_seq_cst); /* seq_cst: as above */
		}
		pthread_mutex_unlock(&T->lock);
		if (!act && !leave && mbp__now_ns() - last_act <= T->mo.spin_ns)
			sched_yield();
	}
	teardown_loop(T, dead);
	pthread_mutex_lock(&T->lock);
	T->state = S_ENDED;
	pthread_cond_broadcast(&T->cond);
	pthread_mutex_unlock(&T->lock);
	return 0;
}

/* ---- steps ---- */

/* Why no step can run any more (lock held): the run's error (a failed start, a silent rank), else
 * -ESHUTDOWN. */
static int ended_rc_locked(const mbp_mpi_trainer *T)
{
	return T->run_err ? T->run_err : -ESHUTDOWN;
}

/* The state, read under the lock (the loop's thread writes S_ENDED). */
static int state_of(mbp_mpi_trainer *T)
{
	pthread_mutex_lock(&T->lock);
	int st = T->state;
	pthread_mutex_unlock(&T->lock);
	return st;
}

/* Ranks other than 0: wait for rank 0's next step and run this rank's part of it. *ended: the run is
 * over (the return value says why). */
static int serve_step(mbp_mpi_trainer *T, double *loss, bool *ended)
{
	pthread_mutex_lock(&T->lock);
	while (!T->cmd_ready) {
		if (T->dead || T->stopped || T->state != S_RUNNING) {
			int rc = ended_rc_locked(T);
			if (rc == -ESHUTDOWN && T->cancelled)
				rc = -ECANCELED;
			*ended = true;
			pthread_mutex_unlock(&T->lock);
			return rc;
		}
		pthread_cond_wait(&T->cond, &T->lock);
	}
	T->cmd_ready = false;
	size_t rows = (size_t)T->cmd_rows;
	uint32_t mb_rows = T->cmd_mb_rows;
	pthread_mutex_unlock(&T->lock);
	return mbp__trainer_step_remote(T->t, NULL, T->rank == T->size - 1 ? T->tgt : NULL, rows, mb_rows,
					loss);
}

int mbp_mpi_trainer_step(mbp_mpi_trainer *T, const void *in, const void *targets, size_t rows,
			 uint32_t mb_rows, double *loss)
{
	if (!T)
		return -EINVAL;
	if (state_of(T) == S_NEW)
		return -ENOTCONN;
	if (T->rank != 0) {
		if (in || targets || rows || mb_rows)
			return -EINVAL;
		bool ended = false;
		int rc = serve_step(T, loss, &ended);
		return ended && rc == -ECANCELED ? -ESHUTDOWN : rc;
	}
	if (!in || !targets)
		return -EINVAL;
	int rc = mbp__train_size_check(rows, mb_rows, T->o.max_mb_rows, T->o.max_mbs);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&T->lock);
	if (T->state != S_RUNNING || T->dead || T->cancelled || T->draining || T->stop_req) {
		rc = ended_rc_locked(T);
		pthread_mutex_unlock(&T->lock);
		return rc;
	}
	T->attempt++;
	T->cmd_rows = rows;
	T->cmd_mb_rows = mb_rows;
	for (int p = 1; p < T->size; p++)
		T->peers[p].pending |= 1u << C_STEP;
	if (T->size > 1) {
		T->tgt_send = targets;
		T->tgt_bytes = rows * T->o.target_row_bytes;
		T->tgt_pending = true;
	}
	wake_loop_locked(T);
	pthread_mutex_unlock(&T->lock);
	rc = mbp__trainer_step_remote(T->t, in, T->size == 1 ? targets : NULL, rows, mb_rows, loss);
	/* the caller's targets are in use until their send is done (or the run is over: the loop finished
	 * or abandoned the send as it left) */
	pthread_mutex_lock(&T->lock);
	while ((T->tgt_pending || T->tgt_active) && T->state == S_RUNNING)
		pthread_cond_wait(&T->cond, &T->lock);
	pthread_mutex_unlock(&T->lock);
	return rc;
}

int mbp_mpi_trainer_serve(mbp_mpi_trainer *T)
{
	if (!T)
		return -EINVAL;
	if (T->rank == 0)
		return -EPERM;
	if (state_of(T) == S_NEW)
		return -ENOTCONN;
	for (;;) {
		bool ended = false;
		int rc = serve_step(T, NULL, &ended);
		if (ended)
			return rc == -ESHUTDOWN ? 0 : rc;
	}
}

int mbp_mpi_trainer_cancel(mbp_mpi_trainer *T)
{
	if (!T)
		return -EINVAL;
	if (T->rank != 0)
		return -EPERM;
	pthread_mutex_lock(&T->lock);
	T->cancelled = true;
	for (int p = 1; T->peers && p < T->size; p++)
		T->peers[p].pending |= 1u << C_CANCEL;
	wake_loop_locked(T);
	pthread_mutex_unlock(&T->lock);
	mbp_trainer_cancel(T->t);
	return 0;
}

int mbp_mpi_trainer_drain(mbp_mpi_trainer *T)
{
	if (!T)
		return -EINVAL;
	if (T->rank != 0)
		return -EPERM;
	pthread_mutex_lock(&T->lock);
	T->draining = true;
	pthread_mutex_unlock(&T->lock);
	return 0;
}

mbp_trainer *mbp__mpi_trainer_local(mbp_mpi_trainer *T)
{
	return T->t;
}

int mbp_mpi_trainer_error(const mbp_mpi_trainer *T, mbp_train_error *e)
{
	if (!T || !e)
		return -EINVAL;
	return mbp_trainer_error(T->t, e);
}

const char *mbp_mpi_trainer_run_error(const mbp_mpi_trainer *T)
{
	return T ? T->err : "";
}

int mbp_mpi_trainer_stats_get(mbp_mpi_trainer *T, mbp_mpi_train_stats *st, mbp_train_stage_stats *ss,
			      unsigned n)
{
	if (!T || !st)
		return -EINVAL;
	memset(st, 0, sizeof(*st));
	int rc = mbp_trainer_stats_get(T->t, &st->local, ss, n);
	if (rc < 0)
		return rc;
	st->rank = (uint32_t)T->rank;
	st->ranks = (uint32_t)T->size;
	st->stage0 = T->stage0;
	st->stages = T->stages;
	/* relaxed, each: statistics, written by the communication thread alone */
	st->sent = atomic_load_explicit(&T->sent, memory_order_relaxed);
	st->received = atomic_load_explicit(&T->received, memory_order_relaxed);
	st->dropped = atomic_load_explicit(&T->dropped, memory_order_relaxed);
	st->credit_waits = atomic_load_explicit(&T->credit_waits, memory_order_relaxed);
	return rc;
}

void mbp_mpi_trainer_destroy(mbp_mpi_trainer *T)
{
	if (!T)
		return;
	pthread_mutex_lock(&T->lock);
	if (T->state == S_RUNNING) {
		/* rank 0 ends the run; the others wait for it to, and one that is not told to end yet tells
		 * rank 0 it leaves (rank 0 would wait for its votes) */
		T->leaving = T->rank != 0 && !T->stopped;
		T->stop_req = true;
		wake_loop_locked(T);
		while (T->state == S_RUNNING)
			pthread_cond_wait(&T->cond, &T->lock);
	}
	pthread_mutex_unlock(&T->lock);
	if (T->loop_ticket)
		mbp__mpi_await(T->loop_ticket);
	if (T->peers) {
		/* a run that ended on a silent rank: a step's last pushes may have come after the loop left */
		pthread_mutex_lock(&T->lock);
		close_step_locked(T);
		pthread_mutex_unlock(&T->lock);
	}
	mbp_trainer_destroy(T->t);
	for (unsigned i = 0; i < T->nlinks; i++) {
		free(T->links[i].ss);
		free(T->links[i].rs);
		free(T->links[i].fifo);
	}
	free(T->peers);
	free(T->all);
	free(T->tgt);
	pthread_cond_destroy(&T->cond);
	pthread_cond_destroy(&T->wake);
	pthread_mutex_destroy(&T->lock);
	free(T);
}
