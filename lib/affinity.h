/*
 * Where stage threads run: the CPUs this process may use, the placement plan, pinning with checked errors.
 */
#ifndef MBP__AFFINITY_H
#define MBP__AFFINITY_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>

#include <mbpipe.h>

#include "common.h"

/* Whole CPUs granted by the cgroup v2 quota of this process (cpu.max "quota period", rounded up), or 0 when
 * there is none or it cannot be read. */
unsigned mbp__cgroup_quota_cpus(void);

/* Tests: read the quota from `file` (cpu.max's format, "quota period" or "max period") instead of the
 * cgroup's own cpu.max; NULL: the cgroup's again. Set before the plans it should affect. */
void mbp__cgroup_cpu_max_set(const char *file);

/* Tests: every pin fails with `err` (a negative errno); 0: pins work again. */
void mbp__pin_fail_set(int err);

/* Whether this process may run on `cpu` (sched_getaffinity). */
bool mbp__cpu_allowed(int cpu);

/* Pin the calling thread to `cpu`. 0 or a negative errno. */
int mbp__pin_self(int cpu);

/*
 * The record of pinned CPUs, process-wide and thread-safe. mbp__placement_plan() claims the CPU of each
 * thread it pins; its owner gives each claim back once (mbp__cpu_release): when the thread stops, or at
 * once when its pin failed (the thread then runs unpinned on no claim).
 */
void mbp__cpu_release(int cpu);
/* Pin the calling thread to `cpu`, which its plan claimed: 0, or the pin's error, the claim then given
 * back (the thread runs unpinned, on no claim). */
int mbp__pin_claimed(int cpu);
/* Threads of this process holding a claim on `cpu` now. */
unsigned mbp__cpu_claims(int cpu);
/* What a thread pinned to `cpu` reports as `sharing` (pipeline.h): the other claims on it, plus the
 * other ranks of its node given it (node_sharers, from its plan). */
unsigned mbp__cpu_sharing(int cpu, unsigned node_sharers);

/* Under mbp_mpi: rank `me` of the n ranks of a node, all[r] the CPUs rank r's threads may use, is the
 * *k-th of the *m ranks given the same CPUs as its own (itself among them, in rank order), which split
 * them (below). */
void mbp__node_part(const cpu_set_t *all, unsigned n, unsigned me, unsigned *k, unsigned *m);
/* Under mbp_mpi, before start: the pipeline is the part of a pipeline across ranks that the k-th of m
 * ranks of its node with the same CPUs runs; it plans in its k-th part of them (pipeline.h, "Placement").
 * 0, -EINVAL (started, k >= m). */
int mbp__pipeline_node_share(mbp_pipeline *p, unsigned k, unsigned m);
/* Under mbp_mpi: the pool of mbp_mb_acquire() (NULL before start), to check a caller's buffer. */
mbp_pool *mbp__pipeline_mb_pool(mbp_pipeline *p);

/*
 * The placement plan: how many worker threads run S stages, which stages each runs (consecutive ones:
 * stage i on thread i * T / S), and the CPU of each thread, claimed in the record above. See "Threads and
 * stages" and "Placement" in pipeline.h.
 */
struct mbp__placement_req {
	unsigned nstages; /* S, 1 .. MBP_MAX_STAGES */
	unsigned threads; /* opts.threads: 0 = one per stage while they fit the CPUs, else one per CPU */
	bool pin;	  /* opts.pin: false = no thread is pinned (and named CPUs mean nothing) */
	const int *named; /* per stage: the CPU its descriptor names, or -1 */
	unsigned ncpus;	  /* opts.ncpus: entries in cpus; 0 = the CPUs this process may use */
	const int *cpus;  /* opts.cpus */
	unsigned node_k;  /* this part of a pipeline across MPI ranks is the node_k-th of node_m ranks of */
	unsigned node_m;  /* its node given the same CPUs: it plans in its part of them; 0: all of them */
	const uint16_t *thread_of; /* per stage its thread, 0 .. threads - 1 (a chunked training schedule's
				      placement; threads must be set); NULL: stage i on thread i * T / S */
};

struct mbp__placement_plan {
	unsigned nthreads;		    /* T */
	bool oversubscribed;		    /* more threads than CPUs to run them: waits must not spin */
	unsigned node_sharers;		    /* other ranks of this node given the same CPU (mbp_mpi) */
	unsigned thread_of[MBP_MAX_STAGES]; /* per stage */
	int thread_cpu[MBP_MAX_STAGES];	    /* per thread: the CPU to pin to (claimed), -1 = none */
	int cpu[MBP_MAX_STAGES];	    /* per stage: its thread's CPU */
	bool pin_required[MBP_MAX_STAGES];  /* the CPU was asked for (named, or opts.cpus): a failed pin fails
					       start instead of being reported */
};

/* Plan the placement and claim its CPUs (release each thread_cpu >= 0 once). 0, -EINVAL (stages of one
 * thread name different CPUs; nothing claimed), or the error of mbp_cpus_allowed(). */
int mbp__placement_plan(const struct mbp__placement_req *rq, struct mbp__placement_plan *pl);

#endif
