/*
 * Internal to libmbpipe-mpi. Not installed. One room per object:
 *   comm.c     the communication thread, the one thread of the process that calls MPI, and its tasks;
 *              the node's CPUs (mbp__mpi_node_share)
 *   link.c     a credit-windowed link: one direction of one hop between two ranks
 *   ctl.c      the control channel: commands, heartbeats, the watchdog, the quiet stop
 *   loop.c     a run, the base object of both flows: hand-shake, set-up, the one link loop with its park,
 *              tear-down; each flow fills in a small table of operations (struct mbp__run_ops)
 *   mpi.c      the pipeline across ranks on a run: rank 0's table and the job API
 *   trainer.c  training across ranks on a run: the step, the vote and the targets
 */
#ifndef MBP__MPI_INTERNAL_H
#define MBP__MPI_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include <mpi.h>

#include <mbpipe.h>
#include <mbpipe/mpi.h>

#include "wait.h"

/* ---- comm.c ---- */

/* Run fn(arg) on the communication thread (after the task before it): returns a ticket for await. */
uint64_t mbp__mpi_post(int (*fn)(void *), void *arg);
/* Wait for a posted task; its return value. */
int mbp__mpi_await(uint64_t ticket);
/* Post and await. */
int mbp__mpi_call(int (*fn)(void *), void *arg);
/* Collective over every rank, before a rank's local pipeline or trainer starts: this rank is the k-th of
 * the m ranks of its node (MPI_COMM_TYPE_SHARED) whose threads may use the same CPUs as the calling
 * thread's (compared by affinity mask); they split them (pipeline.h, "Placement"). 0 or -errno (then
 * k = m = 0: no split). */
int mbp__mpi_node_share(unsigned *k, unsigned *m);
/* mbp_mpi_finalize() is to abort, not finalize (a rank went silent). */
void mbp__mpi_abort_at_end(void);
/* On the communication thread: MPI_Abort now if mbp_mpi_abort() asked for it. */
void mbp__mpi_check_abort(void);
/* On the communication thread: wait for a request (cancelled first if `cancel`), at most until `deadline`
 * (mbp__now_ns); then leave it (the run failed and MPI_Abort follows). */
void mbp__mpi_finish(MPI_Request *rq, bool cancel, uint64_t deadline);

/* ---- the wire ---- */

/* The header of an item on a link; its payload follows as a second message. */
struct mbp__hdr {
	uint64_t seq;	    /* the pipeline: the global sequence number; the trainer: the micro-batch */
	uint64_t tag;	    /* the pipeline: rank 0's clock at acceptance; the trainer: the step's attempt */
	uint32_t rows;	    /* rows in the payload */
	uint32_t row_bytes; /* bytes per row */
	int32_t status;	    /* 0, or the error that failed it: then the payload is empty */
	uint32_t flags;
};
_Static_assert(sizeof(struct mbp__hdr) == 32, "the header is 32 bytes on the wire");

/* Commands of the control channel, in no order (ctl.c sends them in its order of urgency). */
enum {
	MBP__CTL_HB,	  /* a heartbeat */
	MBP__CTL_STEP,	  /* the trainer: rank 0 starts a step (a: attempt, b: rows, arg: micro-batch rows) */
	MBP__CTL_ABORT,	  /* the trainer: a rank's step failed (a: attempt) */
	MBP__CTL_CANCEL,  /* rank 0 cancels */
	MBP__CTL_STOP,	  /* rank 0 ends the run */
	MBP__CTL_STOPPED, /* the answer: this rank's last word (st: its counters) */
	MBP__CTL_LEAVE,	  /* the trainer: a rank leaves mid-run */
};

struct mbp__ctl_msg {
	uint32_t cmd, arg;
	uint64_t a, b;
	mbp_mpi_rank_stats st;
};

/* ---- link.c: one direction of a hop ---- */

/* What an owner did with an arrival (mbp__run_ops.arrived). */
enum {
	MBP__TAKEN, /* the buffer is the owner's now: the slot gets a new one */
	MBP__KEEP,  /* not now: it stays at the head of the window, its credit with it */
	MBP__AGAIN, /* done with it: post the slot again with the same buffer */
};

struct mbp__slot {
	struct mbp__hdr h;
	mbp_mb *mb;
	void *item;    /* sender: the owner's handle of what is being sent */
	uint32_t out;  /* requests still going: bit 0 the header's, bit 1 the payload's */
	bool used, in; /* posted or sending; a receive counted */
};

