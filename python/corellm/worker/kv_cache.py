"""The paged KV cache: how many blocks a memory budget buys, and the per-layer tensors."""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import threading
import time
import weakref

import torch

from corellm import ops
from corellm.config import KV_CACHE_DTYPES
from corellm.huge_pages import HUGE_PAGE, libc as _libc, page_span as _pages, prefer_huge_pages
from corellm.model.model_config import ModelConfig
from corellm.worker.step_activity import StepActivity

logger = logging.getLogger("corellm")

DEFAULT_CPU_KV_CACHE_BYTES = 2 * 1024**3

# EngineConfig.kv_cache_dtype's values (config.KV_CACHE_DTYPES) as element types ("auto": the
# model's). "fp8" is "fp8_e4m3", as in vLLM.
_ELEMENT_TYPES = {"auto": None, "bfloat16": torch.bfloat16, "fp8": torch.float8_e4m3fn,
                  "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
assert tuple(_ELEMENT_TYPES) == KV_CACHE_DTYPES


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache's element type for EngineConfig.kv_cache_dtype: "auto" the model's dtype; the
    others name one, which the kernels must be able to write from and read with the model's dtype:
    bfloat16 a bfloat16 model's, an 8-bit float (ops/attention.py) a bfloat16 model's on the CPU.
    ValueError naming what does not fit."""
    if kv_cache_dtype not in _ELEMENT_TYPES:
        raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    dtype = _ELEMENT_TYPES[kv_cache_dtype]
    if dtype is None or dtype == model_dtype:
        return model_dtype
    if device.type != "cpu":
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype}: 8-bit KV caches are implemented in the CPU kernels only, "
                         f"not on {device.type}; use kv_cache_dtype auto")
    if model_dtype != torch.bfloat16 or dtype == torch.bfloat16:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype} needs a bfloat16 model (the kernels write the cache from, and "
                         f"read it with, bfloat16), this one runs in {model_dtype}; use kv_cache_dtype auto or "
                         f"dtype bfloat16")
    return dtype


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
                       device: torch.device,
                       activity: StepActivity | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One (key, value) cache per layer. Attention never reads a slot it has not written, but every
    page is committed once the engine has had a moment, so that the resident size stays flat while
    serving. On the CPU the pages are committed by the kernel (madvise MADV_POPULATE_WRITE) on a
    background thread: that leaves the contents as they are, so the engine may serve meanwhile, and
    start-up does not wait for it (~0.5 s for 2 GiB on a bare machine, 37 s on a VM whose host backs
    the memory on its first use). It commits a chunk only when `activity` (the step runner's) has
    been idle for COMMIT_AFTER_IDLE_S (see step_activity.py; None: at once); a page the engine
    writes first is faulted in by that write. Where the kernel lacks the advice (Linux < 5.14)
    every page is zeroed before this returns. On the CPU the cache asks for 2 MiB pages (see
    prefer_huge_pages)."""
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, config.num_key_value_heads, config.head_dim, block_size, dtype)
    caches = [(torch.empty(k_shape, dtype=dtype, device=device), torch.empty(v_shape, dtype=dtype, device=device))
              for _ in range(config.num_hidden_layers)]
    tensors = [t for pair in caches for t in pair]
    if device.type == "cpu":
        # Decode attention reads each sequence's KV blocks wherever the block pool put them; once a
        # server has run a while (blocks freed, cached and reused in LRU order) they lie scattered
        # over the whole cache, and on 4 KiB pages nearly every block is a TLB miss, a nested page
        # walk in a VM. 64 sequences x 192 tokens, 30 layers' 2 GiB of caches, AMD EPYC Zen 5 VM, 2
        # threads: with the blocks scattered, decode attention 15.3-18.8 ms on 4 KiB pages,
        # 11.6-14.6 ms on 2 MiB pages (1.27-1.4x); with each sequence's blocks consecutive, about the
        # same on both (1.00-1.03x; bench/kv_pages.py).
        for t in tensors:
            prefer_huge_pages(t)
    if device.type != "cpu" or not _populate(_pages(tensors[0])[0], mmap.PAGESIZE):
        for t in tensors:
            t.zero_()
        return caches
    # The thread gets the pages' addresses, never the tensors: had it held them, the last reference
    # to a deleted engine's cache could be its own, and freeing the cache from a daemon thread
    # while the interpreter exits killed the process (torch gives up the GIL to free the memory, the
    # exiting interpreter ends the thread when it asks for it back, and that unwinding through
    # torch's C++ frame calls std::terminate: "terminate called without an active exception", exit
    # code 134 after a script's last line). `freed` is set when any of them is freed.
    freed = threading.Event()
    for t in tensors:
        weakref.finalize(t, freed.set)
    threading.Thread(target=_populate_all, args=(_commit_order(tensors), freed, activity), name="corellm-kv-commit",
                     daemon=True).start()
    return caches


COMMIT_AFTER_IDLE_S = 0.05  # longer than the engine's own work between two steps
_MADV_POPULATE_WRITE = 23


def _populate(start: int, length: int) -> bool:
    """Faults in the pages [start, start + length) writable without touching their contents (ctypes
    releases the GIL meanwhile). False where the kernel does not know the advice; OSError for any
    other failure."""
    if _libc.madvise(start, length, _MADV_POPULATE_WRITE) == 0:
        return True
    code = ctypes.get_errno()
    if code == errno.EINVAL:
        return False
    raise OSError(code, f"committing the KV cache's memory: {errno.errorcode.get(code, code)}")


def _commit_order(tensors: list[torch.Tensor], chunk: int = HUGE_PAGE) -> list[tuple[int, int]]:
    """Every tensor's pages as (start, length) ranges of up to `chunk` bytes, in the order the engine
    first writes them: the block pool hands blocks out from block 0 up, and a block is a slice of
    every layer's cache, so the first chunk of every tensor comes first, then the second of each..."""
    pages = [_pages(t) for t in tensors]
    ranges = []
    for offset in range(0, max(length for _, length in pages), chunk):
        ranges += [(start + offset, min(chunk, length - offset)) for start, length in pages if offset < length]
    return ranges


def _populate_all(ranges: list[tuple[int, int]], freed: threading.Event, activity: StepActivity | None) -> None:
    # At the lowest priority (nice 19, this thread only), and a chunk (one 2 MiB page) at a time,
    # each in a pause of the steps: the kernel's zeroing of the pages (and in a VM the host's
    # faulting them in, which stalls the vCPU whatever the priority) would otherwise take a core
    # from the forward passes of the first requests; any page the engine writes first is faulted
    # in by that write anyway. Stops once the cache is freed (its engine deleted); a chunk asked for
    # as it is freed fails or populates memory that is no longer the cache's, which the advice
    # leaves as it was.
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    except OSError:
        pass
    try:
        for start, length in ranges:
            while (not freed.is_set() and activity is not None
                   and (idle := activity.idle_seconds()) < COMMIT_AFTER_IDLE_S):
                time.sleep(COMMIT_AFTER_IDLE_S - idle)
            if freed.is_set():
                return
            _populate(start, length)
    except OSError as e:  # the pages will be faulted in as they are first written instead
        if not freed.is_set():
            logger.error("%s; the KV cache's memory is committed as it is used", e)
