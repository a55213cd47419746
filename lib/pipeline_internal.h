/*
 * The pipeline's internal objects, shared by pipeline.c (construction, admission, single micro-batches,
 * shutdown), job.c (jobs), worker.c (the loop of one stage thread) and stats.c (statistics and the
 * trace). The ingress (ingress.h), the crew of threads (crew.h) and the activity log (trace.h) have
 * headers of their own, below this one; the jobs' bookkeeping (job.h) sits beside it, for job.c and
 * worker.c: no header includes one that includes it back. Not installed.
 *
 * Data flow (see ARCHITECTURE.md): callers enqueue jobs and single micro-batches on the multi-producer ingress;
 * stage 0 takes them in order, splits jobs into micro-batches read in place from the caller's input, and
 * pushes each result (a pool buffer) into the SPSC ring to stage 1, and so on; the last stage writes into
 * the caller's output (a job's array, or the caller's own buffer for a single micro-batch) and completes.
 * Where opts.threads < stages (by default: stages outnumber CPUs), one worker thread runs consecutive
 * stages, each calling the next (pass_on in worker.c): the first sketch's one thread per stage would make the
 * threads of a CPU time-slice it, a context switch per hop where a call does (pipeline.h, "Threads and
 * stages", has the figures). The threads are the pipeline's crew (crew.h: placement, pins, names, the
 * start handshake, the init/fini rule, stop), the trainer's the same way.
 * The hop between two stages is a "link": today an SPSC ring in memory; the worker touches it only through
 * link_push/link_pop in worker.c, so a remote link (MPI) or a backward flow can take its place later.
 */
#ifndef MBP__PIPELINE_INTERNAL_H
#define MBP__PIPELINE_INTERNAL_H

#include <pthread.h>

#include <mbpipe.h>

#include "common.h"
#include "crew.h"
#include "ingress.h"
#include "pool_internal.h"
#include "ring.h"
#include "seqwin.h"
#include "trace.h"
#include "wait.h"

/* A hop buffer (engine pool) never enters the ingress, so its link holds something else: the caller's
 * buffer that its micro-batch answers (mbp_mb_submit), or NULL for a job's micro-batch. */
static inline mbp_mb **mbp__origin(mbp_mb *hop)
{
	return (mbp_mb **)&mbp__buf_of(hop)->link[0];
}
/* A caller's buffer enters the ingress through its header's link and kind, laid out as an entry. */
_Static_assert(offsetof(struct mbp__buf, kind) - offsetof(struct mbp__buf, link) ==
		   offsetof(struct mbp__item, kind),
	       "buffer ingress entry layout");

/* Counters of one stage: single writer (its worker), relaxed readers. */
struct mbp__stage_counters {
	_Atomic uint64_t mbs, rows, failed;
	/* Time spent in each state, and when the state under way began (0: not in it), so that a snapshot
	 * counts a long computation or wait while it lasts, not all at once when it ends (see stats.c).
	 * parked: an inactive replica asleep in park_inactive (worker.c), its thread's only other state. */
	_Atomic uint64_t busy_ns, starved_ns, blocked_ns, parked_ns;
	_Atomic uint64_t busy_since, starved_since, blocked_since, parked_since;
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
	/* Threads (the crew's): stages first .. last of one thread (one stage unless opts.threads < stages)
	 * are called one after the other; rings link the threads only. */
	struct mbp__ring *in;  /* NULL for stage 0, which reads the ingress, and for a stage that the
				  previous one calls on its own thread */
	struct mbp__ring *out; /* NULL unless this stage ends a thread that is not the last */
	mbp_pool_cache *cache; /* its thread's (the crew's), shared by its stages */
	int named_cpu;	       /* the descriptor's pin_cpu as a CPU number, -1: none */
	/* Replicas (mbp_stage_desc.replicas): each runs on a thread of its own, on a copy of this struct (its
	 * own counters, cache, trace); replica 0 is the stage itself, the others are rep[0 .. r - 2]. A
	 * replicated stage and its neighbours hand off through sequenced windows (seqwin.h) instead of
	 * rings; a stage of one thread between two stages of one thread keeps its ring. */
	unsigned replicas;	/* at least 1 */
	unsigned replica;	/* this copy's index */
	unsigned unit;		/* its thread's index in the crew (= idx unless the pipeline has replicas) */
	struct mbp__stage *rep; /* replicas 1 .. r - 1 (replica 0's field; NULL: r = 1) */
	struct mbp__seqwin *win_in;   /* from the replicated stage before, or to this stage's replicas */
	struct mbp__seqwin *win_out;  /* to the next stage, where this one or it is replicated */
	struct mbp__seqwin *win_done; /* a replicated last stage: completion in order */
	uint32_t cur_seq;	      /* the stream index of the micro-batch under way (windows) */
	uint32_t in_seq, out_seq;     /* a stage of one thread's next index in and out; a replica's puts */
	struct mbp__trace trace;      /* the micro-batches it computed (trace.h): written by its thread */
	MBP_CACHELINE_ALIGNED struct mbp__stage_counters c;
};

