/*
 * Helpers shared by the benchmarks in perf/ (not part of the library); the clock and the busy work are
 * util/'s, as the tools'.
 */
#ifndef MBP_BENCH_UTIL_H
#define MBP_BENCH_UTIL_H

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <errno.h>

#include "util/clock.h" /* mbt_now_ns, mbt_clock_ns: the tools' clock */
#include "util/parse.h" /* the tools' option parsers and their one-line errors */

#define BENCH_MEDIAN_MAX 1024

static inline int bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Median of v[0..n) (at most BENCH_MEDIAN_MAX values are looked at); v is left as it is. */
static inline double bench_median(const double *v, unsigned n)
{
	double t[BENCH_MEDIAN_MAX];
	if (n > BENCH_MEDIAN_MAX)
		n = BENCH_MEDIAN_MAX;
	if (n == 0)
		return 0;
	for (unsigned i = 0; i < n; i++) /* not memcpy: GCC 12 -O2 warns it past a caller's shorter array */
		t[i] = v[i];
	qsort(t, n, sizeof(*t), bench_cmp_double);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

/* Busy time of all CPUs (user, nice, system, irq, softirq, steal) from /proc/stat, in seconds; 0 when it
 * cannot be read. Less this process's CPU time over a window: what other processes kept busy. */
static inline double bench_sys_busy_s(void)
{
	unsigned long long v[8] = {0};
	FILE *f = fopen("/proc/stat", "r");
	if (!f)
		return 0;
	int n =
	    fscanf(f, "cpu %llu %llu %llu %*u %*u %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]);
	fclose(f);
	if (n != 6)
		return 0;
	return (double)(v[0] + v[1] + v[2] + v[3] + v[4] + v[5]) / (double)sysconf(_SC_CLK_TCK);
}

/* The CPU other processes took over a window: bench_others_start() before, bench_others_cpus() after
 * (CPUs: the busy time of all CPUs less this process's own, over the wall time; 0 when none). */
typedef struct bench_others {
	double busy, self, wall;
} bench_others;

static inline double bench_clock_s(clockid_t id)
{
	return (double)mbt_clock_ns(id) * 1e-9;
}

static inline bench_others bench_others_start(void)
{
	return (bench_others){bench_sys_busy_s(), bench_clock_s(CLOCK_PROCESS_CPUTIME_ID),
			      bench_clock_s(CLOCK_MONOTONIC)};
}

static inline double bench_others_cpus(bench_others o)
{
	double wall = bench_clock_s(CLOCK_MONOTONIC) - o.wall;
	double oth = (bench_sys_busy_s() - o.busy) - (bench_clock_s(CLOCK_PROCESS_CPUTIME_ID) - o.self);
	return wall > 0 && oth > 0 ? oth / wall : 0;
}

/* The 1, 5 and 15 minute load averages (-1 each when /proc/loadavg cannot be read). */
static inline void bench_loadavg(double load[3])
{
	load[0] = load[1] = load[2] = -1;
	FILE *f = fopen("/proc/loadavg", "r");
	if (!f)
		return;
	if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3)
		load[0] = load[1] = load[2] = -1;
	fclose(f);
}

/* Sum of the bytes of a buffer, 8 at a time: 16-bit lanes, folded before they can overflow (bench_pool's
 * stage 2 reads its payloads with it, bench_limits its floor of that read). */
static inline uint64_t bench_byte_sum(const void *buf, size_t n)
{
	const uint64_t *w = buf;
	const uint64_t m = 0x00ff00ff00ff00ffull;
	uint64_t total = 0;
	for (size_t i = 0; i < n / 8;) {
		uint64_t acc = 0;
		for (size_t end = i + 128 < n / 8 ? i + 128 : n / 8; i < end; i++)
			acc += (w[i] & m) + ((w[i] >> 8) & m); /* each lane at most 2 * 255 * 128 */
		total += (acc & 0xffff) + ((acc >> 16) & 0xffff) + ((acc >> 32) & 0xffff) + (acc >> 48);
	}
	return total;
}

/* Pins the calling thread to one CPU; false when it cannot. */
static inline bool bench_pin(int cpu)
{
	cpu_set_t one;
	CPU_ZERO(&one);
	CPU_SET(cpu, &one);
	return pthread_setaffinity_np(pthread_self(), sizeof(one), &one) == 0;
}

/*
 * An option's value, parsed strictly (no sign, space or suffix) and in [lo, hi]; anything else ends the
 * benchmark at once: one line naming the option and the range, exit 2, as the tools do.
 */
static inline uint64_t bench_opt_u64(const char *opt, const char *s, uint64_t lo, uint64_t hi)
{
	uint64_t v = 0; /* (set on success; gcc cannot see that through the parser) */
	char err[256];
	if (parse_u64_opt(opt, s ? s : "", "a whole number", lo, hi, &v, err, sizeof err) == 0)
		return v;
	fprintf(stderr, "%s: %s\n", program_invocation_short_name, err);
	exit(2);
}

static inline double bench_opt_double(const char *opt, const char *s, double lo, double hi)
{
	double v = 0;
	char err[256];
	if (parse_double_opt(opt, s ? s : "", "a number", lo, hi, &v, err, sizeof err) == 0)
		return v;
	fprintf(stderr, "%s: %s\n", program_invocation_short_name, err);
	exit(2);
}

#endif
