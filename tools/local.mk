# Tools built on the public API only.
include tools/shared.mk
include tools/pipebench.mk
include tools/pipeserve.mk
include tools/pipetrain.mk
# What the tools share (parsing, plural, clock, busy work, progress bar, BLAS warning, MPI ranks) is in
# util/ (util/local.mk), which the benchmarks use too. The tools' tests' check for "1 rows":
EXTRA_DIST += tests/plural_check.h

# One convention for the three tools: -h/--help and -V/--version answer on standard output with exit 0, a
# bad option is one line with exit 2, and each manual page lists exactly the options its --help lists.
TESTS += tests/tool_convention.sh
EXTRA_DIST += tests/tool_convention.sh
