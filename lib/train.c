/*
 * The trainer: a forward and a backward flow through the stages, in the order a schedule gives.
 *
 * Threads. T worker threads (one per stage while the stages fit the CPUs), the trainer's crew (crew.h:
 * placement, pins, names, pool caches, the init/fini rule, the start handshake, stop, as the pipeline's);
 * thread t runs the consecutive stages s with s * T / S == t and follows the merged list of their
 * operations in the schedule's global order (schedule.c says why that cannot deadlock). With replicas
 * (train.h, "Replicas") each thread of the schedule is copied as often as the most replicas of its
 * stages, replica k of a stage on copy k (mbp__replica_bases): a copy follows its projection of that
 * order too. Between stages s and s+1 there are two hops, one each way: forward (s's outputs, which
 * become s+1's inputs) and backward (s+1's input gradients, which become s's output gradients). A hop
 * between two threads is an SPSC ring; a hop between two units of one thread (consecutive stages of a
 * block, two chunks of a chunked schedule, the same replica copy) is a FIFO of that thread's alone, no
 * ring and no atomics: the buffer is handed over in it and taken out, in order, by a later operation of
 * the same list (the thread's list runs the producer's operation first). Every hop holds at least max_mbs
 * pointers, so a push never waits: only a ring's pop waits, for an operation earlier in the global order
 * (a local FIFO found empty is a list not followed: -EPROTO). Each stage counts its hand-offs to another
 * thread and its local passes (mbp_train_stage_stats.hops, local_hops).
 *
 * Buffers. Every output and gradient is a pool buffer (one pool, buffers as wide as the widest row
 * times max_mb_rows), taken from the thread's cache and released into it; stashes and recomputations'
 * work buffers come from the activation pool (train.h, "Activation memory"), without a cache. Before the first step of each
 * micro-batch count M the pool grows to the most the schedule lets the threads hold at once over every
 * timing (mbp__schedule_buffer_peak), plus what the threads' caches and a remote agent can keep out of the
 * depot: no step allocates after that, whatever its timing. Stage 0 reads the caller's input rows in place
 * and the loss reads the caller's target rows in place. Stage s keeps, per micro-batch, its input (stage s-1's output
 * buffer), its stash and its output gradient from the forward until its last backward operation (B, or
 * B_w under ZB-H1), then releases them; the engine checks the stash and the held count against the
 * schedule's figures at every forward.
 *
 * A step. The controlling thread publishes the step and bumps `go` (wait.h's generation word); every
 * thread runs its list; a failed operation (an error from a stage, a non-finite loss, a cancel) records the
 * first error, raises `abort` and wakes every waiter (a ring wait ends on the abort: the rings' wopts name
 * it), and each thread stops at its next operation. A thread done with its list runs
 * its stages' checks and grad_sq (a refusal fails the step the same way). Then two barriers: after the
 * first, no thread pushes any more, so each thread releases what its stages hold and drains its input
 * hops (rings and local FIFOs); then each stage updates (or, after a failure, discards its gradient) on
 * its own thread, using the sum of the stages' squared gradient norms, and after the second the
 * controller returns. An update that
 * refuses all the same (a stage breaking its check's contract) cannot be undone in the others: the trainer
 * is then broken, and fails that step and every later one with -ENOTRECOVERABLE. Losses are summed in
 * micro-batch order, so a step's loss does not depend on the threads' timing.
 */
#include "config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crew.h"
#include "pool_internal.h"
#include "ring.h"
#include "schedule.h"
#include "trace.h"
#include "train_internal.h"
#include "wait.h"

enum { TS_NEW, TS_RUNNING, TS_STOPPED };

/* Buffers in each thread's pool cache: the most recently released is the next one taken (still in the
 * core's cache), and every buffer a cache keeps out of the depot is reserved on top of the schedule's
 * peak, so a small cache. An operation gets at most two buffers and releases at most three. */
enum { CACHE_BUFS = 4 };

/* A hop from one unit to a unit of a neighbouring stage: a ring to another thread (or a remote part's
 * agent), or between two units of one thread a FIFO that only that thread touches. */
struct thop {
	struct mbp__ring *ring; /* another thread's end; NULL: local */
	mbp_mb **q;		/* local: mask + 1 slots */
	uint32_t head, tail;	/* local: free-running, head - tail items held (one thread: no atomics) */
	uint32_t mask;
};

/* Counters of one stage: single writer (its thread), relaxed readers. */
struct tcounters {
	_Atomic uint64_t ns[4];	   /* per mbp_op_kind: time inside the operation this step */
	_Atomic uint64_t count[4]; /* per mbp_op_kind: operations this step */
	_Atomic uint64_t wait_ns;  /* waiting for an input or a gradient this step */
	_Atomic uint64_t stash_peak, held_peak;
	_Atomic uint64_t total_busy_ns;
	_Atomic uint64_t r_ns, r_count;	   /* recomputations this step */
	_Atomic uint64_t act_peak;	   /* activation bytes held at once this step */
	_Atomic uint64_t hops, local_hops; /* this step: hand-offs to another thread, local passes */
};

/* A unit: one replica of a stage (a stage without replicas is one unit). The units of stage s are
 * t->st[ub[s] .. ub[s + 1]), each with a thread of its own when the stage is replicated. */
struct tstage {
	mbp_train_stage_desc d; /* d.ctx: the stage's own (check, grad_sq, update, discard) */
	char name[MBP_STAGE_NAME_MAX];
	char rname[MBP_STAGE_NAME_MAX]; /* the trace's row: the name, and " r<k>" for a replica */
	unsigned idx;			/* the stage (local index) */
	unsigned rep, nrep;		/* this replica, of the stage's nrep */
	void *ctx; /* the replica's (mbp_train_stage_desc.replica_ctx): its operations, init and fini */
	size_t out_w, stash_w, work_w;
	size_t grad_w, din_w;	 /* rows of dout (grad_row_bytes), of din (the previous stage's grad_w) */
	bool split;		 /* gives backward_in and backward_w */
	bool fwd_kick, bwd_kick; /* fwd_out, bwd_out is a link to a remote stage: its agent is told */
	bool init_ok;
	/* the hops from replica a of s-1 (fwd_in[a], bwd_out[a]; a < nprev, its replicas) and to replica
	 * b of s+1 (fwd_out[b], bwd_in[b]; b < nnext): micro-batch j comes from replica j mod nprev and
	 * goes to replica j mod nnext, so each hop carries its micro-batches in order. [0] is NULL at the
	 * ends (or a remote neighbour's link). The hops to s+1 are this unit's own (fwd_hop, bwd_hop) */
	struct thop *fwd_in[MBP_TRAIN_MAX_REPLICAS], *fwd_out[MBP_TRAIN_MAX_REPLICAS];
	struct thop *bwd_in[MBP_TRAIN_MAX_REPLICAS], *bwd_out[MBP_TRAIN_MAX_REPLICAS];
	struct thop fwd_hop[MBP_TRAIN_MAX_REPLICAS], bwd_hop[MBP_TRAIN_MAX_REPLICAS];
	unsigned nprev, nnext;
	struct mbp__parker wpk; /* this replica waiting for its turn to merge (merge_wait) */
	/* replica 0's, of a replicated stage: the micro-batch whose weight gradient is next in turn */
	_Atomic uint32_t w_next;
	/* a stage of pieces (mbp_train_stage_desc.pieces): this replica's [p0, p1), and each piece's
	 * squared norm (the stage's array, replica 0's to free) */
	size_t p0, p1;
	double *piece_sq;
	/* per micro-batch, while held: input (NULL at stage 0), stash, output gradient */
	mbp_mb **in, **stash, **dout, **work;
	unsigned stash_n, held_n; /* now */
	uint64_t act_now;	  /* activation bytes held now */
	double grad_sq;		  /* this step's, written before the first barrier */
	struct mbp__trace trace;  /* this step's operations (trace.h) */
	MBP_CACHELINE_ALIGNED struct tcounters c;
};

/* What the trainer keeps per thread of its crew: written by that thread at every operation. */
struct tthread {
	MBP_CACHELINE_ALIGNED uint64_t last_end; /* end of its last operation this step */
};

struct mbp_trainer {
	mbp_train_opts o;
	unsigned S, T; /* stages; threads (the crew's, once planned) */
	unsigned U;    /* units (the stages' replicas): the crew's stages; U == S without replicas */
	unsigned ub[MBP_MAX_STAGES + 1];  /* stage s's units: st[ub[s] .. ub[s + 1]) */
	unsigned reps[MBP_MAX_STAGES];	  /* per stage: its replicas */
	struct mbp__crew crew;		  /* the worker threads (crew.h) */
	struct tstage st[MBP_MAX_STAGES]; /* per unit */
	struct tthread th[MBP_MAX_STAGES];
	struct mbp__wait_opts wopts; /* the rings' waits: the crew's budgets, ended by `abort` too */
	mbp_pool *pool;
	mbp_pool *apool; /* stashes and work buffers; NULL when no stage has either */
	int state;
	/* activation buffers and bytes held now over every stage, and this step's peaks */
	MBP_CACHELINE_ALIGNED _Atomic uint64_t act_bufs, act_bytes, act_peak_bufs, act_peak_bytes;

	/* the step, written by the controller before `go` is bumped (release), read by the workers after */
	mbp_schedule *sc;
	mbp_sched_op *tops;	       /* the threads' lists, thread t at [toff[t], toff[t + 1]) */
	struct mbp__sched_scratch sim; /* room to play sc at each step's end (bubble_predicted); controller */
	size_t toff[MBP_MAX_STAGES + 1];
	const unsigned char *in, *targets;
	size_t rows;
	uint32_t mb_rows, M;
	uint64_t step_no;
	double *loss; /* per micro-batch, max_mbs */
	uint64_t t_go;

	MBP_CACHELINE_ALIGNED _Atomic uint32_t go;    /* generation word (wait.h): the step; quit when */
	_Atomic uint32_t quit;			      /* bumped with quit set */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t abort; /* the step is failing: stop at the next operation */
	_Atomic uint32_t cancelled;
	_Atomic uint32_t draining;
	/* b0: every operation done, before a shared end of the step (end_shared); b1: the decision; b2: the
	 * updates done */
	struct mbp__crew_barrier b0, b1, b2;
	bool end_shared;       /* the end-of-step work of every stage by pieces, shared by all threads */
	bool step_ok;	       /* decided by the last thread at the first barrier: update (true) or discard */
	int prepare_err;       /* tests: the next step's schedule "fails" with this (controller only) */
	_Atomic uint32_t done; /* generation word: bumped by the last thread to reach the second barrier */

	pthread_mutex_t lock; /* the first error of a step; the summary figures */
	mbp_train_error err;
	mbp_train_stats sum;

	/* a part of a larger pipeline (train_internal.h): set before start */
	bool remote;
	struct mbp__train_remote rem;
	unsigned stage0, Sg;	       /* global index of st[0]; stages of the whole pipeline */
	uint16_t gidx[MBP_MAX_STAGES]; /* each stage's global index (stage0 + s but placed across parts) */
	unsigned placed;	       /* a chunked schedule's thread count here (its placement); 0: block */
	unsigned sched_threads;	       /* where placed: the schedule's (more than placed across parts) */
	uint16_t thread_of[MBP_MAX_STAGES];		     /* where placed: each stage's thread */
	struct mbp__ring *link[MBP__LINKS * MBP_MAX_STAGES]; /* the boundary rings (the agent's far ends) */
	struct thop rhop[MBP__LINKS * MBP_MAX_STAGES];	     /* the stages' hops over them */
	double step_loss, step_norm;			     /* decided at the first barrier */
	mbp_train_update upd;				     /* the step's update, decided there too */
	mbp_train_error broken; /* an update refused after its check accepted (err 0: none); under lock */
};

