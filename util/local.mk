# util/: the header-only helpers shared across the tree, below lib/, tools/ and perf/ alike. Each header
# includes only libc, another util/ header or the public API (<mbpipe.h>, <mbpipe/mpi.h>, MPI for
# mpiutil.h), never lib/, tools/ or perf/: the library (number.h, plural.h), every tool and the benchmarks
# include them as "util/NAME.h" (the top of the source tree is on every include path).
#   number.h    strict number parsing (lib/opts.c and the tools' options)
#   parse.h     the tools' option errors: one error line (fail), an option's number with its message
#   plural.h    singular or plural by count in messages
#   clock.h     the tools' and benchmarks' clock (the library's own is lib/clock.h)
#   burn.h      calibrated busy work (pipebench's synthetic and training workloads, perf/bench_syn.h)
#   progress.h  the progress bar on standard error (pipebench, pipetrain)
#   blas.h      OpenBLAS's generic-kernel warning in every tool's words
#   digest.h    the note on a model file without digests, in every tool's words
#   mpirank.h   the tools under mpirun: a rank's stages and its part of a model file
#   mpiutil.h   MPI calls on libmbpipe-mpi's communication thread (the tools' MPI parts)
EXTRA_DIST += util/number.h util/parse.h util/plural.h util/clock.h util/burn.h util/progress.h util/blas.h util/digest.h \
	util/mpirank.h util/mpiutil.h

# The helpers on their own: the strict parser's edges (and the library reading numbers as the tools do),
# the option errors, the plural, the clock.
check_PROGRAMS += tests/test_util
tests_test_util_SOURCES = tests/test_util.c tests/check_main.h
tests_test_util_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS)
tests_test_util_LDADD = $(MBP_LIBS) $(CHECK_LIBS)
TESTS += tests/test_util
