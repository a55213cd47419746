/*
 * mbp_mpi: a pipeline whose stages run on several MPI ranks (libmbpipe-mpi, pkg-config mbpipe-mpi).
 *
 * Include <mbpipe/mpi.h> after <mbpipe.h>; the umbrella header does not include it, and the core library
 * has no MPI dependency. Link with `pkg-config --static --libs mbpipe-mpi`; run with `mpirun -np R`.
 *
 * Shape. Every rank builds a local mbp_pipeline holding a contiguous range of the stages (rank 0 the
 * first ones, rank R-1 the last ones), in rank order. The hop from the last stage of rank r to the first
 * of rank r+1 is a remote link; the last rank sends the results back to rank 0. Rank 0 alone submits work
 * (jobs, or micro-batches one by one) and gets the results, in submission order, with the job API's
 * guarantees: a status per micro-batch, accepted = completed + failed over all ranks, drain and cancel
 * reaching every rank, a stage error failing its micro-batch only. Ranks other than 0 call
 * mbp_mpi_wait(), which returns when rank 0 ends the run.
 *
 * The link. A message is a 32-byte header (sequence, rows, row width, status, stamp) then the payload,
 * sent straight from the buffer that holds the micro-batch and received straight into one: the receiving
 * rank keeps a window of W receives pre-posted into buffers of the link's pool (headers through
 * persistent requests), and sends a credit back each time it posts a receive again. A sender holds at
 * most W micro-batches without credit: a slow rank back-pressures its upstream as a full ring does. A
 * micro-batch enters a rank's local pipeline as a job of one micro-batch: stage 0 reads it where it lies
 * (where it arrived; on rank 0 the caller's buffer or a job's input rows) and the last local stage writes
 * straight into the buffer that the link sends on, so no rank copies a micro-batch, with one local stage
 * too (mbp_mpi_mb_seq() gives a stage its global number). A caller's micro-batch that carries something
 * for the stages (mb->carry, mbp_model_mb_pin) enters with mbp_mb_submit() instead and is sent from its
 * own buffer. A micro-batch that failed upstream travels on as a header alone, past the stages (its
 * status says why). Rank 0 receives the results into result buffers, hands single micro-batches their
 * buffer and copies a job's rows into its output (the only copy), and retires micro-batches in sequence
 * order.
 *
 * Threads. mbp_mpi_init() starts one communication thread per process; it calls MPI_Init_thread with
 * MPI_THREAD_FUNNELED and then makes every MPI call of the process, also for the set-up calls below
 * (they hand their work to it). Workers hand results to it through a queue and wake it; it sleeps when
 * idle (a short spin, then parks of a quarter of the time it has been quiet, from 1 us up to
 * opts.idle_ns), so it never burns a core and an arrival after a quiet gap g is seen within about g / 4
 * (MPI cannot wake a thread on an arriving message).
 *
 * Failures. Every rank sends rank 0 a heartbeat (and rank 0 every rank) each peer_timeout_ns / 4. A rank
 * heard from in no way for peer_timeout_ns ends the run: on rank 0 every outstanding micro-batch fails
 * with -ETIMEDOUT, drain returns -ETIMEDOUT and mbp_mpi_error() names the rank; on another rank
 * mbp_mpi_wait() does the same about rank 0. mbp_mpi_finalize() then calls MPI_Abort (MPI_Finalize
 * would wait for the silent rank forever), which ends every rank. A rank that dies is seen by mpirun,
 * which ends the job with its own message. Open MPI's default error handler aborts on a failed call.
 *
 * Thread safety:
 *   operation                                              | concurrency
 *   mbp_mpi_job_submit, _mb_acquire/_submit/_release       | any threads of rank 0, concurrently
 *   mbp_mpi_job_wait                                       | any thread, for its own job
 *   mbp_mpi_stats_get, _error, _rank, _size                | any thread
 *   init, finalize, new, start, drain, cancel, wait, destroy | one controlling thread
 */
#ifndef MBPIPE_MPI_H
#define MBPIPE_MPI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <mbpipe.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mbp_mpi mbp_mpi;

