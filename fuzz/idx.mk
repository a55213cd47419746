# libFuzzer target for the IDX reader. `make fuzz-idx` builds it with clang (FUZZ_CC) and runs FUZZ_IDX_RUNS
# executions from a seed of one good pair of plain IDX files (2 images of 2 x 2, labels 3 and 7), in a
# temporary folder: a short, fixed run for CI. For a longer session: make fuzz/fuzz_idx, then run it on a
# corpus folder.
FUZZ_IDX_RUNS = 20000

EXTRA_DIST += fuzz/fuzz_idx.c
CLEANFILES += fuzz/fuzz_idx

if HAVE_FUZZ_CC
fuzz/fuzz_idx: $(srcdir)/fuzz/fuzz_idx.c $(srcdir)/lib/model/idx.c config.h
	@$(MKDIR_P) fuzz
	$(AM_V_CCLD)$(FUZZ_CC) $(FUZZ_ST_FLAGS) $(DEFS) $(DEFAULT_INCLUDES) $(AM_CPPFLAGS) $(ZLIB_CFLAGS) \
		-o $@ $(srcdir)/fuzz/fuzz_idx.c $(srcdir)/lib/model/idx.c $(ZLIB_LIBS)

fuzz-idx: fuzz/fuzz_idx
	@d=$$(mktemp -d) && trap 'rm -rf "$$d"' EXIT && \
	printf '\030\000\000\000\010\003\000\000\000\002\000\000\000\002\000\000\000\002\001\002\003\004\005\006\007\010\000\000\010\001\000\000\000\002\003\007' > "$$d/seed" && \
	./fuzz/fuzz_idx -runs=$(FUZZ_IDX_RUNS) -seed=1 -max_len=4096 -print_final_stats=1 "$$d"
else
fuzz-idx:
	@echo "fuzz-idx: skipped, configure found no clang (FUZZ_CC)"
endif
.PHONY: fuzz-idx
