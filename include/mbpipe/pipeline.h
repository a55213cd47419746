/*
 * mbp_pipeline: stages on pinned worker threads, linked by SPSC rings, fed by micro-batches.
 *
 * Not for direct inclusion: include <mbpipe.h>.
 *
 * Lifecycle: mbp_pipeline_new() -> mbp_pipeline_add_stage() x S -> mbp_pipeline_start() -> submit work ->
 * mbp_pipeline_drain() (finish everything accepted) or mbp_pipeline_cancel() (fail what has not started)
 * -> mbp_pipeline_destroy(). Destroy alone also works: it cancels first.
 *
 * Two levels of use:
 *   1. Jobs: a caller-owned mbp_job describes N input rows, an output array and a micro-batch size m. The
 *      engine splits it into ceil(N/m) micro-batches (the last may be short), runs them through the stages
 *      and gathers the outputs, in order, into the output array. Stage 0 reads the input rows in place and
 *      the last stage writes the output rows in place: a job costs no copy. The caller waits for its own
 *      job (mbp_job_wait) or gets a callback.
 *   2. Micro-batches: mbp_mb_acquire() a pool buffer, fill it, mbp_mb_submit() it; the result arrives
 *      through opts.on_result on the last stage's thread and goes back with mbp_mb_release() (the
 *      callback may pass NULL for the pipeline).
 *
 * Guarantee: every accepted micro-batch ends completed or failed with a status, in every path (stage
 * errors, drain, cancel, destroy with work in flight); the statistics show accepted = completed + failed.
 *
 * Thread safety:
 *   operation                                       | concurrency
 *   mbp_job_submit, mbp_mb_acquire/submit/release   | any threads, concurrently (multi-producer ingress)
 *   mbp_job_wait                                    | any thread, for its own job
 *   mbp_pipeline_stats_get, _placement              | any thread, any time after start
 *   mbp_pipeline_error                              | any thread, any time
 *   mbp_pipeline_replicas_set, _active              | any threads once started (before: the controller)
 *   new, add_stage, start, drain, cancel, destroy   | one controlling thread
 */
#ifndef MBPIPE_PIPELINE_H
#define MBPIPE_PIPELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "mb.h"
#include "pool.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MBP_MAX_STAGES	   64
#define MBP_MAX_CPUS	   256
#define MBP_HIST_BUCKETS   40 /* log2 of nanoseconds: bucket i counts [2^i, 2^(i+1)) ns; the last is open */
#define MBP_STAGE_NAME_MAX 32
#define MBP_MAX_REPLICAS   MBP_MAX_STAGES /* replicas of one stage; all threads together: MBP_MAX_STAGES */

typedef struct mbp_pipeline mbp_pipeline;

/**
 * A stage's computation: read in->rows rows of in->row_bytes at in->data, write as many rows of
 * out->row_bytes at out->data (out->rows and out->row_bytes are preset; out->capacity is at least
 * rows x row_bytes). Return 0, or a negative errno to fail this micro-batch (its job completes with the
 * first error; the pipeline goes on). Runs on the stage's worker thread (its own, or one it shares with
 * neighbouring stages: see "Threads and stages"), one micro-batch at a time.
 */
typedef int (*mbp_stage_fn)(void *ctx, const mbp_mb *in, mbp_mb *out);
/** Runs on the stage's thread before its first micro-batch (thread-local set-up: BLAS, RCU). 0 or -errno.
 * A replicated stage runs it once on each replica's thread, with the same `stage`: mbp_stage_replica()
 * says which replica (index per-replica state with it). */
typedef int (*mbp_stage_init_fn)(void *ctx, unsigned stage);
/** Runs on the stage's thread after its last micro-batch, also when start failed after init succeeded (once
 * per replica, on its thread, where its init succeeded). */
typedef void (*mbp_stage_fini_fn)(void *ctx);
/** Runs for every micro-batch as it leaves the pipeline, completed or failed, on the thread that completes
 * it: release what this stage attached to mb->carry. */
typedef void (*mbp_stage_done_fn)(void *ctx, mbp_mb *mb);

