/*
 * The pipeline's internal objects, shared by pipeline.c (construction, submission, shutdown), worker.c
 * (the loop of one stage thread), stats.c and trace.c. Not installed.
 *
 * Data flow (see DESIGN.md): callers enqueue jobs and single micro-batches on the multi-producer ingress;
 * stage 0 takes them in order, splits jobs into micro-batches read in place from the caller's input, and
 * pushes each result (a pool buffer) into the SPSC ring to stage 1, and so on; the last stage writes into
 * the caller's output (a job's array, or the caller's own buffer for a single micro-batch) and completes.
 * Where opts.threads < stages (by default: stages outnumber CPUs), one worker thread runs consecutive
 * stages, each calling the next (pass_on in worker.c): DESIGN.md's one thread per stage would make the
 * threads of a CPU time-slice it, a context switch per hop where a call does (pipeline.h, "Threads and
 * stages", has the figures).
 * The hop between two stages is a "link": today an SPSC ring in memory; the worker touches it only through
 * link_push/link_pop in worker.c, so a remote link (MPI) or a backward flow can take its place later.
 */
#ifndef MBP__PIPELINE_INTERNAL_H
#define MBP__PIPELINE_INTERNAL_H

#include <pthread.h>
/* Inline wfcqueue fast paths, except under TSan: liburcu's atomics are volatile accesses and inline
 * barriers that TSan cannot see, so TSan builds call the (uninstrumented) library instead and annotate the
 * hand-off of each node (MBP_TSAN_RELEASE/ACQUIRE). */
#ifndef MBP_TSAN
#define _LGPL_SOURCE 1
#endif
#include <urcu/wfcqueue.h>

#include <mbpipe.h>

#include "common.h"
#include "pool_internal.h"
#include "ring.h"
#include "wait.h"

/* What an ingress entry is. The entry is the first members of both a job's priv and a pool buffer's
 * header: { void *link[2]; uint32_t kind; }. */
enum { MBP__ITEM_JOB = 1, MBP__ITEM_MB = 2 };

struct mbp__item {
	void *link[2]; /* struct cds_wfcq_node while queued */
	uint32_t kind;
};
_Static_assert(sizeof(struct cds_wfcq_node) <= 2 * sizeof(void *), "ingress link too small");
/* A hop buffer (engine pool) never enters the ingress, so its link holds something else: the caller's
 * buffer that its micro-batch answers (mbp_mb_submit), or NULL for a job's micro-batch. */
static inline mbp_mb **mbp__origin(mbp_mb *hop)
{
	return (mbp_mb **)&mbp__buf_of(hop)->link[0];
}

/* The engine's view of mbp_job.priv. */
struct mbp__job_priv {
	struct mbp__item item;
	_Atomic uint32_t left; /* micro-batches not yet completed or failed */
	_Atomic uint32_t failed;
	/* (seq << 32) | (uint32_t)err of the lowest failed seq; UINT64_MAX: none */
	_Atomic uint64_t first_err;
	_Atomic uint32_t state; /* futex word: 0 pending, 1 done, 2 pending with a sleeper */
};
_Static_assert(sizeof(struct mbp__job_priv) <= sizeof(((mbp_job *)0)->priv), "mbp_job.priv too small");

static inline struct mbp__job_priv *mbp__jp(mbp_job *job)
{
	return (struct mbp__job_priv *)(void *)job->priv.opaque;
}
_Static_assert(offsetof(struct mbp__buf, kind) - offsetof(struct mbp__buf, link) ==
		   offsetof(struct mbp__item, kind),
	       "buffer ingress entry layout");

/*
 * A bound with sleeping waiters, for callers that may block (the ingress depth). take() reserves one unit
 * or waits; give() returns units and wakes sleepers only when there are any.
 */
struct mbp__bound {
	_Atomic uint32_t used;
	uint32_t limit;
	_Atomic uint32_t seq; /* futex word: bumped by give() when sleepers exist */
	_Atomic uint32_t sleepers;
	_Atomic uint32_t closed; /* take() fails with -ESHUTDOWN once set */
};

/*
 * Multi-producer, single-consumer ingress in front of stage 0 (liburcu wfcqueue: wait-free enqueue from
 * any thread; dequeue by stage 0 alone). Bounded by `room`.
 *   operation      | concurrency
 *   enqueue        | any threads
 *   dequeue, close | stage 0's thread / the controlling thread (close)
 */
struct mbp__ingress_mpsc {
	struct __cds_wfcq_head head;
	MBP_CACHELINE_ALIGNED struct cds_wfcq_tail tail;
	MBP_CACHELINE_ALIGNED struct mbp__bound room;
	MBP_CACHELINE_ALIGNED struct mbp__parker cons_park; /* stage 0 sleeps here when empty */
	_Atomic uint32_t closed;
};

/* One activity-log event: a stage computed a micro-batch. */
struct mbp__trace_ev {
	uint64_t t0, t1;
	uint64_t job;
	uint32_t seq;
	int32_t status;
};