/* ---- small helpers ---- */

/* Unit u runs on thread th (its units first .. last are all of them but under a chunked schedule). */
static bool mine(const struct mbp_trainer *t, const struct mbp__crew_thread *th, unsigned u)
{
	return t->crew.thread_of[u] == th->idx;
}

/* Whether local stage s's previous (next) global stage is this trainer's too: a hop inside it; else a
 * link to another part's (or, at the pipeline's ends, nothing). */
static bool prev_here(const struct mbp_trainer *t, unsigned s)
{
	return s > 0 && t->gidx[s - 1] + 1 == t->gidx[s];
}

static bool next_here(const struct mbp_trainer *t, unsigned s)
{
	return s + 1 < t->S && t->gidx[s + 1] == t->gidx[s] + 1;
}

/* The unit of stage s (local) that runs micro-batch j: replica j mod its replicas. */
static struct tstage *unit_of(struct mbp_trainer *t, unsigned s, uint32_t j)
{
	return &t->st[t->ub[s] + j % t->reps[s]];
}

static uint32_t next_pow2(uint32_t v)
{
	uint32_t p = 2;
	while (p < v)
		p <<= 1;
	return p;
}

static bool aborting(const struct mbp_trainer *t)
{
	/* acquire: partner of the release store in fail(); a worker that sees it stops and reads nothing
	 * else of the failure (the controller reads the error under the lock) */
	return atomic_load_explicit(&((struct mbp_trainer *)t)->abort, memory_order_acquire) != 0;
}

/* Wake every worker that may be parked on a ring: its wait ends on the abort. */
static void wake_all(struct mbp_trainer *t)
{
	for (unsigned u = 0; u < t->U; u++) {
		struct tstage *st = &t->st[u];
		for (unsigned a = 0; a < st->nprev; a++)
			if (st->fwd_in[a] && st->fwd_in[a]->ring)
				mbp__ring_wake(st->fwd_in[a]->ring);
		for (unsigned b = 0; b < st->nnext; b++)
			if (st->bwd_in[b] && st->bwd_in[b]->ring)
				mbp__ring_wake(st->bwd_in[b]->ring);
		mbp__parker_wake(&st->wpk);
	}
}

/* Record the step's first error and make every thread stop. */
static void fail(struct mbp_trainer *t, int err, int stage, int mb, mbp_op_kind op, const char *what)
{
	bool first = false;
	pthread_mutex_lock(&t->lock);
	if (t->err.err == 0) {
		t->err = (mbp_train_error){.err = err, .stage = stage, .mb = mb, .op = op, .what = what};
		first = true;
	}
	pthread_mutex_unlock(&t->lock);
	/* release: partner of the acquire load in aborting() */
	atomic_store_explicit(&t->abort, 1, memory_order_release);
	wake_all(t);
	if (first && t->remote)
		t->rem.failed(t->rem.arg);
}

/* Hand stage st's buffer on over hop h (never full: it holds max_mbs): a ring's push (a remote one's agent
 * is told), or a local pass into the thread's own FIFO. */
static void push_on(struct mbp_trainer *t, struct tstage *st, struct thop *h, bool remote, mbp_mb *mb)
{
	if (!h->ring) {
		MBP_VERIFY(h->head - h->tail <= h->mask); /* (unsigned: the wrap is the modular difference) */
		h->q[h->head++ & h->mask] = mb;
		mbp__counter_add(&st->c.local_hops, 1);
		return;
	}
	MBP_VERIFY(mbp__ring_push_sp(h->ring, mb));
	mbp__counter_add(&st->c.hops, 1);
	if (remote)
		t->rem.kick(t->rem.arg);
}

/* The next item of local hop h, or NULL (empty). */
static mbp_mb *local_pop(struct thop *h)
{
	return h->head != h->tail ? h->q[h->tail++ & h->mask] : NULL;
}

/* ---- one operation ---- */

/* The next item of ring r (for stage st), waiting when another thread produces it. NULL if aborted. */
static mbp_mb *pop(struct tstage *st, struct mbp__ring *r)
{
	void *item;
	if (mbp__ring_pop_sc(r, &item))
		return item;
	uint64_t t0 = mbp__clock_ns();
	int rc = mbp__ring_wait_pop(r, NULL, NULL, UINT64_MAX); /* 0: an item; -ECANCELED: the abort */
	mbp__counter_add(&st->c.wait_ns, mbp__clock_ns() - t0);
	return rc == 0 && mbp__ring_pop_sc(r, &item) ? item : NULL;
}

static int take(mbp_pool *p, mbp_pool_cache *c, uint32_t rows, size_t row_bytes, uint32_t mb, mbp_mb **out)
{
	int rc = mbp_pool_get(p, c, out, 0);
	if (rc < 0)
		return rc == -EAGAIN ? -ENOBUFS : rc;
	MBP_ASSERT((size_t)rows * row_bytes <= (*out)->capacity); /* setup's widest covers every width */
	(*out)->rows = rows;
	(*out)->row_bytes = (uint32_t)row_bytes;
	(*out)->seq = mb;
	return 0;
}

static int get_buf(struct mbp_trainer *t, struct mbp__crew_thread *th, uint32_t rows, size_t row_bytes,
		   uint32_t mb, mbp_mb **out)
{
	return take(t->pool, th->cache, rows, row_bytes, mb, out);
}

/* The largest of *c and v into *c, with other threads raising it too (mbp__counter_max has one writer).
 * relaxed, the load and the exchange: a figure, ordered with nothing else */
static void atomic_max(_Atomic uint64_t *c, uint64_t v)
{
	uint64_t old = atomic_load_explicit(c, memory_order_relaxed);
	while (v > old &&
	       !atomic_compare_exchange_weak_explicit(c, &old, v, memory_order_relaxed, memory_order_relaxed))
		;
}

/* Count an activation buffer of `bytes` taken (dir 1) or released (dir -1) by stage st: after the pool's
 * get, before its put, so that the counts never exceed what the pool holds. */
static void act_count(struct mbp_trainer *t, struct tstage *st, uint64_t bytes, int dir)
{
	st->act_now += dir > 0 ? bytes : -bytes;
	mbp__counter_max(&st->c.act_peak, st->act_now);
	/* relaxed: figures, ordered with nothing else */
	uint64_t n =
	    atomic_fetch_add_explicit(&t->act_bufs, (uint64_t)(int64_t)dir, memory_order_relaxed) + dir;
	uint64_t b =
	    atomic_fetch_add_explicit(&t->act_bytes, dir > 0 ? bytes : -bytes, memory_order_relaxed) +
	    (dir > 0 ? bytes : -bytes);
	if (dir > 0) {
		atomic_max(&t->act_peak_bufs, n);
		atomic_max(&t->act_peak_bytes, b);
	}
}

/* A stash or work buffer of stage st, from the activation pool (no cache: its high-water mark is exact). */
static int get_act(struct mbp_trainer *t, struct tstage *st, uint32_t rows, size_t row_bytes, uint32_t mb,
		   mbp_mb **out)
{
	int rc = take(t->apool, NULL, rows, row_bytes, mb, out);
	if (rc == 0)
		act_count(t, st, (uint64_t)rows * row_bytes, 1);
	return rc;
}

static void put_act(struct mbp_trainer *t, struct tstage *st, mbp_mb **mb)
{
	if (*mb) {
		act_count(t, st, (uint64_t)(*mb)->rows * (*mb)->row_bytes, -1);
		mbp_pool_put(t->apool, NULL, *mb);
		*mb = NULL;
	}
}

static void put_buf(struct mbp_trainer *t, struct mbp__crew_thread *th, mbp_mb **mb)
{
	if (*mb) {
		mbp_pool_put(t->pool, th->cache, *mb);
		*mb = NULL;
	}
}

/* Micro-batch j from hop h into *slot: -ECANCELED when the step aborts while waiting on a ring, -EPROTO
 * when the hop does not hold j next (the lists are not being followed; a local one: nothing in it). */
static int receive(struct mbp_trainer *t, struct mbp__crew_thread *th, struct tstage *st, struct thop *h,
		   uint32_t j, mbp_mb **slot)
{
	mbp_mb *mb = h->ring ? pop(st, h->ring) : local_pop(h);
	if (!mb)
		return h->ring ? -ECANCELED : -EPROTO;
	if (mb->seq != j) {
		mbp_pool_put(t->pool, th->cache, mb);
		return -EPROTO;
	}
	*slot = mb;
	return 0;
}

static uint32_t mb_rows_of(const struct mbp_trainer *t, uint32_t j)
{
	size_t first = (size_t)j * t->mb_rows;
	size_t left = t->rows - first;
	return left < t->mb_rows ? (uint32_t)left : t->mb_rows;
}

/* The input rows of stage st for micro-batch j: the caller's at stage 0, else the held buffer. */
static const void *input_of(const struct mbp_trainer *t, const struct tstage *st, uint32_t j)
{
	if (!st->fwd_in[0]) /* the global stage 0 */
		return t->in + (size_t)j * t->mb_rows * t->o.in_row_bytes;
	return st->in[j]->data;
}

/* What every operation of stage st on micro-batch j reads: its rows, its input and its stash. */
static mbp_train_io io_of(const struct mbp_trainer *t, const struct tstage *st, uint32_t j, uint32_t rows)
{
	return (mbp_train_io){.mb = j,
			      .rows = rows,
			      .step_rows = t->rows,
			      .step = t->step_no,
			      .in = input_of(t, st, j),
			      .stash = st->stash[j] ? st->stash[j]->data : NULL,
			      .work = st->work[j] ? st->work[j]->data : NULL};
}

/* Release what stage st holds for micro-batch j once its last backward operation ran. */
static void put_held(struct mbp_trainer *t, struct mbp__crew_thread *th, struct tstage *st, uint32_t j)
{
	put_buf(t, th, &st->in[j]);
	put_act(t, st, &st->stash[j]);
	put_act(t, st, &st->work[j]);
	put_buf(t, th, &st->dout[j]);
}

static void release_mb(struct mbp_trainer *t, struct mbp__crew_thread *th, struct tstage *st, uint32_t j)
{
	put_held(t, th, st, j);
	st->held_n--;
}