typedef struct mbp_stage_desc {
	const char *name;	/**< copied (at most MBP_STAGE_NAME_MAX - 1 bytes); NULL: "stage<i>" */
	mbp_stage_fn fn;	/**< required */
	mbp_stage_init_fn init; /**< optional */
	mbp_stage_fini_fn fini; /**< optional */
	mbp_stage_done_fn done; /**< optional */
	void *ctx;		/**< passed to every callback */
	size_t out_row_bytes;	/**< width of an output row; 0: same as the input row */
	unsigned pin_cpu;	/**< 0: the placement plan decides (a zeroed descriptor never pins);
				     MBP_PIN_CPU(c): pin this stage's thread to CPU c, one this process
				     may use (opts.pinning MBP_PIN_NONE: ignored) */
	unsigned replicas;	/**< threads that run this stage, each on the next micro-batch that is there
				     (whichever is free takes it); the next stage, or the result, receives
				     them in submission order whatever order they finish in. 0: 1. See
				     "Replicas" below */
} mbp_stage_desc;

/*
 * Replicas. A stage with replicas r > 1 runs on r threads of its own, each on its own CPU where the
 * placement plan has CPUs for them (pinning as for any thread: "Placement"). The hand-off before it is a
 * window indexed by each micro-batch's place in the stream: a replica that is free claims the next index
 * with one atomic increment; the hand-off after it is the same window, read in order by the next stage
 * (or, after the last stage, completed in order by whichever replica puts a result: done hooks,
 * on_result and job completion follow submission order). fn, init and fini run on every replica's
 * thread, on the same ctx: mbp_stage_replica() tells them which replica they run in, 0 .. r - 1.
 * A pipeline with a replicated stage gives every stage a thread of its own (stages do not share threads:
 * opts.threads must be 0 or the sum of the replicas) and hands off between two stages of one thread by
 * the ring, as without replicas; with replicas of 1 everywhere nothing changes. Limits: the threads of
 * all stages together at most MBP_MAX_STAGES; a replicated stage names no CPU (pin_cpu 0). Statistics:
 * mbp_pipeline_stats_get() sums a stage's replicas, mbp_pipeline_replica_stats() gives each (its CPU
 * too); mbp_pipeline_placement() gives a stage's replica 0. The threads are numbered replica-major
 * (every stage's replica 0, then every replica 1, ...: opts.cpus[t] and placement's thread count that
 * way), so that where threads outnumber the CPUs a stage's replicas still get different CPUs; each is
 * named mbp-pipe-<stage>.<replica>. The trace has a track per replica ("<name> replica <j>").
 */

/**
 * Active replicas: how many of stage `stage`'s replicas take micro-batches, 1 .. its replicas (all of
 * them until set). Replicas 0 .. active - 1 take them; each of the others parks (asleep on a futex, no
 * spin) before it claims its next micro-batch and stays parked until a later call makes it active again,
 * so it never holds one; the ordered merge still receives every micro-batch in order, and nothing a
 * replica computes depends on how many are active. A replica busy when it is made inactive finishes the
 * micro-batch it claimed (at most one more) before it parks. Drain, cancel and destroy wake every parked
 * replica to run to the end of the stream. Its parked time counts in mbp_stage_stats.parked_ns, from
 * when it parks to when it wakes (a later call, or the shutdown's wake), in none of busy, starved and
 * blocked. The count stays the one last set after shutdown too (mbp_pipeline_replicas_active and the
 * statistics' active say it), though the shutdown ran every replica to the end of the stream.
 * The threads are made at start and none is made or ended here: this is how a rebalancing move changes a
 * stage's replica count (<mbpipe/model.h>, "Rebalancing"). Placement does not follow: a pinned replica
 * keeps the CPU of the plan made at start, active or parked, and that plan does not look at which
 * replicas are active (see "Active replicas" in <mbpipe/model.h> for what that costs). Any thread once started (before start, the
 * controlling thread, after the stage is added); a stage of one replica takes only 1.
 * @return 0, -EINVAL (NULL), -ERANGE (stage out of range, active 0 or above the stage's replicas).
 */
int mbp_pipeline_replicas_set(mbp_pipeline *p, unsigned stage, unsigned active);

/** The active replicas of stage `stage` as last set (mbp_pipeline_replicas_set). Any thread.
 * @return 1 .. the stage's replicas, -EINVAL (NULL), -ERANGE (stage out of range). */
