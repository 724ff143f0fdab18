"""Offline throughput, like `vllm bench throughput`: N random-token prompts, each generating
exactly its output length (ignore_eos), through corellm's LLM and, with --backend hf, through HF
transformers' batched generate on the same prompts in the same run. Lengths are fixed (128) or
ranges (100:1024: each request draws its own, as nano-vllm's bench). On the CPU it also prints
the run's compute floor.

    .venv/bin/python bench/throughput.py --num-prompts 64 --input-len 128 --output-len 128 --backend both
    python bench/throughput.py --device cuda --random-model qwen3-0.6b --num-prompts 256 \
        --input-len 100:1024 --output-len 100:1024
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import torch


def length_range(text: str) -> tuple[int, int]:
    """'128' -> (128, 128); '100:1024' -> (100, 1024)."""
    lo, _, hi = text.partition(":")
    try:
        lo_i, hi_i = int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a length or LO:HI, got {text!r}") from None
    if not 1 <= lo_i <= hi_i:
        raise argparse.ArgumentTypeError(f"expected 1 <= LO <= HI, got {text!r}")
    return lo_i, hi_i


def random_requests(num: int, input_len: tuple[int, int], output_len: tuple[int, int], vocab_size: int,
                    seed: int) -> tuple[list[list[int]], list[int]]:
    """(prompts, output lengths): lengths uniform in their ranges, token ids uniform (avoiding the
    lowest ids: special tokens in most vocabularies)."""
    g = torch.Generator().manual_seed(seed)
    ins = torch.randint(input_len[0], input_len[1] + 1, (num,), generator=g).tolist()
    outs = torch.randint(output_len[0], output_len[1] + 1, (num,), generator=g).tolist()
    prompts = [torch.randint(100, vocab_size, (n,), generator=g).tolist() for n in ins]
    return prompts, outs


def run_flops(config, lengths: list[tuple[int, int]]) -> float:
    """Floating-point operations the run cannot avoid, over its (input, output) lengths: every
    linear layer for every token fed to the model (the prompt, then each output token but the
    last), the LM head for every sampled token, and causal attention (QK and PV) of each fed token
    over the keys up to its own."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_token = 2 * c.num_hidden_layers * (c.hidden_size * (q + 2 * kv) + q * c.hidden_size
                                           + 3 * c.hidden_size * c.intermediate_size)
    total = 0
    for input_len, output_len in lengths:
        fed = input_len + output_len - 1  # positions 0 .. fed - 1 go through the layers
        keys = fed * (fed + 1) // 2  # sum over positions p of the p + 1 keys p attends to
        total += fed * per_token + 4 * c.num_hidden_layers * q * keys + output_len * 2 * c.vocab_size * c.hidden_size
    return total


def gemm_peak_flops() -> float:
    """corellm's bf16 GEMM at its best shape on this machine now (512 rows x a 576 x 1536 weight,
    the MLP's), in FLOP/s: the compute floor's rate. float('nan') where the CPU lacks AVX2 and FMA."""
    from corellm import _core

    if not _core.kernels.bf16_gemm_available():
        return float("nan")
    m, n, k = 512, 1536, 576
    w = torch.randn(n, k).bfloat16()
    packed = torch.empty(_core.kernels.bf16_gemm_packed_size(n, k), dtype=torch.bfloat16)
    _core.kernels.bf16_gemm_pack(w.data_ptr(), packed.data_ptr(), n, k)
    x, y = torch.randn(m, k).bfloat16(), torch.empty(m, n, dtype=torch.bfloat16)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            _core.kernels.bf16_gemm(x.data_ptr(), k, packed.data_ptr(), 0, y.data_ptr(), n, m, n, k)
        best = min(best, (time.perf_counter() - t0) / 20)
    return 2 * m * n * k / best


def run_corellm(args, prompts: list[list[int]], output_lens: list[int]) -> dict:
    from corellm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(args.model, dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens,
              max_model_len=args.input_len[1] + args.output_len[1] + 16,
              tensor_parallel_size=args.tensor_parallel_size, disable_custom_all_reduce=args.disable_custom_all_reduce,
              **({"block_size": args.block_size} if args.block_size else {}),
              **({"quantization": args.quantization} if args.quantization else {}))
    load_s = time.perf_counter() - t0
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in output_lens]
    llm.generate([{"prompt_token_ids": p} for p in prompts[:2]], params[:2], use_tqdm=False)  # warm-up
    # The KV cache's memory is committed on a background thread after start-up (worker/kv_cache.py);
    # it is start-up work, which would otherwise take a core from the timed run on a small machine.
    committer = next((t for t in threading.enumerate() if t.name == "corellm-kv-commit"), None)
    if committer is not None:
        committer.join()
    t0 = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=not args.quiet)
    elapsed = time.perf_counter() - t0
    out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    assert out_tokens == sum(output_lens)
    llm.shutdown()
    return {"backend": "corellm", "elapsed_s": elapsed, "load_s": load_s, "output_tokens": out_tokens}