static int op_forward(struct mbp_trainer *t, struct mbp__crew_thread *th, struct tstage *st, uint32_t j)
{
	const mbp_schedule *sc = t->sc;
	uint32_t rows = mb_rows_of(t, j);
	if (st->stash_n + 1 > mbp_schedule_stash_peak(sc, t->gidx[st->idx]) ||
	    st->held_n + 1 > mbp_schedule_held_peak(sc, t->gidx[st->idx]))
		return -EOVERFLOW; /* the schedule's bound; cannot happen while the lists are followed */
	if (st->fwd_in[0]) {
		int rc = receive(t, th, st, st->fwd_in[j % st->nprev], j, &st->in[j]);
		if (rc < 0)
			return rc;
	}
	mbp_mb *out = NULL;
	int rc = get_buf(t, th, rows, st->out_w, j, &out);
	if (rc == 0 && st->stash_w)
		rc = get_act(t, st, rows, st->stash_w, j, &st->stash[j]);
	st->stash_n++;
	st->held_n++;
	mbp__counter_max(&st->c.stash_peak, st->stash_n);
	mbp__counter_max(&st->c.held_peak, st->held_n);
	if (rc < 0) {
		put_buf(t, th, &out);
		return rc;
	}
	mbp_train_io io = io_of(t, st, j, rows);
	io.out = out->data;
	rc = st->d.forward(st->ctx, &io);
	if (rc == 0 && !st->fwd_out[0]) {
		/* the global last stage: the loss: the gradient that starts the backward, kept as this stage's output gradient */
		rc = get_buf(t, th, rows, st->out_w, j, &st->dout[j]);
		if (rc == 0) {
			io.dout = st->dout[j]->data;
			io.targets = t->targets + (size_t)j * t->mb_rows * t->o.target_row_bytes;
			double l = NAN;
			rc = t->o.loss(t->o.loss_arg, &io, &l);
			if (rc == 0 && !isfinite(l))
				rc = -EDOM;
			t->loss[j] = l;
		}
		put_buf(t, th, &out);
		return rc;
	}
	if (rc < 0) {
		put_buf(t, th, &out);
		return rc;
	}
	push_on(t, st, st->fwd_out[j % st->nnext], st->fwd_kick, out);
	return 0;
}

/* Stage st's recomputation for micro-batch j into a work buffer held until its last backward: its own
 * figures and trace event (kind MBP_OP_R), its time out of the backward's. */
static int recompute(struct mbp_trainer *t, struct tstage *st, uint32_t j, uint32_t rows)
{
	int rc = get_act(t, st, rows, st->work_w, j, &st->work[j]);
	if (rc < 0)
		return rc;
	mbp_train_io io = io_of(t, st, j, rows);
	uint64_t t0 = mbp__clock_ns();
	rc = st->d.recompute(st->ctx, &io);
	uint64_t t1 = mbp__clock_ns();
	mbp__counter_add(&st->c.r_ns, t1 - t0);
	mbp__counter_add(&st->c.r_count, 1);
	mbp__counter_add(&st->c.total_busy_ns, t1 - t0);
	if (st->trace.ev)
		mbp__trace_add(&st->trace,
			       &(struct mbp__trace_ev){.t0 = t0, .t1 = t1, .mb = j, .kind = MBP_OP_R});
	return rc;
}

/* The ordered merge (train.h, "Replicas"): the replicas of a stage write its one gradient, micro-batch
 * after micro-batch, so its sums are those of one thread. Replica 0's w_next is the micro-batch whose
 * weight gradient is next; the replica of micro-batch j waits for it to be j. */
struct turn {
	_Atomic uint32_t *next;
	uint32_t j;
};

static bool turn_ready(void *arg)
{
	struct turn *w = arg;
	/* acquire; partner: the release store in merge_done(): what j - 1's weight gradient wrote (the
	 * stage's gradient, on another replica's thread) is visible before this one adds to it */
	return atomic_load_explicit(w->next, memory_order_acquire) == w->j;
}

/* Wait for micro-batch j's turn (a stage without replicas: at once). 0, or -ECANCELED (the step fails). */
static int merge_wait(struct mbp_trainer *t, struct tstage *st, uint32_t j)
{
	if (st->nrep == 1)
		return 0;
	struct turn w = {&(st - st->rep)->w_next, j};
	if (turn_ready(&w))
		return 0;
	uint64_t t0 = mbp__clock_ns();
	int rc = mbp__wait_until(&st->wpk, &t->wopts, turn_ready, &w, NULL, UINT64_MAX);
	mbp__counter_add(&st->c.wait_ns, mbp__clock_ns() - t0);
	return rc < 0 ? rc : 0;
}

/* Micro-batch j's weight gradient is in: j + 1's turn, on the replica that runs it; after the last,
 * every replica's, which waits for them all before its check (run_step: replica 0's of the whole stage,
 * or each replica's of its pieces). */
static void merge_done(struct mbp_trainer *t, struct tstage *st, uint32_t j)
{
	if (st->nrep == 1)
		return;
	struct tstage *r0 = st - st->rep;
	/* release; partner: the acquire load in turn_ready() */
	atomic_store_explicit(&r0->w_next, j + 1, memory_order_release);
	mbp__parker_wake(&r0[(j + 1) % st->nrep].wpk);
	for (unsigned k = 0; j + 1 == t->M && k < st->nrep; k++) /* each runs its pieces' check after it */
		mbp__parker_wake(&r0[k].wpk);
}

/* B (whole), B_in or W of stage st for micro-batch j. */
static int op_backward(struct mbp_trainer *t, struct mbp__crew_thread *th, struct tstage *st, unsigned kind,
		       uint32_t j)
{
	uint32_t rows = mb_rows_of(t, j);
	if (kind != MBP_OP_W && st->work_w) { /* before the wait: it needs no gradient */
		int rc = recompute(t, st, j, rows);
		if (rc < 0)
			return rc;
	}
	if (kind != MBP_OP_W && st->bwd_in[0]) {
		int rc = receive(t, th, st, st->bwd_in[j % st->nnext], j, &st->dout[j]);
		if (rc < 0)
			return rc;
	}
	mbp_mb *din = NULL;
	if (kind != MBP_OP_W && st->bwd_out[0]) {
		/* din_w 0: the stage before is another part's, placed: its rows are the input's */
		int rc = get_buf(t, th, rows, st->din_w ? st->din_w : st->in[j]->row_bytes, j, &din);
		if (rc < 0)
			return rc;
	}
	mbp_train_io io = io_of(t, st, j, rows);
	io.dout = st->dout[j]->data;
	io.din = din ? din->data : NULL;
	int rc;
	switch (kind) {
	case MBP_OP_B:
		/* a replica merges only the weight part in turn: its B_in runs meanwhile */
		if (st->d.backward && !(st->nrep > 1 && st->split)) {
			rc = merge_wait(t, st, j);
			rc = rc ? rc : st->d.backward(st->ctx, &io);
		} else {
			rc = st->d.backward_in(st->ctx, &io);
			if (rc == 0 && din &&
			    st->nrep > 1) { /* the previous stage need not wait for the merge */
				push_on(t, st, st->bwd_out[j % st->nprev], st->bwd_kick, din);
				din = NULL;
			}
			rc = rc ? rc : merge_wait(t, st, j);
			rc = rc ? rc : st->d.backward_w(st->ctx, &io);
		}
		break;
	case MBP_OP_BIN:
		rc = st->d.backward_in(st->ctx, &io);
		break;
	default:
		rc = merge_wait(t, st, j);
		rc = rc ? rc : st->d.backward_w(st->ctx, &io);
	}
	if (rc == 0 && kind != MBP_OP_BIN)
		merge_done(t, st, j);
	if (rc < 0) {
		put_buf(t, th, &din);
		return rc;
	}
	if (kind != MBP_OP_W)
		st->stash_n--;
	if (kind != MBP_OP_BIN)
		release_mb(t, th, st, j);
	if (din)
		push_on(t, st, st->bwd_out[j % st->nprev], st->bwd_kick, din);
	return 0;
}

/* ---- the worker ---- */

static void run_ops(struct mbp_trainer *t, struct mbp__crew_thread *th)
{
	uint64_t *last_end = &t->th[th->idx].last_end;
	*last_end = t->t_go;
	for (size_t k = t->toff[th->idx]; k < t->toff[th->idx + 1]; k++) {
		if (aborting(t))
			return;
		const mbp_sched_op *op = &t->tops[k];
		struct tstage *st = unit_of(t, op->stage, op->mb);
		uint64_t t0 = mbp__clock_ns();
		uint64_t w0 = mbp__counter_get(&st->c.wait_ns), r0 = mbp__counter_get(&st->c.r_ns);
		int rc = op->kind == MBP_OP_F ? op_forward(t, th, st, op->mb)
					      : op_backward(t, th, st, op->kind, op->mb);
		uint64_t t1 = mbp__clock_ns();
		/* busy time excludes the wait for the input inside the operation */
		uint64_t waited = mbp__counter_get(&st->c.wait_ns) - w0;
		waited += mbp__counter_get(&st->c.r_ns) - r0; /* and the recomputation, its own figure */
		uint64_t busy = t1 - t0 - waited;
		mbp__counter_add(&st->c.ns[op->kind], busy);
		mbp__counter_add(&st->c.count[op->kind], 1);
		mbp__counter_add(&st->c.total_busy_ns, busy);
		if (st->trace.ev) /* the call only when tracing */
			mbp__trace_add(&st->trace,
				       &(struct mbp__trace_ev){
					   .t0 = t0 + waited, .t1 = t1, .mb = op->mb, .kind = op->kind});
		*last_end = t1;
		if (rc < 0) {
			if (rc != -ECANCELED || !aborting(t))
				fail(t, rc, (int)(t->gidx[st->idx]), (int)op->mb, (mbp_op_kind)op->kind,
				     NULL);
			return;
		}
	}
}

/* Release what hop h (an input of a stage of thread th, or NULL) still holds: a ring's items, or what
 * a failed step left in a local FIFO (its consumer never ran). */
static void drain(struct mbp_trainer *t, struct mbp__crew_thread *th, struct thop *h)
{
	void *item;
	mbp_mb *mb;
	while (h && h->ring && mbp__ring_pop_sc(h->ring, &item))
		mbp_pool_put(t->pool, th->cache, item);
	while (h && !h->ring && (mb = local_pop(h)))
		mbp_pool_put(t->pool, th->cache, mb);
}

/* After the first barrier: nothing is pushed any more. Release everything this thread's stages hold. */
static void cleanup(struct mbp_trainer *t, struct mbp__crew_thread *th)
{
	for (unsigned s = th->first; s <= th->last; s++) {
		if (!mine(t, th, s))
			continue;
		struct tstage *st = &t->st[s];
		for (uint32_t j = 0; j < t->M; j++)
			put_held(t, th, st, j);
		st->stash_n = st->held_n = 0;
		for (unsigned a = 0; a < st->nprev; a++)
			drain(t, th, st->fwd_in[a]);
		for (unsigned b = 0; b < st->nnext; b++)
			drain(t, th, st->bwd_in[b]);
	}
	mbp_pool_cache_flush(th->cache); /* idle until the next step: strand nothing in the cache */
}

static bool same_error(const mbp_train_error *a, const mbp_train_error *b)
{
	return a->err == b->err && a->stage == b->stage && a->mb == b->mb && a->op == b->op;
}

/* Every thread is past its operations: one decision for all of them (a cancel from now on does not
 * touch this step). */
