/*
 * The clock of the tools and the benchmarks (the library's own is lib/clock.h, which they must not
 * include): CLOCK_MONOTONIC in nanoseconds (the scale of the engine's job stamps) or seconds, another
 * clock by id (a process's CPU time), and a timespec for the calls that take one. Header-only, libc only.
 */
#ifndef MBP_UTIL_CLOCK_H
#define MBP_UTIL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* Clock `id` in nanoseconds; 0 when it cannot be read. */
static inline uint64_t mbt_clock_ns(clockid_t id)
{
	struct timespec ts;
	if (clock_gettime(id, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t mbt_now_ns(void)
{
	return mbt_clock_ns(CLOCK_MONOTONIC);
}

/* CLOCK_MONOTONIC in seconds. */
static inline double mbt_now_s(void)
{
	return (double)mbt_now_ns() * 1e-9;
}

/* Nanoseconds (a CLOCK_MONOTONIC time, or a length) as a struct timespec. */
static inline struct timespec mbt_timespec(uint64_t ns)
{
	return (struct timespec){.tv_sec = (time_t)(ns / 1000000000u), .tv_nsec = (long)(ns % 1000000000u)};
}

#endif
