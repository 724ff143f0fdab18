"""The command-line arguments that configure an engine (shared by `corellm generate` and
`corellm serve`), and the EngineConfig they make."""

from __future__ import annotations

import argparse
import json
import os

from corellm.config import KV_CACHE_DTYPES, QUANTIZATION_METHODS, EngineConfig
from corellm.distributed.torchrun import TorchrunPlace
from corellm.pooling_params import POOLING_TYPES
from corellm.reasoning_parser import REASONING_PARSERS


def add_engine_args(p: argparse.ArgumentParser, max_num_seqs: int = 256, max_num_batched_tokens: int = 2048) -> None:
    p.add_argument("--device", default="cpu", help="cpu or cuda (a GPU and corellm's CUDA module)")
    p.add_argument("--enforce-eager", action="store_true", help="CUDA: run every step eagerly (no CUDA graphs)")
    p.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    p.add_argument("--quantization", "-q", default=None, choices=list(QUANTIZATION_METHODS),
                   help="gguf: compute on a GGUF file's quantized weights as they are (the default for a .gguf "
                        "on the CPU); int8: quantize an HF checkpoint's projections to int8 at load (W8A8); "
                        "fp8: the same in fp8 e4m3, on a Hopper GPU; mxfp4: compute on an MXFP4 checkpoint's "
                        "MXFP4 weights as they are (gpt-oss's experts; the default for one on the CPU); "
                        "none: keep or dequantize to --dtype")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-seqs", type=int, default=max_num_seqs)
    p.add_argument("--max-num-batched-tokens", type=int, default=max_num_batched_tokens)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse the KV blocks of prompts' common prefixes (on by default; "
                        "--no-enable-prefix-caching: every prompt computed afresh)")
    p.add_argument("--long-prefill-token-threshold", type=int, default=0, metavar="N",
                   help="> 0: at most N of one request's prompt tokens per step, so that a long prompt "
                        "shares its steps with the others (0: no cap beyond --max-num-batched-tokens)")
    p.add_argument("--kv-cache-memory", type=float, default=None,
                   help="KV cache size: bytes if >= 1, else a fraction of free memory (default on the CPU: 2 GiB)")
    p.add_argument("--kv-cache-dtype", default="auto", choices=list(KV_CACHE_DTYPES),
                   help="the KV cache's element type: auto, the model's dtype; fp8 (= fp8_e4m3) or fp8_e5m2, an 8-bit "
                        "float: twice the tokens in the same memory, half the bytes a decode step reads (CPU, "
                        "bfloat16 models)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reasoning-parser", default=None, choices=list(REASONING_PARSERS),
                   help="a reasoning model's format: <think> blocks (deepseek_r1, qwen3: reasoning_content apart, "
                        "structured output after it) or gpt-oss's harmony messages (openai_gptoss, with "
                        "--tool-call-parser openai for its calls)")
    p.add_argument("--pooling-type", default=None, choices=list(POOLING_TYPES),
                   help="how embedding requests pool the prompt's hidden states (default: the model's "
                        "sentence-transformers pooling config, else LAST)")
    p.add_argument("--generation-config", default="auto", metavar="auto|vllm|FOLDER",
                   help="where the sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty) of "
                        "requests that leave them out come from: auto, the model's generation_config.json; vllm, "
                        "none; or a folder's generation_config.json (its eos_token_id too)")
    p.add_argument("--hf-overrides", default=None, metavar="JSON",
                   help='fields set over the model directory\'s config.json, e.g. \'{"architectures": '
                        '["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"], '
                        '"is_original_qwen3_reranker": true}\'')
    p.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help='sampling defaults set over those, e.g. \'{"temperature": 0.5}\'')
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help='speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_max": 4}\' or \'{"method": "draft_model", "model": PATH, '
                        '"num_speculative_tokens": 4}\'')
    p.add_argument("--stream-interval", type=int, default=1, metavar="N",
                   help="a streamed reply's tokens go out N at a time (its first token and its end at once): fewer, "
                        "larger chunks where many streams run")
    p.add_argument("--enable-lora", action="store_true",
                   help="requests may run with LoRA adapters (PEFT directories; the server's --lora-modules, or "
                        "loaded at run time), named by their `model`")
    p.add_argument("--max-loras", type=int, default=4, metavar="N",
                   help="LoRA adapters held at once; a step mixes any of them and the base model (vLLM's default: 1)")
    p.add_argument("--max-lora-rank", type=int, default=16, metavar="R", help="the highest LoRA rank an adapter may have")
    p.add_argument("--scheduling-policy", default="fcfs", choices=["fcfs", "priority"],
                   help="fcfs: arrival order; priority: a request's `priority` first (lower runs first), then arrival")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1,
                   help="split the model over this many processes (its heads, intermediate rows and vocabulary)")
    p.add_argument("--nnodes", type=int, default=1, help="machines the tensor-parallel ranks run on")
    p.add_argument("--node-rank", type=int, default=0, help="this machine's index (0: the one that serves)")
    p.add_argument("--master-addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"),
                   help="node 0's address, where the ranks meet (default: $MASTER_ADDR or 127.0.0.1)")
    p.add_argument("--master-port", type=int, default=int(os.environ.get("MASTER_PORT", "0")),
                   help="node 0's port for the ranks (needed with --nnodes > 1; default: $MASTER_PORT)")
    p.add_argument("--disable-custom-all-reduce", action="store_true",
                   help="the CPU ranks' all-reduces through gloo rather than shared memory (one machine)")
    p.add_argument("--limit-mm-per-prompt", default=None, metavar="JSON",
                   help='a LLaVA model\'s images per prompt at most, e.g. \'{"image": 2}\' or image=2 (default 1)')
    p.add_argument("--allowed-media-domains", nargs="+", default=[], metavar="HOST",
                   help="hosts whose http(s) image URLs the server may fetch (default: none; data URLs only)")