int mbp_pipeline_replicas_active(mbp_pipeline *p, unsigned stage);

/** The replica of its stage that the calling thread runs, 0 .. replicas - 1: valid inside a stage's fn,
 * init, fini and done on the pipeline's threads (0 on any other thread, and for a stage of one thread). */
unsigned mbp_stage_replica(void);

/** The value of mbp_stage_desc.pin_cpu that names CPU `c` (CPU numbers start at 0; 0 means "none"). */
#define MBP_PIN_CPU(c) ((unsigned)(c) + 1u)

/** Result of a micro-batch submitted with mbp_mb_submit(); `mb` is owned by the callee until
 * mbp_mb_release(), which it may call here with NULL for the pipeline (the options that name the callback
 * are filled before the pipeline exists, so `arg` need not carry it). Runs on the last stage's thread:
 * keep it short. */
typedef void (*mbp_result_fn)(void *arg, mbp_mb *mb);

/**
 * How an engine places its worker threads (mbp_opts.pinning, mbp_train_opts.pinning, the same default in
 * both). Pinned is the default because it is the fast one: with 100 us operations the trainer's 1F1B
 * bubble measured 0.52 unpinned and 0.115 pinned (0.111 predicted).
 */
typedef enum mbp_pin_mode {
	MBP_PIN_PLAN = 0, /**< the default: each thread pinned to a CPU of the placement plan */
	MBP_PIN_NONE = 1, /**< no pinning: the OS places the threads */
} mbp_pin_mode;

/** A spin budget (mbp_opts.spin_ns, mbp_train_opts.spin_ns, mbp_mpi_opts.spin_ns) of none: no spinning.
 * 0 is not none: it is the default budget. */
#define MBP_SPIN_NONE UINT64_MAX
/** A yield budget (mbp_opts.yield_ns) of none: park right after the spin. 0 is the default budget. */
#define MBP_YIELD_NONE UINT64_MAX

/** Options of a pipeline. A zeroed struct with in_row_bytes set is complete: every other field's 0 means
 * the default given after it (mbp_opts_init() fills in the same values). */
typedef struct mbp_opts {
	size_t in_row_bytes;	/**< width of an input row in bytes (required, > 0) */
	uint32_t max_mb_rows;	/**< largest micro-batch in rows; sizes the pool's buffers. 0: 64 */
	uint32_t ring_capacity; /**< slots per hop, a power of two. 0: 16 */
	uint32_t ingress_depth; /**< jobs plus single micro-batches waiting for stage 0. 0: 1024 */
	uint32_t mb_buffers;	/**< buffers for mbp_mb_acquire(), held by callers or in flight. 0: 256 */
	size_t pool_bytes;	/**< bound in bytes of each of the two pools (engine, mb_buffers). 0: 1 GiB */
	uint32_t cache_size;	/**< buffers in each worker's pool cache. 0: 32 */
	uint64_t spin_ns;	/**< spin budget of a waiting worker. 0: 20000; MBP_SPIN_NONE: none */
	uint64_t yield_ns;	/**< yield budget after the spin, then it parks. 0: 200000; MBP_YIELD_NONE:
				      none */
	mbp_pin_mode pinning;	/**< 0: MBP_PIN_PLAN, pinned per the placement plan */
	uint32_t threads;	/**< worker threads T (more than the stages: one per stage); 0: one per
				      stage while the stages fit the CPUs, else one per CPU (one per stage
				      if a pinned descriptor names a CPU). See below. */
	uint32_t ncpus;		/**< entries in cpus; 0: the CPUs this process may use, the least taken first
				     (see "Placement" below) */
	int cpus[MBP_MAX_CPUS]; /**< thread t runs on cpus[t] (with T > ncpus: cpus[t * ncpus / T]) unless a
				      descriptor of one of its stages names a CPU */
	uint32_t trace_events;	/**< activity-log events kept per stage; 0: tracing off */
	mbp_result_fn on_result; /**< required for mbp_mb_submit() */
	void *on_result_arg;
} mbp_opts;