/* One direction of a hop (link.c says how). Every request of a link is tested in one MPI_Testsome per
 * pass (one run of MPI's progress engine, not one per slot). The loop's thread only. */
struct mbp__link {
	bool send;
	int peer;
	uint32_t W;
	mbp_pool *pool;	       /* receiver: its slots' buffers */
	mbp_pool_cache *cache; /* and the loop's cache of it, or NULL */
	struct mbp__slot *slot;
	MPI_Request *rq; /* slot i: header 2i, payload 2i + 1; the credit message 2W */
	int *done;	 /* MPI_Testsome's indices */
	int *fifo;	 /* receiver: slots in posting order */
	uint32_t fhead, fn;
	uint32_t credits; /* sender: sends allowed */
	uint32_t owed;	  /* receiver: credits to send back */
	uint32_t cred;	  /* the credit message's word */
	bool stalled;	  /* sender: an item waits for a credit (counted once per wait) */
	/* single writer (the loop), read by stats: relaxed */
	_Atomic uint64_t sent, received, credit_waits;
};

/* ---- ctl.c ---- */

struct mbp__peer {
	int rank;
	bool watch;		  /* heartbeats and the watchdog: rank 0 and every other rank */
	bool busy;		  /* a send in flight */
	_Atomic uint32_t pending; /* commands to send (1 << MBP__CTL_*); any thread sets them */
	struct mbp__ctl_msg in, out;
	uint64_t last_heard, last_sent;
};

struct mbp__ctl {
	struct mbp__peer *peer;
	unsigned n;
	MPI_Request *rq; /* peer i: its receive 2i (persistent), its send 2i + 1 */
	int *done;
	unsigned stopped; /* rank 0: STOPPED received */
	bool stop_sent;
	/* the stop's handshake has begun (rank 0: STOP posted; the others: STOP in): from now on only its
	 * words go out, on the links and here (ctl.c) */
	bool quiet;
};

/* ---- loop.c: a run ---- */

struct mbp__run;

/* A flow's part of a run: the backend table of the one loop (Redis ae.c's shape). The link operations
 * run on the loop's thread; those marked "lock held" under run->lock. */
struct mbp__run_ops {
	/* sender: the next item (h filled, *mb holds its payload unless h->status, *item is the owner's
	 * handle) or false; whether an item waits (to count a wait for credit); a send done (or abandoned at
	 * the end of the run): its item back */
	bool (*next)(struct mbp__run *r, struct mbp__link *l, struct mbp__hdr *h, mbp_mb **mb, void **item);
	bool (*waiting)(struct mbp__run *r, struct mbp__link *l);
	void (*sent)(struct mbp__run *r, struct mbp__link *l, void *item);
	/* receiver: an arrival in posting order, in buffer mb (MBP__TAKEN, MBP__KEEP, MBP__AGAIN) */
	int (*arrived)(struct mbp__run *r, struct mbp__link *l, const struct mbp__hdr *h, mbp_mb *mb);
	/* the flow's own work each pass, after the links; true when it did something */
	bool (*pass)(struct mbp__run *r);
	/* lock held: a command in; a command out (fill m; false: not yet, it stays pending) */
	void (*on_ctl)(struct mbp__run *r, int peer, const struct mbp__ctl_msg *m);
	bool (*fill)(struct mbp__run *r, int peer, struct mbp__ctl_msg *m);
	/* lock held, rank 0, after mbp__run_end(): the run may end now (STOP goes out) */
	bool (*may_stop)(struct mbp__run *r);
	/* lock held: a peer went silent (run->err and msg say which): fail what waits */
	void (*dead)(struct mbp__run *r);
	/* the links are closed, the communicator not yet: give back what the flow holds */
	void (*closed)(struct mbp__run *r);
	/* the owner's thread, at mbp__run_start once every rank passed its checks (run->node_k and node_m
	 * set): the flow's own start, collectives included; 0 or -errno (its msg may say why) */
	int (*start)(struct mbp__run *r, const uint64_t *all);
	bool mesh;     /* the channel joins every pair of ranks (mbp__ctl_alloc) */
	bool inflight; /* the flow uses mo.inflight (then at least the window) */
};

enum { MBP__RUN_NEW = 0, MBP__RUN_RUNNING, MBP__RUN_ENDED };

/* How long a closing run waits for what is still on the wire (the links, the channel, a flow's own
 * requests): 100 ms when a peer went silent, else 2 s. */
