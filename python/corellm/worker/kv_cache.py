"""The paged KV cache: how many blocks a memory budget buys, and the per-layer tensors."""

from __future__ import annotations

import logging

import torch

from corellm import ops
from corellm.model.model_config import ModelConfig

logger = logging.getLogger("corellm")

DEFAULT_CPU_KV_CACHE_BYTES = 2 * 1024**3


def available_memory(device: torch.device) -> int:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * block_size * elem


def kv_cache_budget(kv_cache_memory: int | float | None, device: torch.device) -> int:
    """Bytes for the KV cache: given in bytes, as a fraction of free memory, or the default."""
    if kv_cache_memory is None:
        if device.type == "cuda":
            return int(0.9 * available_memory(device))
        return min(DEFAULT_CPU_KV_CACHE_BYTES, available_memory(device) // 2)
    if isinstance(kv_cache_memory, float):
        return int(kv_cache_memory * available_memory(device))
    return int(kv_cache_memory)


def allocate_kv_caches(config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype,
                       device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, config.num_key_value_heads, config.head_dim, block_size, dtype)
    # Zeroed at start-up although attention never reads a slot it has not written: touching every
    # page commits the memory now, so that a machine short of it fails at start-up rather than
    # later under load, and the resident size stays flat while serving.
    return [(torch.empty(k_shape, dtype=dtype, device=device).zero_(),
             torch.empty(v_shape, dtype=dtype, device=device).zero_()) for _ in range(config.num_hidden_layers)]
