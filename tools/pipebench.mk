# pipebench: the throughput tool, built on the public API only (no -I lib here: it must not see lib/).
bin_PROGRAMS += tools/pipebench/pipebench
tools_pipebench_pipebench_SOURCES = \
	tools/pipebench/pipebench.h tools/pipebench/main.c tools/pipebench/options.c \
	tools/pipebench/synthetic.c tools/pipebench/mlp.c tools/pipebench/measure.c \
	tools/pipebench/predict.c tools/pipebench/output.c tools/pipebench/gantt.c \
	tools/pipebench/progress.c tools/pipebench/stats.c tools/pipebench/noise.c \
	tools/pipebench/interleave.c tools/pipebench/train.c tools/pipebench/plan.c
tools_pipebench_pipebench_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include
tools_pipebench_pipebench_CFLAGS = $(AM_CFLAGS) $(CJSON_CFLAGS)
tools_pipebench_pipebench_LDADD = $(PB_MPI_LDADD) $(MBT_SHARED) $(MBP_LIBS) $(CJSON_LIBS) -lm
dist_man_MANS += tools/pipebench/pipebench.1
# Under mpirun the stages spread over the ranks (mpi.c): linked with libmbpipe-mpi when configure found
# MPI; without it pipebench has no MPI dependency and refuses to run under mpirun.
if HAVE_MPI
tools_pipebench_pipebench_SOURCES += tools/pipebench/mpi.c
tools_pipebench_pipebench_CPPFLAGS += -DPB_WITH_MPI
tools_pipebench_pipebench_CFLAGS += $(MPI_CFLAGS)
PB_MPI_LDADD = lib/libmbpipe-mpi.la $(MPI_LIBS)
else
PB_MPI_LDADD =
EXTRA_DIST += tools/pipebench/mpi.c
endif

# Tests: every bad argument fails with one line; the JSON parses and has its fields; a small synthetic
# run's measured bubble lies near the predicted one; the statistics on synthetic samples.
check_PROGRAMS += tests/test_pipebench
# The statistics (stats.c, predict.c) are linked in and tested on synthetic samples, the report (output.c,
# with gantt.c that it draws with) on a synthetic report, the options' meanings (options.c), and the noise
# windows (noise.c, with progress.c that it reports through) on CPUs the test keeps loud.
tests_test_pipebench_SOURCES = tests/test_pipebench.c tests/check_main.h tests/plural_check.h tests/tool_run.h tests/model_file.h \
	tools/pipebench/stats.c tools/pipebench/predict.c tools/pipebench/output.c tools/pipebench/gantt.c \
	tools/pipebench/options.c tools/pipebench/noise.c tools/pipebench/progress.c
tests_test_pipebench_CPPFLAGS = $(AM_CPPFLAGS) -I$(top_srcdir)/include -I$(top_builddir)/include \
	-DPIPEBENCH_BIN='"$(abs_top_builddir)/tools/pipebench/pipebench"'
tests_test_pipebench_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
tests_test_pipebench_LDADD = $(MBT_SHARED) $(MBP_LIBS) $(CHECK_LIBS) $(CJSON_LIBS) -lm
EXTRA_tests_test_pipebench_DEPENDENCIES = tools/pipebench/pipebench
TESTS += tests/test_pipebench