static inline uint64_t mbp__run_close_ns(bool dead)
{
	return (dead ? 100 : 2000) * (uint64_t)1000000;
}
#define MBP__RUN_LINKS (2 * MBP_MAX_STAGES) /* a send and a receive link per peer */

/*
 * A run: the part of mbp_mpi and mbp_mpi_trainer that is the same (they embed it first). Threads: the
 * owner's (set-up, its API) and the loop's (a task on the communication thread from mbp__run_start() to the
 * end of the run). They share `lock`; a thread that publishes work for the loop kicks it.
 */
struct mbp__run {
	const struct mbp__run_ops *ops;
	mbp_mpi_opts mo;
	int rank, size;
	MPI_Comm comm;
	uint64_t ticket; /* the loop's task; 0: none */
	pthread_mutex_t lock;
	pthread_cond_t cond;   /* the flow's waits, on CLOCK_MONOTONIC; the end of the run */
	struct mbp__parker pk; /* the loop's park */
	_Atomic uint32_t kick; /* work published for the loop since its last pass */
	_Atomic bool ending;   /* the flow asked to end the run (mbp__run_end) */
	int state;	       /* MBP__RUN_* (under lock once running) */
	bool dead;	       /* a peer went silent (under lock) */
	int err;	       /* the run's error (under lock) */
	bool cancelled;	       /* rank 0 cancelled the run (under lock; mbp__run_cancel) */
	char msg[192];	       /* and why, in words */
	struct mbp__ctl ctl;   /* the loop's */
	struct mbp__link link[MBP__RUN_LINKS];
	unsigned nlinks;
	unsigned node_k, node_m; /* this rank's part of its node's CPUs (mbp__mpi_node_share) */
	/* this rank's stages (mbp__run_stage): how many, their input's and last output's rows, the widest */
	unsigned nstages;
	size_t in_rb, out_rb, wide;
	/* tests (mbp__run_test_late): the others hold their credits until the stop's handshake, then 50 ms
	 * (link.c); rank 0 counts what comes after its peers' last words (loop.c) */
	_Atomic bool test_late;
	bool test_held;
};

/* A flow's object of `size` bytes, its run first, zeroed and filled in (rank, size, options with their
 * defaults; no MPI call): 0, -ENOTCONN (no mbp_mpi_init), -ERANGE (more ranks than MBP_MAX_STAGES),
 * -EINVAL (a window above 1024, or above inflight where ops->inflight), -ENOMEM. Pair with
 * mbp__run_destroy(), which joins the loop and frees the flow's object. */
int mbp__run_new(struct mbp__run **r, size_t size, const struct mbp__run_ops *ops, const mbp_mpi_opts *mo,
		 size_t in_row_bytes);
/* After the flow's local add_stage returned rc: a stage of this rank counted (0) with its output rows
 * (0: as its input's). Returns rc. */
