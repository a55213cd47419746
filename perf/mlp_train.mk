# perf mlp_train: bench_mlp_train, the layer functions of training (F, B_in, B_w per layer), the
# sequential training step with one and with every OpenBLAS thread, and (--roofline) every sgemm of a
# step alone: the 2-core limit of a training step (perf/bench_mlp_train.c).
EXTRA_PROGRAMS += perf/bench_mlp_train
PERF_BINS += perf/bench_mlp_train
perf_bench_mlp_train_SOURCES = perf/bench_mlp_train.c perf/bench_util.h perf/bench_blas.h
perf_bench_mlp_train_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
perf_bench_mlp_train_LDADD = $(MBP_LIBS)
