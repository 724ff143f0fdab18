"""Transparent 2 MiB pages on request for the CPU's large tensors that every step reads: the KV cache
(worker/kv_cache.py) and the packed weights (model/packed_weight_arena.py). On 4 KiB pages a stream
through them takes a TLB miss every 64 cache lines (a nested page walk in a VM), and scattered reads
nearly one per access; each caller states what it measured."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import torch

HUGE_PAGE = 2 * 1024**2
THP_ENABLED = Path("/sys/kernel/mm/transparent_hugepage/enabled")
_MADV_HUGEPAGE = 14
libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def page_span(t: torch.Tensor) -> tuple[int, int]:
    """The start and length of the pages t lies on (its allocation's own: a large tensor has its mapping)."""
    start = t.data_ptr() // mmap.PAGESIZE * mmap.PAGESIZE
    return start, t.data_ptr() + t.numel() * t.element_size() - start


def prefer_huge_pages(t: torch.Tensor) -> bool:
    """Asks the kernel to back t's memory with transparent 2 MiB pages (madvise MADV_HUGEPAGE, before
    the pages are faulted in); True when it took the advice. A system that gives no huge pages on
    request (transparent_hugepage "never", or a kernel without them) keeps 4 KiB pages: False."""
    start, length = page_span(t)
    return length >= HUGE_PAGE and libc.madvise(start, length, _MADV_HUGEPAGE) == 0


def thp_setting() -> str:
    """The system's transparent huge page setting, as the kernel prints it (or why it is unknown)."""
    try:
        return THP_ENABLED.read_text().strip()
    except OSError as e:
        return f"unreadable ({e.strerror})"