/*
 * Threads and stages. With T = S every stage has its own thread, linked to the next by a ring. With
 * T < S, thread t runs the consecutive stages i with i * T / S == t (S = 4, T = 2: stages 0-1 and 2-3):
 * it calls them one after the other on each micro-batch, with no ring and no hand-off between them, and
 * rings link the threads only. This is what the default does when stages outnumber CPUs: threads that
 * would time-slice one CPU pay a context switch per hop instead of a function call (perf/results/
 * pipeline.md: S = 4 on 2 CPUs at 1 us per stage, efficiency 0.72-0.78 -> 0.84-0.90 and CPU time
 * 1.28-1.39 -> 1.11-1.19 times the work, in the same runs). Stages of one thread run their init in stage
 * order (every init runs, also after one failed) and their fini in reverse order, all on that thread;
 * mbp_pipeline_placement() says which thread runs each stage. Each thread is named for its stages, as ps
 * and gdb show it: mbp-pipe-<first>[-<last>] (a trainer's mbp-train-<first>[-<last>]).
 */

/*
 * Placement. With opts.pinning MBP_PIN_PLAN (the default) every worker thread is pinned to one CPU. A thread whose stage
 * names a CPU (MBP_PIN_CPU) runs there, and with opts.cpus thread t runs on cpus[t]. Otherwise the plan
 * chooses among the CPUs this process may use (mbp_cpus_allowed), for each thread the one that the fewest
 * threads of this process are pinned to, the first in order among equals: every running pipeline and
 * trainer (<mbpipe/train.h>) of the process counts, so a second pipeline, or a trainer beside a pipeline,
 * takes the CPUs the first one left free instead of the same ones. A thread holds its CPU from start until
 * the threads stop (drain, cancel, destroy, or a failed start); one whose pin failed holds none.
 *
 * Not enough CPUs. Once every allowed CPU is taken, the next threads share the least taken ones, still
 * pinned (a pinned thread keeps its cache and its neighbour; an unpinned one would share a CPU all the
 * same, wherever the scheduler puts it), and mbp_pipeline_placement() says so: each stage's `sharing`
 * counts the other threads on its CPU. A pipeline whose own threads outnumber its CPUs does not spin in
 * its waits (it would spin on the CPU its peer needs); one that shares CPUs only with another pipeline or
 * trainer keeps its spin budget (what it waits for runs elsewhere): to run two busy ones side by side
 * without sharing, give each its own opts.cpus.
 *
 * Across MPI ranks (<mbpipe/mpi.h>), the ranks of one node that were given the same CPUs (mpirun
 * --bind-to none, or several ranks bound to one socket) split them at mbp_mpi_start() and
 * mbp_mpi_trainer_start(): the k-th of m such ranks places its part of the pipeline in the k-th of m
 * equal parts of the CPU list, as if they were all the CPUs it may use (the default thread count counts
 * them; a cgroup quota is split m ways too). With fewer CPUs than ranks, consecutive ranks share one CPU:
 * `sharing` counts each other rank there as one, and their waits do not spin (each waits for the other).
 * A rank's communication thread, which makes its MPI copies, counts as one more of its threads where the
 * plan takes all of the rank's part of the CPUs (it is not pinned: where opts.cpus lists fewer, it runs
 * on another): a rank whose stage threads fill its part of the CPUs does not spin in their waits either.
 * Ranks that mpirun bound to CPUs of their own keep them; other pipelines of the process are not
 * confined.
 */

/** Fill `o` with the defaults documented above (what a zeroed struct means; in_row_bytes 0: the caller
 * sets it). */
void mbp_opts_init(mbp_opts *o);

/**
 * Apply a `key=value,...` string to `o` (as from an environment variable). Keys: row_bytes, max_mb_rows,
 * ring, ingress, mb_buffers, pool_mb, cache, spin_us, yield_us, pin (0/1), threads, cpus ("0-3" or
 * "0+2+5"), trace. NULL or "" changes nothing. A value means what it says: spin_us=0 and yield_us=0 are
 * none (MBP_SPIN_NONE, MBP_YIELD_NONE), pin=0 is MBP_PIN_NONE and pin=1 MBP_PIN_PLAN; a size of 0
 * (ring=0, cache=0, ...) is refused. Each value is checked against its key's rule as it is
 * parsed (ring=3 fails here, not at mbp_pipeline_new); mbp_opts_rule() words the rule.
 *
 * @return 0, -EINVAL (unknown key, not a number, the key's rule broken), -ERANGE (a number too large for
 *         its field): on error `o` may be partly changed; `errpos`, if not NULL, receives the offset of the
 *         offending key, so that mbp_opts_rule(conf + *errpos) says what it must be.
 */
