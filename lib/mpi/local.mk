# libmbpipe-mpi.a: the pipeline and the trainer across MPI ranks, on top of libmbpipe. Built only when
# configure finds MPI (--with-mpi); the core library has no MPI dependency.
if HAVE_MPI
lib_LTLIBRARIES += lib/libmbpipe-mpi.la
lib_libmbpipe_mpi_la_SOURCES = lib/mpi/mpi_internal.h lib/mpi/comm.c lib/mpi/link.c lib/mpi/ctl.c \
	lib/mpi/loop.c lib/mpi/mpi.c lib/mpi/trainer.c
lib_libmbpipe_mpi_la_CFLAGS = $(AM_CFLAGS) $(MPI_CFLAGS)
lib_libmbpipe_mpi_la_LIBADD = $(MPI_LIBS)
mbpipeinclude_HEADERS += include/mbpipe/mpi.h
pkgconfig_DATA += mbpipe-mpi.pc
# Programs linking libmbpipe-mpi inside this tree.
MBP_MPI_LIBS = lib/libmbpipe-mpi.la $(MPI_LIBS) $(MBP_LIBS)
endif
