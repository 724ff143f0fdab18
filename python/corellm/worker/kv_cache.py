"""The paged KV cache: how many blocks a memory budget buys, and the per-layer tensors."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading

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
    """One (key, value) cache per layer. Attention never reads a slot it has not written, but every
    page is committed as the engine starts, so that a machine short of memory fails then rather than
    later under load, and the resident size stays flat while serving. On the CPU the pages are committed
    by the kernel (madvise MADV_POPULATE_WRITE) on a background thread: that leaves the contents as
    they are, so the engine may serve meanwhile, and start-up does not wait the ~0.5 s that 2 GiB
    takes; where the kernel lacks it (Linux < 5.14) every page is zeroed before this returns."""
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, config.num_key_value_heads, config.head_dim, block_size, dtype)
    caches = [(torch.empty(k_shape, dtype=dtype, device=device), torch.empty(v_shape, dtype=dtype, device=device))
              for _ in range(config.num_hidden_layers)]
    tensors = [t for pair in caches for t in pair]
    if device.type != "cpu" or not _populate(tensors[0], first_page_only=True):
        for t in tensors:
            t.zero_()
        return caches
    threading.Thread(target=_populate_all, args=(tensors,), name="corellm-kv-commit", daemon=True).start()
    return caches


_MADV_POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _populate(t: torch.Tensor, first_page_only: bool = False) -> bool:
    """Faults in t's pages writable without touching their contents (ctypes releases the GIL
    meanwhile). False where the kernel does not know the advice; OSError for any other failure."""
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE  # the pages t lies on (its allocation's own)
    end = t.data_ptr() + t.numel() * t.element_size()
    length = mmap.PAGESIZE if first_page_only else end - start
    if _libc.madvise(start, length, _MADV_POPULATE_WRITE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EINVAL:
        return False
    raise OSError(code, f"committing the KV cache's memory: {errno.errorcode.get(code, code)}")


def _populate_all(tensors: list[torch.Tensor]) -> None:
    # At the lowest priority (nice 19, this thread only): the kernel's zeroing of the pages would
    # otherwise take a core from the forward passes of the first requests (2 GiB took ~2.3 s on a
    # 2-core VM), and any page the engine writes first is faulted in by that write anyway.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:
        pass
    try:
        for t in tensors:
            _populate(t)
    except OSError as e:  # the pages will be faulted in as they are first written instead
        logger.error("%s; the KV cache's memory is committed as it is used", e)
