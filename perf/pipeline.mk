# perf pipeline: the engine against oneTBB's parallel_pipeline and a mutex+condvar pipeline
# (perf/bench_pipeline.c; figures in perf/results/pipeline.md). Needs the perf peers (oneTBB).
if HAVE_PERF_PEERS
EXTRA_PROGRAMS += perf/bench_pipeline
PERF_BINS += perf/bench_pipeline
perf_bench_pipeline_SOURCES = perf/bench_pipeline.c perf/bench_pipeline_tbb.cc perf/bench_pipeline.h
perf_bench_pipeline_CFLAGS = $(AM_CFLAGS)
perf_bench_pipeline_CXXFLAGS = $(AM_CXXFLAGS)
perf_bench_pipeline_LDADD = $(MBP_LIBS) -ltbb
endif
