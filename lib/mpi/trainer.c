/*
 * Training across MPI ranks: each rank's mbp_trainer holds its stages of the whole pipeline (by rank, or
 * as a chunked or custom schedule places them on its threads) and follows the whole schedule
 * (train_internal.h); this file is the agent at the far end of its rings to other ranks, on a run
 * (loop.c) with a send and a receive link to each rank a hop joins, the header's flags naming the stage
 * an item goes to. A header carries the step's attempt (every step rank 0 starts, failed or not): an
 * arrival of a step this rank has closed is dropped (a failed step leaves some on the wire), one of a
 * step it has not begun waits at the head of the window.
 *
 * A step. Rank 0 sends every rank STEP (attempt, rows, micro-batch rows) and the last stage's rank the
 * targets. A stage that fails makes its rank send ABORT (attempt) to every other rank (the channel is a
 * mesh), which fail their step with it. At the first barrier the trainers vote (an MPI_Iallgather):
 * every rank makes the same decision, the update only if all are ok, the gradient norm summed in stage
 * order (bit for bit the single process's), the error the failing stage with the lowest index. Closing
 * the step drops what the outgoing rings still hold. Rank 0 ends the run at destroy: the quiet stop.
 */
#include "config.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "mpi_internal.h"
#include "train_internal.h"

enum { TAG_TGT = 28 };
enum { V_IDLE = 0, V_PENDING, V_ACTIVE, V_DONE };

/* One rank's vote on the wire: its trainer's (err.what NULL: a pointer means nothing on another rank). */
struct vrec {
	struct mbp__train_vote v;
	int32_t left; /* the rank's trainer is being destroyed mid-run: it ran no part of this step */
};

struct mbp_mpi_trainer {
	struct mbp__run r; /* first: the base */
	mbp_trainer *t;
	mbp_train_opts o;
	unsigned stage0, stages;
	int rank_of[MBP_MAX_STAGES];	  /* each global stage's rank */
	int16_t local_of[MBP_MAX_STAGES]; /* each global stage's index here, -1: another rank's */
	int loss_rank;			  /* the global last stage's */
	/* the rings going out to another rank, each with its peer and the route at the far end: the
	 * stage it goes to, << 1, | 1 for a gradient (into its DOWN_BWD ring, else UP_FWD). A group: the
	 * nu rings of one stage's replicas to the same route, consecutive, replica k's at k; they go out
	 * in micro-batch order (the loop's `next` in the group's first: the receiving rings keep it) */
	struct route {
		int ring, peer;
		uint32_t dest;
		unsigned nu, next;
	} out[2 * MBP_MAX_STAGES];
	unsigned nout;
	unsigned char *tgt; /* the loss rank (not 0): the step's targets */

	/* under r.lock */
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
	uint64_t abort_out;	/* the step the ABORT going out names */
	bool draining, stop_req, stopped;
	bool leaving;	     /* others: destroy mid-run; vote no on every step until rank 0's STOP */
	bool leave_told;     /* LEAVE is queued for rank 0 */
	uint64_t leave_vote; /* the step this leaving rank voted on */
	int left_rank;	     /* the rank that left (err -ECONNRESET) */
	int vote_state;
	struct vrec mine;
	struct mbp__train_vote result;

	/* the loop's */
	struct vrec *all;
	MPI_Request vote_req, tgt_req;
	bool tgt_active;
	_Atomic uint64_t dropped;
	_Atomic bool hold; /* tests: arrivals of the open step wait at the head until it closes */
};

static mbp_mpi_trainer *of(struct mbp__run *r)
{
	return mbp__container_of(r, mbp_mpi_trainer, r);
}

/* ---- hooks from the trainer (its threads) ---- */

static void hook_kick(void *arg)
{
	mbp_mpi_trainer *T = arg;
	mbp__run_kick(&T->r); /* after the ring push (release): the loop's pass sees the item */
}

static void hook_begin(void *arg)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->r.lock);
	T->open = T->attempt;
	if (T->r.cancelled || T->r.dead || T->r.err || T->abort_attempt == T->open)
		mbp__trainer_abort(T->t);
	mbp__run_kick(&T->r);
	pthread_mutex_unlock(&T->r.lock);
}