/* Counters of one stage: single writer (its worker), relaxed readers. */
struct mbp__stage_counters {
	_Atomic uint64_t mbs, rows, failed;
	/* Time spent in each state, and when the state under way began (0: not in it), so that a snapshot
	 * counts a long computation or wait while it lasts, not all at once when it ends (see stats.c). */
	_Atomic uint64_t busy_ns, starved_ns, blocked_ns;
	_Atomic uint64_t busy_since, starved_since, blocked_since;
	_Atomic uint64_t hist[MBP_HIST_BUCKETS];
	/* completion, counted by whichever worker completes (last stage; stage 0 for abandoned work) */
	_Atomic uint64_t done_mbs, done_failed_mbs, done_rows, done_jobs, done_failed_jobs;
};

struct mbp_pipeline;

struct mbp__stage {
	mbp_stage_desc d;
	char name[MBP_STAGE_NAME_MAX];
	unsigned idx;
	struct mbp_pipeline *p;
	size_t in_row_bytes, out_row_bytes;
	/* Threads: stages [first, last] of one worker thread (one stage unless opts.threads < stages) are
	 * called one after the other; rings link the threads only. */
	struct mbp__ring *in;  /* NULL for stage 0, which reads the ingress, and for a stage that the
				  previous one calls on its own thread */
	struct mbp__ring *out; /* NULL unless this stage ends a thread that is not the last */
	mbp_pool_cache *cache; /* the thread's, shared by its stages */
	unsigned thread_idx;   /* which worker thread runs this stage */
	unsigned group_last;   /* index of the last stage that thread runs */
	bool leads;	       /* the first stage of its thread: owns `thread` and `cache` */
	pthread_t thread;
	bool thread_started;
	bool init_ok;
	int named_cpu; /* the descriptor's pin_cpu as a CPU number, -1: none */
	int cpu;
	int pin_error;
	bool pin_required;
	/* trace: written by the worker, `trace_n` published with release */
	struct mbp__trace_ev *trace;
	_Atomic uint32_t trace_n;
	MBP_CACHELINE_ALIGNED struct mbp__stage_counters c;
};

enum mbp__state { ST_NEW, ST_RUNNING, ST_DRAINING, ST_STOPPED };

struct mbp_pipeline {
	mbp_opts o;
	unsigned nstages;
	unsigned nthreads;
	struct mbp__stage stages[MBP_MAX_STAGES];
	struct mbp__wait_opts wopts;
	mbp_pool *pool;	      /* hop buffers, engine only */
	mbp_pool *mb_pool;    /* buffers of mbp_mb_acquire() */
	size_t out_row_bytes; /* the last stage's */
	struct mbp__ingress_mpsc ingress;

	/* Read by every worker once per micro-batch: a line of its own, written once. */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t cancel; /* fail what has not started */
	uint64_t start_ns;

	/* Written by every submission: kept off the workers' lines. */
	/* Lifecycle (enum mbp__state). Written by the controlling thread only; each access in pipeline.c
	 * names its memory order and partner (tests/atomic_partners.sh checks it). */
	MBP_CACHELINE_ALIGNED _Atomic int state;
	_Atomic uint32_t submitting; /* callers between their state check and their enqueue */

	/* multi-writer counters (submitting threads): read-modify-write */
	MBP_CACHELINE_ALIGNED _Atomic uint64_t jobs_accepted, mbs_accepted, next_job_id;

	/* start-up handshake */
	pthread_mutex_t start_lock;
	pthread_cond_t start_cond;
	unsigned started; /* workers that finished init */
	int start_err;	  /* first init or required-pin error */
	int go;		  /* 1: run, -1: abort (init failed elsewhere) */
};

void mbp__worker_main_loop(struct mbp__stage *s);
void *mbp__worker_thread(void *arg);

void mbp__bound_init(struct mbp__bound *b, uint32_t limit);
int mbp__bound_take(struct mbp__bound *b, int64_t timeout_ns);
void mbp__bound_give(struct mbp__bound *b, uint32_t n);
void mbp__bound_close(struct mbp__bound *b);

/* Completion of job micro-batches: k micro-batches of `job` leave the pipeline, `failed` of them failed,
 * the first failure being `err` at `seq`. Completes the job when it was the last. Counts into `c`. */
void mbp__job_account(struct mbp__stage_counters *c, mbp_job *job, uint32_t k, uint32_t failed, int err,
		      uint32_t seq);

/* The CPU a stage runs on, as every report gives it: -1 when it is not pinned or its pin failed. */
static inline int mbp__stage_cpu(const struct mbp__stage *s)
{
	return s->pin_error ? -1 : s->cpu;
}

/* Record one trace event (no-op when tracing is off or the log is full). */
void mbp__trace_add(struct mbp__stage *s, uint64_t t0, uint64_t t1, const mbp_mb *mb);

#endif
