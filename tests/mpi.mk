# The pipeline across MPI ranks (libmbpipe-mpi): programs run under mpirun by tests/mpi.sh, not by plain
# `make check` (an MPI program needs its launcher). `make check-mpi` runs them with 2 and 4 ranks; CI runs
# it through scripts/test.sh.
if HAVE_MPI
check_PROGRAMS += tests/test_mpi tests/test_mpi_train tests/mpi_fault
tests_test_mpi_SOURCES = tests/test_mpi.c tests/mpi_main.h
tests_test_mpi_CFLAGS = $(TEST_CFLAGS) $(MPI_CFLAGS)
tests_test_mpi_LDADD = $(MBP_MPI_LIBS) $(CHECK_LIBS)
tests_test_mpi_train_SOURCES = tests/test_mpi_train.c tests/train_toy.h tests/mpi_main.h
tests_test_mpi_train_CFLAGS = $(TEST_CFLAGS) $(MPI_CFLAGS)
tests_test_mpi_train_LDADD = $(MBP_MPI_LIBS) $(CHECK_LIBS)
tests_mpi_fault_SOURCES = tests/mpi_fault.c
tests_mpi_fault_CFLAGS = $(AM_CFLAGS)
tests_mpi_fault_LDADD = $(MBP_MPI_LIBS)
endif
EXTRA_DIST += tests/mpi.sh

# Where configure found MPI but no mpirun the tests cannot run: that fails, rather than passing unseen.
check-mpi: $(check_PROGRAMS) $(bin_PROGRAMS)
if HAVE_MPIRUN
	@MPIRUN="$(MPIRUN)" $(top_srcdir)/tests/mpi.sh $(top_builddir)
else
if HAVE_MPI
	@echo "check-mpi: configure found MPI ($(MBP_PC_MPI)) but no mpirun: the MPI tests cannot run" >&2; exit 1
else
	@echo "check-mpi: skipped (configure found no MPI; --with-mpi)"
endif
endif
.PHONY: check-mpi
