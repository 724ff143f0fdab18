"""The `corellm` command line: `corellm generate` (offline), `corellm serve` (the OpenAI-compatible
server) and `corellm run-batch` (a file of requests in OpenAI's batch format, offline)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys

import corellm
from corellm import startup_gc
from corellm.engine_args import add_engine_args, engine_config_from_args


def cmd_generate(args: argparse.Namespace) -> int:
    from corellm import LLM, LoRARequest, SamplingParams

    c = engine_config_from_args(args)
    if args.lora is not None:  # as llama-cli's --lora: the adapter for every prompt (LoRA on)
        c = dataclasses.replace(c, enable_lora=True)
    if c.torchrun:
        raise ValueError("corellm generate does not run under torchrun (every rank would run it): launch "
                         "`corellm serve` under torchrun")
    with startup_gc.lasting_objects():
        # every field of the configuration, as given (the torchrun place is LLM's own to find)
        llm = LLM(c.model, **{f.name: getattr(c, f.name) for f in dataclasses.fields(c)
                              if f.name not in ("model", "torchrun")})
    # Greedy unless the model's generation config (or --override-generation-config) says otherwise;
    # the sampling flags given win over both.
    given = {name: value for name, value in (("temperature", args.temperature), ("top_p", args.top_p),
                                             ("top_k", args.top_k)) if value is not None}
    sampling = {"temperature": 0.0, **llm.parts.sampling_defaults, **given}
    params = SamplingParams(**sampling, max_tokens=args.max_tokens, seed=args.sampling_seed, n=args.n)
    prompts = args.prompt
    lora = None if args.lora is None else LoRARequest("lora", 1, args.lora)
    if args.chat:
        outputs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False,
                           lora_request=lora)
    else:
        outputs = llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
    for prompt, out in zip(prompts, outputs):
        for c in out.outputs:
            if len(prompts) > 1 or len(out.outputs) > 1:
                print(f"--- {prompt!r} [{c.index}] ({c.finish_reason})")
            print(c.text if args.chat else prompt + c.text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="corellm", description="corellm LLM inference engine")
    parser.add_argument("--version", action="version", version=f"corellm {corellm.__version__}")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("generate", help="generate text for one or more prompts")
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("--model", default=None, help="HF model directory, .gguf file, Hugging Face Hub id in the "
                     "local HF cache, or SmolLM2-135M-Instruct (default)")
    add_engine_args(gen)
    gen.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=None,
                     help="default: the model's generation config's, else 0 (greedy)")
    gen.add_argument("--top-p", type=float, default=None, help="default: the model's generation config's, else 1")
    gen.add_argument("--top-k", type=int, default=None, help="default: the model's generation config's, else 0 (off)")
    gen.add_argument("--n", type=int, default=1)
    gen.add_argument("--sampling-seed", type=int, default=None)
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user message (chat template)")
    gen.add_argument("--lora", default=None, metavar="PATH",
                     help="run every prompt with this LoRA adapter (a PEFT directory or a llama.cpp LoRA .gguf)")
    batch = sub.add_parser("run-batch", help="run a file of requests in OpenAI's batch format (as vLLM's run-batch)")
    srv = sub.add_parser("serve", help="serve a model over an OpenAI-compatible API")
    with startup_gc.lasting_objects():  # the server's modules (aiohttp, pydantic, the engine's)
        from corellm.server.main import add_serve_args
        from corellm.server.run_batch import add_run_batch_args

    add_serve_args(srv)
    srv.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_run_batch_args(batch)
    batch.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given: data-parallel replicas get the same
    logging.basicConfig(level=getattr(args, "log_level", "warning").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command is not None:
        if args.command == "serve":
            from corellm.server.main import run as command
        elif args.command == "run-batch":
            from corellm.server.run_batch import main as command
        else:
            command = cmd_generate
        try:
            return command(args)
        except (ValueError, FileNotFoundError) as e:
            print(f"corellm {args.command}: error: {e}", file=sys.stderr)
            return 2
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
