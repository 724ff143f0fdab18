"""More than one device or process: the tensor-parallel group (parallel_state) and the sharding
of a model's weights across it (model/tensor_parallel.py)."""