static void hook_failed(void *arg)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->r.lock);
	T->fail_attempt = T->open;
	mbp__run_kick(&T->r);
	pthread_mutex_unlock(&T->r.lock);
}

static void hook_agree(void *arg, struct mbp__train_vote *v)
{
	mbp_mpi_trainer *T = arg;
	pthread_mutex_lock(&T->r.lock);
	if (!T->r.dead) {
		/* as it is: the tally reads a stage's grad_sq from its own rank's vote only */
		T->mine = (struct vrec){.v = *v};
		T->mine.v.err.what = NULL;
		T->vote_state = V_PENDING;
		mbp__run_kick(&T->r);
		while (T->vote_state != V_DONE && !T->r.dead && T->r.state == MBP__RUN_RUNNING)
			mbp__run_wait(&T->r, NULL);
	}
	if (T->vote_state == V_DONE) {
		*v = T->result;
	} else {
		v->ok = false;
		v->err = (mbp_train_error){.err = T->r.err ? T->r.err : -ESHUTDOWN, .stage = -1, .mb = -1};
	}
	T->vote_state = V_IDLE;
	pthread_mutex_unlock(&T->r.lock);
}

/* ---- construction ---- */

static const struct mbp__run_ops ops;

int mbp_mpi_trainer_new(mbp_mpi_trainer **tp, const mbp_train_opts *o, const mbp_mpi_opts *mo)
{
	if (!tp || !o)
		return -EINVAL;
	struct mbp__run *r;
	int rc = mbp__run_new(&r, sizeof(mbp_mpi_trainer), &ops, mo, o->in_row_bytes);
	if (rc)
		return rc;
	mbp_mpi_trainer *T = of(r);
	T->vote_req = T->tgt_req = MPI_REQUEST_NULL;
	if ((rc = mbp_trainer_new(&T->t, o)) != 0) {
		mbp_mpi_trainer_destroy(T);
		return rc;
	}
	T->o = *mbp__trainer_opts(T->t); /* with its defaults */
	*tp = T;
	return 0;
}

int mbp_mpi_trainer_add_stage(mbp_mpi_trainer *T, const mbp_train_stage_desc *d)
{
	if (!T || !d || T->r.state != MBP__RUN_NEW)
		return -EINVAL;
	if (d->grad_row_bytes && d->grad_row_bytes != d->out_row_bytes)
		return -ENOTSUP;
	return mbp__run_stage(&T->r, mbp_trainer_add_stage(T->t, d), d->out_row_bytes);
}

/* ---- start ---- */

/* The links: a send and a receive link with every rank a hop goes to or comes from, each carrying every
 * ring's items between the two (routed by the header's flags); the channel. */
static int alloc_run(mbp_mpi_trainer *T)
{
	struct mbp__run *r = &T->r;
	mbp_pool *pool = mbp__trainer_pool(T->t);
	if (!(T->all = calloc((size_t)r->size, sizeof(*T->all))))
		return -ENOMEM;
	if (r->rank == T->loss_rank && r->rank != 0) {
		size_t bytes = (size_t)T->o.max_mbs * T->o.max_mb_rows * T->o.target_row_bytes;
		if (!(T->tgt = malloc(bytes ? bytes : 1)))
			return -ENOMEM;
	}
	int rc = 0;
	for (int q = 0; q < r->size && !rc; q++) {
		bool peer = false;
		for (unsigned i = 0; i < T->nout; i++)
			peer |= T->out[i].peer == q;
		if (peer && !(rc = mbp__run_link(r, true, q, pool, NULL)))
			rc = mbp__run_link(r, false, q, pool, NULL);
	}
	return rc;
}

/* After the values every rank must share, each rank's own: its stages' replicas, 4 bits a stage
 * (replicas - 1), 16 stages a word. */
enum { HS_TGT = MBP__HS_SAME, HS_MBS, HS_SCHED, HS_CUSTOM, HS_REPS, HS_N = HS_REPS + MBP_MAX_STAGES / 16 };
enum { HS_OWN_N = HS_N - HS_REPS };

/* A rank's own value: its threads option, its widest rows. */
static uint64_t own_of(const mbp_mpi_trainer *T)
{
	return (uint64_t)(T->o.threads & 0xff) | (uint64_t)T->r.wide << 8;
}