int mbp_opts_parse(mbp_opts *o, const char *conf, size_t *errpos);

/**
 * Check every field of `o` against the rule of its key (the rules mbp_opts_parse() applies, but for a 0,
 * which is the field's default here; mbp_pipeline_new() applies them too), for options set in code.
 * @param why if not NULL, receives NULL or a static one-line text naming the first field that breaks its
 *        rule by its key, and the rule: "ring: slots per hop, a power of two from 2 to 1073741824".
 * @return 0, -EINVAL.
 */
int mbp_opts_check(const mbp_opts *o, const char **why);

/**
 * The rule of the key that `kv` starts with ("ring=3,cache=8" or "ring"), as a static one-line text that
 * names the key ("ring: slots per hop, a power of two from 2 to 1073741824"); for an unknown key, a line
 * listing the keys. For tools: after mbp_opts_parse() fails, print mbp_opts_rule(conf + errpos).
 */
const char *mbp_opts_rule(const char *kv);

/**
 * Create a pipeline with no stages. Pair with mbp_pipeline_destroy().
 * @return 0, -EINVAL (NULL, a field that breaks its rule: see mbp_opts_check()), -ENOMEM.
 */
int mbp_pipeline_new(mbp_pipeline **p, const mbp_opts *o);

/**
 * Append a stage (before start). The descriptor is copied. A descriptor with only `fn` set is complete:
 * every other field's zero is its default.
 * @return 0, -EINVAL (NULL fn, already started, replicas > 1 with pin_cpu), -E2BIG (more than
 *         MBP_MAX_STAGES stages, or their threads with replicas), -ERANGE (pin_cpu names a CPU this
 *         process may not use: see mbp_cpus_allowed()).
 */
int mbp_pipeline_add_stage(mbp_pipeline *p, const mbp_stage_desc *d);

/**
 * Start the worker threads (opts.threads), pinned per the placement plan, and run each stage's init on the
 * thread that runs the stage. More threads than CPUs works: the waits then skip their spin step.
 * @return 0; -EINVAL (no stages; stages of one thread naming different CPUs; with replicas, opts.threads
 *         other than 0 or their sum); -EALREADY; -ENOMEM;
 *         -ENOSPC (pool_bytes cannot hold what full rings and caches need), -E2BIG, -EOVERFLOW (sizes
 *         beyond the engine's); the first failing init's error (every thread is then joined and fini
 *         ran where init succeeded); a pin error (-EINVAL, -EPERM) only when the CPU was named
 *         explicitly, otherwise a failed pin is reported by mbp_pipeline_placement(). A refusal for a
 *         limit is worded by mbp_pipeline_error().
 */
int mbp_pipeline_start(mbp_pipeline *p);

/**
 * Stop accepting work, wait until everything accepted has completed or failed, stop the threads (each
 * stage's fini runs). Idempotent.
 * @return 0, -ETIMEDOUT (work still in flight: call again, or cancel), -ENOTCONN (never started).
 */
int mbp_pipeline_drain(mbp_pipeline *p, int64_t timeout_ns);

/**
 * Stop accepting work and fail with -ECANCELED every micro-batch that has not started its next stage;
 * micro-batches inside a stage function finish that stage first. Returns when the threads have stopped.
 * @return 0, -ENOTCONN (never started).
 */
int mbp_pipeline_cancel(mbp_pipeline *p);

/** Cancel if running, then free everything. Accepts NULL. */
void mbp_pipeline_destroy(mbp_pipeline *p);

/** Why the pipeline last refused a call for one of its limits: see mbp_pipeline_error(). */
typedef struct mbp_pipeline_refusal {
	int err;	/**< what the refused call returned; 0: nothing refused yet */
	char what[200]; /**< one line naming the limit and its value, such as "micro-batches of 128 rows:
			     above max_mb_rows (64)"; "" when err is 0 */
} mbp_pipeline_refusal;

