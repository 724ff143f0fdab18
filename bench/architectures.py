"""Architectures beside Llama against transformers and llama.cpp, on models all three run. No small
Phi-3 or Granite is on PyPI, so the bench makes one of the default SmolLM2-135M (cached under
build/architectures/):

  phi3     written as a Phi-3 checkpoint: q/k/v fused into qkv_proj and gate/up into gate_up_proj,
           LongRoPE pretrained at --original positions and extended to 8192, with short factors
           from 1 to 1.5 and long ones from 1 to 4 over the rotary frequencies (its text degrades a
           little beyond the original model's; the engines compute the same function of it);
  granite  written as a Granite checkpoint: the embedding and every layer's outputs times 0.5 (the
           RMSNorms make that the original function, unless an engine drops one of the two), the
           attention scale 0.9 of head_dim ** -0.5, the logits divided by 1.25.

Then:
  1. corellm fp32 against transformers fp32 on the HF directory: the largest logit difference and
     the top tokens where transformers' top-2 margin exceeds 0.25 (phi3: with the long factors, a
     prompt longer than --original and corellm's max_model_len past it, and with the short ones,
     max_model_len --original and a shorter prompt);
  2. llama.cpp's own converter (convert_hf_to_gguf.py, in the llama.cpp source that
     compare_llamacpp.py unpacks) writes the directory as a GGUF (BF16), and llama-quantize makes
     --quant of it; on each file corellm scores llama-server's greedy tokens
     (bench/llamacpp_agreement.py; llama-server's context of 1024 is past --original: the long
     factors in both engines).

    .venv/bin/python bench/architectures.py --arch phi3
    .venv/bin/python bench/architectures.py --arch granite --quant Q8_0
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "architectures"


def _fused_checkpoint(source: Path, dest: Path) -> None:
    """source's tensors with q/k/v fused into qkv_proj and gate/up into gate_up_proj (Phi-3's)."""
    import torch
    from safetensors.torch import load_file, save_file

    w = load_file(str(source / "model.safetensors"))
    fused = {}
    for name, t in w.items():
        if ".self_attn.q_proj." in name:
            stem = name.replace(".q_proj.", ".{}.")
            fused[stem.format("qkv_proj")] = torch.cat([w[stem.format(p)] for p in ("q_proj", "k_proj", "v_proj")])
        elif ".mlp.gate_proj." in name:
            stem = name.replace(".gate_proj.", ".{}.")
            fused[stem.format("gate_up_proj")] = torch.cat([w[stem.format(p)] for p in ("gate_proj", "up_proj")])
        elif not any(part in name for part in (".k_proj.", ".v_proj.", ".up_proj.")):
            fused[name] = t
    save_file(fused, str(dest / "model.safetensors"), metadata={"format": "pt"})


def derived_checkpoint(source: Path, dest: Path, arch: str, original: int) -> Path:
    """source (an HF Llama directory) as an `arch` checkpoint in dest (the module docstring)."""
    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((source / "config.json").read_text())
    head_dim = cfg["head_dim"]
    rope_theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    for key in ("rope_parameters", "head_dim", "mlp_bias", "attention_bias"):
        cfg.pop(key, None)
    cfg["rope_theta"] = rope_theta
    if arch == "phi3":
        _fused_checkpoint(source, dest)
        half = head_dim // 2
        cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", max_position_embeddings=8192,
                   original_max_position_embeddings=original, sliding_window=None,
                   rope_scaling={"type": "longrope",
                                 "short_factor": [1.0 + 0.5 * i / (half - 1) for i in range(half)],
                                 "long_factor": [1.0 + 3.0 * (i / (half - 1)) ** 2 for i in range(half)]})
    else:
        shutil.copy(source / "model.safetensors", dest / "model.safetensors")
        cfg.update(architectures=["GraniteForCausalLM"], model_type="granite", embedding_multiplier=0.5,
                   residual_multiplier=0.5, attention_multiplier=0.9 * head_dim**-0.5, logits_scaling=1.25)
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, dest / name)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "GPT2Tokenizer"  # llama.cpp's Phi-3 converter: a BPE vocabulary
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return dest


def transformers_check(model: Path, arch: str, original: int) -> list[str]:
    """corellm fp32 (per-op) against transformers fp32 (the module docstring's step 1)."""
    import torch
    from hf_transformers import import_transformers

    transformers = import_transformers()
    sys.path.insert(0, str(ROOT))  # tests/model/runner.py
    from corellm.model import load_model
    from tests.model.runner import PagedRunner
    from transformers_agreement import LogitAgreement

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    ids = torch.randint(100, hf.config.vocab_size, (2 * original,), generator=torch.Generator().manual_seed(0)).tolist()
    runs = [("long factors", original + original // 2, 8192), ("short factors", original // 2, original)] \
        if arch == "phi3" else [("", original, None)]
    lines = []
    for what, length, max_model_len in runs:
        ours = load_model(str(model), dtype="float32", progress=False, max_model_len=max_model_len).model
        runner = PagedRunner(ours, length + 16, 1)
        seq = ids[:length]
        got = torch.cat([runner.step([seq[:16]])] + [runner.step([[t]]) for t in seq[16:]])  # positions 15..
        with torch.no_grad():
            agreement = LogitAgreement().add(got, hf(torch.tensor([seq])).logits[0, 15:])
        where = f"{what}, max_model_len {max_model_len}, " if what else ""
        lines.append(f"{where}{length} tokens: {agreement}")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", choices=("phi3", "granite"), default="phi3")
    p.add_argument("--original", type=int, default=512, help="phi3: the pretrained context LongRoPE extends")
    p.add_argument("--quant", default="Q4_K_M", help="llama-quantize type of the second file (BF16: none)")
    args = p.parse_args()

    from compare_llamacpp import CACHE as LLAMACPP, build_llamacpp, run
    from compare_vllm import hf_model_dir
    from llamacpp_agreement import PROMPTS, llama_greedy, score

    name = f"SmolLM2-as-Phi3-{args.original}" if args.arch == "phi3" else "SmolLM2-as-Granite"
    model = derived_checkpoint(hf_model_dir(), CACHE / name, args.arch, args.original)
    for line in transformers_check(model, args.arch, args.original):
        print(f"corellm vs transformers, fp32: {line}", flush=True)

    bin_dir = build_llamacpp()
    source = next(LLAMACPP.glob("llama_cpp_python-*/vendor/llama.cpp"))
    bf16 = CACHE / f"{model.name}.BF16.gguf"
    if not bf16.exists():  # the model name must not say "phi3": llama.cpp then expects Phi-3's own vocabulary
        run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(model), "--outtype", "bf16", "--model-name",
             f"smollm2-{args.arch.replace('phi3', 'longrope')}", "--outfile", str(bf16.with_suffix(".tmp"))],
            env={**os.environ, "PYTHONPATH": str(source / "gguf-py")}, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        bf16.with_suffix(".tmp").rename(bf16)
    files = [bf16]
    if args.quant != "BF16":
        quantized = CACHE / f"{model.name}.{args.quant}.gguf"
        if not quantized.exists():
            run([str(bin_dir / "llama-quantize"), str(bf16), str(quantized.with_suffix(".tmp")), args.quant],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            quantized.with_suffix(".tmp").rename(quantized)
        files.append(quantized)
    from corellm import LLM

    for path in files:
        replies = llama_greedy(bin_dir, path, PROMPTS, 24)
        llm = LLM(str(path), kv_cache_memory=256 * 2**20, max_model_len=1024)
        print(f"agreement with llama.cpp on {path.name}: {score(llm, PROMPTS, replies)}", flush=True)
        llm.shutdown()


if __name__ == "__main__":
    main()
