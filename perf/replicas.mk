# perf replicas: bench_replicas, issue 25's targets for replicated stages: a model with one layer of 70 %
# of the work, the replicated plan against the best unreplicated one, outputs bit for bit; the ordered
# merge's cost with replicas of 1 (perf/bench_replicas.c; `make perf-replicas` builds it and proves it runs
# at a small size: the figures come from a quiet machine).
EXTRA_PROGRAMS += perf/bench_replicas
PERF_BINS += perf/bench_replicas
perf_bench_replicas_SOURCES = perf/bench_replicas.c perf/bench_util.h
perf_bench_replicas_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS)
perf_bench_replicas_LDADD = $(MBP_LIBS)
perf-replicas: perf/bench_replicas
	./perf/bench_replicas -q
.PHONY: perf-replicas
