/*
 * Allowed CPUs, the placement plan, the record of pinned CPUs, pinning.
 *
 * A process may run on fewer CPUs than the machine has (taskset, a container's cpuset) and, under a cgroup
 * CPU quota, on fewer than its cpuset too. Threads go to allowed CPUs, never to "CPU i": on a machine
 * where this process may use CPUs 4-7, CPU 0 would fail or steal another tenant's core. Which allowed
 * CPU: the one fewest threads of this process are pinned to (a process-wide record, claimed by every
 * plan and released by its owner), the first in order among equals; so the first pipeline takes the first
 * CPUs, a second pipeline or a trainer beside it the next ones, and only when every CPU is taken do
 * threads share one (the least claimed), as pipeline.h says. The part of a pipeline across MPI ranks
 * that a rank runs plans in its share of the CPUs that its node's ranks were given alike (node_k of
 * node_m), so that the ranks' threads do not meet either.
 */
#include "config.h"

#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mbpipe.h>

#include "affinity.h"

/* Tests' stand-ins (affinity.h), set before the threads they affect start. */
static const char *_Atomic cpu_max_file; /* read instead of the cgroup's cpu.max */
static _Atomic int pin_fail;		 /* every pin fails with this */

/* relaxed, the three of them: a test's setting, made before the plans and threads it affects start
 * (pthread_create orders it) */
void mbp__cgroup_cpu_max_set(const char *file)
{
	atomic_store_explicit(&cpu_max_file, file, memory_order_relaxed);
}

void mbp__pin_fail_set(int err)
{
	/* relaxed: as above */
	atomic_store_explicit(&pin_fail, err, memory_order_relaxed);
}

