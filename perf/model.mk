# perf model: bench_mlp, an MLP as balanced pipeline stages against single- and multi-threaded OpenBLAS
# (perf/bench_mlp.c; figures in perf/results/model.md). Needs nothing beyond the library's dependencies.
EXTRA_PROGRAMS += perf/bench_mlp
PERF_BINS += perf/bench_mlp
perf_bench_mlp_SOURCES = perf/bench_mlp.c perf/bench_util.h perf/bench_blas.h
perf_bench_mlp_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
perf_bench_mlp_LDADD = $(MBP_LIBS)