static void decide(void *arg)
{
	struct mbp_trainer *t = arg;
	t->step_ok = !aborting(t);
	/* a stage of pieces: its squared norm is theirs added in piece order, whichever replica ran each */
	for (unsigned s = 0; t->step_ok && s < t->S; s++) {
		struct tstage *st = &t->st[t->ub[s]];
		double sq = 0;
		for (size_t p = 0; p < st->d.pieces; p++)
			sq += st->piece_sq[p];
		if (st->d.pieces)
			st->grad_sq = sq;
	}
	/* a non-finite gradient would make some stages refuse their update: fail the step for all */
	for (unsigned s = 0; t->step_ok && s < t->S; s++)
		if ((t->st[t->ub[s]].d.grad_sq || t->st[t->ub[s]].d.pieces) &&
		    !isfinite(t->st[t->ub[s]].grad_sq)) {
			pthread_mutex_lock(&t->lock);
			t->err = (mbp_train_error){.err = -EDOM,
						   .stage = (int)t->gidx[s],
						   .mb = -1,
						   .op = MBP_OP_UPDATE,
						   .what = "the stage's grad_sq is not finite"};
			pthread_mutex_unlock(&t->lock);
			t->step_ok = false;
		}
	/* the step's loss and gradient norm, summed in micro-batch and stage order */
	double loss = 0, norm = 0;
	if (t->S && !t->st[t->U - 1].fwd_out[0]) /* the global last stage is here */
		for (uint32_t j = 0; t->step_ok && j < t->M; j++)
			loss += t->loss[j];
	if (t->remote) {
		/* every part votes; the decision is the whole pipeline's */
		struct mbp__train_vote v = {.ok = t->step_ok, .loss = loss};
		pthread_mutex_lock(&t->lock);
		v.err = t->err;
		pthread_mutex_unlock(&t->lock);
		for (unsigned s = 0; s < t->S; s++)
			v.grad_sq[t->gidx[s]] = t->st[t->ub[s]].grad_sq;
		t->rem.agree(t->rem.arg, &v);
		t->step_ok = v.ok;
		if (!v.ok) {
			pthread_mutex_lock(&t->lock);
			/* the words travel no further than this process: keep ours when the error is ours */
			const char *what = same_error(&v.err, &t->err) ? t->err.what : NULL;
			t->err = v.err;
			t->err.what = what;
			pthread_mutex_unlock(&t->lock);
		}
		loss = v.loss;
		for (unsigned s = 0; t->step_ok && s < t->Sg; s++)
			norm += v.grad_sq[s];
	} else {
		for (unsigned s = 0; t->step_ok && s < t->S; s++)
			norm += t->st[t->ub[s]].grad_sq;
	}
	t->step_loss = loss;
	t->step_norm = sqrt(norm);
	t->upd = (mbp_train_update){
	    .step = t->step_no, .rows = t->rows, .loss = t->step_loss, .grad_norm = t->step_norm};
}

/* Every thread is past its updates (the last to reach the second barrier runs this): a stage of pieces
 * ends its update once (its step count; not where an update refused, which breaks the trainer: its
 * step did not succeed), and the controller is told at once, not after this thread's
 * wake of the others and one of theirs. */
static void step_end(void *arg)
{
	struct mbp_trainer *t = arg;
	pthread_mutex_lock(&t->lock);
	bool refused = t->broken.err != 0; /* an update of this step refused (a broken trainer runs none) */
	pthread_mutex_unlock(&t->lock);
	for (unsigned s = 0; t->step_ok && !refused && s < t->S; s++) {
		struct tstage *st = &t->st[t->ub[s]];
		if (st->d.pieces && st->d.update_end)
			st->d.update_end(st->d.ctx, &t->upd);
	}
	/* release; partner: its acquire in step_run(): every thread arrived here after its updates, so
	 * everything the step wrote is visible to the controller. The others leave the barrier after
	 * this, touching nothing of the step (the next may begin meanwhile: they see its go) */
	mbp__gen_bump(&t->done);
}

/* An update refused after the decision (its check accepted, or it has none): the other stages updated.
 * The step fails, and every later one, naming the first such stage. */
static void break_trainer(struct mbp_trainer *t, int stage)
{
	pthread_mutex_lock(&t->lock);
	if (t->broken.err == 0)
		t->broken =
		    (mbp_train_error){.err = -ENOTRECOVERABLE,
				      .stage = stage,
				      .mb = -1,
				      .op = MBP_OP_UPDATE,
				      .what = "the stage's update refused after its check accepted: the "
					      "other stages updated"};
	pthread_mutex_unlock(&t->lock);
}

/*
 * The shared end of a step (t->end_shared: every stage by pieces, no replica, not a part of a larger
 * pipeline): the stages' pieces, in stage order, cut into one contiguous range per thread, so that a
 * thread whose stages hold fewer parameters takes some of another stage's pieces (the pieces' norms and
 * updates are each element's alone: the same bits whichever thread runs them, as with replicas). op:
 * 0 check, 1 update (ok) or discard.
 */
static void shared_pieces(struct mbp_trainer *t, struct mbp__crew_thread *th, int op, bool ok)
{
	size_t total = 0;
	for (unsigned s = 0; s < t->S; s++)
		total += t->st[t->ub[s]].d.pieces;
	const size_t lo = total * th->idx / t->T, hi = total * (th->idx + 1) / t->T;
	for (unsigned s = 0, at = 0; s < t->S && at < hi; at += t->st[t->ub[s]].d.pieces, s++) {
		struct tstage *st = &t->st[t->ub[s]];
		const size_t b = lo > at ? lo - at : 0, e = hi - at < st->d.pieces ? hi - at : st->d.pieces;
		if (b >= e)
			continue;
		if (op == 0) {
			if (aborting(t))
				return;
			int rc = st->d.check_pieces(st->d.ctx, b, e, st->piece_sq + b);
			if (rc < 0) {
				fail(t, rc, (int)t->gidx[st->idx], -1, MBP_OP_UPDATE,
				     "the stage's check refused its update");
				return;
			}
		} else if (ok) {
			if (st->d.update_pieces(st->d.ctx, &t->upd, b, e) < 0)
				break_trainer(t, (int)t->gidx[st->idx]);
		} else {
			st->d.discard_pieces(st->d.ctx, b, e);
		}
	}
}

static void run_step(struct mbp_trainer *t, struct mbp__crew_thread *th)
{
	for (unsigned s = th->first; s <= th->last; s++) {
		if (!mine(t, th, s))
			continue;
		struct tstage *st = &t->st[s];
		for (int k = 0; k < 4; k++) {
			mbp__counter_reset(&st->c.ns[k]);
			mbp__counter_reset(&st->c.count[k]);
		}
		mbp__counter_reset(&st->c.wait_ns);
		mbp__counter_reset(&st->c.stash_peak);
		mbp__counter_reset(&st->c.held_peak);
		mbp__counter_reset(&st->c.r_ns);
		mbp__counter_reset(&st->c.r_count);
		mbp__counter_reset(&st->c.act_peak);
		mbp__counter_reset(&st->c.hops);
		mbp__counter_reset(&st->c.local_hops);
		mbp__trace_clear(&st->trace);
	}
	run_ops(t, th);
	if (t->end_shared) {
		/* release/acquire (the barrier); partner: every thread's arrival after its last operation:
		 * every gradient complete before any thread reads another stage's */
		mbp__crew_barrier_wait(&t->crew, &t->b0, NULL, NULL);
		shared_pieces(t, th, 0, false);
	}
	/* every refusal an update could make, before the decision (the stage's gradient is this thread's) */
	for (unsigned s = th->first; s <= th->last && !t->end_shared && !aborting(t); s++) {
		struct tstage *st = &t->st[s];
		/* a stage's on its replica 0; a stage of pieces' on each replica, over its own */
		if (!mine(t, th, s) || (st->rep && !st->d.pieces))
			continue;
		/* a replicated stage's gradient is whole once the other replicas merged their last */
		int rc = merge_wait(t, st, t->M);
		if (rc < 0)
			break; /* the step failed meanwhile */
		if (st->d.pieces)
			rc = st->p1 > st->p0
				 ? st->d.check_pieces(st->d.ctx, st->p0, st->p1, st->piece_sq + st->p0)
				 : 0;
		else
			rc = st->d.check ? st->d.check(st->d.ctx) : 0;
		if (rc < 0) {
			fail(t, rc, (int)t->gidx[st->idx], -1, MBP_OP_UPDATE,
			     "the stage's check refused its update");
			break;
		}
		if (!st->d.pieces)
			st->grad_sq = st->d.grad_sq ? st->d.grad_sq(st->d.ctx) : NAN;
	}
	mbp__crew_barrier_wait(&t->crew, &t->b1, decide, t);
	cleanup(t, th);
	bool ok = t->step_ok;
	if (t->end_shared)
		shared_pieces(t, th, 1, ok);
	for (unsigned s = th->first; s <= th->last && !t->end_shared; s++) {
		struct tstage *st = &t->st[s];
		if (!mine(t, th, s) || (st->rep && !st->d.pieces))
			continue;
		int rc = 0;
		if (st->d.pieces && st->p1 == st->p0)
			continue; /* more replicas than pieces: nothing of it here */
		if (st->d.pieces && ok)
			rc = st->d.update_pieces(st->d.ctx, &t->upd, st->p0, st->p1);
		else if (st->d.pieces)
			st->d.discard_pieces(st->d.ctx, st->p0, st->p1);
		else if (ok)
			rc = st->d.update(st->d.ctx, &t->upd);
		else
			st->d.discard(st->d.ctx);
		if (rc < 0)
			break_trainer(t, (int)t->gidx[st->idx]);
	}
	mbp__crew_barrier_wait(&t->crew, &t->b2, step_end, t);
}

/* The work of a thread of the crew: a step each time the controller bumps go, until quit. */
static void worker_run(void *arg, struct mbp__crew_thread *th)
{
	struct mbp_trainer *t = arg;
	for (uint32_t seen = 0;;) {
		/* acquire (mbp__gen_wait); partner: the release bump of go in step_run() (or destroy): the
		 * step's parameters written before it are visible */
		seen = mbp__gen_wait(&t->go, seen);
		if (atomic_load_explicit(&t->quit,
					 memory_order_relaxed)) /* relaxed: ordered by go's acquire */
			break;
		run_step(t, th); /* the last to reach its second barrier told the controller (step_end) */
	}
}

/* ---- public API ---- */

int mbp_trainer_new(mbp_trainer **tp, const mbp_train_opts *o)
{
	if (!tp || !o)
		return -EINVAL;
	*tp = NULL;
	if (o->in_row_bytes == 0 || o->in_row_bytes > UINT32_MAX || o->target_row_bytes == 0 ||
	    o->target_row_bytes > UINT32_MAX || !o->loss || o->max_mbs > MBP_TRAIN_MAX_MBS ||
	    (unsigned)o->schedule > MBP_SCHED_CUSTOM ||
	    (o->schedule == MBP_SCHED_CUSTOM || o->schedule == MBP_SCHED_AUTO) != (o->custom != NULL) ||
	    (unsigned)o->pinning > MBP_PIN_NONE ||
	    (o->custom && mbp_schedule_mbs(o->custom) > (o->max_mbs ? o->max_mbs : 64)))
		return -EINVAL;
	struct mbp_trainer *t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->o = *o;
	if (!t->o.max_mb_rows)
		t->o.max_mb_rows = 64;
	if (!t->o.max_mbs)
		t->o.max_mbs = 64;
	if (t->o.schedule == MBP_SCHED_DEFAULT)
		t->o.schedule = MBP_SCHED_1F1B;
	t->loss = calloc(t->o.max_mbs, sizeof(double));
	mbp_schedule *own = NULL;
	if (!t->loss || (o->custom && mbp_schedule_copy(&own, o->custom) < 0)) {
		free(t->loss);
		free(t);
		return -ENOMEM;
	}
	t->o.custom = own; /* the trainer's copy, destroyed with it */
	pthread_mutex_init(&t->lock, NULL);
	mbp__crew_init(&t->crew, "train", worker_run, t);
	t->state = TS_NEW;
	*tp = t;
	return 0;
}

