/*
 * The crew: the threads that run stages, for the pipeline (pipeline.c, worker.c) and the trainer (train.c)
 * alike. Not installed.
 *
 * One base object with the variants on top, as libuv's tcp and pipe handles both start from
 * uv__stream_init: the crew does what every engine's threads need, the same way for each, and a variant
 * gives its stages' own init and fini (the caller's, from their descriptors) and the thread's work.
 *
 *   plan     the placement plan (affinity.c: the thread count, stage i on thread i * T / S, each thread's
 *            CPU claimed in the process-wide record, under the cgroup quota) and the waits' budgets;
 *   start    the threads, each named mbp-<engine>-<first>[-<last>] (its stages), pinned (a failed pin
 *            gives its claim back and is reported, or fails the start where the CPU was asked for), with
 *            a pool cache of its own shared by its stages, then every stage's init in stage order: also
 *            after one failed, so that each init's success is known and its fini runs;
 *   handshake  start returns once every thread is inited: then all go (the variant's run), or, when an
 *            init or a required pin failed or a thread could not be created, none does, each runs the fini
 *            of every stage whose init succeeded, and start returns the first error;
 *   stop     join the threads (each ran its stages' fini, in reverse order, after its run returned) and
 *            give back the CPUs they held;
 *   report   where each stage runs, as mbp_pipeline_placement and mbp_trainer_stats_get both give it.
 *
 * The variant keeps what is its own: the pipeline its forward flow of jobs and micro-batches (worker.c),
 * the trainer its schedule-driven step, stash and update (train.c). Parking and waking go through wait.h:
 * the rings' and the ingress's waits, and for crews that work in rounds the barrier below.
 *
 *   operation                         | thread
 *   init, plan, start, stop, destroy  | the controlling thread
 *   place                             | any thread once started (the pin errors are written before the
 *                                     | handshake; sharing reads the record under its lock)
 *   barrier_wait                      | the crew's threads, inside run
 */
#ifndef MBP__CREW_H
#define MBP__CREW_H

#include <pthread.h>

#include <mbpipe.h>

#include "affinity.h"
#include "common.h"
#include "wait.h"

struct mbp__crew;

/* One thread of the crew: the stages first .. last (those of them whose thread_of is this thread: all of
 * them but under a chunked training schedule's placement). Written by the controller at plan and start, and by
 * the thread itself (pin_error, cache) before the handshake; read-only after it. */
struct mbp__crew_thread {
	struct mbp__crew *crew;
	unsigned idx;	      /* thread t of the crew */
	unsigned first, last; /* its stages */
	int cpu;	   /* the plan's CPU, claimed until stop (given back at once if the pin failed); -1 */
	bool pin_required; /* the CPU was asked for: a failed pin fails the start instead */
	int pin_error;	   /* 0, or the pin's error (the thread then runs unpinned, on no claim) */
	mbp_pool_cache *cache; /* the thread's, shared by its stages (NULL when the crew has no pool) */
	pthread_t tid;
	bool started;
};

/* The thread's work, once every thread is inited (`arg` is the crew's); returns when it is to stop. */
typedef void (*mbp__crew_run_fn)(void *arg, struct mbp__crew_thread *th);

/* A stage's own set-up and tear-down, the caller's (mbp_stage_desc, mbp_train_stage_desc): init(ctx,
 * stage) on its thread after the pin and the cache, 0 or a negative errno (a positive value counts as
 * -EPROTO); fini(ctx) on the same thread, once, where init succeeded. Either may be NULL. */
struct mbp__crew_stage {
	int (*init)(void *ctx, unsigned stage);
	void (*fini)(void *ctx);
	void *ctx;
};

