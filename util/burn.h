/*
 * Calibrated busy work for synthetic workloads: a dependent chain of multiply-adds that the compiler may
 * neither shorten nor remove, so a stage does a fixed amount of computation, not a fixed amount of wall
 * time (a stage that shares its CPU takes longer, as real work would). Header-only; shared by pipebench's
 * synthetic and training workloads and the trainer's benchmarks (perf/bench_syn.h).
 *
 *   double per_us = burn_calibrate();       steps per microsecond on this machine
 *   x = burn((uint64_t)(us * per_us), x);   about `us` microseconds of work
 */
#ifndef MBP_UTIL_BURN_H
#define MBP_UTIL_BURN_H

#include <stdint.h>

#include "clock.h"

static inline uint64_t burn(uint64_t n, uint64_t x)
{
	for (uint64_t i = 0; i < n; i++) {
		x = x * UINT64_C(6364136223846793005) + UINT64_C(1442695040888963407);
		__asm__ volatile("" : "+r"(x));
	}
	return x;
}

/* Steps per microsecond: the fastest of 15 timed runs, so a preempted run does not count. */
static inline double burn_calibrate(void)
{
	const uint64_t n = 200000;
	uint64_t best = UINT64_MAX, x = 1;
	for (int i = 0; i < 15; i++) {
		uint64_t a = mbt_now_ns();
		x = burn(n, x);
		uint64_t dt = mbt_now_ns() - a;
		if (dt < best)
			best = dt;
	}
	if (best == 0)
		best = 1;
	return (double)n * 1000.0 / (double)best + (double)(x & 0); /* x keeps the runs alive */
}

#endif
