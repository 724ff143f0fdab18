"""Benchmark of corellm's kernels against torch-only implementations of the same ops, at
SmolLM2-135M's decode and prefill shapes, in one run. Prints a table (time, achieved GB/s or
GFLOP/s, ratio torch time / corellm time) and, with --json, writes the rows.

    .venv/bin/python bench/kernels.py [--threads N] [--linear-only] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from corellm import _core, ops
from corellm.model.rope import cos_sin_cache

# SmolLM2-135M
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 576, 1536, 9, 3, 64, 49152
LAYERS = 30
BLOCK = 16


def timeit(fn: Callable[[], object], min_time: float = 0.3, repeats: int = 5) -> float:
    """Median seconds per call."""
    fn()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.05:
        fn()
        n += 1
    per_batch = max(1, int(n * min_time / 0.05 / repeats))
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter() - t) / per_batch)
    return statistics.median(samples)


def memory_bandwidth() -> float:
    """GB/s of a large torch copy (read + write), the machine's practical ceiling."""
    a = torch.empty(64 * 1024 * 1024, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    t = timeit(lambda: b.copy_(a), min_time=0.5)
    return 2 * a.numel() * 4 / t / 1e9


# ---------------------------------------------------------------- torch-only implementations

def torch_rms_norm(x, w, eps=1e-5):
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def torch_fused_add_rms_norm(x, r, w, eps=1e-5):
    r = x + r
    return torch_rms_norm(r, w, eps), r


def torch_silu_and_mul(x):
    d = x.shape[1] // 2
    return F.silu(x[:, :d]) * x[:, d:]


def torch_rotary(positions, q, k, cache):
    cos, sin = cache[positions.long()].chunk(2, dim=-1)
    out = []
    for x in (q, k):
        h = x.view(x.shape[0], -1, HEAD_DIM).float()
        x1, x2 = h[..., : HEAD_DIM // 2], h[..., HEAD_DIM // 2 :]
        c, s = cos[:, None], sin[:, None]
        out.append(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1).to(x.dtype))
    return out


def torch_reshape_and_cache(k, v, kc, vc, slots):
    """Scatter into corellm's cache layout with torch advanced indexing."""
    x = kc.shape[-1]
    n = slots.shape[0]
    b, o = (slots.long() // BLOCK)[:, None, None], (slots.long() % BLOCK)[:, None, None]
    h, d = torch.arange(KV_HEADS)[None, :, None], torch.arange(HEAD_DIM)[None, None, :]
    kc[b, h, d // x, o, d % x] = k.view(n, KV_HEADS, HEAD_DIM)
    vc[b, h, o // x, d, o % x] = v.view(n, KV_HEADS, HEAD_DIM)


def torch_paged_attention(q, kc, vc, table, seq_lens, qsl):
    """Gather each sequence's K/V through its block table, then SDPA (causal over the tail)."""
    outs = []
    for s in range(table.shape[0]):
        L = int(seq_lens[s])
        a, b = int(qsl[s]), int(qsl[s + 1])
        blocks = table[s, : math.ceil(L / BLOCK)].long()
        k, v = ops.unpack_kv_cache(kc[blocks], vc[blocks])
        k, v = k.reshape(-1, KV_HEADS, HEAD_DIM)[:L], v.reshape(-1, KV_HEADS, HEAD_DIM)[:L]
        qs = q[a:b].view(b - a, HEADS, HEAD_DIM).transpose(0, 1)
        n = b - a
        mask = torch.arange(L)[None, :] <= torch.arange(L - n, L)[:, None]
        o = F.scaled_dot_product_attention(qs, k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask,
                                           scale=HEAD_DIM**-0.5, enable_gqa=True)
        outs.append(o.transpose(0, 1).reshape(n, -1))
    return torch.cat(outs)


def torch_sample(logits, temperature, top_p):
    probs = torch.softmax(logits / temperature[:, None], -1)
    sorted_p, idx = probs.sort(-1, descending=True)
    cum = sorted_p.cumsum(-1)
    sorted_p[(cum - sorted_p) > top_p[:, None]] = 0
    choice = torch.multinomial(sorted_p, 1)
    return idx.gather(-1, choice)


def torch_sample_top_k(logits, temperature, top_k):
    values, idx = (logits / temperature[:, None]).topk(top_k, -1)
    choice = torch.multinomial(torch.softmax(values, -1), 1)
    return idx.gather(-1, choice)


# ---------------------------------------------------------------- cases

def attention_batch(num_seqs, seq_len, q_len, dtype):
    blocks_per_seq = math.ceil(seq_len / BLOCK)
    nb = num_seqs * blocks_per_seq
    k_shape, v_shape = ops.kv_cache_shapes(nb, KV_HEADS, HEAD_DIM, BLOCK, dtype)
    kc, vc = torch.randn(k_shape).to(dtype), torch.randn(v_shape).to(dtype)
    table = torch.randperm(nb).to(torch.int32).view(num_seqs, blocks_per_seq)
    seq_lens = torch.full((num_seqs,), seq_len, dtype=torch.int32)
    qsl = torch.arange(0, num_seqs + 1, dtype=torch.int32) * q_len
    q = torch.randn(num_seqs * q_len, HEADS * HEAD_DIM).to(dtype)
    return q, kc, vc, table, seq_lens, qsl


class TorchLinearPeer:
    """torch's fastest CPU linear for bf16 weights on this CPU: oneDNN on a prepacked weight where its
    bf16 GEMM runs (AVX-512-BW, AVX-NE-CONVERT or AMX); on an AVX2-only CPU oneDNN has no bf16 path and
    torch's own bf16 linear is ~6x slower than MKL's fp32 one, so there the peer is MKL on fp32 copies
    of the weights and activations (made once, outside the timing)."""

    def __init__(self):
        try:
            torch.ops.mkldnn._reorder_linear_weight(torch.zeros(16, 16, dtype=torch.bfloat16), None)
            self.onednn = True
        except RuntimeError:  # "bf16 path needs the cpu support avx_ne_convert or avx512bw ..."
            self.onednn = False
        self.name = "oneDNN bf16" if self.onednn else "MKL fp32"

    def weight(self, w: torch.Tensor):
        return torch.ops.mkldnn._reorder_linear_weight(w, None) if self.onednn else w.float()

    def input(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.onednn else x.float()

    def __call__(self, x: torch.Tensor, w) -> torch.Tensor:
        if self.onednn:
            return torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], "")
        return F.linear(x, w)


def add_linear_cases(add) -> None:
    """corellm's packed bf16 GEMM, on each instruction-set path this CPU runs, against torch's fastest
    CPU linear for these weights (TorchLinearPeer, named in the row): every projection of a SmolLM2-sized
    model (30 layers of random weights, and the LM head), so that the weights come from memory
    as in a real step. Each row also gives the fraction of the path's dot-product peak, measured
    by a micro-kernel in the same run (peak_GFLOPps)."""
    shapes = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM), (2 * INTER, HIDDEN),
              (HIDDEN, INTER)] * LAYERS + [(VOCAB, HIDDEN)]
    peer = TorchLinearPeer()
    ours, theirs = [], []
    for n, k in shapes:
        w = torch.randn(n, k).bfloat16()
        packed = torch.empty(_core.kernels.bf16_gemm_packed_size(n, k), dtype=torch.bfloat16)
        _core.kernels.bf16_gemm_pack(w.data_ptr(), packed.data_ptr(), n, k)
        ours.append((packed, n, k))
        theirs.append(peer.weight(w))
    flops_per_row = 2 * sum(n * k for n, k in shapes)
    for isa in _core.kernels.supported_cpu_isas():
        peak = dot_peak_gflops(isa)
        for m in (1, 16, 64, 512, 2048):
            xs = {k: torch.randn(m, k).bfloat16() for k in (HIDDEN, INTER)}
            peer_xs = {k: peer.input(x) for k, x in xs.items()}
            y = torch.empty(m * VOCAB, dtype=torch.bfloat16)

            def corellm_linears():
                for packed, n, k in ours:
                    x = xs[k]
                    _core.kernels.bf16_gemm(x.data_ptr(), k, packed.data_ptr(), 0, y.data_ptr(), n, m, n, k, isa=isa)

            def torch_linears():
                for w, (n, k) in zip(theirs, shapes):
                    peer(peer_xs[k], w)

            row = add(f"linear (whole model) [{isa} / {peer.name}]", f"{m} rows", corellm_linears, torch_linears,
                      flops=m * flops_per_row)
            row["peak_GFLOPps"] = peak
            row["of_peak"] = row["corellm_GFLOPps"] / peak


def add_quantized_linear_cases(add) -> None:
    """corellm's quantized GEMM (quant_gemm.h) on a model's worth of weights in a GGUF type
    (random values; the K types on the down projections only, whose k is a multiple of 256),
    against torch's fastest linear on the same shapes (TorchLinearPeer): GB/s counts the quantized weight's bytes."""
    import gguf
    import numpy as np

    from corellm.model.quantized_tensor import QuantizedTensor, quant_path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/quant_blocks.py makes the K types
    from tests.quant_blocks import quantize

    legacy = [((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), (HIDDEN, HEADS * HEAD_DIM), (2 * INTER, HIDDEN),
              (HIDDEN, INTER)] * LAYERS
    peer = TorchLinearPeer()
    for type_name in ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"):
        shapes = [(HIDDEN, INTER)] * LAYERS if type_name.endswith(("_K", "_XS")) else legacy
        rng = np.random.default_rng(0)
        ggml_type = int(getattr(gguf.GGMLQuantizationType, type_name))
        first = [QuantizedTensor.pack(ggml_type, quantize(rng.standard_normal((n, k)).astype(np.float32) * 0.05,
                                                          type_name), (n, k)) for n, k in shapes[:4]]
        # One layer's weights quantized, copied to every layer (each from memory in a step, as in a model).
        weights = [QuantizedTensor(t.ggml_type, t.shape, t.packed.clone()) for _ in range(LAYERS) for t in first]
        weights = weights[: len(shapes)]
        theirs = [peer.weight(torch.randn(n, k).bfloat16()) for n, k in shapes]
        nbytes = sum(w.nbytes for w in weights)
        for m in (1, 16, 64, 512):
            xs = {k: torch.randn(m, k).bfloat16() for k in (HIDDEN, INTER)}
            ys = {n: torch.empty(m, n, dtype=torch.bfloat16) for n, _ in shapes}
            peer_xs = {k: peer.input(x) for k, x in xs.items()}

            def corellm_linears():
                for w in weights:
                    w.matmul_into(xs[w.shape[1]], ys[w.shape[0]])

            def torch_linears():
                for w, (n, k) in zip(theirs, shapes):
                    peer(peer_xs[k], w)

            add(f"quantized linear [{type_name}, {quant_path()} / {peer.name}]", f"{m} rows", corellm_linears,
                torch_linears,
                nbytes=nbytes, flops=2 * m * sum(n * k for n, k in shapes))


def dot_peak_gflops(isa: str) -> float:
    """GFLOP/s of the path's dot-product micro-kernel on every thread (operands in registers)."""
    iterations = 200_000
    t = timeit(lambda: _core.kernels.bf16_dot_peak(isa, iterations), min_time=0.2, repeats=3)
    return _core.kernels.bf16_dot_peak(isa, iterations) / t / 1e9


def run(dtype: torch.dtype, linear_only: bool = False) -> list[dict]:
    rows = []
    esize = torch.finfo(dtype).bits // 8

    def add(name, shape, ours, theirs, nbytes=None, flops=None):
        t_ours, t_torch = timeit(ours), timeit(theirs)
        row = {"kernel": name, "shape": shape, "dtype": str(dtype).replace("torch.", ""),
               "corellm_us": t_ours * 1e6, "torch_us": t_torch * 1e6, "speedup": t_torch / t_ours}
        if nbytes:
            row["corellm_GBps"] = nbytes / t_ours / 1e9
            row["torch_GBps"] = nbytes / t_torch / 1e9
        if flops:
            row["corellm_GFLOPps"] = flops / t_ours / 1e9
            row["torch_GFLOPps"] = flops / t_torch / 1e9
        rows.append(row)
        return row

    if linear_only:
        if dtype == torch.bfloat16 and _core.kernels.bf16_gemm_available():
            add_linear_cases(add)
            add_quantized_linear_cases(add)
        return rows

    for tokens, label in ((16, "decode 16"), (512, "prefill 512")):
        x = torch.randn(tokens, HIDDEN).to(dtype)
        w = torch.randn(HIDDEN).to(dtype)
        r = torch.randn(tokens, HIDDEN).to(dtype)
        add("rms_norm", f"{label} x {HIDDEN}", lambda: ops.rms_norm(x, w, 1e-5), lambda: torch_rms_norm(x, w),
            nbytes=2 * x.numel() * esize)
        add("fused_add_rms_norm", f"{label} x {HIDDEN}", lambda: ops.fused_add_rms_norm(x, r, w, 1e-5),
            lambda: torch_fused_add_rms_norm(x, r, w), nbytes=4 * x.numel() * esize)
        gu = torch.randn(tokens, 2 * INTER).to(dtype)
        add("silu_and_mul", f"{label} x {2 * INTER}", lambda: ops.silu_and_mul(gu), lambda: torch_silu_and_mul(gu),
            nbytes=3 * tokens * INTER * esize)
        # A real cos / sin table: rotations keep q and k's size over the timed repetitions (which
        # rotate in place); a random one grew them to infinities and denormals, timing those instead.
        inv_freq = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
        cache = cos_sin_cache(None, 8192, inv_freq=inv_freq)
        pos = torch.randint(0, 8192, (tokens,), dtype=torch.int32)
        qkv = torch.randn(tokens, (HEADS + 2 * KV_HEADS) * HEAD_DIM).to(dtype)
        q, k = qkv[:, : HEADS * HEAD_DIM], qkv[:, HEADS * HEAD_DIM : (HEADS + KV_HEADS) * HEAD_DIM]
        add("rotary_embedding", f"{label}, 9+3 heads", lambda: ops.rotary_embedding(pos, q, k, HEAD_DIM, cache),
            lambda: torch_rotary(pos, q, k, cache), nbytes=2 * (q.numel() + k.numel()) * esize)
        nb = tokens // BLOCK + 64
        k_shape, v_shape = ops.kv_cache_shapes(nb, KV_HEADS, HEAD_DIM, BLOCK, dtype)
        kc, vc = torch.zeros(k_shape, dtype=dtype), torch.zeros(v_shape, dtype=dtype)
        slots = torch.randperm(nb * BLOCK)[:tokens].to(torch.int32)
        kk, vv = torch.randn(tokens, KV_HEADS * HEAD_DIM).to(dtype), torch.randn(tokens, KV_HEADS * HEAD_DIM).to(dtype)
        add("reshape_and_cache", f"{label}", lambda: ops.reshape_and_cache(kk, vv, kc, vc, slots),
            lambda: torch_reshape_and_cache(kk, vv, kc, vc, slots), nbytes=4 * kk.numel() * esize)

    for num_seqs, seq_len in ((1, 1024), (16, 1024), (64, 512)):
        q, kc, vc, table, seq_lens, qsl = attention_batch(num_seqs, seq_len, 1, dtype)
        kv_bytes = 2 * num_seqs * seq_len * KV_HEADS * HEAD_DIM * esize
        add("paged_attention", f"decode {num_seqs} x {seq_len}",
            lambda: ops.paged_attention(q, kc, vc, table, seq_lens, qsl, HEAD_DIM**-0.5),
            lambda: torch_paged_attention(q, kc, vc, table, seq_lens, qsl), nbytes=kv_bytes)
        if dtype == torch.bfloat16:  # the same over an 8-bit cache (kv_cache_dtype fp8); torch on it widened
            k8, v8 = kc.to(torch.float8_e4m3fn), vc.to(torch.float8_e4m3fn)
            kw, vw = k8.to(dtype), v8.to(dtype)
            add("paged_attention (fp8 e4m3 cache)", f"decode {num_seqs} x {seq_len}",
                lambda: ops.paged_attention(q, k8, v8, table, seq_lens, qsl, HEAD_DIM**-0.5),
                lambda: torch_paged_attention(q, kw, vw, table, seq_lens, qsl), nbytes=kv_bytes // 2)
    for num_seqs, seq_len in ((1, 512), (4, 256)):
        q, kc, vc, table, seq_lens, qsl = attention_batch(num_seqs, seq_len, seq_len, dtype)
        flops = 4 * num_seqs * HEADS * HEAD_DIM * seq_len * (seq_len + 1) / 2
        add("paged_attention", f"prefill {num_seqs} x {seq_len}",
            lambda: ops.paged_attention(q, kc, vc, table, seq_lens, qsl, HEAD_DIM**-0.5),
            lambda: torch_paged_attention(q, kc, vc, table, seq_lens, qsl), flops=flops)

    if dtype == torch.bfloat16 and _core.kernels.bf16_gemm_available():
        add_linear_cases(add)
        add_quantized_linear_cases(add)

    for n in (1, 16, 64):
        logits = torch.randn(n, VOCAB) * 3
        md = ops.SamplingMetadata(temperature=torch.full((n,), 0.8), seeds=torch.arange(n, dtype=torch.int64),
                                  steps=torch.zeros(n, dtype=torch.int64), top_p=torch.full((n,), 0.9))
        temp, top_p = md.temperature, md.top_p
        add("sample (T=0.8, top_p=0.9)", f"{n} x {VOCAB}", lambda: ops.sample(logits.clone(), md),
            lambda: torch_sample(logits.clone(), temp, top_p), nbytes=logits.numel() * 4)
        md_k = ops.SamplingMetadata(temperature=md.temperature, seeds=md.seeds, steps=md.steps,
                                    top_k=torch.full((n,), 50, dtype=torch.int32))
        add("sample (T=0.8, top_k=50)", f"{n} x {VOCAB}", lambda: ops.sample(logits.clone(), md_k),
            lambda: torch_sample_top_k(logits.clone(), temp, 50), nbytes=logits.numel() * 4)
        md0 = ops.SamplingMetadata(temperature=torch.zeros(n), seeds=md.seeds, steps=md.steps)
        add("sample (greedy)", f"{n} x {VOCAB}", lambda: ops.sample(logits.clone(), md0),
            lambda: logits.clone().argmax(-1), nbytes=logits.numel() * 4)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads (default: all cores)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32", "both"], default="both")
    parser.add_argument("--json", help="write the rows to this file")
    parser.add_argument("--linear-only", action="store_true", help="only the bf16 and quantized GEMM rows")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: the GPU benchmark instead (bench/cuda_kernels.py)")
    args = parser.parse_args()
    if args.device == "cuda":
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        import cuda_kernels

        return cuda_kernels.report(args.json)
    if args.threads:
        torch.set_num_threads(args.threads)
    bw = memory_bandwidth()
    isa = _core.kernels.cpu_isa() if _core.kernels.bf16_gemm_available() else "none"
    print(f"CPU: {_core.kernels.cpu_model_name()}   kernel path: {isa} (runs: "
          f"{', '.join(_core.kernels.supported_cpu_isas()) or 'none'})")
    print(f"threads: {torch.get_num_threads()}   memory bandwidth (torch copy): {bw:.1f} GB/s\n")
    dtypes = [torch.bfloat16, torch.float32] if args.dtype == "both" else [getattr(torch, args.dtype)]
    rows = [row for dt in dtypes for row in run(dt, linear_only=args.linear_only)]
    head = f"{'kernel':<50} {'shape':<22} {'dtype':<9} {'corellm us':>11} {'torch us':>10} {'speedup':>8}  achieved"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "corellm_GBps" in r:
            extra = f"{r['corellm_GBps']:.1f} GB/s ({100 * r['corellm_GBps'] / bw:.0f}% of bw) vs {r['torch_GBps']:.1f}"
        else:
            extra = f"{r['corellm_GFLOPps']:.1f} GFLOP/s vs {r['torch_GFLOPps']:.1f}"
            if "of_peak" in r:
                extra += f" ({100 * r['of_peak']:.0f}% of the path's {r['peak_GFLOPps']:.0f} peak)"
        print(f"{r['kernel']:<50} {r['shape']:<22} {r['dtype']:<9} {r['corellm_us']:>11.1f} {r['torch_us']:>10.1f} "
              f"{r['speedup']:>7.2f}x  {extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": _core.kernels.cpu_model_name(), "isa": isa, "threads": torch.get_num_threads(),
                       "bandwidth_GBps": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