/**
 * The last refusal of a call on this pipeline for a limit, in words: a job or micro-batch whose size
 * breaks max_mb_rows (or makes more than 2^32 - 1 micro-batches), an add_stage beyond MBP_MAX_STAGES or
 * naming a CPU this process may not use, a start with no stages, with stages of one thread naming
 * different CPUs, or whose options cannot hold what full rings need (pool_bytes, ring, cache, a size that
 * overflows). For tools: print `what` with the error. Other errors (-EAGAIN, -ETIMEDOUT, -ESHUTDOWN,
 * -ENOTCONN, a NULL argument, a foreign buffer, a stage's init) leave it as it was, and a later success
 * does not clear it: compare `err` with the error you got.
 * Any thread, also while others submit (a copy taken under the pipeline's lock); with several threads
 * refused at once it is whichever came last.
 * @return 0, -EINVAL (NULL).
 */
int mbp_pipeline_error(const mbp_pipeline *p, mbp_pipeline_refusal *r);

/* ---- jobs ---- */

struct mbp_job;
typedef void (*mbp_job_fn)(struct mbp_job *job, void *arg);

/** A caller-owned job. Fill it with mbp_job_init(); fields under "results" are valid once it is done. */
typedef struct mbp_job {
	const void *in;	  /**< rows x in_row_bytes */
	void *out;	  /**< rows x the last stage's output row width */
	size_t rows;	  /**< N */
	uint32_t mb_rows; /**< m */
	mbp_job_fn cb;	  /**< optional completion callback, on the completing thread; may free the job.
			       A job with a callback completes through it alone: see mbp_job_wait() */
	void *cb_arg;
	/* results */
	int status;	     /**< 0, or the error of the first failed micro-batch */
	uint32_t mbs;	     /**< micro-batches: ceil(rows / mb_rows) */
	uint32_t mbs_failed; /**< how many of them failed */
	uint64_t id;	     /**< assigned at submit, unique in the pipeline */
	uint64_t submit_ns;  /**< CLOCK_MONOTONIC at acceptance */
	uint64_t done_ns;    /**< CLOCK_MONOTONIC at completion */
	/* private: the engine's bookkeeping; do not touch */
	struct {
		uint64_t opaque[8];
	} priv;
} mbp_job;

/** Describe a job: `rows` rows from `in` into `out`, split into micro-batches of `mb_rows`. */
void mbp_job_init(mbp_job *job, const void *in, void *out, size_t rows, uint32_t mb_rows);

/**
 * Submit a job. The job, `in` and `out` must stay valid until it is done.
 * @param timeout_ns 0: fail at once when the ingress is full; < 0: wait; > 0: wait at most this long
 * @return 0 (accepted: it will complete), -EINVAL (NULL, rows 0, mb_rows 0, more than 2^32 - 1
 *         micro-batches), -E2BIG (mb_rows above max_mb_rows), -ENOTCONN (not started), -ESHUTDOWN
 *         (draining or cancelled), -EAGAIN (full, timeout 0), -ETIMEDOUT. A refusal for a limit (E2BIG,
 *         too many micro-batches) is worded by mbp_pipeline_error().
 */
int mbp_job_submit(mbp_pipeline *p, mbp_job *job, int64_t timeout_ns);

/*
 * Completion. A job without a callback is done once mbp_job_done() returns true or mbp_job_wait() returns
 * 0: its results are then visible and the engine no longer touches it (free or resubmit it). A job with a
 * callback completes through the callback alone: the engine fills the results and then calls cb, its last
 * touch of the job, so the callback may free it. Waiting on such a job would race with that free (a
 * waiter woken before the callback could free the job under it; one woken after could not be woken at
 * all), so mbp_job_wait() refuses it with -EINVAL at once and mbp_job_done() is false for it: signal
 * whatever the caller waits for from the callback.
 */

/**
 * Wait for a submitted job without a callback.
 * @param timeout_ns 0: just look; < 0: no limit; > 0: wait at most this long
 * @return 0 when it is done (see job->status), -ETIMEDOUT, -EINVAL (NULL, or a job with a callback).
 */
int mbp_job_wait(mbp_job *job, int64_t timeout_ns);

/** Whether a submitted job without a callback is done (acquire: its results are then visible). Always
 * false for a job with a callback (see "Completion" above). */
bool mbp_job_done(const mbp_job *job);

