"""A mixture of experts against llama.cpp on this machine, on a model both engines run: the default
SmolLM2-135M "upcycled" into a Mixtral-style mixture — each layer's MLP copied into --experts
experts, every copy's weights scaled by (1 + 0.1 N(0, 1)) so that the experts differ, and a random
router that picks --used of them per token — written as llama.cpp writes Mixtral (a "llama" GGUF
with expert_count; each layer's experts stacked in ffn_{gate,up,down}_exps; the router in
ffn_gate_inp, F32), BF16, then quantized by llama-quantize to --quant (default Q4_K_M, what CPU
users run). Cached under build/llamacpp/. Then:

  1. the reference: the BF16 file's weights as an HF Mixtral checkpoint, run by transformers in
     fp32 beside corellm in fp32 on random prompts (logits, and top tokens where transformers' top-2
     margin is clear); then agreement with llama.cpp: llama-server's greedy tokens for a few prompts
     scored by corellm (its top token where llama.cpp's top-2 margin is clear, and the chosen
     tokens' logprobs) on the file both serve;
  2. bench/compare_llamacpp.py --gguf FILE: pp512 / tg128 single stream and serving at
     --concurrency, both engines on the file, one after the other.

    .venv/bin/python bench/moe.py --concurrency 1,16
    .venv/bin/python bench/moe.py --quant Q8_0 --skip-serving
    .venv/bin/python bench/moe.py --experts 64 --used 8 --expert-rows 192   # fine-grained, as Qwen3-MoE
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers


def upcycled_gguf(source: Path, dest: Path, experts: int, used: int, expert_rows: int | None = None,
                  seed: int = 0) -> Path:
    """source (a dense "llama" GGUF) as a mixture of `experts` perturbed copies of each MLP, `used`
    per token (the module docstring); BF16 matrices. expert_rows: each expert a slice of that many of
    the MLP's intermediate rows (expert e: rows from e * expert_rows, wrapping), as the fine-grained
    experts of Qwen3-MoE; llama.cpp's "llama" files give the experts' size as feed_forward_length."""
    from corellm.model.gguf_export import export_bf16

    rng = np.random.default_rng(seed)
    sizes: dict[str, int] = {}

    def field_value(key: str, value):
        if key.endswith(".embedding_length"):
            sizes["hidden"] = int(value)
        if key.endswith(".feed_forward_length"):
            sizes["inter"] = int(value)
            return expert_rows or value  # llama.cpp's Mixtral files: the experts' size
        return value

    def extra_fields(writer) -> None:
        writer.add_expert_count(experts)
        writer.add_expert_used_count(used)

    def tensors(name: str, a: np.ndarray):
        layer, _, rest = name.partition(".ffn_")
        if rest not in ("gate.weight", "up.weight", "down.weight"):
            return [(name, a, a.ndim >= 2)]
        out = []
        if rest == "gate.weight":  # the router, F32 as the converter keeps it, before the layer's experts
            router = rng.normal(0.0, 2.0 / sizes["hidden"] ** 0.5, (experts, sizes["hidden"])).astype(np.float32)
            out.append((f"{layer}.ffn_gate_inp.weight", router, False))
        if expert_rows:  # gate and up: rows of the intermediate; down: its columns
            inter = sizes["inter"]
            if inter % expert_rows:
                raise SystemExit(f"--expert-rows {expert_rows} must divide the MLP's {inter} rows")
            starts = [e * expert_rows % inter for e in range(experts)]
            a = np.stack([a[s : s + expert_rows] if rest != "down.weight" else a[:, s : s + expert_rows]
                          for s in starts])
        else:
            a = np.broadcast_to(a[None], (experts, *a.shape))
        copies = a * (1.0 + 0.1 * rng.standard_normal(a.shape, dtype=np.float32))
        out.append((f"{layer}.ffn_{rest.split('.')[0]}_exps.weight", copies, True))
        return out

    tmp = dest.with_suffix(".tmp")
    export_bf16(source, tmp, field_value=field_value, extra_fields=extra_fields, tensors=tensors)
    tmp.rename(dest)
    return dest


def transformers_check(model: Path) -> str:
    """corellm (fp32, per-op) against transformers (fp32) on the weights of `model`, a Mixtral-style
    GGUF, written out as an HF checkpoint: the largest logit difference over three random prompts,
    and how often the top token differs where transformers' top-2 margin exceeds 0.25."""
    import json
    import tempfile

    import torch
    from safetensors.torch import save_file

    from hf_transformers import import_transformers

    transformers = import_transformers()  # (bench/kernels.py is not the `kernels` package it imports)

    from corellm.model import load_model
    from corellm.model.gguf_file import GGUFModelFile
    from transformers_agreement import decode_agreement

    gguf_file = GGUFModelFile(model)
    c = gguf_file.config()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp)
        state = {name: t.float().contiguous() for name, t in gguf_file.weights(torch.float32, progress=False)}
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"].clone())
        save_file(state, str(hf_dir / "model.safetensors"))
        del state
        (hf_dir / "config.json").write_text(json.dumps(dict(
            architectures=["MixtralForCausalLM"], model_type="mixtral", vocab_size=c.vocab_size,
            hidden_size=c.hidden_size, intermediate_size=c.moe_intermediate_size, num_hidden_layers=c.num_hidden_layers,
            num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads, head_dim=c.head_dim,
            rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta, max_position_embeddings=2048,
            tie_word_embeddings=False, num_local_experts=c.num_experts, num_experts_per_tok=c.num_experts_per_tok,
            sliding_window=None)))
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ours = load_model(str(model), dtype="float32", quantization="none", progress=False, use_cache=False)
    return str(decode_agreement(ours.model, hf, c.vocab_size, (20, 60, 100)))


def main() -> None:
    from llamacpp_agreement import add_file_comparison_args, agreement_on_file, compare_speed_on_file, quantized_file

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--used", type=int, default=2)
    p.add_argument("--expert-rows", type=int, default=None,
                   help="fine-grained experts: each a slice of this many of the MLP's 1536 intermediate rows")
    add_file_comparison_args(p, quant="Q4_K_M")
    args = p.parse_args()

    from compare_llamacpp import CACHE, bf16_model, build_llamacpp

    bin_dir = build_llamacpp()
    stem = f"SmolLM2-MoE-{args.experts}x{args.expert_rows or '135M'}-top{args.used}"
    model = CACHE / f"{stem}.BF16.gguf"
    if not model.exists():
        upcycled_gguf(bf16_model(), model, args.experts, args.used, args.expert_rows)
    model = quantized_file(bin_dir, model, args.quant)
    print(f"model: {model} ({model.stat().st_size / 2**20:.0f} MiB)", flush=True)
    if not args.skip_agreement:
        print(f"corellm vs transformers, fp32, on {model.name.replace(args.quant, 'BF16')}'s weights: "
              f"{transformers_check(CACHE / f'{stem}.BF16.gguf')}", flush=True)
        print(f"agreement on {model.name}: {agreement_on_file(bin_dir, model)}", flush=True)
    compare_speed_on_file(model, args)


if __name__ == "__main__":
    main()