enum mbp__state { ST_NEW, ST_RUNNING, ST_DRAINING, ST_STOPPED };

struct mbp_pipeline {
	mbp_opts o;
	unsigned nstages;
	unsigned node_k, node_m; /* mbp__pipeline_node_share(): its part of its node's CPUs (mbp_mpi) */
	struct mbp__stage stages[MBP_MAX_STAGES];
	struct mbp__crew crew; /* the worker threads: placement, start, stop (crew.h) */
	mbp_pool *pool;	       /* hop buffers, engine only */
	mbp_pool *mb_pool;     /* buffers of mbp_mb_acquire() */
	size_t out_row_bytes;  /* the last stage's */
	struct mbp__ingress_mpsc ingress;
	/* Replicas: the crew's threads are units, one per replica (units: any stage has replicas > 1). */
	bool units;
	unsigned nunits;
	struct mbp__stage *unit[MBP_MAX_STAGES];
	unsigned unit_stage[MBP_MAX_STAGES], unit_replica[MBP_MAX_STAGES];
	/* A replicated stage 0: its replicas take the next micro-batch of the ingress's stream under `lock`
	 * (the ingress has one consumer at a time); `job` is the one being split, `k` its next micro-batch. */
	struct {
		pthread_mutex_t lock;
		mbp_job *job;
		uint32_t k, seq;
	} feed;

	/* Read by every worker once per micro-batch: a line of its own, written once. */
	MBP_CACHELINE_ALIGNED _Atomic uint32_t cancel; /* fail what has not started */
	uint64_t start_ns;

	/* Active replicas (mbp_pipeline_replicas_set): replica j of stage s takes micro-batches while j <
	 * active[s], or once `all` is set (shutdown: every replica runs to the end of the stream). One that
	 * is not active parks on `gen` (wait.h's generation word) before it claims a micro-batch, so it never
	 * holds one; a setter stores, then bumps `gen`. Read by the replicas once per micro-batch, written
	 * by a move: a line of its own. */
	MBP_CACHELINE_ALIGNED struct {
		_Atomic uint32_t active[MBP_MAX_STAGES];
		_Atomic uint32_t all;
		_Atomic uint32_t gen;
	} park;

	/* Written by every submission: kept off the workers' lines. */
	/* Lifecycle (enum mbp__state). Written by the controlling thread only; each access in pipeline.c
	 * names its memory order and partner (tests/atomic_partners.sh checks it). */
	MBP_CACHELINE_ALIGNED _Atomic int state;
	_Atomic uint32_t submitting; /* callers between their state check and their enqueue */

	/* multi-writer counters (submitting threads): read-modify-write */
	MBP_CACHELINE_ALIGNED _Atomic uint64_t jobs_accepted, mbs_accepted, next_job_id;

	/* the last refusal for a limit (mbp_pipeline_error); any thread, under err_lock */
	pthread_mutex_t err_lock;
	mbp_pipeline_refusal refusal;
};

/* Record why a call was refused for a limit (mbp_pipeline_error) and return `err`. Any thread. */
__attribute__((format(printf, 3, 4))) int mbp__pipeline_refuse(struct mbp_pipeline *p, int err,
							       const char *fmt, ...);

/* What the pipeline runs on its crew's threads (worker.c, mbp__crew_run_fn): the loop of a thread's
 * stages. The crew's arg is the pipeline. */
void mbp__worker_run(void *arg, struct mbp__crew_thread *th);

/* Admission of a submission (job.c, mbp_mb_submit): announce it; fails with -ENOTCONN (not started) or
 * -ESHUTDOWN unless running. On 0, pair with mbp__submit_leave() once the entry is in the ingress or
 * refused: shutdown waits for every admitted submitter to leave before it closes the ingress. */
int mbp__submit_enter(struct mbp_pipeline *p);
void mbp__submit_leave(struct mbp_pipeline *p);

/* Replica j of stage s (0: s itself). */
static inline struct mbp__stage *mbp__stage_replica(struct mbp__stage *s, unsigned j)
{
	return j ? &s->rep[j - 1] : s;
}

/* The CPU a stage runs on, as every report gives it: -1 when it is not pinned or its pin failed. */
static inline int mbp__stage_cpu(const struct mbp__stage *s)
{
	return mbp__crew_place(&s->p->crew, s->unit, false).cpu;
}

#endif