/** Convenience: init, submit (waiting for room) and wait. @return the job's status or a submit error. */
int mbp_run(mbp_pipeline *p, const void *in, void *out, size_t rows, uint32_t mb_rows);

/* ---- micro-batches one by one ---- */

/**
 * Get an input buffer of max_mb_rows x in_row_bytes from the pipeline's pool (any thread), with
 * mb->carry NULL.
 * @return 0, -EAGAIN, -ETIMEDOUT, -ENOTCONN, -ESHUTDOWN.
 */
int mbp_mb_acquire(mbp_pipeline *p, mbp_mb **mb, int64_t timeout_ns);

/**
 * Submit a filled buffer: mb->rows (1 .. max_mb_rows) rows of in_row_bytes; mb->seq and mb->user are the
 * caller's and come back with the result. mb->carry is handed to stage 0 as it is (NULL from
 * mbp_mb_acquire, or what the stages' own API says a caller may put there, such as mbp_model_mb_pin()); a
 * micro-batch no stage saw (cancelled before stage 0) comes back with it unchanged. On success the pipeline
 * owns the buffer until its result reaches on_result; on error the caller still does, and the buffer is
 * unchanged.
 * @return 0, -EINVAL (no on_result, rows out of range: worded by mbp_pipeline_error(), `mb` not a
 *         buffer from this pipeline's mbp_mb_acquire() that the caller holds: a foreign pointer, a
 *         released buffer, or one already submitted whose result has not come back), -ENOTCONN,
 *         -ESHUTDOWN, -EAGAIN, -ETIMEDOUT.
 */
int mbp_mb_submit(mbp_pipeline *p, mbp_mb *mb, int64_t timeout_ns);

/**
 * Give back a result (or an acquired buffer never submitted). Any thread, also inside opts.on_result.
 * @param p the pipeline the buffer came from, or NULL: then it is found from the buffer's address among
 *        the started pipelines that have not been destroyed (a lookup under a shared lock; pass p where
 *        you have it).
 * A pointer that is not a buffer the caller holds (a foreign pointer, one released already, one still
 * submitted, one of a destroyed pipeline, or of another pipeline than p) aborts with a message, as
 * mbp_pool_put() does: going on would corrupt the pool.
 */
void mbp_mb_release(mbp_pipeline *p, mbp_mb *mb);

/* ---- placement ---- */

typedef struct mbp_placement {
	int cpu;	  /**< CPU the stage was placed on, -1 when not pinned */
	int pin_error;	  /**< 0, or the error pinning returned (the stage then runs unpinned) */
	unsigned thread;  /**< worker thread running the stage, 0 .. T-1; stages of one thread share it */
	unsigned sharing; /**< other threads pinned to its CPU now: of this pipeline (more threads than
			       CPUs), of other pipelines and trainers of this process, and, under mbp_mpi,
			       one for each other rank of its node given the same CPU; 0: the CPU is its
			       thread's alone, or it is not pinned, or the pipeline has stopped. See
			       "Placement" above */
} mbp_placement;

/**
 * The CPUs this process may use: sched_getaffinity, further limited by a cgroup v2 CPU quota when one is
 * set (cpu.max). Writes up to `max` CPU numbers. @return how many CPUs are allowed (may exceed max), or a
 * negative error. `quota_cpus`, if not NULL, receives the quota in whole CPUs (0: none).
 */
int mbp_cpus_allowed(int *cpus, unsigned max, unsigned *quota_cpus);

/** The placement actually used, one entry per stage (see "Placement" above). @return the stage count, or
 * -ENOTCONN. */
int mbp_pipeline_placement(mbp_pipeline *p, mbp_placement *out, unsigned n);

/* ---- statistics and trace ---- */

