/*
 * Where stage threads run: the CPUs this process may use, the placement plan, pinning with checked errors.
 */
#ifndef MBP__AFFINITY_H
#define MBP__AFFINITY_H

#include <pthread.h>
#include <stdbool.h>

#include <mbpipe.h>

#include "common.h"

/* Whole CPUs granted by the cgroup v2 quota of this process (cpu.max "quota period", rounded up), or 0 when
 * there is none or it cannot be read. */
unsigned mbp__cgroup_quota_cpus(void);

/* Whether this process may run on `cpu` (sched_getaffinity). */
bool mbp__cpu_allowed(int cpu);

/* Pin the calling thread to `cpu`. 0 or a negative errno. */
int mbp__pin_self(int cpu);

/*
 * The placement plan: how many worker threads run S stages, which stages each runs (consecutive ones:
 * stage i on thread i * T / S), and the CPU of each thread. See "Threads and stages" in pipeline.h.
 */
struct mbp__placement_req {
	unsigned nstages; /* S, 1 .. MBP_MAX_STAGES */
	unsigned threads; /* opts.threads: 0 = one per stage while they fit the CPUs, else one per CPU */
	bool pin;	  /* opts.pin: false = no thread is pinned (and named CPUs mean nothing) */
	const int *named; /* per stage: the CPU its descriptor names, or -1 */
	unsigned ncpus;	  /* opts.ncpus: entries in cpus; 0 = the CPUs this process may use */
	const int *cpus;  /* opts.cpus */
};

struct mbp__placement_plan {
	unsigned nthreads;		    /* T */
	bool oversubscribed;		    /* more threads than CPUs to run them: waits must not spin */
	unsigned thread_of[MBP_MAX_STAGES]; /* per stage */
	int cpu[MBP_MAX_STAGES];	    /* per stage (its thread's): the CPU to pin to, -1 = none */
	bool pin_required[MBP_MAX_STAGES];  /* the CPU was asked for (named, or opts.cpus): a failed pin fails
					       start instead of being reported */
};

/* Plan the placement. 0, -EINVAL (stages of one thread name different CPUs), or the error of
 * mbp_cpus_allowed(). */
int mbp__placement_plan(const struct mbp__placement_req *rq, struct mbp__placement_plan *pl);

#endif
