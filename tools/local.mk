# Tools built on the public API only.
include tools/pipebench.mk
include tools/pipeserve.mk
include tools/pipetrain.mk
# Shared by the tools: singular or plural by count in messages; strict number parsing for options; busy work;
# the progress bar; OpenBLAS's generic-kernel warning.
EXTRA_DIST += tools/plural.h tools/parse.h tools/burn.h tools/progress.h tools/blas.h tests/plural_check.h

# One convention for the three tools: -h/--help and -V/--version answer on standard output with exit 0, a
# bad option is one line with exit 2, and each manual page lists exactly the options its --help lists.
TESTS += tests/tool_convention.sh
EXTRA_DIST += tests/tool_convention.sh
