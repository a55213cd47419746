# Model tests: the safetensors reader and file layout; the model, its stages, partitioner and weight swap.
check_PROGRAMS += tests/test_safetensors tests/test_model
tests_test_safetensors_SOURCES = tests/test_safetensors.c tests/check_main.h tests/model_file.h
tests_test_safetensors_CFLAGS = $(TEST_CFLAGS) $(CJSON_CFLAGS)
tests_test_safetensors_LDADD = $(TEST_LIBS)
tests_test_model_SOURCES = tests/test_model.c tests/check_main.h tests/model_file.h tests/model_rig.h
tests_test_model_CFLAGS = $(TEST_CFLAGS) $(CJSON_CFLAGS)
tests_test_model_LDADD = $(TEST_LIBS)
TESTS += tests/test_safetensors tests/test_model
# Replicated model stages: the partitioner with replicas, the forward bits in order.
check_PROGRAMS += tests/test_model_replicas
tests_test_model_replicas_SOURCES = tests/test_model_replicas.c tests/check_main.h tests/model_rig.h
tests_test_model_replicas_CFLAGS = $(TEST_CFLAGS)
tests_test_model_replicas_LDADD = $(TEST_LIBS)
TESTS += tests/test_model_replicas
CONCURRENCY_TESTS += tests/test_model_replicas
# The weight swap under load is a concurrency test: it runs in CI's ThreadSanitizer pass too.
CONCURRENCY_TESTS += tests/test_model
# Training: the trainable model's gradients, losses, optimizers and checkpoints; the IDX data reader.
check_PROGRAMS += tests/test_mlp
tests_test_mlp_SOURCES = tests/test_mlp.c tests/check_main.h tests/test_tmpdir.h
tests_test_mlp_CFLAGS = $(TEST_CFLAGS)
tests_test_mlp_LDADD = $(TEST_LIBS)
TESTS += tests/test_mlp
# Stages of one model trained on two threads at once: a concurrency test too.
CONCURRENCY_TESTS += tests/test_mlp
# The planner: plans for a hand-worked profile under loose and tight budgets, refusals, determinism.
check_PROGRAMS += tests/test_planner
tests_test_planner_SOURCES = tests/test_planner.c tests/check_main.h
tests_test_planner_CFLAGS = $(TEST_CFLAGS)
tests_test_planner_LDADD = $(TEST_LIBS)
TESTS += tests/test_planner
check_PROGRAMS += tests/test_data
tests_test_data_SOURCES = tests/test_data.c tests/check_main.h tests/test_tmpdir.h
tests_test_data_CFLAGS = $(TEST_CFLAGS) $(ZLIB_CFLAGS)
tests_test_data_LDADD = $(TEST_LIBS)
TESTS += tests/test_data