/* A unit's init and fini as the crew calls them: the replica's context, the stage's index. */
static int unit_init(void *ctx, unsigned u)
{
	(void)u;
	struct tstage *st = ctx;
	return st->d.init(st->ctx, st->idx);
}

static void unit_fini(void *ctx)
{
	struct tstage *st = ctx;
	st->d.fini(st->ctx);
}

int mbp_trainer_add_stage(mbp_trainer *t, const mbp_train_stage_desc *d)
{
	if (!t || !d || !d->forward || d->out_row_bytes == 0 || d->out_row_bytes > UINT32_MAX ||
	    d->stash_row_bytes > UINT32_MAX || d->grad_row_bytes > UINT32_MAX)
		return -EINVAL;
	if (!d->backward && !(d->backward_in && d->backward_w))
		return -EINVAL;
	if (d->pieces ? !d->check_pieces || !d->update_pieces || !d->discard_pieces || d->pieces > UINT32_MAX
		      : !d->update || !d->discard)
		return -EINVAL;
	if (d->work_row_bytes > UINT32_MAX || (d->work_row_bytes && !d->recompute))
		return -EINVAL;
	unsigned r = d->replicas ? d->replicas : 1;
	if (t->state != TS_NEW || r > MBP_TRAIN_MAX_REPLICAS)
		return -EINVAL;
	if (t->S == MBP_MAX_STAGES || t->U + r > MBP_MAX_STAGES)
		return -E2BIG;
	double *piece_sq = NULL;
	if (d->pieces && !(piece_sq = calloc(d->pieces, sizeof(double))))
		return -ENOMEM;
	for (unsigned k = 0; k < r; k++) {
		struct tstage *st = &t->st[t->U + k];
		memset(st, 0, sizeof(*st));
		st->d = *d;
		st->d.replica_ctx = NULL; /* the caller's array: read here only */
		st->idx = t->S;
		st->rep = k;
		st->nrep = r;
		st->ctx = d->replica_ctx ? d->replica_ctx[k] : d->ctx;
		if (d->name)
			snprintf(st->name, sizeof(st->name), "%s", d->name);
		else
			snprintf(st->name, sizeof(st->name), "stage%u", t->S);
		snprintf(st->rname, sizeof(st->rname), r > 1 ? "%.*s r%u" : "%.*s", MBP_STAGE_NAME_MAX - 8,
			 st->name, k);
		st->d.name = st->name;
		t->crew.stage[t->U + k] = (struct mbp__crew_stage){
		    .init = d->init ? unit_init : NULL, .fini = d->fini ? unit_fini : NULL, .ctx = st};
		st->out_w = d->out_row_bytes;
		st->stash_w = d->stash_row_bytes;
		st->work_w = d->work_row_bytes;
		st->grad_w = d->grad_row_bytes ? d->grad_row_bytes : d->out_row_bytes;
		st->din_w = t->S == 0 ? t->o.in_row_bytes : t->st[t->U - 1].grad_w;
		st->split = d->backward_in && d->backward_w;
		/* replica k's pieces: a contiguous k-th of them */
		st->p0 = d->pieces * k / r;
		st->p1 = d->pieces * (k + 1) / r;
		st->piece_sq = piece_sq;
	}
	t->ub[t->S] = t->U;
	t->reps[t->S] = r;
	t->U += r;
	t->S++;
	t->ub[t->S] = t->U;
	return 0;
}

/* A hop to another thread is a ring, one between two units of one thread a local FIFO. */
static int hop_new(struct mbp_trainer *t, struct thop *h, bool local, uint32_t cap)
{
	*h = (struct thop){.mask = cap - 1};
	if (!local)
		return mbp__ring_new(&h->ring, cap, &t->wopts, 0);
	h->q = calloc(cap, sizeof(*h->q));
	return h->q ? 0 : -ENOMEM;
}

static void hop_free(struct thop *h)
{
	mbp__ring_destroy(h->ring);
	free(h->q);
	*h = (struct thop){0};
}

/* The stage's hop over boundary ring `link` (its other end a remote part's agent). */
static struct thop *link_hop(struct mbp_trainer *t, int link)
{
	t->rhop[link] = (struct thop){.ring = t->link[link]};
	return &t->rhop[link];
}

static void free_stages(struct mbp_trainer *t)
{
	/* the threads are told to stop (or never ran): join them; the CPUs the plan claimed for them go back
	 * to the record (a thread whose pin failed gave its claim back at once) */
	mbp__crew_stop(&t->crew);
	/* the boundary rings are the trainer's; the hops to the next stage its unit's */
	for (size_t k = 0; k < MBP_ARRAY_SIZE(t->link); k++)
		mbp__ring_destroy(t->link[k]);
	memset(t->rhop, 0, sizeof(t->rhop));
	for (unsigned u = 0; u < t->U; u++) {
		struct tstage *st = &t->st[u];
		for (unsigned b = 0; b < MBP_TRAIN_MAX_REPLICAS; b++) {
			hop_free(&st->fwd_hop[b]);
			hop_free(&st->bwd_hop[b]);
		}
		memset(st->fwd_in, 0, sizeof(st->fwd_in));
		memset(st->fwd_out, 0, sizeof(st->fwd_out));
		memset(st->bwd_in, 0, sizeof(st->bwd_in));
		memset(st->bwd_out, 0, sizeof(st->bwd_out));
		free(st->in);
		free(st->stash);
		free(st->dout);
		free(st->work);
		mbp__trace_free(&st->trace);
		st->in = st->stash = st->dout = st->work = NULL;
	}
	memset(t->link, 0, sizeof(t->link));
}

/* The activation pool: per stage and micro-batch a stash and a work buffer at most (reserved per
 * schedule by reserve_act). */
static int act_pool_new(struct mbp_trainer *t, size_t widest)
{
	if (widest == 0)
		return 0;
	mbp_pool_opts po;
	mbp_pool_opts_init(&po);
	po.buf_bytes = (size_t)t->o.max_mb_rows * widest;
	uint64_t nbuf = 2ull * t->U * t->o.max_mbs;
	if (nbuf > UINT32_MAX || po.buf_bytes / t->o.max_mb_rows != widest)
		return -EOVERFLOW;
	po.max_buffers = (uint32_t)nbuf;
	po.max_bytes =
	    nbuf * (po.buf_bytes + 256) < ((size_t)1 << 46) ? nbuf * (po.buf_bytes + 256) : ((size_t)1 << 46);
	return mbp_pool_new(&t->apool, &po);
}

/* Stage s has input-gradient backwards of its own in sc (its B_in and W apart). */
static bool splits(const mbp_schedule *sc, unsigned s)
{
	const mbp_sched_op *ops;
	size_t n = mbp_schedule_stage_ops(sc, s, &ops);
	for (size_t i = 0; i < n; i++)
		if (ops[i].kind == MBP_OP_BIN)
			return true;
	return false;
}

/* Grow the activation pool to the most a step of this schedule can hold: per stage (a chunk, under a
 * chunked schedule) a stash per micro-batch held, and a work buffer per micro-batch between its B_in and
 * its W (a stage that splits them: ZB-H1, ZB-H2, ZB-V, DualPipeV, built or read), or one (a B's). */
static int reserve_act(struct mbp_trainer *t, const mbp_schedule *sc)
{
	if (!t->apool)
		return 0;
	uint64_t want = 0;
	/* a replica holds at most what its stage's list does (its list is a projection of that one) */
	for (unsigned u = 0; u < t->U; u++) {
		unsigned g = t->gidx[t->st[u].idx], held = mbp_schedule_held_peak(sc, g);
		want += t->st[u].stash_w ? held : 0;
		want += t->st[u].work_w ? (splits(sc, g) ? held : 1) : 0;
	}
	return mbp__pool_reserve(t->apool, (uint32_t)want);
}

