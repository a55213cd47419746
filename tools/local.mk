# Tools built on the public API only.
include tools/pipebench.mk
include tools/pipeserve.mk
# Shared by both tools: singular or plural by count in messages.
EXTRA_DIST += tools/plural.h tools/burn.h tests/plural_check.h
