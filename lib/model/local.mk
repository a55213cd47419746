# Model stages (OpenBLAS layers, safetensors, partitioner, RCU weight swap), training (backward, losses,
# optimizers, checkpoints) and the IDX data reader (zlib).
lib_libmbpipe_la_SOURCES += \
	lib/model/model_internal.h lib/model/safetensors.h lib/model/safetensors.c lib/model/digest.c lib/model/layers.c lib/model/dense.c \
	lib/model/load.c lib/model/versions.c lib/model/describe.c lib/model/plan.c lib/model/planner.c lib/model/stages.c lib/model/rebalance.h lib/model/rebalance.c lib/model/blas.c lib/model/write.c \
	lib/model/mlp_internal.h lib/model/mlp.c lib/model/optim.c lib/model/loss.c lib/model/checkpoint.c \
	lib/model/idx.c
lib_libmbpipe_la_CFLAGS += $(ZLIB_CFLAGS)
lib_libmbpipe_la_LIBADD += $(ZLIB_LIBS)
MBP_LIBS += $(ZLIB_LIBS)
mbpipeinclude_HEADERS += include/mbpipe/model.h include/mbpipe/model_train.h include/mbpipe/data.h
