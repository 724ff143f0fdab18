"""LoRA adapters' cost: offline generation of the same random prompts on the base model, every
prompt with one adapter, and the prompts spread over four adapters, in alternating rounds in one
process (the VM's speed drifts: each round's three runs are back to back). The adapters are random
PEFT directories of the given rank on all seven projections of every layer (the most costly case).

With --vs-llamacpp, against llama.cpp instead, on the default model's BF16 GGUF
(bench/compare_llamacpp.py builds llama.cpp and writes it): one random adapter, converted by
llama.cpp's own convert_lora_to_gguf.py; first both engines' agreement (llama-server's greedy
tokens with --lora, scored by corellm with the PEFT directory: its top token where llama.cpp's
top-2 margin is clear, and the chosen tokens' logprobs), then bench/serve.py against corellm serving
the adapter by name and llama-server with --lora, one after the other.

    .venv/bin/python bench/lora.py --num-prompts 32 --input-len 128 --output-len 64 --rank 16 --rounds 3
    .venv/bin/python bench/lora.py --vs-llamacpp --rank 16 --concurrency 1,16
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/lora_adapters.py writes the adapters
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the other benches' helpers
from tests.lora_adapters import hf_shape, make_lora_adapter  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--vs-llamacpp", action="store_true", help="against llama-server --lora (see above)")
    p.add_argument("--concurrency", default="1,16", help="with --vs-llamacpp: the serving levels")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="with --vs-llamacpp: llama.cpp's")
    args = p.parse_args()
    if args.vs_llamacpp:
        return vs_llamacpp(args)

    from corellm import LLM, LoRARequest, SamplingParams
    from corellm.native import cpu_kernel_path

    llm = LLM(args.model, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
    c = llm.loaded.config
    hf_config = hf_shape(c)
    root = Path(tempfile.mkdtemp(prefix="corellm-lora-bench-"))
    loras = []
    for i in range(4):
        make_lora_adapter(root / f"a{i}", hf_config, rank=args.rank, std=0.02, seed=i)
        loras.append(LoRARequest(f"a{i}", i + 1, str(root / f"a{i}")))
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(100, c.vocab_size, (args.input_len,), generator=g).tolist()}
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    cases = {"base model": None, "one adapter": loras[0],
             "four adapters": [loras[i % 4] for i in range(args.num_prompts)]}
    llm.generate(prompts[:4], SamplingParams(max_tokens=2), use_tqdm=False, lora_request=loras)  # loaded and placed
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, lora in cases.items():
            salted = [{**pr, "cache_salt": f"{time.monotonic_ns()}"} for pr in prompts]  # no prefix-cache hits
            start = time.perf_counter()
            llm.generate(salted, params, use_tqdm=False, lora_request=lora)
            rates[name].append(args.num_prompts * args.output_len / (time.perf_counter() - start))
    print(f"CPU kernels: {cpu_kernel_path()}, {torch.get_num_threads()} threads; {args.num_prompts} prompts x "
          f"{args.input_len} in / {args.output_len} out, rank {args.rank} on q, k, v, o, gate, up, down")
    # Each round's runs are back to back: a run's ratio to its round's base run is what the VM's
    # drift between rounds leaves alone.
    base = rates["base model"]
    print("| case | output tok/s per round | vs the base model per round | median ratio |\n|---|---|---|---|")
    for name, r in rates.items():
        ratios = sorted(x / b for x, b in zip(r, base))
        print(f"| {name} | {' / '.join(f'{x:.1f}' for x in r)} | "
              f"{' / '.join(f'{x / b:.2f}' for x, b in zip(r, base))} | {ratios[len(ratios) // 2]:.2f}x |")
    llm.shutdown()


def vs_llamacpp(args) -> None:
    import subprocess

    from compare_llamacpp import CACHE, bf16_model, build_llamacpp
    from compare_vllm import hf_model_dir
    from llamacpp_agreement import PROMPTS, llama_greedy, score
    from server_process import free_port, print_serving_table, serve_both

    from corellm import LLM, LoRARequest
    from corellm.model.loader import load_model_config

    bin_dir, model, base_dir = build_llamacpp(), bf16_model(), hf_model_dir()
    config = load_model_config(model)
    root = CACHE / f"lora-rank{args.rank}"
    peft, converted = root / "peft", root / "adapter.gguf"
    if not converted.exists():
        make_lora_adapter(peft, hf_shape(config), rank=args.rank, alpha=2.0 * args.rank, std=0.05, seed=5)
        converter = next(CACHE.glob("llama_cpp_python-*/vendor/llama.cpp"))
        subprocess.run([sys.executable, str(converter / "convert_lora_to_gguf.py"), str(peft), "--base", str(base_dir),
                        "--outfile", str(converted), "--outtype", "f32"], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(converter / "gguf-py")})
    # Agreement: llama.cpp's greedy tokens scored by corellm (its prompt logprobs over them).
    replies = llama_greedy(bin_dir, model, PROMPTS, 24, extra_args=("--lora", str(converted)))
    llm = LLM(str(model), quantization="none", enable_lora=True, max_lora_rank=args.rank,
              kv_cache_memory=256 * 2**20, max_model_len=1024)
    agreement = score(llm, PROMPTS, replies, lora_request=LoRARequest("a", 1, str(peft)))
    llm.shutdown()
    print(f"agreement, rank-{args.rank} adapter on {model.name}: {agreement}")
    max_conc = max(int(c) for c in args.concurrency.split(","))
    ports = {"corellm": free_port(), "llama-server": free_port()}
    servers = {
        "corellm": [sys.executable, "-m", "corellm.cli", "serve", str(model), "--port", str(ports["corellm"]),
                    "--log-level", "warning", "--max-num-seqs", str(max(64, max_conc)), "--enable-lora",
                    "--max-lora-rank", str(args.rank), "--lora-modules", f"a={peft}"],
        "llama-server": [str(bin_dir / "llama-server"), "-m", str(model), "--lora", str(converted), "-t",
                         str(args.threads), "-c", str(max_conc * (args.input_len + args.output_len + 64)),
                         "-np", str(max_conc), "--host", "127.0.0.1", "--port", str(ports["llama-server"])],
    }
    served = serve_both(servers, ports, args, root, models={"corellm": "a"})
    print_serving_table(served["corellm"], served["llama-server"], "llama-server")


if __name__ == "__main__":
    main()
