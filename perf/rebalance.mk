# perf rebalance: bench_rebalance, 2 stages whose costs go from 1:1 to 1:3 mid-stream, rebalancing against
# a plan fixed at start and a fresh plan for the new costs (perf/bench_rebalance.c; issue 25's target);
# --case=replica: one layer going to 75 % of the work, a move that turns a replica on (active replicas).
EXTRA_PROGRAMS += perf/bench_rebalance
PERF_BINS += perf/bench_rebalance
perf_bench_rebalance_SOURCES = perf/bench_rebalance.c perf/bench_util.h
perf_bench_rebalance_CFLAGS = $(AM_CFLAGS)
perf_bench_rebalance_LDADD = $(MBP_LIBS)
