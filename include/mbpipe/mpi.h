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
 * sent straight from the pool buffer that holds the micro-batch and received straight into one: the
 * receiving rank keeps a window of W receives pre-posted into buffers from its pipeline's
 * mbp_mb_acquire() (headers through persistent requests), submits each arrival with mbp_mb_submit(), and
 * sends a credit back when it re-posts a receive. A sender holds at most W micro-batches without credit:
 * a slow rank back-pressures its upstream as a full ring does. A micro-batch that failed upstream
 * travels on as a header alone, past the stages (its status says why). Rank 0 receives result headers
 * into its window and each payload straight into the job's output rows (or into a result buffer for a
 * single micro-batch), and retires micro-batches in sequence order. Rank 0 copies a job's input rows into
 * pool buffers once (the only copy).
 *
 * Threads. mbp_mpi_init() starts one communication thread per process; it calls MPI_Init_thread with
 * MPI_THREAD_FUNNELED and then makes every MPI call of the process, also for the set-up calls below
 * (they hand their work to it). Workers hand results to it through a queue; it sleeps when idle (a short
 * spin, then parks of a quarter of the time it has been quiet, from 1 us up to opts.idle_ns), so it never
 * burns a core and an arrival after a quiet gap g is seen within about g / 4 (MPI cannot wake a thread on
 * an arriving message).
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
	uint64_t spin_ns;	 /**< the communication thread polls this long after its last event. 20 us */
	uint64_t idle_ns;	 /**< then parks at most this long between polls (see above). 200 us */
} mbp_mpi_opts;

/** Fill `o` with the defaults above (a zeroed struct means the same). */
void mbp_mpi_opts_init(mbp_mpi_opts *o);

/**
 * Make this rank's part of the pipeline: a local mbp_pipeline with options `local` (its in_row_bytes
 * is the width of this rank's input rows; rank 0's on_result receives results of single micro-batches,
 * and must be NULL elsewhere: the link owns it). Add this rank's stages with mbp_mpi_add_stage(), then
 * mbp_mpi_start(). Pair with mbp_mpi_destroy().
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
 * Start, on every rank (collective): start the local pipeline, check that each rank's output row width
 * is the next rank's input width and that all ranks agree on max_mb_rows and the window, then open the
 * links. Every rank gets the same result.
 * @return 0, -EINVAL (widths or options disagree between ranks: the message names them, see
 *         mbp_mpi_error()), -EALREADY, or mbp_pipeline_start's error (on any rank).
 */
int mbp_mpi_start(mbp_mpi *mp);

/* ---- rank 0: work ---- */

/**
 * Submit a job (rank 0): as mbp_job_submit(), with the results of the last rank gathered into job->out
 * (rows x the last rank's output width). Wait for it with mbp_mpi_job_wait(), not mbp_job_wait().
 * @return 0 (accepted: it will complete), -EINVAL, -E2BIG (mb_rows above max_mb_rows), -ENOTCONN (not
 *         started), -EPERM (not rank 0), -ESHUTDOWN (draining, cancelled or the run failed), -EAGAIN,
 *         -ETIMEDOUT (no room for its micro-batches in opts.inflight within the timeout).
 */
int mbp_mpi_job_submit(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns);

/** Wait for a job submitted with mbp_mpi_job_submit(). @return 0 when done (see job->status), -ETIMEDOUT,
 * -EINVAL. */
int mbp_mpi_job_wait(mbp_mpi *mp, mbp_job *job, int64_t timeout_ns);

/** Convenience (rank 0): init, submit (waiting for room) and wait. @return the job's status or a submit
 * error. */
int mbp_mpi_run(mbp_mpi *mp, const void *in, void *out, size_t rows, uint32_t mb_rows);

/** Rank 0: an input buffer, as mbp_mb_acquire() on the local pipeline. */
int mbp_mpi_mb_acquire(mbp_mpi *mp, mbp_mb **mb, int64_t timeout_ns);

/**
 * Rank 0: submit a filled buffer, as mbp_mb_submit(). Its result (rows of the last rank's output width,
 * with the caller's seq and user) reaches the local opts.on_result on the communication thread, in
 * submission order, in a result buffer: give it back with mbp_mpi_mb_release().
 * @return 0, -EINVAL (no on_result, rows out of range), -EPERM, -ENOTCONN, -ESHUTDOWN, -EAGAIN,
 *         -ETIMEDOUT; on error the caller still owns the buffer.
 */
int mbp_mpi_mb_submit(mbp_mpi *mp, mbp_mb *mb, int64_t timeout_ns);

/** Give back a result, or an acquired buffer never submitted. Any thread of rank 0. */
void mbp_mpi_mb_release(mbp_mpi *mp, mbp_mb *mb);

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

#ifdef __cplusplus
}
#endif
#endif