/**
 * Start the communication thread, which initialises MPI (MPI_THREAD_FUNNELED). Call once per process,
 * before anything else here; pair with mbp_mpi_finalize().
 * @return 0, -EALREADY, -ENOTSUP (MPI provides less than MPI_THREAD_FUNNELED, or was initialised by
 *         someone else), -ENOMEM, -EIO (MPI_Init_thread failed).
 */
int mbp_mpi_init(int *argc, char ***argv);

/**
 * Finalise MPI on the communication thread and stop it. After a run that ended on a silent or dead rank
 * this calls MPI_Abort instead, and does not return.
 */
void mbp_mpi_finalize(void);

/** This process's rank in MPI_COMM_WORLD, or -ENOTCONN before mbp_mpi_init(). */
int mbp_mpi_rank(void);
/** The number of ranks, or -ENOTCONN before mbp_mpi_init(). */
int mbp_mpi_size(void);
/** End every rank now (MPI_Abort with `code`). Does not return. */
void mbp_mpi_abort(int code);

/**
 * Run fn(arg) on the communication thread, the one thread that may call MPI (MPI_THREAD_FUNNELED): for a
 * program's own MPI calls (a broadcast of its settings, a barrier) between runs. Waits for fn.
 * @return fn's return value; -EINVAL (NULL fn), -ENOTCONN (no mbp_mpi_init), -EBUSY (a run is active on
 *         this rank: its link loop holds the thread from mbp_mpi_start() to the end of the run).
 */
int mbp_mpi_exec(int (*fn)(void *), void *arg);

typedef struct mbp_mpi_opts {
	uint32_t window;	 /**< W: receives pre-posted per link (credits of the sender). 8 */
	uint32_t inflight;	 /**< rank 0: micro-batches accepted and not yet retired, at most. 512 */
	int64_t peer_timeout_ns; /**< a rank silent this long ends the run. 10 s; < 0: never */
	uint64_t spin_ns;	 /**< the communication thread polls this long after its last event. 0:
				      20 us; MBP_SPIN_NONE: it parks at once */
	uint64_t idle_ns;	 /**< then parks at most this long between polls (see above). 200 us */
} mbp_mpi_opts;

/** Fill `o` with the defaults above (a zeroed struct means the same). */
void mbp_mpi_opts_init(mbp_mpi_opts *o);

/**
 * Make this rank's part of the pipeline: a local mbp_pipeline with options `local` (its in_row_bytes
 * is the width of this rank's input rows; rank 0's on_result receives results of single micro-batches,
 * and must be NULL elsewhere: the link owns it; local->mb_buffers also bounds the micro-batches this rank
 * holds at once, in its pipeline or waiting to be sent, and so do two windows plus the local pipeline's
 * threads (the sum of its stages' replicas, a stage without them counting one), whichever is less: more
 * would only wait for the link). Add this rank's stages with mbp_mpi_add_stage(),
 * then mbp_mpi_start(). Pair with mbp_mpi_destroy().
 * @param mo NULL: defaults
 * @return 0, -ENOTCONN (no mbp_mpi_init), -EINVAL (NULL, on_result set on a rank other than 0, a bad
 *         option), or mbp_pipeline_new's error, -ERANGE (more than MBP_MAX_STAGES ranks).
 */
int mbp_mpi_new(mbp_mpi **mp, const mbp_opts *local, const mbp_mpi_opts *mo);

/**
 * Append one of this rank's stages (before mbp_mpi_start()), as mbp_pipeline_add_stage() on the local
 * pipeline; the link learns the rank's output row width from the descriptors. Add every stage this way.
 * @return 0, -EINVAL (NULL, already started), or mbp_pipeline_add_stage's error.
 */
int mbp_mpi_add_stage(mbp_mpi *mp, const mbp_stage_desc *d);

/** This rank's local pipeline: its stats and placement (add stages with mbp_mpi_add_stage()). */
mbp_pipeline *mbp_mpi_pipeline(mbp_mpi *mp);

/**
 * Start, on every rank (collective): split each node's CPUs between its ranks that were given the same
 * ones (pipeline.h, "Placement": two ranks under mpirun --bind-to none do not pin their stages to one
 * CPU), start the local pipeline, check that each rank's output row width is the next rank's input width
 * and that all ranks agree on max_mb_rows and the window, then open the links. Every rank gets the same
 * result.
 * @return 0, -EINVAL (widths or options disagree between ranks: the message names them, see
 *         mbp_mpi_error()), -EALREADY, or mbp_pipeline_start's error (on any rank).
 */
