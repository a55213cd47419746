# libmbpipe.a: the engine (and, from lib/model, the model stages).
lib_LTLIBRARIES += lib/libmbpipe.la

lib_libmbpipe_la_SOURCES = \
	lib/common.h lib/clock.c lib/wait.h lib/wait.c lib/ring.h lib/ring_pvt.h lib/ring.c \
	lib/error.c lib/file.c lib/pool_internal.h lib/pool.c \
	lib/affinity.h lib/affinity.c lib/crew.h lib/crew.c lib/opts.c lib/ingress.h lib/ingress.c lib/job.h lib/job.c \
	lib/pipeline_internal.h lib/pipeline.c lib/seqwin.h lib/seqwin.c lib/worker.c lib/stats.c lib/trace.h lib/trace.c \
	lib/schedule.h lib/schedule.c lib/train_internal.h lib/train.c lib/train_place.c
lib_libmbpipe_la_SOURCES += lib/clock.h lib/strbuf.h lib/strbuf.c
lib_libmbpipe_la_CFLAGS = $(AM_CFLAGS) $(OPENBLAS_CFLAGS) $(URCU_CFLAGS) $(JEMALLOC_CFLAGS) $(CJSON_CFLAGS)
lib_libmbpipe_la_LIBADD = $(OPENBLAS_LIBS) $(URCU_CDS_LIBS) $(URCU_LIBS) $(JEMALLOC_LIBS) $(CJSON_LIBS) -lm

include_HEADERS += include/mbpipe.h
mbpipeinclude_HEADERS += include/mbpipe/error.h include/mbpipe/file.h include/mbpipe/mb.h include/mbpipe/pool.h \
	include/mbpipe/pipeline.h include/mbpipe/train.h
nodist_mbpipeinclude_HEADERS += include/mbpipe/version.h

# Libraries a program linking libmbpipe inside this tree needs (the .pc file says the same to users).
MBP_LIBS = lib/libmbpipe.la $(OPENBLAS_LIBS) $(URCU_CDS_LIBS) $(URCU_LIBS) $(JEMALLOC_LIBS) $(CJSON_LIBS) -lm

include lib/model/local.mk
