/*
 * Where stage threads run: the CPUs this process may use, the placement plan, pinning with checked errors.
 */
#ifndef MBP__AFFINITY_H
#define MBP__AFFINITY_H

#include <pthread.h>

#include "common.h"

/* Whole CPUs granted by the cgroup v2 quota of this process (cpu.max "quota period", rounded up), or 0 when
 * there is none or it cannot be read. */
unsigned mbp__cgroup_quota_cpus(void);

/* Whether this process may run on `cpu` (sched_getaffinity). */
bool mbp__cpu_allowed(int cpu);

/* Pin the calling thread to `cpu`. 0 or a negative errno. */
int mbp__pin_self(int cpu);

#endif