int mbp_mpi_start(mbp_mpi *mp);

/* ---- rank 0: work ---- */

/**
 * Submit a job (rank 0): as mbp_job_submit(), with the results of the last rank gathered into job->out
 * (rows x the last rank's output width). It completes as a local job does (pipeline.h, "Completion": its
 * callback, or mbp_mpi_job_wait(), which is mbp_job_wait(), and mbp_job_done()); job->status is the error
 * of its first failed micro-batch.
 * @return 0 (accepted: it will complete), -EINVAL, -E2BIG (mb_rows above max_mb_rows), -ENOTCONN (not
 *         started), -EPERM (not rank 0), -ESHUTDOWN (draining, cancelled or the run failed), -EAGAIN,
 *         -ETIMEDOUT (no room for its micro-batches in opts.inflight within the timeout).
 */
int mbp_mpi_job_submit(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns);

/** Wait for a job submitted with mbp_mpi_job_submit(), as mbp_job_wait(). @return 0 when done (see
 * job->status), -ETIMEDOUT, -EINVAL (NULL, or a job with a callback). */
int mbp_mpi_job_wait(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns);

/** Convenience (rank 0): init, submit (waiting for room) and wait. @return the job's status or a submit
 * error. */
int mbp_mpi_run(mbp_mpi *mp, const void *in, void *out, size_t rows, uint32_t mb_rows);

/** Rank 0: an input buffer, as mbp_mb_acquire() on the local pipeline. */
int mbp_mpi_mb_acquire(mbp_mpi *mp, mbp_mb **mb, int64_t timeout_ns);

/**
 * Rank 0: submit a filled buffer, as mbp_mb_submit(). Its result (rows of the last rank's output width,
 * with the caller's seq and user) reaches the local opts.on_result on the communication thread, in
 * submission order, in a result buffer: give it back with mbp_mpi_mb_release(). Waiting for room (the
 * micro-batches this rank may hold, mbp_mpi_new()), a submit with a timeout is woken as soon as one
 * leaves; one without (timeout < 0) once a quarter of them have: it then submits a quarter in a row.
 * @return 0, -EINVAL (no on_result, rows out of range), -EPERM, -ENOTCONN, -ESHUTDOWN, -EAGAIN,
 *         -ETIMEDOUT; on error the caller still owns the buffer.
 */
int mbp_mpi_mb_submit(mbp_mpi *mp, mbp_mb *mb, int64_t timeout_ns);

/** Give back a result, or an acquired buffer never submitted. Any thread of rank 0. `mp` may be NULL
 * (an on_result that has no handle), as for mbp_mb_release(). */
void mbp_mpi_mb_release(mbp_mpi *mp, mbp_mb *mb);

/**
 * In a stage of an mbp_mpi's local pipeline (any rank): the micro-batch's global sequence number, the
 * order in which rank 0 accepted it. A stage sees each micro-batch as a local job of one micro-batch
 * (in->job set, in->seq 0: its input read in place, its output written straight into the buffer the
 * link sends), or, for a caller's micro-batch that carries something for the stages (mb->carry), as a
 * single micro-batch.
 */
uint64_t mbp_mpi_mb_seq(const mbp_mb *in);

/* ---- ending a run ---- */

/**
 * Rank 0: stop accepting, wait until every accepted micro-batch is retired, then end the run on every
 * rank (each drains its local pipeline and reports its counters). Idempotent.
 * @return 0; -ETIMEDOUT (work still in flight: call again, or cancel); the run's error when a rank went
 *         silent (-ETIMEDOUT, with mbp_mpi_error() naming the rank); -EPERM (not rank 0); -ENOTCONN.
 */
int mbp_mpi_drain(mbp_mpi *mp, int64_t timeout_ns);

/**
 * Rank 0: stop accepting and cancel on every rank: micro-batches not yet inside a stage fail with
 * -ECANCELED wherever they are (also on the wire); then end the run as drain does.
 * @return 0, or the run's error when a rank went silent; -EPERM; -ENOTCONN.
 */
int mbp_mpi_cancel(mbp_mpi *mp);

