# Tools built on the public API only.
include tools/pipebench.mk
include tools/pipeserve.mk
include tools/pipetrain.mk
# Shared by the tools: singular or plural by count in messages; strict number parsing for options; busy work;
# the progress bar; OpenBLAS's generic-kernel warning.
EXTRA_DIST += tools/plural.h tools/parse.h tools/burn.h tools/progress.h tools/blas.h tests/plural_check.h