def run_hf(args, prompts: list[list[int]], output_lens: list[int]) -> dict:
    from hf_transformers import import_transformers

    transformers = import_transformers()

    from corellm.model.loader import resolve_model_path

    path = resolve_model_path(args.model)
    t0 = time.perf_counter()
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    if path.suffix == ".gguf":
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    model.eval()
    load_s = time.perf_counter() - t0
    ids = torch.tensor(prompts)  # equal lengths: no padding needed
    mask = torch.ones_like(ids)
    kwargs = dict(max_new_tokens=output_lens[0], min_new_tokens=output_lens[0], do_sample=False, pad_token_id=0)
    t0 = time.perf_counter()
    out_tokens = 0
    with torch.inference_mode():
        for i in range(0, len(prompts), args.hf_batch_size):
            out = model.generate(ids[i:i + args.hf_batch_size], attention_mask=mask[i:i + args.hf_batch_size], **kwargs)
            out_tokens += (out.shape[1] - ids.shape[1]) * out.shape[0]
    elapsed = time.perf_counter() - t0
    return {"backend": "hf", "elapsed_s": elapsed, "load_s": load_s, "output_tokens": out_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--random-model", default=None, metavar="SHAPE",
                        help="random bf16 weights of this shape (bench/random_model.py: qwen3-0.6b, llama-3.2-1b)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=length_range, default=(128, 128), help="a length, or LO:HI")
    parser.add_argument("--output-len", type=length_range, default=(128, 128), help="a length, or LO:HI")
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=None, help="KV block size (default: the engine's)")
    parser.add_argument("--quantization", default=None,
                        help="corellm's quantization= (default: the engine's: gguf for a .gguf file); none: bf16 weights")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="corellm's ranks (processes)")
    parser.add_argument("--disable-custom-all-reduce", action="store_true",
                        help="the ranks' all-reduces through gloo rather than shared memory")
    parser.add_argument("--backend", choices=["corellm", "hf", "both"], default="corellm")
    parser.add_argument("--hf-batch-size", type=int, default=64, help="prompts per HF generate call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results to this file")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    fixed = args.input_len[0] == args.input_len[1] and args.output_len[0] == args.output_len[1]
    if args.backend != "corellm" and not fixed:
        parser.error("--backend hf needs fixed lengths (its batched generate pads nothing here)")
    if args.random_model:
        import sys
        import tempfile
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from random_model import make_random_model

        args.model = str(make_random_model(args.random_model, Path(tempfile.gettempdir()) / f"corellm-{args.random_model}"))

    from corellm.model.loader import load_model_config

    config = load_model_config(args.model)
    prompts, output_lens = random_requests(args.num_prompts, args.input_len, args.output_len, config.vocab_size,
                                           args.seed)
    results = []
    if args.backend in ("corellm", "both"):
        results.append(run_corellm(args, prompts, output_lens))
    if args.backend in ("hf", "both"):
        results.append(run_hf(args, prompts, output_lens))
    total_in = sum(len(p) for p in prompts)
    span = lambda r: str(r[0]) if r[0] == r[1] else f"{r[0]}:{r[1]}"  # noqa: E731
    print(f"\n{args.num_prompts} prompts x ({span(args.input_len)} in, {span(args.output_len)} out), {args.dtype}, "
          f"{args.device}, "
          f"threads {torch.get_num_threads()}"
          + (f", quantization={args.quantization}" if args.quantization else "")
          + (f", corellm in {args.tensor_parallel_size} tensor-parallel ranks (all-reduce over "
             f"{'gloo' if args.disable_custom_all_reduce else 'shared memory'})" if args.tensor_parallel_size > 1 else ""))
    print(f"{'backend':<10} {'elapsed s':>10} {'req/s':>8} {'output tok/s':>13} {'total tok/s':>12}")
    for r in results:
        r["requests_per_s"] = args.num_prompts / r["elapsed_s"]
        r["output_tok_per_s"] = r["output_tokens"] / r["elapsed_s"]
        r["total_tok_per_s"] = (r["output_tokens"] + total_in) / r["elapsed_s"]
        print(f"{r['backend']:<10} {r['elapsed_s']:>10.2f} {r['requests_per_s']:>8.2f} {r['output_tok_per_s']:>13.1f} "
              f"{r['total_tok_per_s']:>12.1f}")
    if len(results) == 2:
        ratio = results[0]["output_tok_per_s"] / results[1]["output_tok_per_s"]
        print(f"corellm / hf output throughput: {ratio:.2f}x")
    floor = None
    if args.device == "cpu":
        floor = compute_floor(config, [(len(p), n) for p, n in zip(prompts, output_lens)], results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results, "compute_floor": floor}, f, indent=1)


def compute_floor(config, lengths: list[tuple[int, int]], results: list[dict]) -> dict:
    """The least time any exact bf16 engine needs on this CPU: the run's FLOPs at corellm's best
    GEMM rate, measured now (so in the same spell of this machine's speed as the run)."""
    flops = run_flops(config, lengths)
    peak = gemm_peak_flops()
    floor_s = flops / peak
    out_tokens = sum(n for _, n in lengths)
    print(f"\ncompute floor: {flops / 1e12:.2f} TFLOP (linear layers, LM head at sampled tokens, attention) "
          f"at {peak / 1e9:.0f} GFLOP/s (corellm's bf16 GEMM at 512 rows, now) = {floor_s:.2f} s, "
          f"{out_tokens / floor_s:.0f} output tok/s at most")
    for r in results:
        print(f"  {r['backend']:<8} runs at {floor_s / r['elapsed_s']:.0%} of the floor's speed")
    return {"flops": flops, "gemm_peak_flops": peak, "floor_s": floor_s, "floor_output_tok_per_s": out_tokens / floor_s}


if __name__ == "__main__":
    main()