int mbp__run_stage(struct mbp__run *r, int rc, size_t out_row_bytes);
/* Why the run failed, in words, into r->msg (every message of both flows goes this way); returns err. */
int mbp__run_fail(struct mbp__run *r, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Tests: the run late messages (mbp__run's test_late); how many rank 0's runs have seen so far. */
void mbp__run_test_late(struct mbp__run *r);
uint64_t mbp__run_late_seen(void);
/* Tests: how many submitters of rank 0's pipeline wait in reserve() for a carrier or an entry now. */
unsigned mbp__mpi_test_reserving(mbp_mpi *mp);
/* Tests: freed carriers wake no submitter while `quiet` (one waiting with a deadline then finds one only
 * by its late look, after the wait timed out). */
void mbp__mpi_test_quiet_free(mbp_mpi *mp, bool quiet);
/* In ops->start: a link. 0 or -ENOMEM. */
int mbp__run_link(struct mbp__run *r, bool send, int peer, mbp_pool *pool, mbp_pool_cache *cache);
/* The values every rank gives at start: its error so far, its row widths in and out, its largest message,
 * one of the flow's own, its stages (filled in by mbp__run_start); then those that must be equal on
 * every rank: its max_mb_rows, the window (filled in by mbp__run_start), the flow's own. */
enum {
	MBP__HS_RC,
	MBP__HS_IN,
	MBP__HS_OUT,
	MBP__HS_BYTES,
	MBP__HS_OWN,
	MBP__HS_STAGES,
	MBP__HS_ROWS,
	MBP__HS_WINDOW,
	MBP__HS_SAME
};
/*
 * Start, collective: every rank's mine[0..n) to every rank, checked (an error on a rank; no stages; OUT not
 * the next rank's IN; BYTES above 2 GiB, `what` in words; a value from MBP__HS_ROWS up to the last `own`
 * (each rank's own, not compared) that is not rank 0's, the flow's names[i - MBP__HS_SAME] in words); then on every rank the node's CPUs shared out, the
 * flow's own start (ops->start), the channel, the result shared, and the loop started. Every rank gets
 * the same result; r->msg says why. 0, -EALREADY (started before: no MPI call), or -errno.
 */
int mbp__run_start(struct mbp__run *r, uint64_t *mine, unsigned n, unsigned own, const char *const *names,
		   const char *what);
/* A public call's check of its run: NULL (-EINVAL), the wrong rank for `who` (-EPERM), not started when
 * `started` is asked (-ENOTCONN: the state read under the lock, which the loop writes at the end). */
enum { MBP__RUN_ANY, MBP__RUN_RANK0, MBP__RUN_OTHERS };
int mbp__run_check(struct mbp__run *r, int who, bool started);
/* Lock held, the run over: how it ended for a rank that waited for its end: its error, -ECANCELED (rank 0
 * cancelled it), or 0. */
int mbp__run_ended_rc(const struct mbp__run *r);
/* Lock held, rank 0: the run is cancelled, CANCEL goes to every rank (on every call); false: it was
 * cancelled already. */
bool mbp__run_cancel(struct mbp__run *r);
/* Lock held: end the run (mbp__run_end) and wait until the loop has; then (unlocked) for its task. */
void mbp__run_stop(struct mbp__run *r);
void mbp__run_join(struct mbp__run *r);
void mbp__run_destroy(struct mbp__run *r);
/* Lock held: wait on cond until `deadline` (NULL: no limit; see mbp__run_deadline). false: timed out. */
bool mbp__run_wait(struct mbp__run *r, const struct timespec *deadline);
/* CLOCK_MONOTONIC's now plus timeout_ns (>= 0), or NULL (timeout_ns < 0). */
const struct timespec *mbp__run_deadline(int64_t timeout_ns, struct timespec *ts);
/* The links' counters added to *sent, *received, *credit_waits. Any thread. */
void mbp__run_counts(struct mbp__run *r, uint64_t *sent, uint64_t *received, uint64_t *credit_waits);

/* Work for the loop is published (a store before this): it passes again instead of parking. Any
 * thread. The publisher's half of the park (wait.h's seq_cst mode). */
static inline void mbp__run_kick(struct mbp__run *r)
{
	/* seq_cst: also the release that the loop's acquire exchange at the top of its pass pairs with */
	atomic_store_explicit(&r->kick, 1, memory_order_seq_cst);
	mbp__parker_wake_sc(&r->pk);
}

/* Lock held: the flow asks the loop to end the run; on rank 0 it sends STOP once ops->may_stop()
 * allows. */
static inline void mbp__run_end(struct mbp__run *r)
{
	atomic_store_explicit(&r->ending, true, memory_order_relaxed); /* relaxed: the kick publishes it */
	mbp__run_kick(r);
}

/* ctl.c. Queue command `cmd` for peer `rank` (-1: every peer) and kick the loop. Any thread. */
void mbp__ctl_post(struct mbp__run *r, int rank, uint32_t cmd);
/* Before go: the channel's peers (mesh: every pair of ranks, else rank 0 and each other rank); 0 or
 * -ENOMEM. The loop's: open and close it; one pass (leave: this rank's STOPPED is out); the watchdog
 * (true: a peer went silent, the run is dead); something heard from peer `rank` (a credit). */
int mbp__ctl_alloc(struct mbp__run *r, bool mesh);
void mbp__ctl_open(struct mbp__run *r, uint64_t now);
bool mbp__ctl_pass(struct mbp__run *r, uint64_t now, bool *leave);
bool mbp__ctl_watchdog(struct mbp__run *r, uint64_t now);
void mbp__ctl_heard(struct mbp__run *r, int rank, uint64_t now);
void mbp__ctl_close(struct mbp__run *r, uint64_t deadline);
void mbp__ctl_free(struct mbp__ctl *c);

/* link.c, the loop's thread (alloc and free: the owner's, before and after the run). */
int mbp__link_alloc(struct mbp__link *l, uint32_t W);
void mbp__link_open(struct mbp__run *r, struct mbp__link *l);
bool mbp__link_pass(struct mbp__run *r, struct mbp__link *l, uint64_t now);
void mbp__link_close(struct mbp__run *r, struct mbp__link *l, uint64_t deadline);
void mbp__link_free(struct mbp__link *l);

#endif