struct mbp__crew {
	const char *engine; /* in the threads' names: "pipe", "train" (mbp-train-62-63 is 15 characters) */
	mbp__crew_run_fn run;
	void *arg;
	struct mbp__crew_stage stage[MBP_MAX_STAGES]; /* set by the variant before start */
	mbp_pool *pool; /* each thread's cache comes from it (set before start); NULL: none */
	unsigned nstages, nthreads;
	unsigned node_sharers;		    /* other ranks of this node given the same CPUs (mbp_mpi) */
	bool planned;			    /* plan succeeded: the CPUs below were claimed */
	bool claimed;			    /* ... and not given back yet (controlling thread only) */
	struct mbp__wait_opts wopts;	    /* the budgets of the threads' waits, from the plan */
	unsigned thread_of[MBP_MAX_STAGES]; /* per stage */
	/* A pipeline with replicas plans units, one thread each: unit u is replica unit_replica[u] of stage
	 * unit_stage[u], and its init receives that stage's index (mbp_stage_replica() says which replica).
	 * NULL (every other crew): the unit is the stage, replica 0. Set by the variant before plan. */
	const unsigned *unit_stage, *unit_replica;
	bool init_ok[MBP_MAX_STAGES]; /* per stage: its init ran and succeeded (its thread's) */
	MBP_CACHELINE_ALIGNED struct mbp__crew_thread th[MBP_MAX_STAGES];

	/* the start handshake, under lock */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned arrived;    /* threads done with their init */
	int start_err;	     /* the error of the first stage whose init or required pin failed */
	unsigned err_thread; /* its thread */
	int go;		     /* 0 until decided; 1: run, -1: abort */
};

/* An idle crew of no threads for the engine named `engine` (a static string), its threads running
 * run(arg, thread). Pair with mbp__crew_destroy(). */
void mbp__crew_init(struct mbp__crew *c, const char *engine, mbp__crew_run_fn run, void *arg);
/* Stop (if started) and free what init made. */
void mbp__crew_destroy(struct mbp__crew *c);

/*
 * Plan the threads of rq->nstages stages (affinity.c, mbp__placement_plan) and the waits' budgets from
 * the public options' spin_ns and yield_ns (0: the default, MBP_SPIN_NONE: none; no spin either where the
 * plan's threads outnumber its CPUs). Claims the plan's CPUs: stop gives them back. Once only.
 * @return 0, or the plan's error: -EINVAL when stages of one thread name different CPUs (thread_of is
 *         filled all the same, so the caller can say which), the error of mbp_cpus_allowed().
 */
int mbp__crew_plan(struct mbp__crew *c, const struct mbp__placement_req *rq, uint64_t spin_ns,
		   uint64_t yield_ns);

/*
 * Start the planned threads and hold the handshake (above). On 0 every thread runs `run`; on an error
 * the crew is stopped already (joined, its CPUs given back).
 * @return 0, the error of the first stage (in stage order) whose init or required pin failed, or the
 *         error of pthread_create().
 */
int mbp__crew_start(struct mbp__crew *c);

/* Join the threads (their run must be returning: the variant told them) and give back the CPUs the plan
 * claimed, except where a pin failed. Idempotent; also for a crew that was planned but never started. */
void mbp__crew_stop(struct mbp__crew *c);

/* Where stage `stage` runs, as every report gives it: its thread; its CPU (-1 when unpinned or the pin
 * failed; known once planned); the pin's error; and, where the caller knows that the crew still holds its
 * CPUs (`holding`: started and not stopping, as its own state says), the other threads and ranks on that
 * CPU (else 0). */
mbp_placement mbp__crew_place(const struct mbp__crew *c, unsigned stage, bool holding);

/* The thread of stage `stage`. */
static inline const struct mbp__crew_thread *mbp__crew_thread_of(const struct mbp__crew *c, unsigned stage)
{
	return &c->th[c->thread_of[stage]];
}

/*
 * A reusable barrier of the crew's threads: each waits until all nthreads have arrived; the last to arrive
 * runs last(arg) (if not NULL) before any leaves. What a thread wrote before it arrived is visible to every
 * thread after. Waits on wait.h's generation word with the crew's spin (wopts.spin_ns; none where the
 * threads outnumber the CPUs) before it parks (mbp__gen_wait_spin): the threads of a crew that works in
 * rounds arrive within a short while of each other, and a parked thread's wake costs the step a syscall
 * and the wait for its CPU (the trainer's two barriers a step: perf/bench_train_overhead).
 */
struct mbp__crew_barrier {
	_Atomic uint32_t count;
	_Atomic uint32_t gen;
};

void mbp__crew_barrier_wait(const struct mbp__crew *c, struct mbp__crew_barrier *b, void (*last)(void *),
			    void *arg);

#endif
