# perf pool: bench_pool, the pool's get+put against jemalloc and glibc, and LIFO vs FIFO vs malloc recycling
# in a two-stage hand-off (see perf/bench_pool.c; results in perf/results/pool.md).
EXTRA_PROGRAMS += perf/bench_pool
PERF_BINS += perf/bench_pool
perf_bench_pool_SOURCES = perf/bench_pool.c
perf_bench_pool_CFLAGS = $(AM_CFLAGS) $(JEMALLOC_CFLAGS)
perf_bench_pool_LDADD = $(MBP_LIBS) $(JEMALLOC_LIBS) -ldl
