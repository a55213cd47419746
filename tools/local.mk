# Tools built on the public API only.
include tools/pipebench.mk
include tools/pipeserve.mk
