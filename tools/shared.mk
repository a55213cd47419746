# What the tools that train an MLP share (tools/shared/mlptrain.h: the trainer's stages onto the model's,
# the loss, each layer's profile, the planner run with its lines, JSON and refusal, each thread's figures of a step): one convenience
# library, linked by pipetrain, pipebench and their tests. Public API only, as the tools (no -I lib).
noinst_LTLIBRARIES += tools/shared/libmbtools.la
tools_shared_libmbtools_la_SOURCES = tools/shared/mlptrain.h tools/shared/stages.c tools/shared/autoplan.c \
	tools/shared/threads.c
tools_shared_libmbtools_la_CPPFLAGS = -I$(top_srcdir)/include -I$(top_builddir)/include
tools_shared_libmbtools_la_CFLAGS = $(AM_CFLAGS) $(CJSON_CFLAGS)
MBT_SHARED = tools/shared/libmbtools.la