unsigned mbp__cgroup_quota_cpus(void)
{
	const char *fake = atomic_load_explicit(&cpu_max_file, memory_order_relaxed); /* relaxed: as above */
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
	f = fopen(fake ? fake : file, "r");
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
	/* relaxed: a test's setting, made before the threads that pin start */
	int fail = atomic_load_explicit(&pin_fail, memory_order_relaxed);
	if (fail)
		return fail;
	return -pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

/* ---- the record of pinned CPUs ---- */

/*
 * Every CPU a plan gives a thread is claimed here until its owner releases it (mbp__cpu_release: at stop,
 * at destroy, or at once when the pin failed), so that a second pipeline, or a trainer beside a pipeline,
 * takes the CPUs nobody has yet instead of the first ones again. One mutex: plans, releases and placement
 * reports are rare.
 */
static struct {
	pthread_mutex_t lock;
	uint32_t claims[CPU_SETSIZE]; /* threads of this process placed on each CPU, not yet released */
} rec = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void claim_locked(int cpu)
{
	if (cpu >= 0 && cpu < CPU_SETSIZE)
		rec.claims[cpu]++;
}

void mbp__cpu_release(int cpu)
{
	if (cpu < 0 || cpu >= CPU_SETSIZE)
		return;
	pthread_mutex_lock(&rec.lock);
	MBP_VERIFY(rec.claims[cpu] > 0); /* a release without its claim */
	rec.claims[cpu]--;
	pthread_mutex_unlock(&rec.lock);
}

int mbp__pin_claimed(int cpu)
{
	int err = mbp__pin_self(cpu);
	if (err)
		mbp__cpu_release(cpu); /* unpinned: it takes no CPU from the next plan */
	return err;
}

unsigned mbp__cpu_claims(int cpu)
{
	if (cpu < 0 || cpu >= CPU_SETSIZE)
		return 0;
	pthread_mutex_lock(&rec.lock);
	unsigned n = rec.claims[cpu];
	pthread_mutex_unlock(&rec.lock);
	return n;
}

unsigned mbp__cpu_sharing(int cpu, unsigned node_sharers)
{
	unsigned c = mbp__cpu_claims(cpu);
	/* the asking thread's own claim is one of them, unless a stop is giving it back just now */
	return (c ? c - 1 : 0) + node_sharers;
}

void mbp__node_part(const cpu_set_t *all, unsigned n, unsigned me, unsigned *k, unsigned *m)
{
	*k = 0;
	*m = 0;
	for (unsigned r = 0; r < n; r++)
		if (CPU_EQUAL(&all[r], &all[me])) {
			++*m;
			*k += r < me;
		}
}

/* The k-th of m ranks' part of the n allowed CPUs, as list positions [*first, *first + *count), and how
 * many other ranks were given the same CPUs: with at least as many CPUs as ranks, disjoint blocks; with
 * fewer, consecutive ranks share one CPU (rank j on position j * n / m). */
static void node_slice(unsigned k, unsigned m, unsigned n, unsigned *first, unsigned *count, unsigned *others)
{
	*first = 0;
	*count = n;
	*others = 0;
	if (m <= 1 || k >= m || n == 0)
		return;
	*first = (unsigned)((uint64_t)k * n / m);
	if (n >= m) {
		*count = (unsigned)((uint64_t)(k + 1) * n / m) - *first;
		return;
	}
	*count = 1;
	for (unsigned j = 0; j < m; j++)
		*others += j != k && (unsigned)((uint64_t)j * n / m) == *first;
}

/* Choose `d` CPUs of list[0 .. n) for the threads placed by default, each the least claimed so far (this
 * plan's own choices counted), the first in list order among equals; claim them and write them to `out`
 * in list order, so that consecutive threads that must share a CPU share it (blocks, not round robin:
 * half their hops stay on one core). Under lock. */
static void pick_least_claimed_locked(const int *list, unsigned n, unsigned d, int *out)
{
	uint32_t picked[MBP_MAX_CPUS] = {0};
	for (unsigned k = 0; k < d; k++) {
		unsigned best = 0;
		uint64_t best_load = UINT64_MAX;
		for (unsigned i = 0; i < n; i++) {
			uint64_t load = (uint64_t)rec.claims[list[i]] + picked[i];
			if (load < best_load) {
				best = i;
				best_load = load;
			}
		}
		picked[best]++;
		claim_locked(list[best]);
	}
	unsigned k = 0;
	for (unsigned i = 0; i < n; i++)
		for (uint32_t j = 0; j < picked[i]; j++)
			out[k++] = list[i];
}

int mbp__placement_plan(const struct mbp__placement_req *rq, struct mbp__placement_plan *pl)
{
	int allowed[MBP_MAX_CPUS];
	unsigned quota = 0;
	int n = mbp_cpus_allowed(allowed, MBP_MAX_CPUS, &quota);
	if (n < 0)
		return n;
	unsigned nallowed = (unsigned)(n < MBP_MAX_CPUS ? n : MBP_MAX_CPUS);
	unsigned first, nshare, others;
	node_slice(rq->node_k, rq->node_m, nallowed, &first, &nshare, &others);
	if (quota && rq->node_m > 1)
		quota = (quota + rq->node_m - 1) / rq->node_m; /* the node's ranks share the quota too */
	unsigned navail = nshare;
	if (quota && quota < navail)
		navail = quota; /* a quota of q CPUs: more than q busy threads only share them */
	const int *list = rq->ncpus ? rq->cpus : allowed + first;
	unsigned nlist = rq->ncpus ? rq->ncpus : nshare;
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
	/* Threads of this plan outnumber its CPUs, or this rank's CPUs are other ranks' too (they run the
	 * stages before and after its own): a wait that spins takes the slice its peer needs. A rank of a
	 * run across ranks (node_m set) has one busy thread more than its plan's, the communication thread,
	 * which makes the MPI copies: a stage thread that spins between micro-batches takes its CPU. That
	 * thread is not pinned: it runs on any of the rank's CPUs, so it shares the plan's only where the
	 * plan takes them all; where opts.cpus lists fewer, it runs on another and the stages still spin. */
	unsigned comm = rq->node_m && distinct >= navail ? 1 : 0;
	pl->oversubscribed = T + comm > distinct || (rq->pin && others > 0);
	pl->node_sharers = rq->pin ? others : 0;

	for (unsigned i = 0; i < S; i++)
		pl->thread_of[i] = rq->thread_of ? rq->thread_of[i] : (unsigned)((uint64_t)i * T / S);
	/* Each thread's CPU: one its stages name (they must agree), else from opts.cpus (thread t on the
	 * t-th; with more threads than CPUs, consecutive threads share a CPU), else by default. */
	bool by_default[MBP_MAX_STAGES] = {false};
	unsigned ndefault = 0;
	int rc = 0;
	for (unsigned t = 0; t < T; t++) {
		int cpu = -1;
		bool required = false;
		if (rq->pin) {
			for (unsigned j = 0; j < S; j++) {
				if (pl->thread_of[j] != t)
					continue;
				int c = rq->named[j];
				if (c < 0)
					continue;
				if (required && c != cpu)
					rc = -EINVAL;
				cpu = c;
				required = true;
			}
			if (!required && rq->ncpus) {
				cpu = list[T <= nlist ? t : (unsigned)((uint64_t)t * nlist / T)];
				required = true;
			} else if (!required && nlist) {
				by_default[t] = true;
				ndefault++;
			}
		}
		pl->thread_cpu[t] = cpu;
		for (unsigned j = 0; j < S; j++)
			if (pl->thread_of[j] == t)
				pl->pin_required[j] = required;
	}
	if (rc == 0) {
		pthread_mutex_lock(&rec.lock);
		/* The CPUs asked for are claimed first, so that the default ones keep off them. */
		for (unsigned t = 0; t < T; t++)
			claim_locked(pl->thread_cpu[t]);
		int picks[MBP_MAX_STAGES];
		pick_least_claimed_locked(list, nlist, ndefault, picks);
		for (unsigned t = 0, k = 0; t < T; t++)
			if (by_default[t])
				pl->thread_cpu[t] = picks[k++];
		for (unsigned i = 0; i < S; i++)
			pl->cpu[i] = pl->thread_cpu[pl->thread_of[i]];
		pthread_mutex_unlock(&rec.lock);
	}
	return rc;
}