/**
 * Ranks other than 0: serve until rank 0 ends the run (draining or cancelling the local pipeline as it
 * says). @return 0 (drained), -ECANCELED (cancelled), -ETIMEDOUT (this wait's timeout, or rank 0 went
 * silent: see mbp_mpi_error()), -EPERM (rank 0), -ENOTCONN.
 */
int mbp_mpi_wait(mbp_mpi *mp, int64_t timeout_ns);

/** Why the run failed ("rank 2 stopped answering: nothing heard for 2.0 s"), or "" . Static per object. */
const char *mbp_mpi_error(const mbp_mpi *mp);

/** Destroy (any rank, after drain/cancel/wait; otherwise it ends the run first). Accepts NULL. */
void mbp_mpi_destroy(mbp_mpi *mp);

/* ---- statistics ---- */

typedef struct mbp_mpi_rank_stats {
	uint64_t mbs_accepted, mbs_completed, mbs_failed; /**< the rank's local pipeline */
	uint64_t passed;				  /**< failed upstream: sent on past the stages */
	uint64_t sent, received;			  /**< micro-batches over its links */
	uint64_t credit_waits;				  /**< times a send waited for a credit */
} mbp_mpi_rank_stats;

typedef struct mbp_mpi_stats {
	uint64_t jobs_accepted, jobs_completed, jobs_failed; /**< rank 0's view over all ranks */
	uint64_t mbs_accepted, mbs_completed, mbs_failed;
	uint64_t rows_completed;
	uint32_t ranks;
	uint32_t reported; /**< ranks whose counters arrived (all of them after drain/cancel) */
	mbp_mpi_rank_stats rank[MBP_MAX_STAGES]; /**< per rank, as each reported at the end of the run;
						    this rank's own entry is always current */
} mbp_mpi_stats;

/** Snapshot the counters. @return 0, -EINVAL. */
int mbp_mpi_stats_get(mbp_mpi *mp, mbp_mpi_stats *st);

/* ---- training across ranks ---- */

/*
 * mbp_mpi_trainer: a training pipeline (<mbpipe/train.h>) whose stages run on several ranks. Under a block
 * schedule (GPipe, 1F1B, ZB-H1, ZB-H2) each rank holds a contiguous range of the stages (rank 0 the first
 * ones). Under a chunked or custom one (interleaved, looped BFS, ZB-V, DualPipeV, one read from text or
 * built) the schedule places the chunks on its threads (train.h, "Chunks") and the ranks take its threads in
 * rank order, each as many as hold its stages: its threads option where every rank gives one (the schedule's
 * thread count is then their sum), else the schedule's default (two chunks a thread; a custom schedule's
 * own); one thread a rank under ZB-V on R ranks holds chunks r and 2R-1-r. A start that cannot give each rank
 * whole threads is refused on every rank alike. A rank adds its stages in global order with
 * mbp_mpi_trainer_add_stage() and runs them on its own threads; every rank follows the schedule of the whole
 * pipeline. A hop between two stages of one rank is what it is in one process (a ring between two of its
 * threads, a direct pass between two chunks of one thread); a hop to another rank goes
 * over the link between the two ranks (one each way between every two ranks that a hop joins, carrying every
 * stage's activations and gradients between them, each item's header naming the stage it goes to). The links
 * are like the forward pipeline's (pre-posted windows of receives into pool buffers, credits, no copy between
 * the buffer and MPI), driven by the communication thread. A sender
 * holds a micro-batch until a credit says that a receive waits for it (window: opts.window receives per
 * link); the receiver hands each arrival to its stage's ring at once, as a stage does in one process (the
 * trainer's rings hold a step's micro-batches, so no stage ever waits to push: the schedule bounds what
 * is in flight).
 *
 * Rank 0 calls mbp_mpi_trainer_step() with the inputs and the targets; it sends the targets of each step to
 * the rank holding the last stage (one message; none when rank 0 holds it, as under ZB-V), so a program's
 * data loader runs on rank 0 only. The other ranks call mbp_mpi_trainer_step() with NULL, NULL, 0, 0 (it
 * waits for rank 0's next step, runs this rank's part and returns the same result as rank 0's step), or
 * mbp_mpi_trainer_serve() to do that until the run ends. A step is all or nothing across ranks: every rank's
 * stages update only when every stage on every rank finished every operation and the loss and gradients are
 * finite; the gradient norm given to each update is the one over all stages of all ranks (summed in stage
 * order: bit for bit the single-process trainer's); the loss is that of the rank holding the last stage. A
 * stage error on any rank fails the step on every rank, which
 * returns that error and names the stage (its index in the whole pipeline) and the micro-batch through
 * mbp_mpi_trainer_error(); the next step runs normally. A cancel from rank 0 fails the step under way on
 * every rank with -ECANCELED; a rank that stops answering ends the run with -ETIMEDOUT (see "Failures"
 * above: mbp_mpi_trainer_run_error() names it, mbp_mpi_finalize() aborts). Rank 0 ends the run in
 * mbp_mpi_trainer_destroy(); the other ranks' serve (or step: -ESHUTDOWN) returns then. Another rank
 * that destroys its trainer before that ends the run with -ECONNRESET (see mbp_mpi_trainer_destroy).
 *
 * The communication thread runs one run at a time: a trainer and an mbp_mpi pipeline are not started at
 * once in one process.
 *
 * Thread safety:
 *   operation                                    | concurrency
 *   mbp_mpi_trainer_cancel, _drain, _stats_get   | any thread, also while a step runs
 *   new, add_stage, start, step, serve, error, events_get, destroy | one controlling thread
 */
