"""An HF model directory with random bf16 weights in the shape of a known model (config.json,
model.safetensors, a word-level tokenizer.json covering the vocabulary): for throughput benchmarks
of a model size whose weights this machine does not have. Weights ~ N(0, 0.02), norms 1.

    python bench/random_model.py qwen3-0.6b /tmp/qwen3-0.6b-random
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

SHAPES = {
    "qwen3-0.6b": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
                       intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
                       tie_word_embeddings=True),
    "llama-3.2-1b": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256, hidden_size=2048,
                         intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                         tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}),
}


def tensors(c: dict, generator: torch.Generator) -> dict[str, torch.Tensor]:
    h, inter, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd

    def rand(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).bfloat16()

    ones = lambda n: torch.ones(n, dtype=torch.bfloat16)  # noqa: E731
    out = {"model.embed_tokens.weight": rand(c["vocab_size"], h), "model.norm.weight": ones(h)}
    if not c["tie_word_embeddings"]:
        out["lm_head.weight"] = rand(c["vocab_size"], h)
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out |= {p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
                p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
                p + "mlp.gate_proj.weight": rand(inter, h), p + "mlp.up_proj.weight": rand(inter, h),
                p + "mlp.down_proj.weight": rand(h, inter),
                p + "input_layernorm.weight": ones(h), p + "post_attention_layernorm.weight": ones(h)}
        if c["model_type"] == "qwen3":
            out |= {p + "self_attn.q_norm.weight": ones(hd), p + "self_attn.k_norm.weight": ones(hd)}
    return out


def make_random_model(shape: str, directory: Path, seed: int = 0) -> Path:
    """Writes the directory (once: an existing one with a config.json is reused) and returns it."""
    from safetensors.torch import save_file
    from tokenizers import Tokenizer, models, pre_tokenizers

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}: one of {sorted(SHAPES)}")
    directory = Path(directory)
    if (directory / "config.json").is_file():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    c = SHAPES[shape]
    save_file(tensors(c, torch.Generator().manual_seed(seed)), str(directory / "model.safetensors"))
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(c["vocab_size"])}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(directory / "tokenizer.json"))
    (directory / "config.json").write_text(json.dumps({**c, "torch_dtype": "bfloat16", "eos_token_id": 1}, indent=1))
    return directory


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("shape", choices=sorted(SHAPES))
    p.add_argument("directory")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    print(make_random_model(args.shape, Path(args.directory), args.seed))


if __name__ == "__main__":
    main()
