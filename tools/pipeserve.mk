# pipeserve: an Open Inference Protocol (KServe v2) HTTP server embedding mbpipe (public API only).
bin_PROGRAMS += tools/pipeserve/pipeserve
tools_pipeserve_pipeserve_SOURCES = \
	tools/pipeserve/main.c tools/pipeserve/flags.h tools/pipeserve/flags.c tools/pipeserve/model.h \
	tools/pipeserve/model.c tools/pipeserve/engine.h tools/pipeserve/engine.c tools/pipeserve/signals.h \
	tools/pipeserve/signals.c tools/pipeserve/transport.h tools/pipeserve/transport.c tools/pipeserve/routes.h \
	tools/pipeserve/routes.c tools/pipeserve/server.h tools/pipeserve/server.c \
	tools/pipeserve/batch.h tools/pipeserve/batch.c tools/pipeserve/oip.h tools/pipeserve/oip.c \
	tools/pipeserve/metrics.h tools/pipeserve/metrics.c tools/pipeserve/mpi.h
# Public headers only: no -I lib (AM_CPPFLAGS carries it for the library's own code).
tools_pipeserve_pipeserve_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include
tools_pipeserve_pipeserve_CFLAGS = $(AM_CFLAGS) $(MHD_CFLAGS) $(CJSON_CFLAGS)
tools_pipeserve_pipeserve_LDADD = $(PS_MPI_LDADD) $(MBP_LIBS) $(MHD_LIBS) $(CJSON_LIBS)
dist_man_MANS += tools/pipeserve/pipeserve.1
# Under mpirun the model's stages run on several ranks (mpi.c): linked with libmbpipe-mpi when configure
# found MPI; without it pipeserve has no MPI dependency and refuses to run under mpirun.
if HAVE_MPI
tools_pipeserve_pipeserve_SOURCES += tools/pipeserve/mpi.c
tools_pipeserve_pipeserve_CPPFLAGS += -DPS_WITH_MPI
tools_pipeserve_pipeserve_CFLAGS += $(MPI_CFLAGS)
PS_MPI_LDADD = lib/libmbpipe-mpi.la $(MPI_LIBS)
else
PS_MPI_LDADD =
EXTRA_DIST += tools/pipeserve/mpi.c
endif

# Tests: start the server on a loopback port picked at run time and talk to it over plain sockets; the
# protocol parser alone, in process.
check_PROGRAMS += tests/test_pipeserve_oip tests/test_pipeserve
tests_test_pipeserve_oip_SOURCES = tests/test_pipeserve_oip.c tools/pipeserve/oip.c tools/pipeserve/oip.h \
	tests/check_main.h
tests_test_pipeserve_oip_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include \
	-I$(top_srcdir)/tools/pipeserve
tests_test_pipeserve_oip_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
tests_test_pipeserve_oip_LDADD = $(CHECK_LIBS) $(CJSON_LIBS) -lm
tests_test_pipeserve_SOURCES = tests/test_pipeserve.c tests/test_pipeserve_client.h tests/check_main.h \
	tests/model_file.h
tests_test_pipeserve_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include \
	-DPIPESERVE_BIN='"$(abs_top_builddir)/tools/pipeserve/pipeserve"'
tests_test_pipeserve_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(CJSON_CFLAGS)
tests_test_pipeserve_LDADD = $(MBP_LIBS) $(CHECK_LIBS) $(CJSON_LIBS)
TESTS += tests/test_pipeserve_oip tests/test_pipeserve
