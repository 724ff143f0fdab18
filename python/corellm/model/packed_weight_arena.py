"""The CPU's packed weights gathered into one arena on transparent 2 MiB pages once a model is loaded.

A decode step at one sequence streams every packed weight once, and the packed tensors (one torch
allocation each, on 4 KiB pages) cost the stream a TLB miss every 64 lines and stop the hardware
prefetcher at every 4 KiB boundary. So the bf16 GEMM panels and the quantized GEMM blocks are copied,
in the order the model reads them, into one allocation the kernel is asked to back with 2 MiB pages
(huge_pages.prefer_huge_pages), and every holder is pointed at its slice: the same bytes, so the same
results. Measured on an AMD EPYC Zen 4 VM (2 threads, one row, four alternating pairs each): the
quantized GEMM over ~150 MB of SmolLM2's projections Q4_1 29.4-30.4 -> 31.1-31.5 GB/s, Q8_0 29.9-31.0
-> 31.8-32.4; the bf16 projections of 30 layers 4.93-5.01 -> 4.82-4.95 ms. In the whole model, where
the TLB also holds the KV cache, the activations and the interpreter's state, more (six alternating
pairs of fresh processes): tg128 BF16 106.0-116.9 -> 122.9-134.4 tok/s, the default Q4_1 file
241.6-333.9 -> 270.1-315.9; two engines in one process, alternating twelve runs: BF16 median 119.0
-> 131.1, Q4_1 240.3 -> 265.1, Gemma 3 270M Q4_K_M 106.8 -> 111.4. A decode step of 64 sequences,
compute-bound, is level (57.4-59.2 against 57.6-59.2 ms, the same way). The start-up pays for the
arena's first touch (the engine's part 0.12-0.19 -> 0.16-0.34 s).

Where the system gives no huge pages on request, nothing moves. Tensors on a GPU are left alone."""

from __future__ import annotations

import logging

import torch

from corellm.huge_pages import HUGE_PAGE, THP_ENABLED, libc, prefer_huge_pages, thp_setting

logger = logging.getLogger("corellm")

_ALIGN = 64  # each slice starts on a cache line, as torch's own allocations do


def packed_holders(model) -> list[tuple[object, str]]:
    """(object, attribute) for every packed weight tensor of the model, in the order a step reads
    them: the embedding's quantized rows, each linear layer's bf16 panels or quantized parts, the LM
    head (all_linears puts it first) last. A tensor held twice (a tied LM head) appears twice."""
    holders: list[tuple[object, str]] = []
    embed = getattr(model, "embed", None)
    if embed is not None and embed.quantized is not None:
        holders.append((embed.quantized, "packed"))
    linears = model.all_linears()
    for linear in linears[1:] + linears[:1]:
        if linear.packed is not None:
            holders.append((linear, "packed"))
        holders.extend((q, "packed") for _, q in linear.quantized)
    return holders


def gather_packed_weights(model) -> int:
    """Moves the model's packed CPU weights into one arena on 2 MiB pages (see above); returns the
    bytes moved (0 where nothing moved). Each tensor is let go as soon as it is copied, so that the
    memory held at once stays about one model's weights, not two."""
    holders: dict[int, list[tuple[object, str]]] = {}  # data_ptr -> its holders, in reading order
    for owner, attr in packed_holders(model):
        t = getattr(owner, attr)
        if t.device.type == "cpu":
            holders.setdefault(t.data_ptr(), []).append((owner, attr))
    offsets, size = {}, 0
    for ptr, (first, *_) in holders.items():
        t = getattr(*first)
        offsets[ptr] = size
        size += (t.numel() * t.element_size() + _ALIGN - 1) // _ALIGN * _ALIGN
    if size < HUGE_PAGE:
        return 0
    block = torch.empty(size + HUGE_PAGE, dtype=torch.uint8)
    start = -block.data_ptr() % HUGE_PAGE  # the arena starts on a 2 MiB boundary
    arena = block[start : start + size]
    if not prefer_huge_pages(arena):
        logger.info("packed weights stay on 4 KiB pages: the system gives no transparent 2 MiB pages on "
                    "request (%s: %s); decode reads them slower", THP_ENABLED, thp_setting())
        return 0
    for ptr, owners in holders.items():
        t = getattr(*owners[0])
        piece = arena[offsets[ptr] : offsets[ptr] + t.numel() * t.element_size()]
        piece.copy_(t.contiguous().view(-1).view(torch.uint8))
        view = piece.view(t.dtype).view(t.shape)
        del t
        for owner, attr in owners:
            setattr(owner, attr, view)
    trim = getattr(libc, "malloc_trim", None)  # glibc: the old tensors' heap pages back to the system
    if trim is not None:
        trim(0)
    logger.debug("packed weights: %.1f MiB gathered on 2 MiB pages", size / 2**20)
    return size
