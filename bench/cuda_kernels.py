"""Benchmark of corellm's CUDA kernels on a GPU: decode paged attention (achieved GB/s of the KV
cache read, and % of the GPU's bandwidth: a device-to-device copy measured in the same run, and
the nominal HBM peak when the GPU is known) at batch 1 / 16 / 64 x context 512 / 2k / 8k, for
SmolLM2-135M's heads (9 query, 3 KV, 64 dims) and a Llama-3-8B-like config (32, 8, 128); and the
elementwise ops at decode and prefill sizes; the sampler at batch 256 over a 151k vocabulary.
Timed with CUDA events.

    python bench/cuda_kernels.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math

import torch

from corellm import ops

NOMINAL_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100": 2000.0, "A100-SXM4-80GB": 2039.0, "A100": 1555.0}
SHAPES = {"SmolLM2-135M": (9, 3, 64), "Llama-3-8B": (32, 8, 128)}
BLOCK = 16


def cuda_time(fn, iters: int = 50) -> float:
    """Seconds per call launched from Python one after another (median of 5 batches of `iters`):
    for a kernel shorter than its launch path (Python checks, pybind11, the driver) this is the
    launch path's time, as an eager caller sees it."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    return sorted(samples)[2]


def cuda_graph_time(fn, iters: int = 20) -> float:
    """Seconds per call on the GPU alone: `iters` calls captured in one CUDA graph, the graph
    replayed (median of 5 replays), so no launch path is in the figure (a decode step's graph
    runs its kernels this way). Raises what the capture raises."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # first calls (lazy initialisation, kernel attributes) outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    samples = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) / 1e3 / iters)
    del graph
    return sorted(samples)[2]


def copy_bandwidth() -> float:
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    return 2 * a.numel() / cuda_time(lambda: b.copy_(a), iters=10) / 1e9


def nominal_peak() -> float | None:
    name = torch.cuda.get_device_name()
    return next((v for k, v in NOMINAL_GBPS.items() if k in name), None)


def decode_attention_rows(dtype: torch.dtype) -> list[dict]:
    rows = []
    for model, (heads, kv_heads, head) in SHAPES.items():
        for batch in (1, 16, 64):
            for ctx in (512, 2048, 8192):
                per = math.ceil(ctx / BLOCK)
                nb = batch * per
                ks, vs = ops.kv_cache_shapes(nb, kv_heads, head, BLOCK, dtype)
                kc = torch.randn(ks, device="cuda").to(dtype)
                vc = torch.randn(vs, device="cuda").to(dtype)
                table = torch.randperm(nb, device="cuda").to(torch.int32).view(batch, per)
                seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
                qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda")
                q = torch.randn(batch, heads * head, device="cuda").to(dtype)
                t = cuda_time(lambda: ops.paged_attention(q, kc, vc, table, seq_lens, qsl, head**-0.5,  # noqa: B023
                                                          max_query_len=1, max_seq_len=ctx))  # noqa: B023
                nbytes = 2 * batch * ctx * kv_heads * head * dtype.itemsize
                rows.append({"kernel": "paged_attention decode", "model": model, "batch": batch, "context": ctx,
                             "dtype": str(dtype).replace("torch.", ""), "us": t * 1e6, "GBps": nbytes / t / 1e9})
                del kc, vc
    return rows


def elementwise_rows(dtype: torch.dtype) -> list[dict]:
    rows = []
    for tokens in (64, 8192):
        x = torch.randn(tokens, 4096, device="cuda").to(dtype)
        r = torch.randn_like(x)
        w = torch.randn(4096, device="cuda").to(dtype)
        gu = torch.randn(tokens, 2 * 14336, device="cuda").to(dtype)
        for name, fn, nbytes in (
            ("rms_norm", lambda: ops.rms_norm(x, w, 1e-5), 2 * x.numel() * dtype.itemsize),
            ("fused_add_rms_norm", lambda: ops.fused_add_rms_norm(x, r, w, 1e-5), 4 * x.numel() * dtype.itemsize),
            ("silu_and_mul", lambda: ops.silu_and_mul(gu), 3 * gu.numel() // 2 * dtype.itemsize),
        ):
            t = cuda_time(fn)
            rows.append({"kernel": name, "model": "4096 / 14336", "batch": tokens, "context": 0,
                         "dtype": str(dtype).replace("torch.", ""), "us": t * 1e6, "GBps": nbytes / t / 1e9})
    return rows


def sampler_rows() -> list[dict]:
    """The sampler at batch 256 over a 151,936-token vocabulary (Qwen's): each call restores the
    logits first (the sampler processes them in place); the restore's own time is subtracted."""
    from corellm.ops import SamplingMetadata

    n, vocab = 256, 151936
    pristine = torch.randn(n, vocab, device="cuda") * 4
    logits = torch.empty_like(pristine)
    restore = cuda_time(lambda: logits.copy_(pristine))
    cases = {"greedy": dict(temperature=0.0), "T=0.8 top_p=0.9": dict(temperature=0.8, top_p=0.9),
             "T=0.8 top_k=50": dict(temperature=0.8, top_k=50),
             "T=0.8 top_p=0.9 top_k=50 min_p=0.05": dict(temperature=0.8, top_p=0.9, top_k=50, min_p=0.05),
             "greedy + 5 logprobs": dict(temperature=0.0, num_logprobs=5)}
    rows = []
    for name, c in cases.items():
        md = SamplingMetadata(temperature=torch.full((n,), c["temperature"], device="cuda"),
                              seeds=torch.arange(n, dtype=torch.int64, device="cuda"),
                              steps=torch.zeros(n, dtype=torch.int64, device="cuda"),
                              num_logprobs=c.get("num_logprobs", -1))
        if "top_p" in c:
            md.top_p = torch.full((n,), c["top_p"], device="cuda")
        if "top_k" in c:
            md.top_k = torch.full((n,), c["top_k"], dtype=torch.int32, device="cuda")
        if "min_p" in c:
            md.min_p = torch.full((n,), c["min_p"], device="cuda")
        t = cuda_time(lambda: (logits.copy_(pristine), ops.sample(logits, md))) - restore  # noqa: B023
        rows.append({"kernel": f"sample {name}", "model": f"vocab {vocab}", "batch": n, "context": 0,
                     "dtype": "float32", "us": t * 1e6, "GBps": logits.numel() * 4 / t / 1e9})
    return rows


# Llama-3-8B's projections (n, k): qkv, o, gate_up, down.
GEMM_SHAPES = {"qkv 6144x4096": (6144, 4096), "o 4096x4096": (4096, 4096), "gate_up 28672x4096": (28672, 4096),
               "down 4096x14336": (4096, 14336)}
GEMM_ROWS = (1, 16, 64, 512, 2048, 8192)


def scaled_gemm_rows() -> list[dict]:
    """W8A8 (--quantization fp8 / int8): corellm's CUTLASS scaled GEMM, on activations already
    quantized ("gemm") and with their per-token quantization ("+quant", what a layer runs), against
    the bf16 product torch runs (cuBLAS) and, for fp8, torch._scaled_mm (cuBLASLt) with the same
    scales. Each kind twice: on the GPU alone (its calls in a CUDA graph: the kernels' speed, and
    what the ratios and the target use) and launched one by one from Python (what an eager caller
    pays, the launch path included): TFLOP/s and the ratio to bf16 timed the same way."""
    from corellm.model.scaled_weight import ScaledWeight
    from corellm.ops.scaled_gemm import scaled_gemm_built

    if not scaled_gemm_built() or torch.cuda.get_device_capability() != (9, 0):
        print("scaled GEMM: not run (needs corellm._cuda built with CUTLASS, and a Hopper GPU)\n")
        return []
    rows = []
    for shape_name, (n, k) in GEMM_SHAPES.items():
        w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
        weights = {q: ScaledWeight.quantize(w, q) for q in ("fp8", "int8")}
        for m in GEMM_ROWS:
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            out = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
            calls = {"bf16 torch": lambda: torch.matmul(x, w.T, out=out)}  # noqa: B023
            for q, sw in weights.items():
                a, a_scales = ops.quantize_rows(x, q)
                calls[f"{q} gemm"] = lambda a=a, s=a_scales, sw=sw: ops.scaled_gemm(a, s, sw.weight, sw.scales, out=out)  # noqa: B023
                calls[f"{q} +quant"] = lambda sw=sw: sw.matmul(x)  # noqa: B023
                if q == "fp8" and m % 16 == 0:  # cuBLASLt's fp8 needs every dimension a multiple of 16
                    wt, ws, xs = sw.weight.T, sw.scales.view(1, -1), a_scales.view(-1, 1)
                    calls["fp8 torch._scaled_mm"] = lambda a=a, wt=wt, ws=ws, xs=xs: torch._scaled_mm(
                        a, wt, scale_a=xs, scale_b=ws, out_dtype=torch.bfloat16)
            times: dict[str, tuple[float | None, float | None]] = {}
            for kind, fn in calls.items():
                try:
                    eager = cuda_time(fn, iters=20)
                except (RuntimeError, AttributeError) as e:
                    print(f"{kind} at m={m}, {shape_name}: not run ({str(e).splitlines()[0]})")
                    continue
                try:
                    graph = cuda_graph_time(fn)
                except (RuntimeError, AttributeError) as e:
                    print(f"{kind} at m={m}, {shape_name}: not captured in a CUDA graph ({str(e).splitlines()[0]})")
                    graph = None
                times[kind] = (graph, eager)
            flops = 2 * m * n * k
            bf16_graph, bf16_eager = times["bf16 torch"]
            for kind, (graph, eager) in times.items():
                rows.append({"shape": shape_name, "m": m, "kind": kind,
                             "us": None if graph is None else graph * 1e6,
                             "TFLOPs": None if graph is None else flops / graph / 1e12,
                             "vs_bf16": None if graph is None or bf16_graph is None else bf16_graph / graph,
                             "eager_us": eager * 1e6, "eager_vs_bf16": bf16_eager / eager})
    print(f"{'scaled GEMM (W8A8)':<22} {'m':>5} {'kind':<22} {'graph us':>9} {'TFLOP/s':>8} {'x bf16':>7} "
          f"{'eager us':>9} {'x bf16':>7}")

    def fmt(v: float | None, spec: str, suffix: str = "") -> str:
        return "-" if v is None else f"{v:{spec}}{suffix}"

    for r in rows:
        print(f"{r['shape']:<22} {r['m']:>5} {r['kind']:<22} {fmt(r['us'], '9.1f')} {fmt(r['TFLOPs'], '8.1f')} "
              f"{fmt(r['vs_bf16'], '6.2f', 'x'):>7} {r['eager_us']:>9.1f} {r['eager_vs_bf16']:>6.2f}x")
    big = [r for r in rows if r["kind"] == "fp8 gemm" and r["m"] >= 512 and r["vs_bf16"] is not None]
    if big:
        print(f"\nfp8 gemm at m >= 512, on the GPU alone (CUDA graphs): {min(r['vs_bf16'] for r in big):.2f}x to "
              f"{max(r['vs_bf16'] for r in big):.2f}x the bf16 product (target >= 1.6x)\n")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the rows here")
    report(p.parse_args().json)


def report(json_path: str | None) -> None:
    """Runs every row, prints the table, writes the rows to json_path when given."""
    from corellm.ops._backend import cuda_available

    if not (torch.cuda.is_available() and cuda_available()):
        raise SystemExit("cuda_kernels.py needs an NVIDIA GPU, a CUDA build of torch and corellm._cuda "
                         f"(torch sees a GPU: {torch.cuda.is_available()}; corellm._cuda built: {cuda_available()})")
    copy = copy_bandwidth()
    peak = nominal_peak()
    print(f"{torch.cuda.get_device_name()}: device copy {copy:.0f} GB/s, nominal peak "
          f"{'unknown' if peak is None else f'{peak:.0f} GB/s'}\n")
    gemm_rows = scaled_gemm_rows()
    rows = decode_attention_rows(torch.bfloat16) + elementwise_rows(torch.bfloat16) + sampler_rows()
    print(f"{'kernel':<44} {'model':<14} {'batch':>6} {'context':>8} {'us':>10} {'GB/s':>9} {'% copy':>7} {'% peak':>7}")
    for r in rows:
        r["pct_copy"] = 100 * r["GBps"] / copy
        r["pct_peak"] = None if peak is None else 100 * r["GBps"] / peak
        pct_peak = "-" if r["pct_peak"] is None else f"{r['pct_peak']:.0f}%"
        print(f"{r['kernel']:<44} {r['model']:<14} {r['batch']:>6} {r['context']:>8} {r['us']:>10.1f} "
              f"{r['GBps']:>9.0f} {r['pct_copy']:>6.0f}% {pct_peak:>7}")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_GBps": copy, "peak_GBps": peak, "rows": rows,
                       "scaled_gemm": gemm_rows}, f, indent=1)


if __name__ == "__main__":
    main()