typedef struct mbp_mpi_trainer mbp_mpi_trainer;

/**
 * Create this rank's part of a training pipeline. `o` is this rank's trainer options (<mbpipe/train.h>):
 * in_row_bytes is the width of this rank's input rows (the previous rank's output width; under a chunked or
 * custom schedule only rank 0's is used: a chunk's input is what the stage before sends); target_row_bytes,
 * max_mb_rows, max_mbs and schedule (and a custom schedule's actions) must be the same on every rank (start
 * checks), and so must loss (only the rank holding the last stage calls it; start cannot compare functions).
 * Of `mo` (NULL: defaults) the window, peer_timeout_ns, spin_ns and idle_ns apply. Pair with
 * mbp_mpi_trainer_destroy().
 * @return 0, -ENOTCONN (no mbp_mpi_init), -EINVAL, -ERANGE (more ranks than MBP_MAX_STAGES), or
 *         mbp_trainer_new's error.
 */
int mbp_mpi_trainer_new(mbp_mpi_trainer **tp, const mbp_train_opts *o, const mbp_mpi_opts *mo);

/** Append one of this rank's stages (before start), as mbp_trainer_add_stage(). @return its result,
 * -EINVAL (NULL, started), or -ENOTSUP (a grad_row_bytes other than out_row_bytes: the links carry
 * gradients of the activations' width). */
int mbp_mpi_trainer_add_stage(mbp_mpi_trainer *t, const mbp_train_stage_desc *d);

/**
 * Start, on every rank (collective): check that the ranks agree (each rank's output width is the next
 * one's input width under a block schedule, the options above and mbp_mpi_opts.window are equal, every
 * rank has a stage, at most MBP_MAX_STAGES stages in all, a chunked schedule places whole threads on each
 * rank), split each node's CPUs between its ranks as mbp_mpi_start() does,
 * start each rank's trainer, open the links. Every rank gets the
 * same result; after a failure, step and serve return it too.
 * @return 0, -EINVAL or -E2BIG (mbp_mpi_trainer_run_error() says which rank and what), -EALREADY, or a
 *         rank's mbp_trainer_start error (ZB-H1 with a stage lacking backward_in/backward_w: -EINVAL; a
 *         stage with replicas under a custom or built schedule, MBP_SCHED_CUSTOM or MBP_SCHED_AUTO:
 *         -ENOTSUP). Replicated stages
 *         (mbp_train_stage_desc.replicas) run as in one process (train.h, "Replicas"): every rank
 *         learns every stage's replicas here, and the parameters are bit for bit those without.
 */
int mbp_mpi_trainer_start(mbp_mpi_trainer *t);

