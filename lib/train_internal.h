/*
 * The trainer's remote neighbours: what lets a trainer hold a contiguous range of a larger pipeline's
 * stages, its other stages running elsewhere (libmbpipe-mpi's trainer across ranks). Not installed.
 *
 * A trainer given a remote (before mbp_trainer_start) follows the schedule of all `stages` stages and runs
 * the ones from `stage0` on. Where a neighbouring stage is remote, its ring has the remote's agent at its
 * far end (one thread, the agent's): at the first local stage, the forward input ring (the agent pushes
 * activations into it) and the backward output ring (the agent pops input gradients); at the last local
 * stage, the forward output ring (popped) and the backward input ring (pushed). Items are pool buffers of
 * the trainer's pool with seq = micro-batch, rows and row_bytes set. Only the global last stage computes
 * the loss; only the global stage 0 reads the caller's input rows.
 *
 * A step: the controller's mbp__trainer_step_remote() resets the step's abort flag, then calls begin()
 * (from then on mbp__trainer_abort() reaches this step), then starts the workers. A failure of one of the
 * trainer's own operations calls failed() once (tell the other parts). At the first barrier the last
 * worker calls agree() with the local vote and takes back the whole pipeline's decision; the agent stops
 * pushing into the incoming rings of this step before agree() returns, and drops what the outgoing rings
 * still hold (mbp__trainer_link_pop until empty) before it returns too.
 */
#ifndef MBP__TRAIN_INTERNAL_H
#define MBP__TRAIN_INTERNAL_H

#include <errno.h>
#include <stdbool.h>

#include <mbpipe.h>

/* The boundary rings, by the remote neighbour's side: local unit k's (a stage's replica) are link ids
 * k * MBP__LINKS + these (mbp__train_link), where the stage before or after it is remote. */
enum {
	MBP__LINK_UP_FWD = 0, /* activations from the stage before (pushed by the agent) */
	MBP__LINK_UP_BWD,     /* input gradients of the stage, to the stage before (popped by the agent) */
	MBP__LINK_DOWN_FWD,   /* activations of the stage, to the next (popped) */
	MBP__LINK_DOWN_BWD,   /* output gradients of the stage, from the next (pushed) */
	MBP__LINKS
};

static inline int mbp__train_link(unsigned unit, int kind)
{
	return (int)unit * MBP__LINKS + kind;
}

/* The vote at the first barrier. In: this part's view; out: the whole pipeline's. */
struct mbp__train_vote {
	bool ok;	     /* in: no local failure; out: every part ok (update) */
	mbp_train_error err; /* in: the local failure (stage is global), err 0: none; out: the step's */
	double grad_sq[MBP_MAX_STAGES]; /* in: the local stages' (at their global index); out: all stages' */
	double loss; /* in: the summed loss when the global last stage is local; out: the step's */
};

struct mbp__train_remote {
	unsigned stage0; /* global index of the first local stage (block placement) */
	unsigned stages; /* stages of the whole pipeline */
	/* A chunked or custom schedule (sched_threads > 0) placed over the parts by mbp__train_place: the
	 * schedule's thread count, this part's stages (their global indices, ascending), each one's thread
	 * here (0 .. threads - 1), and the widest row of any part (its items travel into this pool). */
	unsigned sched_threads, threads;
	uint16_t global[MBP_MAX_STAGES], thread_of[MBP_MAX_STAGES];
	size_t widest;
	unsigned reps[MBP_MAX_STAGES]; /* each global stage's replicas (0: one), the same on every part */
	unsigned extra_buffers;	       /* pool buffers the agent holds at once (its receive windows) */
	unsigned node_k; /* the k-th of node_m ranks of its node given the same CPUs: its threads */
	unsigned node_m; /* take the k-th part of them (pipeline.h, "Placement"); 0: all of them */
	void *arg;
	void (*kick)(void *arg);   /* an outgoing ring has a new item (any worker) */
	void (*begin)(void *arg);  /* the controller, as a step starts */
	void (*failed)(void *arg); /* a worker, at the step's first local failure */
	void (*agree)(void *arg, struct mbp__train_vote *v); /* the last worker at the first barrier */
};

/* A kind whose schedule places its stages itself (chunked, or custom: not the block rule). */
static inline bool mbp__sched_kind_placed(mbp_sched_kind k)
{
	return k == MBP_SCHED_INTERLEAVED || k == MBP_SCHED_LOOPED_BFS || k == MBP_SCHED_ZBV ||
	       k == MBP_SCHED_DUALPIPEV || k == MBP_SCHED_CUSTOM || k == MBP_SCHED_AUTO;
}

/* The placement of a chunked or custom schedule of `stages` stages on `threads` threads (0: two chunks a
 * thread, or the custom schedule's own): each stage's thread into thread_of, the thread count into
 * *placed (0, and 0 returned, for a block kind). -EINVAL with *what saying why, -ENOMEM. */
int mbp__train_place(const mbp_train_opts *o, unsigned stages, unsigned threads, uint16_t *thread_of,
		     unsigned *placed, const char **what);

