"""Decode attention on KV caches on 4 KiB pages vs transparent 2 MiB pages (huge_pages.prefer_huge_pages),
with each sequence's blocks consecutive (a fresh server) and scattered over the whole cache (a server
that has run a while: blocks freed, cached and reused in LRU order).

SmolLM2-135M's attention shapes (30 layers, 3 KV heads, head size 64, 16-token blocks), a 2 GiB cache,
one decode step of every layer over --num-seqs sequences of --seq-len tokens; both page sizes measured
alternately in one process. Prints a table: best / median step time, KV read GB/s, 4 KiB / 2 MiB.

    .venv/bin/python bench/kv_pages.py [--num-seqs 64] [--seq-len 192]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from corellm import ops
from corellm.huge_pages import prefer_huge_pages

LAYERS, KV_HEADS, HEADS, HEAD_DIM, BLOCK = 30, 3, 9, 64, 16


def caches(num_blocks: int, huge: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every layer's (key, value) cache, written once (every page faulted in)."""
    out = []
    for _ in range(LAYERS):
        pair = []
        for shape in ops.kv_cache_shapes(num_blocks, KV_HEADS, HEAD_DIM, BLOCK, torch.bfloat16):
            t = torch.empty(shape, dtype=torch.bfloat16)
            if huge and not prefer_huge_pages(t):
                raise SystemExit("this system gives no transparent huge pages on request "
                                 f"({Path('/sys/kernel/mm/transparent_hugepage/enabled').read_text().strip()})")
            pair.append(t.normal_())
        out.append(tuple(pair))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-seqs", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=192)
    p.add_argument("--cache-gib", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()

    block_bytes = 2 * KV_HEADS * HEAD_DIM * BLOCK * 2  # one layer's key + value block
    num_blocks = int(args.cache_gib * 1024**3 / (LAYERS * block_bytes))
    per_seq = math.ceil(args.seq_len / BLOCK)
    if args.num_seqs * per_seq > num_blocks:
        raise SystemExit(f"{args.num_seqs} x {args.seq_len} tokens do not fit {num_blocks} blocks")
    pages = {"4 KiB": caches(num_blocks, huge=False), "2 MiB": caches(num_blocks, huge=True)}
    g = torch.Generator().manual_seed(0)
    tables = {"consecutive": torch.arange(args.num_seqs * per_seq),
              "scattered": torch.randperm(num_blocks, generator=g)[:args.num_seqs * per_seq]}
    seq_lens = torch.full((args.num_seqs,), args.seq_len, dtype=torch.int32)
    query_start = torch.arange(args.num_seqs + 1, dtype=torch.int32)
    q = torch.randn(args.num_seqs, HEADS * HEAD_DIM).to(torch.bfloat16)
    kv_bytes = LAYERS * args.num_seqs * args.seq_len * block_bytes / BLOCK

    print(f"decode attention, {args.num_seqs} x {args.seq_len} tokens, {LAYERS} layers, "
          f"{args.cache_gib:g} GiB cache, {torch.get_num_threads()} threads")
    print(f"{'blocks':<12} {'pages':>6} {'best ms':>8} {'median ms':>10} {'GB/s':>6}")
    for layout, table in tables.items():
        table = table.to(torch.int32).view(args.num_seqs, per_seq)

        def step(name: str) -> None:
            for k, v in pages[name]:
                ops.paged_attention(q, k, v, table, seq_lens, query_start, HEAD_DIM**-0.5)

        times: dict[str, list[float]] = {name: [] for name in pages}
        for name in pages:
            step(name)
        for _ in range(args.rounds):
            for name in pages:  # alternately: the VM's drift meets both
                start = time.perf_counter()
                for _ in range(5):
                    step(name)
                times[name].append((time.perf_counter() - start) / 5)
        best = {name: min(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"{layout:<12} {name:>6} {best[name] * 1e3:>8.2f} {sorted(t)[len(t) // 2] * 1e3:>10.2f} "
                  f"{kv_bytes / best[name] / 1e9:>6.1f}")
        print(f"{layout:<12} 4 KiB / 2 MiB = {best['4 KiB'] / best['2 MiB']:.2f}x")


if __name__ == "__main__":
    main()
