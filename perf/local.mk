# Benchmarks against peer libraries (not tests). `make perf` builds them; each prints a grep-able summary
# line. Each fragment adds its programs to EXTRA_PROGRAMS (built on demand) and to PERF_BINS.
EXTRA_PROGRAMS =
PERF_BINS =
include perf/ring.mk
include perf/pool.mk
include perf/pipeline.mk
include perf/model.mk
include perf/replicas.mk
include perf/roofline.mk
include perf/train.mk
include perf/mpi.mk
include perf/mlp_train.mk
include perf/planner.mk
include perf/rebalance.mk
include perf/limits.mk
EXTRA_DIST += perf/bench_util.h perf/pipeserve_load.sh perf/pipebench_repeat.sh perf/pipetrain_run.sh \
	perf/train_vs_torch.sh perf/pipetrain_torch.py perf/train_profile.py perf/ab.sh perf/others.sh perf/train_replicas.sh perf/train_rebalance.sh \
	perf/RESULTS.md perf/results
perf: $(PERF_BINS)
.PHONY: perf