/* The ranks' stages in the whole pipeline (mbp__train_place_ranks), from every rank's counts: the same on
 * every rank, or refused alike. */
static int place_ranks(mbp_mpi_trainer *T, const uint64_t *all, struct mbp__train_remote *rem)
{
	struct mbp__run *r = &T->r;
	unsigned n[MBP_MAX_STAGES], th[MBP_MAX_STAGES];
	for (int k = 0; k < r->size && k < MBP_MAX_STAGES; k++) {
		uint64_t own = all[(size_t)k * HS_N + MBP__HS_OWN];
		n[k] = (unsigned)all[(size_t)k * HS_N + MBP__HS_STAGES]; /* at least 1 (mbp__run_start) */
		th[k] = own & 0xff;
		rem->widest = own >> 8 > rem->widest ? own >> 8 : rem->widest;
	}
	int rc = mbp__train_place_ranks(&T->o, r->size, r->rank, n, th, T->rank_of, &T->stages, rem, r->msg,
					sizeof(r->msg));
	/* every stage's replicas, from its rank's words (a rank's stages ascend in global order) */
	unsigned next[MBP_MAX_STAGES] = {0};
	for (unsigned g = 0; rc == 0 && g < T->stages; g++) {
		int k = T->rank_of[g];
		unsigned i = next[k]++;
		rem->reps[g] = 1 + (unsigned)(all[(size_t)k * HS_N + HS_REPS + i / 16] >> (i % 16 * 4) & 15);
	}
	return rc;
}

/* The rings to and from other ranks, and where each goes there. */
static void route_rings(mbp_mpi_trainer *T)
{
	int me = T->r.rank;
	unsigned k = 0;
	T->nout = 0;
	for (unsigned g = 0; g < T->stages; g++) {
		T->local_of[g] = (int16_t)(T->rank_of[g] == me ? (int)k++ : -1);
		if (T->local_of[g] < 0)
			continue;
		/* each replica of the stage has its rings (train_internal.h): a group each way */
		unsigned u0, nu = mbp__trainer_units(T->t, (unsigned)T->local_of[g], &u0);
		for (unsigned u = u0; g > 0 && T->rank_of[g - 1] != me && u < u0 + nu; u++)
			T->out[T->nout++] = (struct route){mbp__train_link(u, MBP__LINK_UP_BWD),
							   T->rank_of[g - 1], (g - 1) << 1 | 1, nu, 0};
		for (unsigned u = u0; g + 1 < T->stages && T->rank_of[g + 1] != me && u < u0 + nu; u++)
			T->out[T->nout++] = (struct route){mbp__train_link(u, MBP__LINK_DOWN_FWD),
							   T->rank_of[g + 1], (g + 1) << 1, nu, 0};
	}
	T->loss_rank = T->rank_of[T->stages - 1];
}

/* Every rank passed the checks of the start: each rank's stages in the whole pipeline, its trainer on its
 * part of the node, the run's buffers. */
static int op_start(struct mbp__run *r, const uint64_t *all)
{
	mbp_mpi_trainer *T = of(r);
	struct mbp__train_remote rem = {.extra_buffers = 8,
					.node_k = r->node_k,
					.node_m = r->node_m,
					.arg = T,
					.kick = hook_kick,
					.begin = hook_begin,
					.failed = hook_failed,
					.agree = hook_agree};
	int rc = place_ranks(T, all, &rem);
	if (rc < 0)
		return rc;
	route_rings(T);
	for (T->stage0 = 0; T->local_of[T->stage0] < 0; T->stage0++)
		;
	rem.stage0 = T->stage0;
	rem.stages = T->stages;
	for (unsigned i = 0; i < T->nout; i++)
		rem.extra_buffers += 2 * r->mo.window; /* a receive window per peer, the sends' */
	rc = mbp__trainer_set_remote(T->t, &rem);
	if (rc == 0 && (rc = mbp_trainer_start(T->t)) != 0) {
		mbp_train_error te = {0};
		mbp_trainer_error(T->t, &te);
		if (te.err)
			mbp__run_fail(r, rc, "rank %d failed to start (stage %d): %s%s%s", r->rank, te.stage,
				      mbp_strerror(rc), te.what ? ": " : "", te.what ? te.what : "");
	}
	return rc ? rc : alloc_run(T);
}

