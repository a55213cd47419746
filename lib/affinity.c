/*
 * Allowed CPUs, the placement plan, pinning.
 *
 * A process may run on fewer CPUs than the machine has (taskset, a container's cpuset) and, under a cgroup
 * CPU quota, on fewer than its cpuset too. Stage i goes to the i-th allowed CPU, never to "CPU i": on a
 * machine where this process may use CPUs 4-7, CPU 0 would fail or steal another tenant's core.
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

#include <mbpipe.h>

#include "affinity.h"

unsigned mbp__cgroup_quota_cpus(void)
{
	/* cgroup v2 unified hierarchy: the process's own cgroup is named in /proc/self/cgroup as "0::/path" */
	char path[512] = "/sys/fs/cgroup";
	FILE *f = fopen("/proc/self/cgroup", "r");
	if (f) {
		char line[400];
		while (fgets(line, sizeof(line), f)) {
			if (strncmp(line, "0::", 3) == 0) {
				line[strcspn(line, "\n")] = 0;
				if (strcmp(line + 3, "/") != 0)
					snprintf(path, sizeof(path), "/sys/fs/cgroup%s", line + 3);
				break;
			}
		}
		fclose(f);
	}
	char file[600];
	snprintf(file, sizeof(file), "%s/cpu.max", path);
	f = fopen(file, "r");
	if (!f)
		return 0;
	char quota[32] = "";
	unsigned long period = 0;
	int n = fscanf(f, "%31s %lu", quota, &period);
	fclose(f);
	if (n != 2 || strcmp(quota, "max") == 0 || period == 0)
		return 0;
	unsigned long q = strtoul(quota, NULL, 10);
	return (unsigned)((q + period - 1) / period);
}

int mbp_cpus_allowed(int *cpus, unsigned max, unsigned *quota_cpus)
{
	if (!cpus && max)
		return -EINVAL;
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return -errno;
	unsigned n = 0;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, &set))
			continue;
		if (n < max)
			cpus[n] = c;
		n++;
	}
	if (quota_cpus)
		*quota_cpus = mbp__cgroup_quota_cpus();
	return (int)n;
}

bool mbp__cpu_allowed(int cpu)
{
	if (cpu < 0 || cpu >= CPU_SETSIZE)
		return false;
	cpu_set_t set;
	CPU_ZERO(&set);
	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return true; /* cannot tell: let pinning report it */
	return CPU_ISSET(cpu, &set);
}

int mbp__pin_self(int cpu)
{
	if (cpu < 0 || cpu >= CPU_SETSIZE)
		return -EINVAL;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return -pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

int mbp__placement_plan(const struct mbp__placement_req *rq, struct mbp__placement_plan *pl)
{
	int allowed[MBP_MAX_CPUS];
	unsigned quota = 0;
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, &quota);
	if (n < 0)
		return n;
	unsigned navail = (unsigned)(n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS);
	if (quota && quota < navail)
		navail = quota; /* a quota of q CPUs: more than q busy threads only share them */
	const int *list = rq->ncpus ? rq->cpus : allowed;
	unsigned nlist = rq->ncpus ? rq->ncpus : (unsigned)(n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS);
	unsigned distinct = rq->ncpus ? rq->ncpus : navail;
	if (distinct > navail)
		distinct = navail;
	if (distinct == 0)
		distinct = 1;

	const unsigned S = rq->nstages;
	bool named = false;
	for (unsigned i = 0; i < S; i++)
		named |= rq->pin && rq->named[i] >= 0; /* unpinned, a named CPU means nothing */
	/* Threads: as asked; by default one per stage while they fit the CPUs (or where the caller placed
	 * stages itself), else one per CPU running consecutive stages (see "Threads and stages" in
	 * pipeline.h). */
	unsigned T = rq->threads ? rq->threads : named || S <= distinct ? S : distinct;
	if (T > S)
		T = S;
	pl->nthreads = T;
	pl->oversubscribed = T > distinct;

	for (unsigned i = 0; i < S; i++)
		pl->thread_of[i] = (unsigned)((uint64_t)i * T / S);
	for (unsigned i = 0; i < S;) {
		const unsigned t = pl->thread_of[i];
		unsigned last = i;
		while (last + 1 < S && pl->thread_of[last + 1] == t)
			last++;
		int cpu = -1;
		bool required = false;
		if (rq->pin) {
			/* A CPU named by a stage of this thread; they must agree. */
			for (unsigned j = i; j <= last; j++) {
				int c = rq->named[j];
				if (c < 0)
					continue;
				if (required && c != cpu)
					return -EINVAL;
				cpu = c;
				required = true;
			}
			if (!required && nlist) {
				/* Thread t on the t-th CPU; with more threads than CPUs, consecutive threads share
				 * a CPU (blocks, not round robin), so that half their hops stay on one core. */
				cpu = list[T <= nlist ? t : (unsigned)((uint64_t)t * nlist / T)];
				required = rq->ncpus != 0;
			}
		}
		for (unsigned j = i; j <= last; j++) {
			pl->cpu[j] = cpu;
			pl->pin_required[j] = required;
		}
		i = last + 1;
	}
	return 0;
}
