/*
 * Helpers shared by the benchmarks in perf/ (not part of the library); the clock and the busy work are
 * util/'s, as the tools'.
 */
#ifndef MBP_BENCH_UTIL_H
#define MBP_BENCH_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util/clock.h" /* mbt_now_ns, mbt_clock_ns: the tools' clock */

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
	memcpy(t, v, n * sizeof(*t));
	qsort(t, n, sizeof(*t), bench_cmp_double);
	return n % 2 ? t[n / 2] : (t[n / 2 - 1] + t[n / 2]) / 2;
}

#endif