int mbp_mpi_trainer_start(mbp_mpi_trainer *T)
{
	static const char *const names[] = {"target_row_bytes", "max_mbs", "schedule",
					    "custom schedule (a hash of its actions)"};
	if (!T)
		return -EINVAL;
	/* the widest rows here (wide counts the input's) or a step's targets */
	uint64_t most = mbp__mul_sat(T->r.wide, T->o.max_mb_rows),
		 tgt = mbp__mul_sat(T->o.target_row_bytes, (uint64_t)T->o.max_mb_rows * T->o.max_mbs);
	/* a placed schedule's hops are not from one rank to the next: no widths to compare by rank */
	bool placed = mbp__sched_kind_placed(T->o.schedule);
	uint64_t mine[HS_N] = {[MBP__HS_IN] = placed ? 0 : T->o.in_row_bytes,
			       [MBP__HS_OUT] = placed ? 0 : T->r.out_rb,
			       [MBP__HS_BYTES] = most > tgt ? most : tgt,
			       [MBP__HS_OWN] = own_of(T),
			       [MBP__HS_ROWS] = T->o.max_mb_rows,
			       [HS_TGT] = T->o.target_row_bytes,
			       [HS_MBS] = T->o.max_mbs,
			       [HS_SCHED] = (uint64_t)T->o.schedule,
			       [HS_CUSTOM] = mbp__train_schedule_hash(T->o.custom)};
	for (unsigned i = 0, u0; i < T->r.nstages; i++)
		mine[HS_REPS + i / 16] |= (uint64_t)(mbp__trainer_units(T->t, i, &u0) - 1) << (i % 16 * 4);
	return mbp__run_start(&T->r, mine, HS_N, HS_OWN_N, names, "micro-batches or a step's targets");
}

/* ---- the run's operations (the loop's thread) ---- */

/* The step closes here: nothing more goes into its rings; what the outgoing rings hold is dropped. */
static void close_step_locked(mbp_mpi_trainer *T)
{
	T->closed = T->open > T->closed ? T->open : T->closed;
	T->open = 0;
	mbp_pool *pool = mbp__trainer_pool(T->t);
	mbp_mb *mb;
	for (unsigned i = 0; i < T->nout; i++) {
		while (mbp__trainer_link_pop(T->t, T->out[i].ring, &mb))
			mbp_pool_put(pool, NULL, mb);
		T->out[i].next = 0;
	}
}

/* The ring of group i (its first route) that holds the group's next item, if any: the replica that runs
 * the next micro-batch (each replica's ring holds its own in order). */
static int next_ring(const mbp_mpi_trainer *T, unsigned i)
{
	const struct route *g = &T->out[i];
	return T->out[i + (g->nu > 1 ? g->next % g->nu : 0)].ring;
}

static bool op_next(struct mbp__run *r, struct mbp__link *l, struct mbp__hdr *h, mbp_mb **mb, void **item)
{
	mbp_mpi_trainer *T = of(r);
	unsigned i = 0;
	while (i < T->nout &&
	       (T->out[i].peer != l->peer || !mbp__trainer_link_pop(T->t, next_ring(T, i), mb)))
		i += T->out[i].nu;
	if (i >= T->nout)
		return false;
	if (T->out[i].nu > 1) /* (a schedule's stage runs its micro-batches in order: start refuses others) */
		MBP_VERIFY((*mb)->seq == T->out[i].next++);
	/* the step the item belongs to: the open one (its push came after the step began here) */
	pthread_mutex_lock(&r->lock);
	*h = (struct mbp__hdr){.seq = (*mb)->seq,
			       .tag = T->open,
			       .rows = (*mb)->rows,
			       .row_bytes = (*mb)->row_bytes,
			       .flags = T->out[i].dest};
	pthread_mutex_unlock(&r->lock);
	*item = *mb;
	return true;
}

static bool op_waiting(struct mbp__run *r, struct mbp__link *l)
{
	mbp_mpi_trainer *T = of(r);
	for (unsigned i = 0; i < T->nout; i += T->out[i].nu)
		if (T->out[i].peer == l->peer && mbp__trainer_link_count(T->t, next_ring(T, i)))
			return true;
	return false;
}

