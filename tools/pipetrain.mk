# pipetrain: trains an MLP on Fashion-MNIST with the pipeline-parallel trainer (public API only).
bin_PROGRAMS += tools/pipetrain/pipetrain
tools_pipetrain_pipetrain_SOURCES = \
	tools/pipetrain/pipetrain.h tools/pipetrain/main.c tools/pipetrain/options.c \
	tools/pipetrain/stages.c tools/pipetrain/output.c tools/pipetrain/plot.c
tools_pipetrain_pipetrain_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include
tools_pipetrain_pipetrain_CFLAGS = $(AM_CFLAGS) $(CJSON_CFLAGS) $(OPENBLAS_CFLAGS)
tools_pipetrain_pipetrain_LDADD = $(MBT_SHARED) $(MBP_LIBS) $(CJSON_LIBS) -lm
dist_man_MANS += tools/pipetrain/pipetrain.1

# Tests: bad arguments, a small run, same weights for every schedule and stage count, resume, NaN and
# SIGINT handling, what the lines say, --log and --plot (the curve's bound on plot.c itself), and end to
# end: the checkpoint served by pipeserve, then reloaded live.
check_PROGRAMS += tests/test_pipetrain
tests_test_pipetrain_SOURCES = tests/test_pipetrain.c tests/test_pipeserve_client.h tests/test_tmpdir.h tests/tool_run.h \
	tests/model_file.h tests/check_main.h tools/pipetrain/stages.c tools/pipetrain/output.c tools/pipetrain/plot.c
tests_test_pipetrain_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include -I$(top_srcdir)/tools/pipetrain \
	-DPIPETRAIN_BIN='"$(abs_top_builddir)/tools/pipetrain/pipetrain"' \
	-DPIPESERVE_BIN='"$(abs_top_builddir)/tools/pipeserve/pipeserve"'
tests_test_pipetrain_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
tests_test_pipetrain_LDADD = $(MBT_SHARED) $(MBP_LIBS) $(CHECK_LIBS) $(CJSON_LIBS) -lm
EXTRA_tests_test_pipetrain_DEPENDENCIES = tools/pipetrain/pipetrain tools/pipeserve/pipeserve
TESTS += tests/test_pipetrain