/**
 * One synchronous step over all ranks. Rank 0: as mbp_trainer_step() (in: rows x its in_row_bytes;
 * targets: rows x target_row_bytes). Other ranks: in and targets NULL, rows and mb_rows 0: run this
 * rank's part of rank 0's next step.
 * @param loss if not NULL, receives the step's summed loss (on every rank)
 * @return 0 or the step's error, the same on every rank (see mbp_trainer_step: -ECANCELED, -EDOM, a
 *         stage's error ...); -EINVAL, -E2BIG (rank 0's arguments, refused before the step starts
 *         anywhere); -ENOTCONN (not started); -ESHUTDOWN (rank 0: cancelled, drained or ending; others:
 *         rank 0 ended the run); -ETIMEDOUT (a rank stopped answering); -ECONNRESET (a rank left:
 *         destroyed its trainer while the run went on); start's error after a failed start.
 */
int mbp_mpi_trainer_step(mbp_mpi_trainer *t, const void *in, const void *targets, size_t rows,
			 uint32_t mb_rows, double *loss);

/**
 * Ranks other than 0: run rank 0's steps until it ends the run.
 * @return 0 (ended), -ECANCELED (rank 0 cancelled), -ETIMEDOUT (a rank stopped answering), -ECONNRESET
 *         (a rank left), start's error (a failed start), -EPERM (rank 0), -ENOTCONN, -EINVAL.
 */
int mbp_mpi_trainer_serve(mbp_mpi_trainer *t);

/** Rank 0: cancel (mbp_trainer_cancel on every rank): the step under way fails with -ECANCELED on every
 * rank, later steps with -ESHUTDOWN; a cancel before the start reaches every rank once the run starts.
 * Any thread. @return 0, -EPERM (not rank 0), -EINVAL. */
int mbp_mpi_trainer_cancel(mbp_mpi_trainer *t);

/** Rank 0: the step under way finishes; later steps fail with -ESHUTDOWN. Any thread. @return 0, -EPERM. */
int mbp_mpi_trainer_drain(mbp_mpi_trainer *t);

/** Where the last failed step failed: stage is the index in the whole pipeline. @return 0, -EINVAL. */
int mbp_mpi_trainer_error(const mbp_mpi_trainer *t, mbp_train_error *e);

/** Why the run failed to start or ended ("rank 2 stopped answering: ..."), or "". */
const char *mbp_mpi_trainer_run_error(const mbp_mpi_trainer *t);

/**
 * Rank 0 ends the run on every rank, then frees everything. Another rank waits until rank 0 has ended
 * the run; one that rank 0 has not told to stop yet (its serve has not returned) leaves: rank 0's step
 * under way and every later one fail with -ECONNRESET, mbp_mpi_trainer_run_error() names the rank, and
 * rank 0 ends the run (the other ranks' serve returns -ECONNRESET). NULL ok.
 */
void mbp_mpi_trainer_destroy(mbp_mpi_trainer *t);

typedef struct mbp_mpi_train_stats {
	mbp_train_stats local; /**< this rank's trainer (its stages; bubble_predicted 0) */
	uint32_t rank, ranks;
	uint32_t stage0, stages; /**< this rank's first stage (in the whole pipeline), the stages of it */
	uint64_t sent, received; /**< activations and gradients over this rank's links */
	uint64_t dropped;	 /**< arrivals of a step that had failed here already */
	uint64_t credit_waits;	 /**< times a send waited for a credit */
} mbp_mpi_train_stats;

/** Snapshot; `ss` receives up to n of this rank's stages. @return this rank's stage count, -EINVAL. */
int mbp_mpi_trainer_stats_get(mbp_mpi_trainer *t, mbp_mpi_train_stats *st, mbp_train_stage_stats *ss,
			      unsigned n);

/**
 * The operations this rank ran in the last step, as mbp_trainer_events_get() gives them (tracing on:
 * trace_events in the trainer's options): stage by stage, this rank's stages in ascending order, each
 * event's stage its index in the whole pipeline (stage0 and up, or a chunked schedule's chunks here).
 * The controlling thread, between steps.
 * @param ev receives up to n events; may be NULL when n is 0 (to ask for the count)
 * @return the number of events recorded (more than n when ev was too small: only n were written),
 *         -EINVAL (NULL t, NULL ev with n > 0, tracing off).
 */
int mbp_mpi_trainer_events_get(const mbp_mpi_trainer *t, mbp_train_event *ev, size_t n);

#ifdef __cplusplus
}
#endif
#endif