static void op_sent(struct mbp__run *r, struct mbp__link *l, void *item)
{
	(void)l;
	mbp_pool_put(mbp__trainer_pool(of(r)->t), NULL, item);
}

/* An arrival: into the stage's ring (the open step's), dropped (a closed step's), or left at the head (a
 * step not begun here yet). */
static int op_arrived(struct mbp__run *r, struct mbp__link *l, const struct mbp__hdr *h, mbp_mb *mb)
{
	mbp_mpi_trainer *T = of(r);
	pthread_mutex_lock(&r->lock);
	uint64_t open = T->open, closed = T->closed;
	pthread_mutex_unlock(&r->lock);
	if (h->tag <= closed) {
		mbp__counter_add(&T->dropped, 1); /* the loop is its only writer */
		return MBP__AGAIN;
	}
	/* relaxed: the test's flag, set between steps and ordered with nothing else */
	if (h->tag != open || atomic_load_explicit(&T->hold, memory_order_relaxed))
		return MBP__KEEP;
	mb->seq = h->seq;
	mb->rows = h->rows;
	mb->row_bytes = h->row_bytes;
	unsigned g = h->flags >> 1;
	MBP_VERIFY(g < T->stages && T->local_of[g] >= 0); /* a route of this run's placement */
	/* to the replica that runs micro-batch seq */
	int ring = mbp__trainer_link_of(T->t, (unsigned)T->local_of[g], (uint32_t)h->seq,
					h->flags & 1 ? MBP__LINK_DOWN_BWD : MBP__LINK_UP_FWD);
	MBP_VERIFY(mbp__trainer_link_push(T->t, ring, mb)); /* the ring holds max_mbs */
	return MBP__TAKEN;
}

/* Rank r left the run (destroyed its trainer while the run went on): the run ends with -ECONNRESET on
 * every rank; rank 0 ends it once the step under way closes (lock held). */
static void left_locked(mbp_mpi_trainer *T, int r)
{
	if (T->r.err)
		return;
	T->r.err = -ECONNRESET;
	T->left_rank = r;
	mbp__run_fail(&T->r, 0, "rank %d left the run: its trainer was destroyed while the run went on", r);
	if (T->r.rank == 0) {
		T->stop_req = true;
		mbp__run_end(&T->r);
	}
	pthread_cond_broadcast(&T->r.cond);
}

/* Everyone's votes in: the same decision on every rank (train_place.c's rule); a rank that left ends the
 * run. */
static void tally_locked(mbp_mpi_trainer *T)
{
	for (int r = 0; r < T->r.size; r++)
		if (T->all[r].left)
			left_locked(T, r);
	mbp__train_vote_tally(&T->all[0].v, sizeof(*T->all), T->r.size, T->rank_of, T->stages, &T->result);
}

/* A rank leaving mid-run (lock held): LEAVE to rank 0, and a vote of no, with the ABORT a failing stage
 * sends, on every step rank 0 starts until its STOP (the others wait for this rank's vote). */
static bool leave_step_locked(mbp_mpi_trainer *T)
{
	bool act = false;
	if (!T->leave_told && !T->stopped) { /* once told to stop, its STOPPED says all */
		mbp__ctl_post(&T->r, 0, MBP__CTL_LEAVE);
		T->leave_told = act = true;
	}
	if (T->vote_state == V_DONE) {
		T->closed = T->leave_vote; /* its arrivals are dropped from now on */
		T->vote_state = V_IDLE;
		act = true;
	}
	if (T->vote_state == V_IDLE && T->attempt > T->closed && !T->tgt_active) {
		T->mine = (struct vrec){.v.err = {.err = -ECONNRESET, .stage = -1, .mb = -1}, .left = 1};
		T->leave_vote = T->fail_attempt = T->attempt;
		T->vote_state = V_PENDING;
		act = true;
	}
	return act;
}

