# Model stages (OpenBLAS layers, safetensors, partitioner, RCU weight swap).
lib_libmbpipe_la_SOURCES += \
	lib/model/model_internal.h lib/model/safetensors.h lib/model/safetensors.c lib/model/layers.c \
	lib/model/model.c lib/model/plan.c lib/model/stages.c lib/model/blas.c lib/model/write.c
mbpipeinclude_HEADERS += include/mbpipe/model.h
