"""Phi-3 (Phi3ForCausalLM) against transformers and llama.cpp, on a model all three run. No small
Phi-3 is on PyPI, so the bench makes one: the default SmolLM2-135M written as a Phi-3 checkpoint —
q/k/v fused into qkv_proj and gate/up into gate_up_proj, LongRoPE pretrained at --original
positions and extended to 8192, with short factors from 1 to 1.5 and long ones from 1 to 4 over
the rotary frequencies (its text degrades a little beyond the original model's; both engines
compute the same function of it) — cached under build/phi3/. Then:

  1. corellm fp32 against transformers fp32 on the HF directory: the long factors (a prompt
     longer than --original, which transformers computes with them; corellm's max_model_len past
     it) and the short ones (max_model_len --original; a shorter prompt): the largest logit
     difference and the top tokens where transformers' top-2 margin exceeds 0.25;
  2. llama.cpp's own converter (convert_hf_to_gguf.py, in the llama.cpp source that
     compare_llamacpp.py unpacks) writes the directory as a "phi3" GGUF (BF16; fused attn_qkv and
     ffn_up, the factor tensors), and llama-quantize makes --quant of it; on each file corellm
     scores llama-server's greedy tokens (bench/llamacpp_agreement.py; llama-server's context of
     1024 past --original: the long factors in both engines).

    .venv/bin/python bench/phi3.py
    .venv/bin/python bench/phi3.py --quant Q8_0
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
CACHE = ROOT / "build" / "phi3"


def phi3_checkpoint(source: Path, dest: Path, original: int) -> Path:
    """source (an HF Llama directory) as a Phi-3 checkpoint in dest (the module docstring)."""
    import torch
    from safetensors.torch import load_file, save_file

    if (dest / "model.safetensors").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
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
    cfg = json.loads((source / "config.json").read_text())
    half = cfg["head_dim"] // 2
    rope_theta = cfg.get("rope_parameters", {}).get("rope_theta", cfg.get("rope_theta"))
    for key in ("rope_parameters", "head_dim", "mlp_bias", "attention_bias"):
        cfg.pop(key, None)
    cfg.update(architectures=["Phi3ForCausalLM"], model_type="phi3", max_position_embeddings=8192,
               original_max_position_embeddings=original, sliding_window=None, rope_theta=rope_theta,
               rope_scaling={"type": "longrope", "short_factor": [1.0 + 0.5 * i / (half - 1) for i in range(half)],
                             "long_factor": [1.0 + 3.0 * (i / (half - 1)) ** 2 for i in range(half)]})
    (dest / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (source / name).exists():
            shutil.copy(source / name, dest / name)
    tokenizer_config = json.loads((source / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "GPT2Tokenizer"  # llama.cpp's Phi-3 converter: a BPE vocabulary
    (dest / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    return dest


def transformers_check(model: Path, original: int) -> list[str]:
    """corellm fp32 (per-op) against transformers fp32 with each set of factors (the module docstring)."""
    import torch
    from hf_transformers import import_transformers

    transformers = import_transformers()
    sys.path.insert(0, str(ROOT))  # tests/model/runner.py
    from corellm.model import load_model
    from tests.model.runner import PagedRunner

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    ids = transformers.AutoTokenizer.from_pretrained(str(model))((ROOT / "README.md").read_text()[:12000])["input_ids"]
    lines = []
    runs = (("long", original + original // 2, 8192), ("short", original // 2, original))
    for factors, length, max_model_len in runs:
        ours = load_model(str(model), dtype="float32", progress=False, max_model_len=max_model_len).model
        runner = PagedRunner(ours, length + 16, 1)
        seq = ids[:length]
        got = torch.cat([runner.step([seq[:16]])] + [runner.step([[t]]) for t in seq[16:]])  # positions 15..
        with torch.no_grad():
            want = hf(torch.tensor([seq])).logits[0, 15:]
        top2 = torch.topk(want, 2).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.25
        differ = int(((got.argmax(-1) != want.argmax(-1)) & clear).sum())
        lines.append(f"{factors} factors (max_model_len {max_model_len}, {length} tokens): the largest logit "
                     f"difference {float((got - want).abs().max()):.1e}; the top token differs at {differ} of "
                     f"{int(clear.sum())} positions where transformers' top-2 margin exceeds 0.25")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--original", type=int, default=512, help="the pretrained context LongRoPE extends")
    p.add_argument("--quant", default="Q4_K_M", help="llama-quantize type of the second file (BF16: none)")
    args = p.parse_args()

    from compare_llamacpp import CACHE as LLAMACPP, build_llamacpp, run
    from compare_vllm import hf_model_dir
    from llamacpp_agreement import PROMPTS, llama_greedy, score

    model = phi3_checkpoint(hf_model_dir(), CACHE / f"SmolLM2-as-Phi3-{args.original}", args.original)
    for line in transformers_check(model, args.original):
        print(f"corellm vs transformers, fp32: {line}", flush=True)

    bin_dir = build_llamacpp()
    source = next(LLAMACPP.glob("llama_cpp_python-*/vendor/llama.cpp"))
    bf16 = CACHE / f"{model.name}.BF16.gguf"
    if not bf16.exists():  # the model name must not say "phi3": llama.cpp then expects Phi-3's own vocabulary
        run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(model), "--outtype", "bf16", "--model-name",
             "smollm2-longrope", "--outfile", str(bf16.with_suffix(".tmp"))],
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