/* Rank 0's step starts: the targets to the last rank. A local failure: ABORT to every rank. The vote. */
static bool op_pass(struct mbp__run *r)
{
	mbp_mpi_trainer *T = of(r);
	bool act = false;
	int flag = 0;
	pthread_mutex_lock(&r->lock);
	if (T->leaving)
		act |= leave_step_locked(T);
	if (T->tgt_pending && !T->tgt_active) {
		T->tgt_pending = false;
		MPI_Isend(T->tgt_send, (int)T->tgt_bytes, MPI_BYTE, T->loss_rank, TAG_TGT, r->comm,
			  &T->tgt_req);
		T->tgt_active = act = true;
	}
	if (T->tgt_active) {
		MPI_Test(&T->tgt_req, &flag, MPI_STATUS_IGNORE);
		if (flag) {
			T->tgt_active = false;
			if (r->rank != 0)
				T->cmd_ready = true; /* the last rank: the step's targets are in */
			/* the last rank's step may run; rank 0's step may return (the caller's targets are free) */
			pthread_cond_broadcast(&r->cond);
			act = true;
		}
	}
	if (T->fail_attempt) {
		T->abort_out = T->fail_attempt;
		T->fail_attempt = 0;
		mbp__ctl_post(r, -1, MBP__CTL_ABORT);
		act = true;
	}
	if (T->vote_state == V_PENDING) {
		MPI_Iallgather(&T->mine, sizeof(T->mine), MPI_BYTE, T->all, sizeof(T->mine), MPI_BYTE,
			       r->comm, &T->vote_req);
		T->vote_state = V_ACTIVE;
		act = true;
	}
	if (T->vote_state == V_ACTIVE) {
		MPI_Test(&T->vote_req, &flag, MPI_STATUS_IGNORE);
		if (flag && r->rank == 0 && T->tgt_active) {
			/* the last rank took this step's targets before it could vote */
			MPI_Wait(&T->tgt_req, MPI_STATUS_IGNORE);
			T->tgt_active = false;
		}
		if (flag) {
			tally_locked(T);
			close_step_locked(T);
			T->vote_state = V_DONE;
			pthread_cond_broadcast(&r->cond);
			act = true;
		}
	}
	pthread_mutex_unlock(&r->lock);
	return act;
}

static void op_on_ctl(struct mbp__run *r, int peer, const struct mbp__ctl_msg *m)
{
	mbp_mpi_trainer *T = of(r);
	switch (m->cmd) {
	case MBP__CTL_STEP:
		T->attempt = m->a;
		T->cmd_rows = m->b;
		T->cmd_mb_rows = m->arg;
		if (T->tgt) {
			MPI_Irecv(T->tgt, (int)(m->b * T->o.target_row_bytes), MPI_BYTE, 0, TAG_TGT, r->comm,
				  &T->tgt_req);
			T->tgt_active = true;
		} else {
			T->cmd_ready = true;
			pthread_cond_broadcast(&r->cond);
		}
		break;
	case MBP__CTL_ABORT:
		if (m->a == T->open && m->a > T->closed)
			mbp__trainer_abort(T->t);
		else if (m->a > T->closed)
			T->abort_attempt = m->a;
		break;
	case MBP__CTL_CANCEL:
		if (T->open > T->closed)
			mbp__trainer_abort(T->t);
		break;
	case MBP__CTL_LEAVE:
		if (!T->stop_req)
			left_locked(T, peer);
		if (T->open > T->closed)
			mbp__trainer_abort(T->t);
		break;
	case MBP__CTL_STOP:
		if (m->b)
			left_locked(T, (int)m->arg); /* the reason rank 0 ends the run */
		T->stopped = true;
		pthread_cond_broadcast(&r->cond);
		break;
	}
}

static bool op_fill(struct mbp__run *r, int peer, struct mbp__ctl_msg *m)
{
	(void)peer;
	mbp_mpi_trainer *T = of(r);
	switch (m->cmd) {
	case MBP__CTL_STOPPED: /* the last word waits for this rank's part of the last vote */
		return T->vote_state != V_PENDING && T->vote_state != V_ACTIVE;
	case MBP__CTL_ABORT:
		m->a = T->abort_out;
		break;
	case MBP__CTL_STOP:
		if (r->err == -ECONNRESET) { /* why the run ends: a rank left */
			m->b = (uint64_t)-r->err;
			m->arg = (uint32_t)T->left_rank;
		}
		break;
	case MBP__CTL_STEP:
		m->a = T->attempt;
		m->b = T->cmd_rows;
		m->arg = T->cmd_mb_rows;
		break;
	}
	return true;
}

