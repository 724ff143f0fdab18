"""The `corellm` command line: `corellm generate` (offline) and `corellm serve` (the OpenAI-compatible server)."""

from __future__ import annotations

import argparse
import logging
import sys

import corellm


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF model directory, .gguf file, or SmolLM2-135M-Instruct (default)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-cache-memory", type=float, default=None,
                   help="KV cache size: bytes if >= 1, else a fraction of free memory")
    p.add_argument("--seed", type=int, default=0)


def _kv_memory(value: float | None) -> int | float | None:
    if value is None:
        return None
    return int(value) if value >= 1 else float(value)


def cmd_generate(args: argparse.Namespace) -> int:
    from corellm import LLM, SamplingParams

    llm = LLM(args.model, dtype=args.dtype, max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, block_size=args.block_size,
              kv_cache_memory=_kv_memory(args.kv_cache_memory), seed=args.seed)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            max_tokens=args.max_tokens, seed=args.sampling_seed, n=args.n)
    prompts = args.prompt
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            if len(prompts) > 1 or len(out.outputs) > 1:
                print(f"--- {prompt!r} [{c.index}] ({c.finish_reason})")
            print(c.text if args.chat else prompt + c.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corellm", description="corellm LLM inference engine")
    parser.add_argument("--version", action="version", version=f"corellm {corellm.__version__}")
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    gen.add_argument("prompt", nargs="+")
    _engine_args(gen)
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message (chat template)")
    srv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible API")
    from corellm.server.main import add_serve_args

    add_serve_args(srv)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.command == "generate":
        try:
            return cmd_generate(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"corellm generate: error: {e}", file=sys.stderr)
            return 2
    if args.command == "serve":
        from corellm.server.main import run

        try:
            return run(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"corellm serve: error: {e}", file=sys.stderr)
            return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