/* The stages of a pipeline over `ranks` ranks (train_place.c), rank k holding n[k] stages (at least 1)
 * and asking th[k] threads (0: none asked): by rank (the block placement), or as a chunked or custom
 * schedule places them on its threads, the ranks taking its threads in rank order, each as many as hold
 * its stages (and its th[k], where every rank gives one). Each global stage's rank into rank_of, their
 * count into *stages, and for rank `me` rem's sched_threads, threads, global and thread_of (left alone
 * for a block kind). 0; -E2BIG (more than MBP_MAX_STAGES stages) or -EINVAL (the schedule cannot place
 * them so), with err saying why; -ENOMEM. */
int mbp__train_place_ranks(const mbp_train_opts *o, int ranks, int me, const unsigned *n, const unsigned *th,
			   int *rank_of, unsigned *stages, struct mbp__train_remote *rem, char *err,
			   size_t len);

/* The whole pipeline's decision at a step's first barrier from its parts' votes (part k's at
 * (const char *)votes + k * stride: a part's record may carry more than its vote), the same on every
 * part (train_place.c): ok only if every part is; stage s's grad_sq from its part, rank_of[s], the loss
 * from the last stage's; the error the failing stage with the lowest index (one of no stage, stage < 0,
 * only where no stage failed), the first part's among those of no stage, -ECANCELED where none says
 * why; none when ok. */
void mbp__train_vote_tally(const void *votes, size_t stride, int parts, const int *rank_of, unsigned stages,
			   struct mbp__train_vote *out);

/* A custom schedule's actions and placement, hashed (FNV-1a): ranks given different ones disagree at
 * start. 0 for NULL. */
uint64_t mbp__train_schedule_hash(const mbp_schedule *sc);

/* Set before mbp_trainer_start(). @return 0, -EINVAL (started, stages out of range). */
int mbp__trainer_set_remote(mbp_trainer *t, const struct mbp__train_remote *r);

/* The boundary rings are a unit's (a replica of a stage: train.c): link ids mbp__train_link(unit, kind).
 * The link of local stage s's replica that runs micro-batch j (j mod its replicas); stage s's units,
 * [*first, *first + the count returned). Valid once the stages are added. */
int mbp__trainer_link_of(const mbp_trainer *t, unsigned s, uint32_t j, int kind);
unsigned mbp__trainer_units(const mbp_trainer *t, unsigned s, unsigned *first);
/* The agent's end of a boundary ring (NULL-safe: false when the ring does not exist). */
bool mbp__trainer_link_pop(mbp_trainer *t, int link, mbp_mb **mb);
bool mbp__trainer_link_push(mbp_trainer *t, int link, mbp_mb *mb);
/* Items waiting in a boundary ring (0 when it does not exist). Any thread. */
unsigned mbp__trainer_link_count(mbp_trainer *t, int link);
/* The trainer's options, their defaults filled in. */
const mbp_train_opts *mbp__trainer_opts(const mbp_trainer *t);
/* The trainer's pool (its buffers travel over the links). */
mbp_pool *mbp__trainer_pool(mbp_trainer *t);

/* Fail the running step from outside (a remote part failed): no local error is recorded. Any thread. */
void mbp__trainer_abort(mbp_trainer *t);

/* A step's size against the trainer's bounds (mbp_trainer_step's rule, also rank 0's across ranks):
 * -EINVAL (rows or mb_rows 0), -E2BIG (mb_rows above max_mb_rows, more than max_mbs micro-batches).
 * Compared without a rounding division, which would wrap for rows near SIZE_MAX. */
static inline int mbp__train_size_check(size_t rows, uint32_t mb_rows, uint32_t max_mb_rows, uint32_t max_mbs)
{
	if (rows == 0 || mb_rows == 0)
		return -EINVAL;
	if (mb_rows > max_mb_rows || (uint64_t)rows > (uint64_t)max_mbs * mb_rows)
		return -E2BIG;
	return 0;
}

/* mbp_trainer_step for a part: `in` NULL when stage0 > 0, `targets` NULL when the last stage is remote;
 * no refusal for a cancel or drain (the step runs, and fails if cancelled, so every part votes). */
int mbp__trainer_step_remote(mbp_trainer *t, const void *in, const void *targets, size_t rows,
			     uint32_t mb_rows, double *loss);

/* Tests: the spin budget the trainer's waits use (0: none). */
uint64_t mbp__trainer_spin_ns(const mbp_trainer *t);
/* Tests: the next step cannot build its schedule and fails with `err` (< 0), as on -ENOMEM. */
void mbp__trainer_fail_next_prepare(mbp_trainer *t, int err);
/* Tests: the local trainer of an MPI trainer (libmbpipe-mpi). */
struct mbp_mpi_trainer;
mbp_trainer *mbp__mpi_trainer_local(struct mbp_mpi_trainer *T);
/* Tests: while `hold` is set, this rank keeps every arrival of its open step at the head of its link
 * (as one of a step not begun here): it is taken once the step has closed, and dropped then
 * (mbp_mpi_train_stats.dropped): items on the wire past a failed step. Set between steps. */
void mbp__mpi_trainer_test_hold(struct mbp_mpi_trainer *T, bool hold);
/* Tests: a late message. The ranks other than 0 hold their links' credits until the stop's handshake
 * begins, then 50 ms; rank 0 then looks for 200 ms for anything a peer sent after its last word, counted
 * over the process (mbp__mpi_trainer_late_seen). */
void mbp__mpi_trainer_test_late(struct mbp_mpi_trainer *T);
uint64_t mbp__mpi_trainer_late_seen(void);

#endif