typedef struct mbp_stage_stats {
	char name[MBP_STAGE_NAME_MAX];
	int cpu;
	uint64_t mbs;	     /**< micro-batches computed */
	uint64_t rows;	     /**< rows computed */
	uint64_t failed;     /**< micro-batches this stage failed (its fn returned an error) */
	uint64_t busy_ns;    /**< time inside fn */
	uint64_t starved_ns; /**< time waiting for input (where stages share a thread: its first) */
	uint64_t blocked_ns; /**< time waiting for room downstream (shared thread: its last) or a buffer */
	uint64_t parked_ns;  /**< time parked: an inactive replica asleep (mbp_pipeline_replicas_set), from
				  when it parks to when a set or the shutdown wakes it; 0 for a stage that
				  never parks. Counted by the replica's thread where it parks and wakes, as
				  the three above are where it enters and leaves them, so that over a window
				  busy + starved + blocked + parked is each thread's time but for the engine's
				  own work between states (hand-offs, completion): exactly the window while
				  the thread stays in one state (a stage's: its replicas' threads', summed) */
	uint64_t hist[MBP_HIST_BUCKETS]; /**< service time of fn, log2 buckets */
	uint32_t ring_occupancy; /**< micro-batches waiting in the stage's input ring (stage 0: ingress;
				      a replicated stage and the one after it: the sequenced window
				      before it, which its replicas share; 0 of 0 for a stage called by
				      the previous one on its thread) */
	uint32_t ring_capacity;
	uint32_t
	    replicas;	 /**< the stage's replicas (its figures above are their sums; mbp_pipeline_stats_get)
			      or 1 for one replica's own (mbp_pipeline_replica_stats) */
	uint32_t active; /**< of them, those set to take micro-batches (mbp_pipeline_replicas_set; all
			      unless set), the count last set, also after drain, cancel or destroy woke
			      every replica to finish the stream; one replica's own: 1 if it is among
			      them, 0 if not (it parks before it claims; parked_ns says for how long) */
} mbp_stage_stats;

typedef struct mbp_pipeline_stats {
	uint64_t start_ns, now_ns; /**< the window: from start (or the earlier snapshot) to now */
	uint64_t jobs_accepted, jobs_completed, jobs_failed;
	uint64_t mbs_accepted, mbs_completed, mbs_failed;
	uint64_t rows_completed;
	uint32_t stages;
	uint32_t threads;	 /**< worker threads (T); equals stages unless stages share threads, or
				      have replicas (then their sum) */
	uint32_t ingress_queued; /**< entries waiting in the ingress now */
	double throughput;	 /**< rows completed per second in the window */
	double bubble;		 /**< 1 - sum(busy) / (threads x window): idle share of the workers' time */
	mbp_pool_stats pool;	 /**< the engine's buffers between stages */
	mbp_pool_stats mb_pool;	 /**< the buffers of mbp_mb_acquire() */
} mbp_pipeline_stats;

/**
 * Snapshot the counters (relaxed reads, each single-writer). `ss` may be NULL; else it receives up to n
 * stages. @return the stage count, or -EINVAL.
 */
int mbp_pipeline_stats_get(mbp_pipeline *p, mbp_pipeline_stats *ps, mbp_stage_stats *ss, unsigned n);

/**
 * Snapshot the counters of each replica of stage `stage` (as mbp_pipeline_stats_get() does for stages;
 * cpu is the replica's own): up to n entries into `out`, replica j in out[j]; summed, they are the
 * stage's figures. @return the stage's replicas, or -EINVAL (NULL, stage out of range).
 */
int mbp_pipeline_replica_stats(mbp_pipeline *p, unsigned stage, mbp_stage_stats *out, unsigned n);

/**
 * Turn snapshot `b` into the window since snapshot `a` (both of the same pipeline): counters become
 * differences and throughput and bubble are recomputed over that window. `bs` and `as` hold n stages.
 */
void mbp_stats_window(mbp_pipeline_stats *b, mbp_stage_stats *bs, const mbp_pipeline_stats *a,
		      const mbp_stage_stats *as, unsigned n);

/**
 * Write the activity log (each stage's begin and end of every traced micro-batch) as a Chrome trace JSON
 * file that Perfetto and chrome://tracing open. Valid while running (a consistent prefix) or after drain.
 * Each stage's track is named "<index> <name> (cpu <c>)", c being -1 where the stage is not pinned or its
 * pin failed; the name is escaped for JSON, and bytes of it that are not UTF-8 become U+FFFD. Written by
 * rename, as every file mbpipe writes (<mbpipe/file.h>): whole or not at all, a node at path refused.
 * @return 0, -EINVAL (tracing off), -EEXIST (path is not a regular file), -errno from the file system.
 */
int mbp_pipeline_trace_write(mbp_pipeline *p, const char *path);

#ifdef __cplusplus
}
#endif
#endif