/* Not while a step rank 0 started is open, nor before it begins here: its STEP is out, and a rank that
 * began it waits for its vote (a STOP first would leave that rank's step waiting for items forever). */
static bool op_may_stop(struct mbp__run *r)
{
	mbp_mpi_trainer *T = of(r);
	return T->stop_req && T->open <= T->closed && T->attempt <= T->closed;
}

static void op_dead(struct mbp__run *r)
{
	mbp_mpi_trainer *T = of(r);
	if (T->open > T->closed)
		mbp__trainer_abort(T->t);
}

static void op_closed(struct mbp__run *r)
{
	mbp_mpi_trainer *T = of(r);
	if (T->tgt_req != MPI_REQUEST_NULL)
		mbp__mpi_finish(&T->tgt_req, r->rank != 0, mbp__now_ns() + mbp__run_close_ns(r->dead));
	pthread_mutex_lock(&r->lock);
	T->tgt_pending = T->tgt_active = false;
	close_step_locked(T);
	pthread_mutex_unlock(&r->lock);
}

static const struct mbp__run_ops ops = {.next = op_next,
					.waiting = op_waiting,
					.sent = op_sent,
					.arrived = op_arrived,
					.pass = op_pass,
					.on_ctl = op_on_ctl,
					.fill = op_fill,
					.may_stop = op_may_stop,
					.dead = op_dead,
					.closed = op_closed,
					.start = op_start,
					.mesh = true};

/* ---- steps ---- */

/* Ranks other than 0: wait for rank 0's next step and run this rank's part of it. *ended: the run is
 * over (the return value says how, mbp__run_ended_rc). */
static int serve_step(mbp_mpi_trainer *T, double *loss, bool *ended)
{
	pthread_mutex_lock(&T->r.lock);
	while (!T->cmd_ready) {
		if (T->r.dead || T->stopped || T->r.state != MBP__RUN_RUNNING) {
			int rc = mbp__run_ended_rc(&T->r);
			*ended = true;
			pthread_mutex_unlock(&T->r.lock);
			return rc;
		}
		mbp__run_wait(&T->r, NULL);
	}
	T->cmd_ready = false;
	size_t rows = (size_t)T->cmd_rows;
	uint32_t mb_rows = T->cmd_mb_rows;
	pthread_mutex_unlock(&T->r.lock);
	return mbp__trainer_step_remote(T->t, NULL, T->tgt, rows, mb_rows, loss);
}

int mbp_mpi_trainer_step(mbp_mpi_trainer *T, const void *in, const void *targets, size_t rows,
			 uint32_t mb_rows, double *loss)
{
	int rc = mbp__run_check(T ? &T->r : NULL, MBP__RUN_ANY, true);
	if (rc)
		return rc;
	if (T->r.rank != 0) {
		if (in || targets || rows || mb_rows)
			return -EINVAL;
		bool ended = false;
		rc = serve_step(T, loss, &ended);
		return ended && (rc == 0 || rc == -ECANCELED) ? -ESHUTDOWN : rc;
	}
	if (!in || !targets)
		return -EINVAL;
	rc = mbp__train_size_check(rows, mb_rows, T->o.max_mb_rows, T->o.max_mbs);
	if (rc < 0)
		return rc;
	pthread_mutex_lock(&T->r.lock);
	if (T->r.state != MBP__RUN_RUNNING || T->r.dead || T->r.cancelled || T->draining || T->stop_req) {
		rc = T->r.err ? T->r.err : -ESHUTDOWN; /* a failed start, a silent rank; or no more steps */
		pthread_mutex_unlock(&T->r.lock);
		return rc;
	}
	T->attempt++;
	T->cmd_rows = rows;
	T->cmd_mb_rows = mb_rows;
	mbp__ctl_post(&T->r, -1, MBP__CTL_STEP);
	if (T->loss_rank != 0) {
		T->tgt_send = targets;
		T->tgt_bytes = rows * T->o.target_row_bytes;
		T->tgt_pending = true;
	}
	mbp__run_kick(&T->r);
	pthread_mutex_unlock(&T->r.lock);
	rc = mbp__trainer_step_remote(T->t, in, T->loss_rank == 0 ? targets : NULL, rows, mb_rows, loss);
	/* the caller's targets are in use until their send is done (or the run is over: the loop finished
	 * or abandoned the send as it left) */
	pthread_mutex_lock(&T->r.lock);
	while ((T->tgt_pending || T->tgt_active) && T->r.state == MBP__RUN_RUNNING)
		mbp__run_wait(&T->r, NULL);
	pthread_mutex_unlock(&T->r.lock);
	return rc;
}

