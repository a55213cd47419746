# Model stages (OpenBLAS layers, safetensors, partitioner, RCU weight swap).
nobase_include_HEADERS += include/mbpipe/model.h
