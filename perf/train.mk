# perf train: the trainer's schedules on a synthetic workload with calibrated costs (perf/bench_train.c;
# figures in perf/results/train.md). Needs nothing beyond the library.
EXTRA_PROGRAMS += perf/bench_train
PERF_BINS += perf/bench_train
perf_bench_train_SOURCES = perf/bench_train.c perf/bench_syn.h perf/bench_util.h
perf_bench_train_CFLAGS = $(AM_CFLAGS)
perf_bench_train_LDADD = $(MBP_LIBS)

# the trainer's own cost of a step, empty operations (perf/bench_train_overhead.c; issue 25)
EXTRA_PROGRAMS += perf/bench_train_overhead
PERF_BINS += perf/bench_train_overhead
perf_bench_train_overhead_SOURCES = perf/bench_train_overhead.c perf/bench_syn.h perf/bench_util.h
perf_bench_train_overhead_CFLAGS = $(AM_CFLAGS)
perf_bench_train_overhead_LDADD = $(MBP_LIBS)