static int setup(struct mbp_trainer *t)
{
	/* Threads and CPUs from the pipeline's placement plan (affinity.c): the same thread count (the CPUs
	 * this process may use, under its cgroup quota), stage s on thread s * T / S, each thread on the CPU
	 * fewest threads of the process are pinned to, claimed until free_stages(). */
	int unnamed[MBP_MAX_STAGES];
	for (unsigned u = 0; u < t->U; u++)
		unnamed[u] = -1;
	/* replicas: a copy of its thread for each replica (train.h, "Replicas"), replica k of stage s on
	 * thread base[s] + k */
	uint16_t base[MBP_MAX_STAGES], unit_thread[MBP_MAX_STAGES];
	unsigned copies = 0;
	if (t->U > t->S) {
		MBP_VERIFY(mbp__replica_bases(t->S, t->placed, t->thread_of, t->reps, base, &copies) == 0);
		for (unsigned u = 0; u < t->U; u++)
			unit_thread[u] = (uint16_t)(base[t->st[u].idx] + t->st[u].rep);
	}
	struct mbp__placement_req rq = {.nstages = t->U,
					.threads = t->o.threads,
					.pin = t->o.pinning == MBP_PIN_PLAN,
					.named = unnamed,
					.node_k = t->remote ? t->rem.node_k : 0,
					.node_m = t->remote ? t->rem.node_m : 0,
					.thread_of = t->placed ? t->thread_of : NULL};
	if (t->placed)
		rq.threads = t->placed;
	if (t->U > t->S) {
		rq.threads = copies;
		rq.thread_of = unit_thread;
	}
	int prc = mbp__crew_plan(&t->crew, &rq, t->o.spin_ns, 0 /* the default yield, as the pipeline's */);
	if (prc < 0)
		return prc;
	t->T = t->crew.nthreads;
	/* the end of the step shared by all threads where every stage goes by pieces and none is
	 * replicated (a replicated one's replicas share its own); not in a part of a larger pipeline,
	 * whose stages are its own range of the whole's */
	t->end_shared = t->T > 1 && t->U == t->S && !t->remote;
	for (unsigned s = 0; s < t->S; s++)
		t->end_shared &= t->st[s].d.pieces > 0;
	mbp__wait_global_init(); /* the replicas' parkers (a trainer of one stage has no ring to call it) */
	t->wopts = t->crew.wopts;
	t->wopts.abort = &t->abort; /* a worker waiting on a ring stops when the step fails */
	size_t widest = t->o.in_row_bytes, act_widest = 0;
	for (unsigned u = 0; u < t->U; u++) {
		struct tstage *st = &t->st[u];
		unsigned s = st->idx;
		/* a remote neighbour (another part's stage) is one link, whatever its replicas */
		st->nprev = prev_here(t, s) ? t->reps[s - 1] : 1;
		st->nnext = next_here(t, s) ? t->reps[s + 1] : 1;
		widest = st->out_w > widest ? st->out_w : widest;
		widest = st->grad_w > widest ? st->grad_w : widest;
		act_widest = st->stash_w > act_widest ? st->stash_w : act_widest;
		act_widest = st->work_w > act_widest ? st->work_w : act_widest;
		st->in = calloc(t->o.max_mbs, sizeof(mbp_mb *));
		st->stash = calloc(t->o.max_mbs, sizeof(mbp_mb *));
		st->dout = calloc(t->o.max_mbs, sizeof(mbp_mb *));
		st->work = calloc(t->o.max_mbs, sizeof(mbp_mb *));
		if (!st->in || !st->stash || !st->dout || !st->work)
			return -ENOMEM;
		if (mbp__trace_init(&st->trace, t->o.trace_events) < 0)
			return -ENOMEM;
		/* a hop each way to every replica of the next stage (micro-batch j: j mod nnext), where the
		 * next global stage is this part's too (else a link, below): a ring to another thread, a
		 * local FIFO where that replica runs on this unit's thread */
		for (unsigned b = 0; next_here(t, s) && b < st->nnext; b++) {
			uint32_t cap = next_pow2(t->o.max_mbs);
			unsigned v = t->ub[s + 1] + b;
			bool local = t->crew.thread_of[u] == t->crew.thread_of[v];
			int rc = hop_new(t, &st->fwd_hop[b], local, cap);
			if (rc == 0)
				rc = hop_new(t, &st->bwd_hop[b], local, cap);
			if (rc < 0)
				return rc;
			st->fwd_out[b] = &st->fwd_hop[b];
			st->bwd_in[b] = &st->bwd_hop[b];
			t->st[v].fwd_in[st->rep] = st->fwd_out[b];
			t->st[v].bwd_out[st->rep] = st->bwd_in[b];
		}
	}
	for (unsigned u = 0; u < t->U && t->remote; u++) {
		/* the rings to the remote neighbours, their agent at the far end: each replica of a stage at
		 * a part's edge has its own (the agent sends it micro-batches j mod its replicas) */
		struct tstage *st = &t->st[u];
		unsigned s = st->idx;
		uint32_t cap = next_pow2(t->o.max_mbs);
		int id = mbp__train_link(u, 0);
		struct mbp__ring **l = &t->link[id];
		int rc = 0;
		if (t->gidx[s] > 0 && !prev_here(t, s) &&
		    (rc = mbp__ring_new(&l[MBP__LINK_UP_FWD], cap, &t->wopts, 0)) == 0)
			rc = mbp__ring_new(&l[MBP__LINK_UP_BWD], cap, &t->wopts, 0);
		if (rc == 0 && t->gidx[s] + 1u < t->Sg && !next_here(t, s) &&
		    (rc = mbp__ring_new(&l[MBP__LINK_DOWN_FWD], cap, &t->wopts, 0)) == 0)
			rc = mbp__ring_new(&l[MBP__LINK_DOWN_BWD], cap, &t->wopts, 0);
		if (l[MBP__LINK_UP_FWD]) {
			st->fwd_in[0] = link_hop(t, id + MBP__LINK_UP_FWD);
			st->bwd_out[0] = link_hop(t, id + MBP__LINK_UP_BWD);
			st->bwd_kick = true;
			if (t->sched_threads) /* the stage before is another part's: its rows are the input's */
				st->din_w = 0;
		}
		if (l[MBP__LINK_DOWN_FWD]) {
			st->fwd_out[0] = link_hop(t, id + MBP__LINK_DOWN_FWD);
			st->bwd_in[0] = link_hop(t, id + MBP__LINK_DOWN_BWD);
			st->fwd_kick = true;
		}
		if (rc < 0)
			return rc;
	}
	if (t->remote && t->rem.widest > widest)
		widest = t->rem.widest; /* every part's items come into this pool */
	/* The bound, for any M up to max_mbs: what prepare_schedule() reserves is at most, per stage and
	 * micro-batch, a stash and the loss's gradient; per link (S + 1 at most, the remote ones included)
	 * and micro-batch, an output and an input gradient; per thread the buffer its operation fills and its
	 * cache; and the agent's. */
	mbp_pool_opts po;
	mbp_pool_opts_init(&po);
	po.buf_bytes = (size_t)t->o.max_mb_rows * widest;
	uint64_t nbuf = (4ull * t->Sg + 2) * t->o.max_mbs + (CACHE_BUFS + 1ull) * t->T +
			(t->remote ? t->rem.extra_buffers : 0);
	if (nbuf > UINT32_MAX || po.buf_bytes / t->o.max_mb_rows != widest)
		return -EOVERFLOW;
	po.max_buffers = (uint32_t)nbuf;
	po.max_bytes =
	    nbuf * (po.buf_bytes + 256) < ((size_t)1 << 46) ? nbuf * (po.buf_bytes + 256) : ((size_t)1 << 46);
	po.cache_size = CACHE_BUFS;
	int rc = mbp_pool_new(&t->pool, &po);
	if (rc < 0)
		return rc;
	t->crew.pool = t->pool; /* each thread's cache */
	return act_pool_new(t, act_widest);
}

/* A start refused before anything is set up: `err`, and mbp_trainer_error says why. */
static int start_refused_with(struct mbp_trainer *t, int err, int stage, mbp_op_kind op, const char *what)
{
	t->err = (mbp_train_error){.err = err, .stage = stage, .mb = -1, .op = op, .what = what};
	return err;
}

static int start_refused(struct mbp_trainer *t, int stage, mbp_op_kind op, const char *what)
{
	return start_refused_with(t, -EINVAL, stage, op, what);
}

/* What replicas need (train.h, "Replicas"): 0, or a refused start. */
static int replicas_check(struct mbp_trainer *t)
{
	if (t->U == t->S)
		return 0;
	/* across ranks a replicated stage's items go out in micro-batch order, as every fixed kind runs
	 * them; a custom or built one (t->o.custom) need not */
	if (t->remote && t->o.custom)
		return start_refused_with(
		    t, -ENOTSUP, -1, MBP_OP_F,
		    "replicas: across ranks, not under a custom or built schedule (read "
		    "from text or MBP_SCHED_AUTO: its stages may run their micro-batches "
		    "out of order)");
	/* a chunked, built or custom schedule: `threads` is its own (its placement), copied per replica */
	if (!mbp__sched_kind_placed(t->o.schedule) && t->o.threads && t->o.threads != t->U)
		return start_refused(t, -1, MBP_OP_F,
				     "threads: with replicas every replica has a thread of its own (0 or the "
				     "replicas' sum)");
	return 0;
}

/* A chunked schedule fixes each stage's thread: its placement for the thread count asked (0: two chunks
 * a thread), as mbp_schedule_new_placed gives it, or a part's of it (train_internal.h). 0, or a refused
 * start. */
static int place_chunks(struct mbp_trainer *t)
{
	if (t->remote) {
		t->placed = t->rem.sched_threads ? t->rem.threads : 0;
		t->sched_threads = t->rem.sched_threads;
		memcpy(t->thread_of, t->rem.thread_of, sizeof(t->thread_of));
	} else {
		const char *what = NULL;
		int rc = mbp__train_place(&t->o, t->S, t->o.threads, t->thread_of, &t->placed, &what);
		if (rc == -EINVAL)
			return start_refused(t, -1, MBP_OP_F, what);
		if (rc < 0)
			return rc;
		t->sched_threads = t->placed;
	}
	for (unsigned s = 0; t->o.custom && s < t->S; s++)
		if (!t->st[t->ub[s]].split && splits(t->o.custom, t->gidx[s]))
			return start_refused(t, (int)t->gidx[s], MBP_OP_W,
					     "the schedule splits this stage's backward: it needs "
					     "backward_in and backward_w");
	return 0;
}

int mbp_trainer_start(mbp_trainer *t)
{
	if (!t)
		return -EINVAL;
	if (t->state != TS_NEW)
		return -EALREADY;
	if (t->S == 0)
		return -EINVAL;
	if (!t->remote) {
		t->stage0 = 0;
		t->Sg = t->S;
	}
	for (unsigned s = 0; s < t->S; s++) {
		t->gidx[s] = (uint16_t)(t->remote && t->rem.sched_threads ? t->rem.global[s] : t->stage0 + s);
		if (t->gidx[s] >= t->Sg || (s && t->gidx[s] <= t->gidx[s - 1]) ||
		    (t->remote && t->rem.sched_threads && t->rem.thread_of[s] >= t->rem.threads))
			return -EINVAL;
	}
	int rc = replicas_check(t);
	if (rc < 0)
		return rc;
	/* As mbp_schedule_simulate refuses it: a thread without a stage would have nothing to run. */
	if (t->U == t->S && t->o.threads > t->S)
		return start_refused(t, -1, MBP_OP_F,
				     "threads: more than the stages (each thread runs one stage or more)");
	mbp_sched_kind kind = t->o.schedule;
	if (kind == MBP_SCHED_ZBH1 || kind == MBP_SCHED_ZBH2 || kind == MBP_SCHED_ZBV ||
	    kind == MBP_SCHED_DUALPIPEV)
		for (unsigned s = 0; s < t->S; s++)
			if (!t->st[t->ub[s]].split)
				return start_refused(
				    t, (int)t->gidx[s], MBP_OP_W,
				    "a zero-bubble schedule (ZB-H1, ZB-H2, ZB-V, DualPipeV) needs "
				    "backward_in and backward_w at every stage");
	rc = place_chunks(t);
	if (rc < 0)
		return rc;
	/* The loss writes the global last stage's output gradient: rows of its output. */
	const struct tstage *last = &t->st[t->U - 1];
	if (t->gidx[t->S - 1] + 1u == t->Sg && last->grad_w != last->out_w)
		return start_refused(t, (int)(t->Sg - 1), MBP_OP_B,
				     "the last stage's grad_row_bytes must be its out_row_bytes (the loss "
				     "writes it)");
	rc = setup(t);
	/* every init runs; on an error, every fini where the init succeeded */
	if (rc == 0)
		rc = mbp__crew_start(&t->crew);
	if (rc < 0) {
		free_stages(t);
		mbp_pool_destroy(t->pool);
		mbp_pool_destroy(t->apool);
		t->pool = t->apool = NULL;
		t->state = TS_STOPPED;
		return rc;
	}
	t->state = TS_RUNNING;
	t->sum.stages = t->S;
	t->sum.threads = t->T;
	return 0;
}

/* Grow the pool to what a step of this schedule can hold at once, whatever its timing: the threads' peak,
 * what their caches can keep out of the depot (the pool grows only when a getter finds both its cache and
 * the depot empty), and the agent's buffers. */
static int reserve_buffers(struct mbp_trainer *t, const mbp_schedule *sc, const mbp_sched_op *ops,
			   const size_t *toff, bool replicated)
{
	bool stash[MBP_MAX_STAGES] = {false}; /* the stashes are the activation pool's (reserve_act) */
	struct mbp__sched_part part = {t->stage0, t->S, t->T, ops, toff, stash};
	if (t->placed) /* each stage its own process: a bound over every timing of the stage lists, which
			  the threads' lists only narrow (their chunks are not neighbours); across parts, of the
			  whole pipeline's (it holds this part's) */
		part = (struct mbp__sched_part){0, t->Sg, t->Sg, sc->stage_ops, sc->stage_off, stash};
	uint64_t peak;
	int rc = 0;
	if (replicated) {
		/* replicas (here or in another part): the per-process play cannot follow one stage on
		 * several threads, so the bound over every timing is counted per micro-batch: an output and
		 * an input gradient per link (between two stages here, or to another part's) and the loss's
		 * gradient, each held once at most, and a buffer per running operation */
		unsigned links = 0; /* after each stage but the pipeline's last; before one whose previous
				       is another part's */
		for (unsigned s = 0; s < t->S; s++)
			links += (t->gidx[s] + 1u < t->Sg) + (t->gidx[s] > 0 && !prev_here(t, s));
		peak = (uint64_t)mbp_schedule_mbs(sc) * (2ull * links + 1) + t->T;
	} else
		rc = mbp__schedule_buffer_peak(sc, &part, &peak);
	if (rc < 0)
		return rc;
	uint64_t want = peak + (uint64_t)CACHE_BUFS * t->T + (t->remote ? t->rem.extra_buffers : 0);
	mbp_pool_stats ps;
	mbp_pool_stats_get(t->pool, &ps);
	if (want > ps.max_buffers) /* setup's bound covers every M up to max_mbs, unless bytes cap it */
		return -ENOBUFS;
	return mbp__pool_reserve(t->pool, (uint32_t)want);
}