int mbp_mpi_trainer_serve(mbp_mpi_trainer *T)
{
	int rc = mbp__run_check(T ? &T->r : NULL, MBP__RUN_OTHERS, true);
	if (rc)
		return rc;
	for (;;) {
		bool ended = false;
		rc = serve_step(T, NULL, &ended);
		if (ended)
			return rc;
	}
}

int mbp_mpi_trainer_cancel(mbp_mpi_trainer *T)
{
	int rc = mbp__run_check(T ? &T->r : NULL, MBP__RUN_RANK0, false);
	if (rc)
		return rc;
	pthread_mutex_lock(&T->r.lock);
	mbp__run_cancel(&T->r);
	pthread_mutex_unlock(&T->r.lock);
	mbp_trainer_cancel(T->t);
	return 0;
}

int mbp_mpi_trainer_drain(mbp_mpi_trainer *T)
{
	int rc = mbp__run_check(T ? &T->r : NULL, MBP__RUN_RANK0, false);
	if (rc)
		return rc;
	pthread_mutex_lock(&T->r.lock);
	T->draining = true;
	pthread_mutex_unlock(&T->r.lock);
	return 0;
}

mbp_trainer *mbp__mpi_trainer_local(mbp_mpi_trainer *T)
{
	return T->t;
}

void mbp__mpi_trainer_test_hold(mbp_mpi_trainer *T, bool hold)
{
	/* relaxed: a test's flag, set between steps; op_arrived reads it with nothing else to order */
	atomic_store_explicit(&T->hold, hold, memory_order_relaxed);
}

void mbp__mpi_trainer_test_late(mbp_mpi_trainer *T)
{
	mbp__run_test_late(&T->r);
}

uint64_t mbp__mpi_trainer_late_seen(void)
{
	return mbp__run_late_seen();
}

int mbp_mpi_trainer_error(const mbp_mpi_trainer *T, mbp_train_error *e)
{
	if (!T || !e)
		return -EINVAL;
	return mbp_trainer_error(T->t, e);
}

int mbp_mpi_trainer_events_get(const mbp_mpi_trainer *T, mbp_train_event *ev, size_t n)
{
	if (!T)
		return -EINVAL;
	return mbp_trainer_events_get(T->t, ev, n); /* its stages named by their global index */
}

const char *mbp_mpi_trainer_run_error(const mbp_mpi_trainer *T)
{
	return T ? T->r.msg : "";
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
	st->rank = (uint32_t)T->r.rank;
	st->ranks = (uint32_t)T->r.size;
	st->stage0 = T->stage0;
	st->stages = T->stages;
	mbp__run_counts(&T->r, &st->sent, &st->received, &st->credit_waits);
	st->dropped = mbp__counter_get(&T->dropped);
	return rc;
}

void mbp_mpi_trainer_destroy(mbp_mpi_trainer *T)
{
	if (!T)
		return;
	pthread_mutex_lock(&T->r.lock);
	if (T->r.state == MBP__RUN_RUNNING) {
		/* rank 0 ends the run; the others wait for it to, and one that is not told to end yet tells
		 * rank 0 it leaves (rank 0 would wait for its votes) */
		T->leaving = T->r.rank != 0 && !T->stopped;
		T->stop_req = true;
		mbp__run_stop(&T->r);
	}
	pthread_mutex_unlock(&T->r.lock);
	mbp__run_join(&T->r);
	if (T->all) {
		/* a run that ended on a silent rank: a step's last pushes may have come after the loop left */
		pthread_mutex_lock(&T->r.lock);
		close_step_locked(T);
		pthread_mutex_unlock(&T->r.lock);
	}
	mbp_trainer_destroy(T->t);
	free(T->all);
	free(T->tgt);
	mbp__run_destroy(&T->r);
}
