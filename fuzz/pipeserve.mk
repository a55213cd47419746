# libFuzzer target for pipeserve's request parsing. `make fuzz-pipeserve` builds it with clang
# (-fsanitize=fuzzer,address,undefined) and runs a fixed number of executions from the seed corpus, in a
# scratch corpus directory that is removed afterwards (the seeds in the source tree are never written).
# FUZZ_PIPESERVE_RUNS sets the count; a crash leaves its input as crash-* in the build directory.
FUZZ_PIPESERVE_RUNS = 100000
EXTRA_DIST += fuzz/pipeserve_fuzz.c fuzz/pipeserve_corpus

if HAVE_FUZZ_CC
PIPESERVE_FUZZ_SRC = $(top_srcdir)/fuzz/pipeserve_fuzz.c $(top_srcdir)/tools/pipeserve/oip.c
fuzz/pipeserve_fuzz: $(PIPESERVE_FUZZ_SRC) $(top_srcdir)/tools/pipeserve/oip.h \
		$(top_srcdir)/util/number.h config.h
	@$(MKDIR_P) fuzz
	$(AM_V_CC)$(FUZZ_CC) -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		-I$(top_builddir) -I$(top_srcdir) -I$(top_srcdir)/tools/pipeserve $(CJSON_CFLAGS) \
		-o $@ $(PIPESERVE_FUZZ_SRC) $(CJSON_LIBS) -lm
CLEANFILES += fuzz/pipeserve_fuzz

fuzz-pipeserve: fuzz/pipeserve_fuzz
	@dir=$$(mktemp -d) && \
	./fuzz/pipeserve_fuzz -runs=$(FUZZ_PIPESERVE_RUNS) -seed=1 -max_len=4096 -print_final_stats=1 \
		"$$dir" $(top_srcdir)/fuzz/pipeserve_corpus; rc=$$?; rm -rf "$$dir"; exit $$rc
else
fuzz-pipeserve:
	@echo "fuzz-pipeserve: skipped (configure found no clang for FUZZ_CC)"
endif
.PHONY: fuzz-pipeserve