/* The schedule for M micro-batches, and the threads' lists: built when M changes, kept otherwise. */
static int prepare_schedule(struct mbp_trainer *t, uint32_t M)
{
	if (t->sc && mbp_schedule_mbs(t->sc) == M)
		return 0;
	/* replicas of any stage of the pipeline (this part's or another's: every part plays the same
	 * order) give a block kind its replicated order */
	const unsigned *reps = t->remote ? t->rem.reps : t->reps;
	bool replicated = false;
	for (unsigned g = 0; g < t->Sg; g++)
		replicated |= reps[g] > 1;
	mbp_schedule *sc;
	int rc = t->o.custom
		     ? (mbp_schedule_mbs(t->o.custom) == M ? mbp_schedule_copy(&sc, t->o.custom) : -EINVAL)
		 : replicated && !t->placed
		     ? mbp_schedule_new_replicated(&sc, t->o.schedule, t->Sg, M, reps)
		     : mbp_schedule_new_placed(&sc, t->o.schedule, t->Sg, M, t->sched_threads);
	if (rc < 0)
		return rc;
	mbp_sched_op *ops = malloc(sc->n * sizeof(*ops));
	if (!ops) {
		mbp_schedule_destroy(sc);
		return -ENOMEM;
	}
	size_t toff[MBP_MAX_STAGES + 1];
	/* each stage's operations on its thread; a replicated stage's micro-batch j on its replica j mod r,
	 * whose threads follow its first's (a thread per unit) */
	uint16_t thread[MBP_MAX_STAGES];
	for (unsigned s = 0; s < t->S; s++) {
		thread[s] = (uint16_t)t->crew.thread_of[t->ub[s]];
		for (unsigned k = 0; k < t->reps[s]; k++)
			MBP_VERIFY(t->crew.thread_of[t->ub[s] + k] == thread[s] + k);
	}
	mbp__schedule_local_lists(sc, t->gidx, thread, t->reps, t->S, t->T, ops, toff);
	rc = reserve_buffers(t, sc, ops, toff, replicated || t->U > t->S);
	if (rc == 0)
		rc = reserve_act(t, sc);
	/* a part has the costs of its own stages only: it predicts no bubble */
	struct mbp__sched_scratch sim = {0};
	if (rc == 0 && !t->remote)
		rc = mbp__sched_scratch_new(&sim, sc, t->T);
	if (rc < 0) {
		mbp__sched_scratch_free(&sim);
		mbp_schedule_destroy(sc);
		free(ops);
		return rc;
	}
	memcpy(t->toff, toff, sizeof(toff));
	mbp_schedule_destroy(t->sc);
	free(t->tops);
	mbp__sched_scratch_free(&t->sim);
	t->sc = sc;
	t->tops = ops;
	t->sim = sim;
	return 0;
}

static void summarise(struct mbp_trainer *t, int rc, uint64_t t_end)
{
	mbp_op_costs costs[MBP_MAX_STAGES];
	double busy = 0;
	for (unsigned s = 0; s < t->S; s++) {
		/* a stage's mean costs over its replicas' operations */
		uint64_t ns[4] = {0}, rn = 0;
		uint32_t n[4] = {0};
		for (unsigned u = t->ub[s]; u < t->ub[s + 1]; u++) {
			struct tcounters *c = &t->st[u].c;
			for (int k = 0; k < 4; k++) {
				ns[k] += mbp__counter_get(&c->ns[k]);
				n[k] += (uint32_t)mbp__counter_get(&c->count[k]);
			}
			rn += mbp__counter_get(&c->r_ns);
		}
		for (int k = 0; k < 4; k++)
			busy += (double)ns[k];
		/* a recomputation is part of the B or B_in it serves */
		busy += (double)rn;
		ns[n[MBP_OP_B] ? MBP_OP_B : MBP_OP_BIN] += rn;
		costs[s].f = n[MBP_OP_F] ? (double)ns[MBP_OP_F] / n[MBP_OP_F] : 0;
		if (n[MBP_OP_BIN] && n[MBP_OP_W]) { /* (DualPipeV: some micro-batches' B whole, b_in + b_w) */
			costs[s].b_in = (double)ns[MBP_OP_BIN] / n[MBP_OP_BIN];
			costs[s].b_w = (double)ns[MBP_OP_W] / n[MBP_OP_W];
		} else {
			costs[s].b_in = n[MBP_OP_B] ? (double)ns[MBP_OP_B] / n[MBP_OP_B] : 0;
			costs[s].b_w = 0;
		}
	}
	mbp_sched_sim sim = {0};
	if (rc == 0 && t->U > t->S && !t->remote)
		mbp__schedule_simulate_rep_in(t->sc, costs, t->reps, &sim, NULL, &t->sim);
	else if (rc == 0 && !t->remote) /* a part has the costs of its own stages only */
		mbp__schedule_simulate_in(t->sc, costs, t->T, &sim, NULL, &t->sim); /* allocates nothing */
	pthread_mutex_lock(&t->lock);
	t->sum.mbs = t->M;
	t->sum.step_ns = t_end - t->t_go;
	if (rc == 0) {
		t->sum.steps++;
		t->sum.bubble = t->sum.step_ns ? 1.0 - busy / ((double)t->T * (double)t->sum.step_ns) : 0;
		t->sum.bubble_predicted = sim.bubble;
	} else {
		t->sum.steps_failed++;
	}
	pthread_mutex_unlock(&t->lock);
}

/* The checks of a step's arguments that do not depend on a cancel or drain. */
static int step_check(const mbp_trainer *t, size_t rows, uint32_t mb_rows)
{
	if (rows == 0 || mb_rows == 0)
		return -EINVAL;
	if (t->state != TS_RUNNING)
		return t->state == TS_NEW ? -ENOTCONN : -ESHUTDOWN;
	return mbp__train_size_check(rows, mb_rows, t->o.max_mb_rows, t->o.max_mbs);
}

static int step_run(struct mbp_trainer *t, const void *in, const void *targets, size_t rows, uint32_t mb_rows,
		    double *loss);
static int step_fail_early(struct mbp_trainer *t, mbp_train_error e);

/* A broken trainer (train.h: -ENOTRECOVERABLE) runs no more steps: the error it broke with, or 0. */
static mbp_train_error broken(struct mbp_trainer *t)
{
	pthread_mutex_lock(&t->lock);
	mbp_train_error e = t->broken;
	if (e.err)
		t->err = e;
	pthread_mutex_unlock(&t->lock);
	return e;
}

int mbp_trainer_step(mbp_trainer *t, const void *in, const void *targets, size_t rows, uint32_t mb_rows,
		     double *loss)
{
	if (!t || !in || !targets || t->remote)
		return -EINVAL;
	int rc = step_check(t, rows, mb_rows);
	if (rc < 0)
		return rc;
	/* relaxed: a hint; a cancel that lands after this check fails the step through abort, a drain lets
	 * it finish */
	if (atomic_load_explicit(&t->cancelled, memory_order_relaxed) ||
	    atomic_load_explicit(&t->draining, memory_order_relaxed))
		return -ESHUTDOWN;
	mbp_train_error e = broken(t);
	return e.err ? e.err : step_run(t, in, targets, rows, mb_rows, loss);
}

int mbp__trainer_step_remote(mbp_trainer *t, const void *in, const void *targets, size_t rows,
			     uint32_t mb_rows, double *loss)
{
	if (!t || !t->remote || (!in && t->gidx[0] == 0) || (!targets && t->gidx[t->S - 1] + 1u == t->Sg))
		return -EINVAL;
	int rc = step_check(t, rows, mb_rows);
	if (rc < 0)
		return rc;
	mbp_train_error e = broken(t); /* the other parts learn it from this part's vote */
	return e.err ? step_fail_early(t, e) : step_run(t, in, targets, rows, mb_rows, loss);
}

/* A part that cannot run its step (its schedule could not be built, or it is broken) still takes part in
 * it: the other parts wait for its vote at their first barrier. It fails the step at once (the remote
 * tells the others) and votes with its error `e`; its workers do not run. What the agent pushed into the
 * incoming rings before agree() closed the step is dropped here (no worker takes it). */
static int step_fail_early(struct mbp_trainer *t, mbp_train_error e)
{
	pthread_mutex_lock(&t->lock);
	t->err = e;
	pthread_mutex_unlock(&t->lock);
	t->rem.begin(t->rem.arg);
	t->rem.failed(t->rem.arg);
	struct mbp__train_vote v = {.ok = false, .err = e};
	t->rem.agree(t->rem.arg, &v);
	for (unsigned u = 0; u < t->U; u++) {
		static const int incoming[] = {MBP__LINK_UP_FWD, MBP__LINK_DOWN_BWD};
		for (unsigned i = 0; i < MBP_ARRAY_SIZE(incoming); i++) {
			struct mbp__ring *l = t->link[mbp__train_link(u, incoming[i])];
			void *item;
			while (l && mbp__ring_pop_sc(l, &item))
				mbp_pool_put(t->pool, NULL, item);
		}
	}
	if (v.ok || v.err.err == 0) /* cannot happen: this part voted no */
		v.err = e;
	v.err.what = same_error(&v.err, &e) ? e.what : NULL; /* another part's words stayed there */
	pthread_mutex_lock(&t->lock);
	t->err = v.err;
	t->sum.steps_failed++;
	pthread_mutex_unlock(&t->lock);
	return v.err.err;
}

static int step_run(struct mbp_trainer *t, const void *in, const void *targets, size_t rows, uint32_t mb_rows,
		    double *loss)
{
	size_t M = (rows + mb_rows - 1) / mb_rows; /* no wrap: rows <= max_mbs * mb_rows (step_check) */
	int rc = t->prepare_err ? t->prepare_err : prepare_schedule(t, (uint32_t)M);
	t->prepare_err = 0;
	if (rc < 0)
		return t->remote ? step_fail_early(t, (mbp_train_error){.err = rc, .stage = -1, .mb = -1})
				 : rc;
	t->in = in;
	t->targets = targets;
	t->rows = rows;
	t->mb_rows = mb_rows;
	t->M = (uint32_t)M;
	for (unsigned s = 0; s < t->S; s++) /* relaxed: published by the bump of go below */
		atomic_store_explicit(&t->st[t->ub[s]].w_next, 0, memory_order_relaxed);
	mbp__counter_reset(&t->act_peak_bufs); /* this step's peaks (every buffer came back) */
	mbp__counter_reset(&t->act_peak_bytes);
	pthread_mutex_lock(&t->lock);
	t->err = (mbp_train_error){0};
	t->err.stage = -1;
	t->err.mb = -1;
	pthread_mutex_unlock(&t->lock);
	/* seq_cst pair with mbp_trainer_cancel(), which stores cancelled then abort: either this load sees
	 * its cancelled, or its abort store comes after this one, so a cancel is never lost */
	atomic_store_explicit(&t->abort, 0, memory_order_seq_cst);
	if (atomic_load_explicit(&t->cancelled, memory_order_seq_cst))
		atomic_store_explicit(&t->abort, 1, memory_order_seq_cst);
	if (t->remote)
		t->rem.begin(t->rem.arg); /* from now on a remote failure reaches this step */
	uint32_t done0 = mbp__gen_get(&t->done);
	t->t_go = mbp__clock_ns();
	mbp__gen_bump(&t->go); /* release; partner: the workers' acquire of go: publishes the step above */
	/* acquire; partner: the release bump in step_end() by the last worker to reach the second barrier,
	 * which every worker reached after its updates: everything the step wrote is visible */
	mbp__gen_wait(&t->done, done0);
	uint64_t t_end = t->t_go;
	for (unsigned i = 0; i < t->T; i++)
		t_end = t->th[i].last_end > t_end ? t->th[i].last_end : t_end;
	pthread_mutex_lock(&t->lock);
	if (t->broken.err && t->err.err == 0) /* an update of this step refused */
		t->err = t->broken;
	rc = t->err.err;
	if (rc == 0 && !t->step_ok)
		rc = t->err.err = -ECANCELED; /* cancelled before any operation failed */
	pthread_mutex_unlock(&t->lock);
	summarise(t, rc, t_end);
	if (rc < 0)
		return rc;
	double l = t->step_loss;
	pthread_mutex_lock(&t->lock);
	t->sum.loss = l;
	pthread_mutex_unlock(&t->lock);
	t->step_no++;
	if (loss)
		*loss = l;
	return 0;
}

