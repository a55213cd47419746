# Unit tests: one Check suite per module, one program each (tests/check_main.h gives them one main).
TEST_CFLAGS = $(AM_CFLAGS) $(CHECK_CFLAGS) $(URCU_CFLAGS) $(OPENBLAS_CFLAGS)
TEST_LIBS = $(MBP_LIBS) $(CHECK_LIBS)

# Iteration counts come from one define so CI and sanitizer builds can shrink them (see tests/check_main.h).
check_PROGRAMS += tests/test_ring tests/test_pool tests/test_crew tests/test_pipeline tests/test_schedule \
	tests/test_train tests/test_opts tests/test_error tests/test_trace tests/test_ingress tests/test_affinity \
	tests/test_replicas
tests_test_ring_SOURCES = tests/test_ring.c tests/check_main.h
tests_test_ring_CFLAGS = $(TEST_CFLAGS)
tests_test_ring_LDADD = $(TEST_LIBS)
tests_test_pool_SOURCES = tests/test_pool.c tests/check_main.h
tests_test_pool_CFLAGS = $(TEST_CFLAGS) $(JEMALLOC_CFLAGS)
tests_test_pool_LDADD = $(TEST_LIBS)
tests_test_crew_SOURCES = tests/test_crew.c tests/check_main.h
tests_test_crew_CFLAGS = $(TEST_CFLAGS)
tests_test_crew_LDADD = $(TEST_LIBS)
tests_test_pipeline_SOURCES = tests/test_pipeline.c tests/pipeline_rig.h tests/check_main.h
tests_test_pipeline_CFLAGS = $(TEST_CFLAGS) $(CJSON_CFLAGS)
tests_test_pipeline_LDADD = $(TEST_LIBS)
tests_test_opts_SOURCES = tests/test_opts.c tests/check_main.h
tests_test_opts_CFLAGS = $(TEST_CFLAGS)
tests_test_opts_LDADD = $(TEST_LIBS)
tests_test_error_SOURCES = tests/test_error.c tests/check_main.h
tests_test_error_CFLAGS = $(TEST_CFLAGS)
tests_test_error_LDADD = $(TEST_LIBS)
tests_test_trace_SOURCES = tests/test_trace.c tests/pipeline_rig.h tests/check_main.h
tests_test_trace_CFLAGS = $(TEST_CFLAGS) $(CJSON_CFLAGS)
tests_test_trace_LDADD = $(TEST_LIBS)
tests_test_ingress_SOURCES = tests/test_ingress.c tests/check_main.h
tests_test_ingress_CFLAGS = $(TEST_CFLAGS)
tests_test_ingress_LDADD = $(TEST_LIBS)
tests_test_replicas_SOURCES = tests/test_replicas.c tests/pipeline_rig.h tests/check_main.h
tests_test_replicas_CFLAGS = $(TEST_CFLAGS)
tests_test_replicas_LDADD = $(TEST_LIBS)
tests_test_affinity_SOURCES = tests/test_affinity.c tests/pipeline_rig.h tests/check_main.h
tests_test_affinity_CFLAGS = $(TEST_CFLAGS)
tests_test_affinity_LDADD = $(TEST_LIBS)

tests_test_schedule_SOURCES = tests/test_schedule.c tests/check_main.h
tests_test_schedule_CFLAGS = $(TEST_CFLAGS)
tests_test_schedule_LDADD = $(TEST_LIBS)
tests_test_train_SOURCES = tests/test_train.c tests/train_toy.h tests/check_main.h
tests_test_train_CFLAGS = $(TEST_CFLAGS) $(JEMALLOC_CFLAGS)
tests_test_train_LDADD = $(TEST_LIBS)

TESTS += tests/test_ring tests/test_pool tests/test_crew tests/test_pipeline tests/test_schedule tests/test_train \
	tests/test_opts tests/test_error tests/test_trace tests/test_ingress tests/test_affinity tests/test_replicas

# ARCHITECTURE.md rule 5 on every atomic access of lib/ and lib/mpi/: each names its memory order and why.
TESTS += tests/atomic_partners.sh
EXTRA_DIST += tests/atomic_partners.sh

# Concurrency tests only: what CI runs under TSan.
CONCURRENCY_TESTS = tests/test_ring tests/test_pool tests/test_crew tests/test_pipeline tests/test_train \
	tests/test_replicas
check-concurrency: $(CONCURRENCY_TESTS)
	@$(MAKE) $(AM_MAKEFLAGS) check TESTS="$(CONCURRENCY_TESTS)"
.PHONY: check-concurrency

include tests/model.mk

# Longer runs, not part of `make check`: the concurrency suites with full iteration counts repeated
# (STRESS_ROUNDS times), each round with a different scheduling. `make soak` repeats them for SOAK_MINUTES.
STRESS_ROUNDS ?= 20
SOAK_MINUTES ?= 30
stress: $(CONCURRENCY_TESTS)
	@for i in $$(seq 1 $(STRESS_ROUNDS)); do \
	  for t in $(CONCURRENCY_TESTS); do \
	    ./$$t >/dev/null 2>&1 || { echo "stress: $$t failed in round $$i"; ./$$t; exit 1; }; \
	  done; echo "stress: round $$i ok"; \
	done
soak: $(CONCURRENCY_TESTS)
	@end=$$(( $$(date +%s) + 60 * $(SOAK_MINUTES) )); n=0; \
	while [ $$(date +%s) -lt $$end ]; do n=$$((n + 1)); \
	  for t in $(CONCURRENCY_TESTS); do ./$$t >/dev/null 2>&1 || { echo "soak: $$t failed in round $$n"; exit 1; }; done; \
	done; echo "soak: $$n rounds ok"
.PHONY: stress soak
include tests/mpi.mk
