# perf roofline: bench_roofline, one core's and two cores' GFLOP/s of OpenBLAS at the inference stream's
# shapes (or any layer product's) and one core's FMA peak (perf/bench_roofline.c), and perf/mlp_profile.sh,
# where a bench_mlp peer's time goes; figures in perf/results/model.md. Needs nothing beyond the library's
# dependencies (the profile needs perf).
EXTRA_PROGRAMS += perf/bench_roofline
PERF_BINS += perf/bench_roofline
perf_bench_roofline_SOURCES = perf/bench_roofline.c perf/bench_util.h perf/bench_blas.h
perf_bench_roofline_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
perf_bench_roofline_LDADD = $(MBP_LIBS)
EXTRA_DIST += perf/mlp_profile.sh
