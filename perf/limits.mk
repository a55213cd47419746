# perf limits: bench_limits, the machine's floors under RESULTS.md's ring round trip, pool get+put and
# hand-off rows with no mbpipe code in the loop (a cache-line ping-pong between CPUs 0 and 1, a thread-local
# LIFO array's get+put, a buffer written and read on one CPU with every line in its cache);
# perf/bench_limits.c, issue 22.
EXTRA_PROGRAMS += perf/bench_limits
PERF_BINS += perf/bench_limits
perf_bench_limits_SOURCES = perf/bench_limits.c perf/bench_util.h
perf_bench_limits_CFLAGS = $(AM_CFLAGS)
perf_bench_limits_LDADD = $(MBP_LIBS)
