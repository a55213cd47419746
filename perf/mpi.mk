# perf mpi: bench_mpi, the pipeline across MPI ranks against raw MPI (osu_bw-style) and one process
# (perf/bench_mpi.c; figures in perf/results/mpi.md). Built when configure found MPI; run under mpirun.
if HAVE_MPI
EXTRA_PROGRAMS += perf/bench_mpi
PERF_BINS += perf/bench_mpi
perf_bench_mpi_SOURCES = perf/bench_mpi.c
perf_bench_mpi_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
perf_bench_mpi_LDADD = $(MBP_MPI_LIBS)
# bench_mpi_train: training across 2 ranks against one process of 2 stages, every schedule (the chunked ones
# with 2 chunks a rank; figures in perf/results/mpi.md).
EXTRA_PROGRAMS += perf/bench_mpi_train
PERF_BINS += perf/bench_mpi_train
perf_bench_mpi_train_SOURCES = perf/bench_mpi_train.c perf/bench_syn.h perf/bench_util.h
perf_bench_mpi_train_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
perf_bench_mpi_train_LDADD = $(MBP_MPI_LIBS)
endif
