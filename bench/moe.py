"""A mixture of experts against llama.cpp on this machine, on a model both engines run: the default
SmolLM2-135M "upcycled" into a Mixtral-style mixture — each layer's MLP copied into --experts
experts, every copy's weights scaled by (1 + 0.1 N(0, 1)) so that the experts differ, and a random
router that picks --used of them per token — written as llama.cpp writes Mixtral (a "llama" GGUF
with expert_count; each layer's experts stacked in ffn_{gate,up,down}_exps; the router in
ffn_gate_inp, F32), BF16, then quantized by llama-quantize to --quant (default Q4_K_M, what CPU
users run). Cached under build/llamacpp/. Then:

  1. agreement: llama-server's greedy tokens for a few prompts scored by corellm (its top token
     where llama.cpp's top-2 margin is clear, and the chosen tokens' logprobs);
  2. bench/compare_llamacpp.py --gguf FILE: pp512 / tg128 single stream and serving at
     --concurrency, both engines on the file, one after the other.

    .venv/bin/python bench/moe.py --concurrency 1,16
    .venv/bin/python bench/moe.py --quant Q8_0 --skip-serving
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers


def upcycled_gguf(source: Path, dest: Path, experts: int, used: int, seed: int = 0) -> Path:
    """source (a dense "llama" GGUF) as a mixture of `experts` perturbed copies of each MLP, `used`
    per token (upcycled_gguf's algorithm in the module docstring); BF16 matrices."""
    import gguf
    from gguf.quants import dequantize

    from corellm.model.gguf_export import float32_to_bf16_bits

    rng = np.random.default_rng(seed)
    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    tmp = dest.with_suffix(".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    writer.add_expert_count(experts)
    writer.add_expert_used_count(used)
    hidden = int(reader.fields[f"{arch}.embedding_length"].contents())

    def bf16(name: str, a: np.ndarray) -> None:
        writer.add_tensor(name, float32_to_bf16_bits(a), raw_shape=a.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)

    for t in reader.tensors:
        a = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        layer, _, rest = t.name.partition(".ffn_")
        if rest in ("gate.weight", "up.weight", "down.weight"):
            if rest == "gate.weight":  # the router goes before the layer's experts, as the converter writes it
                router = rng.normal(0.0, 2.0 / hidden**0.5, (experts, hidden)).astype(np.float32)
                writer.add_tensor(f"{layer}.ffn_gate_inp.weight", router)
            copies = a[None] * (1.0 + 0.1 * rng.standard_normal((experts, *a.shape), dtype=np.float32))
            bf16(f"{layer}.ffn_{rest.split('.')[0]}_exps.weight", copies)
        elif a.ndim >= 2:
            bf16(t.name, a)
        else:
            writer.add_tensor(t.name, a)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(dest)
    return dest


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--used", type=int, default=2)
    p.add_argument("--quant", default="Q4_K_M", help="llama-quantize type of the file both engines run (BF16: none)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--skip-agreement", action="store_true")
    p.add_argument("--skip-single-stream", action="store_true")
    p.add_argument("--skip-serving", action="store_true")
    args = p.parse_args()

    from compare_llamacpp import CACHE, bf16_model, build_llamacpp, run
    from llamacpp_agreement import PROMPTS, llama_greedy, score

    bin_dir = build_llamacpp()
    stem = f"SmolLM2-MoE-{args.experts}x135M-top{args.used}"
    model = CACHE / f"{stem}.BF16.gguf"
    if not model.exists():
        upcycled_gguf(bf16_model(), model, args.experts, args.used)
    if args.quant != "BF16":
        quantized = CACHE / f"{stem}.{args.quant}.gguf"
        if not quantized.exists():
            run([str(bin_dir / "llama-quantize"), str(model), str(quantized.with_suffix(".tmp")), args.quant],
                stdout=subprocess.DEVNULL)
            quantized.with_suffix(".tmp").rename(quantized)
        model = quantized
    print(f"model: {model} ({model.stat().st_size / 2**20:.0f} MiB)", flush=True)
    if not args.skip_agreement:
        from corellm import LLM

        replies = llama_greedy(bin_dir, model, PROMPTS, 24)
        llm = LLM(str(model), kv_cache_memory=256 * 2**20, max_model_len=1024)
        print(f"agreement on {model.name}: {score(llm, PROMPTS, replies)}", flush=True)
        llm.shutdown()
        del llm
    if args.skip_single_stream and args.skip_serving:
        return
    flags = [f for f, on in (("--skip-single-stream", args.skip_single_stream), ("--skip-serving", args.skip_serving))
             if on]
    subprocess.run([sys.executable, str(Path(__file__).parent / "compare_llamacpp.py"), "--gguf", str(model),
                    "--threads", str(args.threads), "--concurrency", args.concurrency, "--num-prompts",
                    str(args.num_prompts), *flags], check=True)


if __name__ == "__main__":
    main()