def json_object_arg(flag: str, text: str | None) -> dict | None:
    """A flag's JSON object (ValueError naming the flag and what is wrong)."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{flag} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag} must be a JSON object, got {text!r}")
    return value


def speculative_config_from_arg(text: str | None) -> dict | None:
    return json_object_arg("--speculative-config", text)


def limit_mm_from_arg(text: str | None) -> dict | None:
    """--limit-mm-per-prompt: JSON ({"image": 2}) or vLLM's older image=2."""
    if text is not None and "=" in text and not text.lstrip().startswith("{"):
        key, _, value = text.partition("=")
        if not value.strip().isdigit():
            raise ValueError(f"--limit-mm-per-prompt: {text!r} is not KIND=N")
        return {key.strip(): int(value)}
    return json_object_arg("--limit-mm-per-prompt", text)


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The engine's configuration from the command line (and, under torchrun, its environment:
    the ranks' machines and this one's place among them)."""
    kv = args.kv_cache_memory
    nnodes, node_rank = args.nnodes, args.node_rank
    torchrun = TorchrunPlace.from_environment()
    if torchrun is not None:
        if args.tensor_parallel_size != torchrun.world_size:
            raise ValueError(f"under torchrun, --tensor-parallel-size ({args.tensor_parallel_size}) must equal its "
                             f"world size ({torchrun.world_size}: --nnodes x --nproc-per-node)")
        if (nnodes, node_rank) not in ((1, 0), (torchrun.nnodes, torchrun.node_rank)):
            raise ValueError(f"--nnodes {nnodes} --node-rank {node_rank} differ from torchrun's "
                             f"({torchrun.nnodes} nodes, this one {torchrun.node_rank}): leave them out under torchrun")
        nnodes, node_rank = torchrun.nnodes, torchrun.node_rank
    return EngineConfig(model=args.model, dtype=args.dtype, quantization=args.quantization, device=args.device, enforce_eager=args.enforce_eager,
                        max_model_len=args.max_model_len,
                        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                        block_size=args.block_size, enable_prefix_caching=args.enable_prefix_caching,
                        long_prefill_token_threshold=args.long_prefill_token_threshold,
                        seed=args.seed, scheduling_policy=args.scheduling_policy, stream_interval=args.stream_interval,
                        enable_lora=args.enable_lora, max_loras=args.max_loras, max_lora_rank=args.max_lora_rank,
                        reasoning_parser=args.reasoning_parser, pooling_type=args.pooling_type,
                        generation_config=args.generation_config,
                        override_generation_config=json_object_arg("--override-generation-config",
                                                                   args.override_generation_config),
                        hf_overrides=json_object_arg("--hf-overrides", args.hf_overrides),
                        speculative_config=speculative_config_from_arg(args.speculative_config),
                        limit_mm_per_prompt=limit_mm_from_arg(args.limit_mm_per_prompt),
                        allowed_media_domains=tuple(args.allowed_media_domains),
                        tensor_parallel_size=args.tensor_parallel_size, nnodes=nnodes,
                        node_rank=node_rank, master_addr=args.master_addr, master_port=args.master_port,
                        disable_custom_all_reduce=args.disable_custom_all_reduce, torchrun=torchrun is not None,
                        kv_cache_memory=None if kv is None else (int(kv) if kv >= 1 else float(kv)),
                        kv_cache_dtype=args.kv_cache_dtype)
