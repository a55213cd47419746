# Model stages (OpenBLAS layers, safetensors, partitioner, RCU weight swap): filled in by the model work.
