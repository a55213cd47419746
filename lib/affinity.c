/*
 * Allowed CPUs and pinning.
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
