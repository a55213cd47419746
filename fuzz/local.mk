# libFuzzer target for the safetensors reader. `make fuzz-safetensors` builds it with clang (FUZZ_CC, found
# by configure) and runs FUZZ_ST_RUNS executions from a generated seed corpus in a temporary folder: a short,
# fixed run for CI. For a longer session: make fuzz/fuzz_safetensors, then run it on a corpus folder.
FUZZ_ST_RUNS = 100000
FUZZ_ST_FLAGS = -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined

EXTRA_DIST += fuzz/fuzz_safetensors.c
EXTRA_PROGRAMS += fuzz/st_seeds
fuzz_st_seeds_SOURCES = fuzz/st_seeds.c
fuzz_st_seeds_LDADD = $(MBP_LIBS)
CLEANFILES += fuzz/fuzz_safetensors fuzz/st_seeds

if HAVE_FUZZ_CC
fuzz/fuzz_safetensors: $(srcdir)/fuzz/fuzz_safetensors.c $(srcdir)/lib/model/safetensors.c \
		$(srcdir)/lib/model/safetensors.h config.h
	@$(MKDIR_P) fuzz
	$(AM_V_CCLD)$(FUZZ_CC) $(FUZZ_ST_FLAGS) $(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(CJSON_CFLAGS) \
		-o $@ $(srcdir)/fuzz/fuzz_safetensors.c $(srcdir)/lib/model/safetensors.c $(CJSON_LIBS) -lm

fuzz-safetensors: fuzz/fuzz_safetensors fuzz/st_seeds$(EXEEXT)
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	./fuzz/st_seeds$(EXEEXT) "$$d" && \
	./fuzz/fuzz_safetensors -runs=$(FUZZ_ST_RUNS) -seed=1 -max_len=4096 -print_final_stats=1 "$$d"
else
fuzz-safetensors:
	@echo "fuzz-safetensors: skipped, configure found no clang (FUZZ_CC)"
endif
.PHONY: fuzz-safetensors
