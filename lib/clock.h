/*
 * Internal: every clock of the library, in one place. mbp__now_ns is CLOCK_MONOTONIC (deadlines, a job's
 * submit and done times); mbp__clock_ns is the engine's accounting clock on the same scale, read through
 * the TSC where the kernel keeps time with it (lib/clock.c says why and how it is calibrated); a deadline
 * and a timespec are made from them here. Included by lib/common.h. Not installed.
 */
#ifndef MBP__CLOCK_H
#define MBP__CLOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <time.h>

/* Monotonic time in nanoseconds (vDSO, about 20 ns). */
static inline uint64_t mbp__now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* The engine's accounting clock (lib/clock.c): nanoseconds on CLOCK_MONOTONIC's scale, read through the
 * TSC where the kernel keeps time with it. Differences only; mbp__clock_init() before the first use. */
struct mbp__tsc {
	uint64_t base_tsc, base_ns;
	uint64_t mult; /* nanoseconds per tick, 32.32 fixed point */
	bool ok;
};
extern struct mbp__tsc mbp__tsc;
void mbp__clock_init(void);

static inline uint64_t mbp__clock_ns(void)
{
#if defined(__x86_64__)
	if (__builtin_expect(mbp__tsc.ok, 1)) {
		uint64_t c = __builtin_ia32_rdtsc();
		uint64_t d = c > mbp__tsc.base_tsc ? c - mbp__tsc.base_tsc : 0;
		return mbp__tsc.base_ns + (uint64_t)(((unsigned __int128)d * mbp__tsc.mult) >> 32);
	}
#endif
	return mbp__now_ns();
}

/* A relative timeout (negative: forever, 0: do not wait) as an absolute deadline; UINT64_MAX is forever. */
static inline uint64_t mbp__deadline(int64_t timeout_ns)
{
	if (timeout_ns < 0)
		return UINT64_MAX;
	return mbp__now_ns() + (uint64_t)timeout_ns;
}

/* Nanoseconds (a CLOCK_MONOTONIC time, or a length) as a struct timespec, for the calls that take one. */
static inline struct timespec mbp__timespec(uint64_t ns)
{
	return (struct timespec){.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
}

#endif
