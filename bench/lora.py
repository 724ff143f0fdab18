"""LoRA adapters' cost: offline generation of the same random prompts on the base model, every
prompt with one adapter, and the prompts spread over four adapters, in alternating rounds in one
process (the VM's speed drifts: each round's three runs are back to back). The adapters are random
PEFT directories of the given rank on all seven projections of every layer (the most costly case).

    .venv/bin/python bench/lora.py --num-prompts 32 --input-len 128 --output-len 64 --rank 16 --rounds 3
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/lora_adapters.py writes the adapters
from tests.lora_adapters import make_lora_adapter  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None)
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    from corellm import LLM, LoRARequest, SamplingParams
    from corellm.native import cpu_kernel_path

    llm = LLM(args.model, enable_lora=True, max_loras=4, max_lora_rank=args.rank)
    c = llm.loaded.config
    hf_config = dict(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
                     num_attention_heads=c.num_attention_heads, num_key_value_heads=c.num_key_value_heads,
                     head_dim=c.head_dim, num_hidden_layers=c.num_hidden_layers)
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


if __name__ == "__main__":
    main()
