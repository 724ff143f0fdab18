"""gpt-oss against transformers and llama.cpp on a model all three run. No gpt-oss small enough is on
PyPI, so the bench makes one (cached under build/llamacpp/): transformers' GptOssForCausalLM with
random weights (initializer_range --init-std; the LM head's of sd --head-std, so that the logits are
peaked without the trunk amplifying rounding: at an initializer_range of 0.08 the same weights' top
tokens in bf16 and fp32 agreed at 27 of 63 clear positions, which leaves an engine comparison
meaningless; at 0.02 35 of 37) at SmolLM2's width with its tokenizer — --layers layers of 9 heads x 64 (3 KV heads), sliding-window (128) and
global layers alternating, attention sinks, --experts experts of --expert-rows rows, --used per
token, biases everywhere, the clamped SwiGLU. Its rope is unscaled: llama.cpp rounds YaRN's blend
bounds and the model (as transformers and corellm) does not, which alone would tell the engines
apart. Then:

  1. corellm fp32 against transformers fp32 on the HF directory (its experts in bf16): the largest
     logit difference and the top tokens where transformers' top-2 margin exceeds 0.25;
  2. llama.cpp's own converter (convert_hf_to_gguf.py) writes it as a GGUF (BF16) and llama-quantize
     makes --quant of it (default MXFP4_MOE: the experts in MXFP4, the rest Q8_0, as ggml-org's gpt-oss
     files); on it corellm scores llama-server's greedy tokens (bench/llamacpp_agreement.py);
  3. bench/compare_llamacpp.py --gguf FILE: pp512 / tg128 single stream and serving at --concurrency.

    .venv/bin/python bench/gpt_oss.py
    .venv/bin/python bench/gpt_oss.py --skip-serving --quant Q8_0
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers


def random_checkpoint(dest: Path, layers: int, experts: int, used: int, expert_rows: int, init_std: float,
                      head_std: float) -> Path:
    """The random gpt-oss HF directory (module docstring), with the default model's tokenizer."""
    from hf_transformers import import_transformers

    transformers = import_transformers()
    import torch

    from compare_vllm import hf_model_dir

    if (dest / "config.json").exists():
        return dest
    tokenizer_dir = hf_model_dir()  # the default model as an HF directory: its tokenizer and special ids
    tokenizer = json.loads((tokenizer_dir / "config.json").read_text())
    config = transformers.GptOssConfig(
        vocab_size=tokenizer["vocab_size"], hidden_size=576, intermediate_size=expert_rows, num_hidden_layers=layers,
        num_attention_heads=9, num_key_value_heads=3, head_dim=64, num_local_experts=experts,
        num_experts_per_tok=used, sliding_window=128, initializer_range=init_std, max_position_embeddings=4096,
        rope_parameters={"rope_type": "default", "rope_theta": 150000.0}, tie_word_embeddings=False,
        bos_token_id=tokenizer.get("bos_token_id"), eos_token_id=tokenizer.get("eos_token_id"))
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).to(torch.bfloat16).eval()
    with torch.no_grad():  # the experts' biases start at zero: drawn, so that they count
        model.lm_head.weight.normal_(0.0, head_std)
        for layer in model.model.layers:
            layer.mlp.experts.gate_up_proj_bias.normal_(0.0, init_std)
            layer.mlp.experts.down_proj_bias.normal_(0.0, init_std)
    tmp = dest.with_suffix(".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, tmp / name)
    tmp.rename(dest)
    return dest


def transformers_check(model: Path) -> str:
    """corellm fp32 (per-op) against transformers fp32 on the HF directory: three random prompts,
    every position's logits (transformers_agreement.LogitAgreement)."""
    import torch

    from hf_transformers import import_transformers

    transformers = import_transformers()
    from corellm.model import load_model
    from transformers_agreement import decode_agreement

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    ours = load_model(str(model), dtype="float32", progress=False, use_cache=False)
    return str(decode_agreement(ours.model, hf, hf.config.vocab_size, (20, 60, 150)))  # past the window of 128


def main() -> None:
    from llamacpp_agreement import add_file_comparison_args, agreement_on_file, compare_speed_on_file, quantized_file

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--experts", type=int, default=32)
    p.add_argument("--used", type=int, default=4)
    p.add_argument("--expert-rows", type=int, default=384)
    p.add_argument("--init-std", type=float, default=0.02)
    p.add_argument("--head-std", type=float, default=0.3)
    add_file_comparison_args(p, quant="MXFP4_MOE")
    args = p.parse_args()

    from compare_llamacpp import CACHE, build_llamacpp, run

    bin_dir = build_llamacpp()
    stem = f"gpt-oss-{args.layers}L-{args.experts}x{args.expert_rows}-top{args.used}-std{args.init_std:g}"
    hf_dir = random_checkpoint(CACHE / stem, args.layers, args.experts, args.used, args.expert_rows, args.init_std,
                               args.head_std)
    model = CACHE / f"{stem}.BF16.gguf"
    if not model.exists():
        source = next(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))
        run([sys.executable, str(source / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "bf16",
             "--outfile", str(model.with_suffix(".tmp"))], stdout=subprocess.DEVNULL)
        model.with_suffix(".tmp").rename(model)
    model = quantized_file(bin_dir, model, args.quant)
    print(f"model: {model} ({model.stat().st_size / 2**20:.0f} MiB)", flush=True)
    if not args.skip_agreement:
        print(f"corellm vs transformers, fp32, on {hf_dir.name}: {transformers_check(hf_dir)}", flush=True)
        print(f"agreement on {model.name}: {agreement_on_file(bin_dir, model)}", flush=True)
    compare_speed_on_file(model, args)


if __name__ == "__main__":
    main()