int mbp_trainer_error(const mbp_trainer *t, mbp_train_error *e)
{
	if (!t || !e)
		return -EINVAL;
	pthread_mutex_lock((pthread_mutex_t *)&t->lock);
	*e = t->err;
	pthread_mutex_unlock((pthread_mutex_t *)&t->lock);
	return 0;
}

void mbp_trainer_cancel(mbp_trainer *t)
{
	if (!t)
		return;
	/* seq_cst: see step_run(); abort also pairs (partner) with the acquire load in aborting() */
	atomic_store_explicit(&t->cancelled, 1, memory_order_seq_cst);
	atomic_store_explicit(&t->abort, 1, memory_order_seq_cst);
	if (t->state == TS_RUNNING)
		wake_all(t);
}

void mbp_trainer_drain(mbp_trainer *t)
{
	if (t)
		/* relaxed: a flag read at the next step, which publishes nothing */
		atomic_store_explicit(&t->draining, 1, memory_order_relaxed);
}

void mbp_trainer_destroy(mbp_trainer *t)
{
	if (!t)
		return;
	if (t->state == TS_RUNNING) {
		/* relaxed: published by the bump that follows */
		atomic_store_explicit(&t->quit, 1, memory_order_relaxed);
		mbp__gen_bump(&t->go); /* release; partner: the workers' acquire of go, which then see quit */
	}
	free_stages(t); /* joins the threads */
	if (t->pool)
		MBP_VERIFY(mbp_pool_destroy(t->pool) == 0); /* every buffer came back */
	if (t->apool)
		MBP_VERIFY(mbp_pool_destroy(t->apool) == 0);
	mbp_schedule_destroy(t->sc);
	mbp_schedule_destroy((mbp_schedule *)t->o.custom);
	free(t->tops);
	mbp__sched_scratch_free(&t->sim);
	free(t->loss);
	for (unsigned s = 0; s < t->S; s++)
		free(t->st[t->ub[s]].piece_sq);
	pthread_mutex_destroy(&t->lock);
	mbp__crew_destroy(&t->crew);
	free(t);
}

/* The figures of units [u0, u1) (a stage's replicas, or one of them) into *o: sums, where it runs that of
 * u0; the peaks summed too (a bound of what they held at once). */
static void unit_stats(struct mbp_trainer *t, unsigned u0, unsigned u1, mbp_train_stage_stats *o)
{
	memset(o, 0, sizeof(*o));
	memcpy(o->name, t->st[u0].name, sizeof(o->name));
	/* where it runs, as mbp_pipeline_placement says it (crew.h) */
	mbp_placement pl = mbp__crew_place(&t->crew, u0, t->state == TS_RUNNING);
	o->thread = pl.thread;
	o->cpu = pl.cpu;
	o->pin_error = pl.pin_error;
	o->sharing = pl.sharing;
	o->act_stash_bytes = (uint64_t)t->st[u0].stash_w * t->mb_rows;
	o->act_work_bytes = (uint64_t)t->st[u0].work_w * t->mb_rows;
	for (unsigned u = u0; u < u1; u++) {
		struct tstage *x = &t->st[u];
		o->f_ns += mbp__counter_get(&x->c.ns[MBP_OP_F]);
		o->b_ns += mbp__counter_get(&x->c.ns[MBP_OP_B]);
		o->bin_ns += mbp__counter_get(&x->c.ns[MBP_OP_BIN]);
		o->w_ns += mbp__counter_get(&x->c.ns[MBP_OP_W]);
		o->f_count += (uint32_t)mbp__counter_get(&x->c.count[MBP_OP_F]);
		o->b_count += (uint32_t)mbp__counter_get(&x->c.count[MBP_OP_B]);
		o->bin_count += (uint32_t)mbp__counter_get(&x->c.count[MBP_OP_BIN]);
		o->w_count += (uint32_t)mbp__counter_get(&x->c.count[MBP_OP_W]);
		o->wait_ns += mbp__counter_get(&x->c.wait_ns);
		o->stash_peak += (uint32_t)mbp__counter_get(&x->c.stash_peak);
		o->held_peak += (uint32_t)mbp__counter_get(&x->c.held_peak);
		o->total_busy_ns += mbp__counter_get(&x->c.total_busy_ns);
		o->r_ns += mbp__counter_get(&x->c.r_ns);
		o->r_count += (uint32_t)mbp__counter_get(&x->c.r_count);
		o->act_peak_bytes += mbp__counter_get(&x->c.act_peak);
		o->hops += (uint32_t)mbp__counter_get(&x->c.hops);
		o->local_hops += (uint32_t)mbp__counter_get(&x->c.local_hops);
	}
}

int mbp_trainer_stats_get(mbp_trainer *t, mbp_train_stats *st, mbp_train_stage_stats *ss, unsigned n)
{
	if (!t || (!ss && n))
		return -EINVAL;
	if (st) {
		pthread_mutex_lock(&t->lock);
		*st = t->sum;
		st->stages = t->S;
		st->threads = t->T;
		pthread_mutex_unlock(&t->lock);
		if (t->pool)
			mbp_pool_stats_get(t->pool, &st->pool);
		else
			memset(&st->pool, 0, sizeof(st->pool));
		memset(&st->act_pool, 0, sizeof(st->act_pool));
		if (t->apool)
			mbp_pool_stats_get(t->apool, &st->act_pool);
		st->act_buf_bytes = t->apool ? mbp_pool_buf_bytes(t->apool) : 0;
		st->act_peak_bufs = mbp__counter_get(&t->act_peak_bufs);
		st->act_peak_bytes = mbp__counter_get(&t->act_peak_bytes);
	}
	for (unsigned s = 0; s < n && s < t->S; s++)
		unit_stats(t, t->ub[s], t->ub[s + 1], &ss[s]);
	return (int)t->S;
}

int mbp_trainer_replica_stats_get(mbp_trainer *t, unsigned stage, mbp_train_stage_stats *ss, unsigned n)
{
	if (!t || (!ss && n) || stage >= t->S)
		return -EINVAL;
	for (unsigned k = 0; k < n && k < t->reps[stage]; k++)
		unit_stats(t, t->ub[stage] + k, t->ub[stage] + k + 1, &ss[k]);
	return (int)t->reps[stage];
}

const mbp_schedule *mbp_trainer_schedule(const mbp_trainer *t)
{
	return t ? t->sc : NULL;
}

int mbp_trainer_trace_write(mbp_trainer *t, const char *path)
{
	if (!t || !path || !t->o.trace_events || t->state != TS_RUNNING)
		return -EINVAL;
	struct mbp__trace_track tk[MBP_MAX_STAGES];
	for (unsigned u = 0; u < t->U; u++) /* a row per replica */
		tk[u] = (struct mbp__trace_track){.name = t->st[u].rname,
						  .cpu = mbp__crew_place(&t->crew, u, false).cpu,
						  .tr = &t->st[u].trace};
	return mbp__trace_write(path, tk, t->U, t->t_go);
}

int mbp_trainer_events_get(const mbp_trainer *t, mbp_train_event *ev, size_t n)
{
	if (!t || (!ev && n) || !t->o.trace_events)
		return -EINVAL;
	size_t k = 0;
	for (unsigned u = 0; u < t->U; u++) /* a replicated stage's replica after replica */
		for (uint32_t i = 0, m = mbp__trace_count(&t->st[u].trace); i < m; i++, k++)
			if (k < n) {
				const struct mbp__trace_ev *e = &t->st[u].trace.ev[i];
				ev[k] = (mbp_train_event){.t0_ns = e->t0 - t->t_go,
							  .t1_ns = e->t1 - t->t_go,
							  .mb = e->mb,
							  .stage = t->gidx[t->st[u].idx],
							  .kind = e->kind};
			}
	return (int)k;
}

/* ---- a part of a larger pipeline (train_internal.h) ---- */

int mbp__trainer_set_remote(mbp_trainer *t, const struct mbp__train_remote *r)
{
	if (!t || !r || t->state != TS_NEW || !r->kick || !r->begin || !r->failed || !r->agree ||
	    r->stages == 0 || r->stages > MBP_MAX_STAGES || r->stage0 >= r->stages ||
	    r->sched_threads > MBP_MAX_STAGES || (r->sched_threads && r->threads == 0))
		return -EINVAL;
	t->rem = *r;
	t->remote = true;
	t->stage0 = r->stage0;
	t->Sg = r->stages;
	return 0;
}

int mbp__trainer_link_of(const mbp_trainer *t, unsigned s, uint32_t j, int kind)
{
	return mbp__train_link(t->ub[s] + j % t->reps[s], kind);
}

unsigned mbp__trainer_units(const mbp_trainer *t, unsigned s, unsigned *first)
{
	*first = t->ub[s];
	return t->reps[s];
}

bool mbp__trainer_link_pop(mbp_trainer *t, int link, mbp_mb **mb)
{
	void *item;
	if (!t->link[link] || !mbp__ring_pop_sc(t->link[link], &item))
		return false;
	*mb = item;
	return true;
}

bool mbp__trainer_link_push(mbp_trainer *t, int link, mbp_mb *mb)
{
	return t->link[link] && mbp__ring_push_sp(t->link[link], mb);
}

unsigned mbp__trainer_link_count(mbp_trainer *t, int link)
{
	return t->link[link] ? mbp__ring_count(t->link[link]) : 0;
}

uint64_t mbp__trainer_spin_ns(const mbp_trainer *t)
{
	return t->crew.wopts.no_spin ? 0 : t->crew.wopts.spin_ns;
}

void mbp__trainer_fail_next_prepare(mbp_trainer *t, int err)
{
	t->prepare_err = err;
}

const mbp_train_opts *mbp__trainer_opts(const mbp_trainer *t)
{
	return &t->o;
}

mbp_pool *mbp__trainer_pool(mbp_trainer *t)
{
	return t->pool;
}

void mbp__trainer_abort(mbp_trainer *t)
{
	/* release: partner of the acquire load in aborting(); no error is recorded (the failing part's
	 * is agreed on at the first barrier) */
	atomic_store_explicit(&t->abort, 1, memory_order_release);
	wake_all(t);
}
