"""`corellm serve`: load the model, start the engine and the aiohttp server, drain on SIGINT /
SIGTERM, exit. Draining: the server keeps listening but answers new requests with 503, waits up
to --shutdown-timeout seconds for the requests in flight to finish, then closes."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import time

from aiohttp import web

from corellm import startup_gc
from corellm.distributed.torchrun import TorchrunPlace
from corellm.engine.async_llm import AsyncLLM
from corellm.engine_args import add_engine_args, engine_config_from_args
from corellm.model.loader import DEFAULT_MODEL
from corellm.server.admission import AdmissionLimits
from corellm.server.app import SERVING, create_app
from corellm.server.lora_adapters import add_lora_modules_arg, checked_lora_modules, load_lora_modules
from corellm.server.serving import ServerConfig
from corellm.server.chat_tools import check_tool_call_parser
from corellm.tool_calls import TOOL_CALL_PARSERS

logger = logging.getLogger("corellm.server")


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", nargs="?", default=None,
                   help=f"HF model directory, .gguf file, Hugging Face Hub id already in the local HF cache "
                        f"(ORG/NAME, or ORG/NAME:TAG for one of a GGUF repository's files), or {DEFAULT_MODEL} "
                        f"(default)")
    p.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                   help="the model as a flag instead (as vLLM's serve also takes it)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None, help="the name clients use (default: the model's)")
    add_engine_args(p, max_num_seqs=64, max_num_batched_tokens=512)  # a small budget keeps TPOT low
    add_lora_modules_arg(p)
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on every route but the probes /health and /ping")
    p.add_argument("--allow-request-chat-template", action="store_true",
                   help="let requests bring their own chat template (rendered in the sandbox)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file, for models without one (or to replace theirs)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let requests with tools use tool_choice "auto" (needs --tool-call-parser)')
    p.add_argument("--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS),
                   help="how the model writes tool calls (hermes: Hermes / Qwen; llama3_json; mistral)")
    p.add_argument("--enable-server-load-tracking", action="store_true",
                   help="vLLM's flag, accepted for its command lines: GET /load always reports the server's load")
    p.add_argument("--max-body-bytes", type=int, default=2 * 1024 * 1024)
    p.add_argument("--max-logprobs", type=int, default=ServerConfig.max_logprobs, metavar="N",
                   help="the most logprobs / top_logprobs / prompt_logprobs a request may ask for (vLLM's; "
                        "-1: up to the vocabulary)")
    p.add_argument("--allow-unknown-fields", action="store_true",
                   help="ignore (and log once) request arguments that corellm does not know, as vLLM does, "
                        "instead of refusing the request with 400 naming the argument (unknown fields within "
                        "messages and other parts are ignored either way, as OpenAI's API ignores them)")
    limits = AdmissionLimits()
    p.add_argument("--max-queued-requests", type=int, default=limits.max_queued_requests,
                   help="requests waiting for their first token beyond which new ones get 429")
    p.add_argument("--max-queued-tokens", type=int, default=limits.max_queued_tokens,
                   help="prompt tokens waiting for their first token beyond which new requests get 429")
    p.add_argument("--shutdown-timeout", type=float, default=30.0)
    p.add_argument("--max-stored-responses", type=int, default=ServerConfig.max_stored_responses,
                   help="responses of the Responses API kept in memory for GET, previous_response_id and "
                        "background runs (least recently used out first; 0: none, store true is then a 400)")
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                   help="engine replicas (each a process, each possibly tensor-parallel) behind this server, "
                        "requests routed by load and prompt prefix")
    p.add_argument("--headless", action="store_true",
                   help="a node other than node 0 (--node-rank K of --nnodes): run its tensor-parallel ranks, no "
                        "HTTP server, until node 0's engine stops them")


async def serve(engine: AsyncLLM, config: ServerConfig, host: str, port: int, shutdown_timeout: float,
                started: float | None = None) -> None:
    app = create_app(engine, config)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=1.0, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    ready = f" (ready in {time.perf_counter() - started:.1f} s)" if started else ""
    logger.info("serving %s on http://%s:%d%s", config.served_model_name, host, port, ready)
    warming = asyncio.create_task(warm_grammar_when_idle(engine, app[SERVING]))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    serving = app[SERVING]
    serving.draining = True
    logger.info("shutting down: draining %d in-flight requests (up to %.0f s); new requests get 503",
                serving.active, shutdown_timeout)
    deadline = loop.time() + shutdown_timeout
    while serving.active and loop.time() < deadline:
        await asyncio.sleep(0.05)
    if serving.active:
        logger.warning("%d requests still in flight after %.0f s: cancelling them", serving.active, shutdown_timeout)
    warming.cancel()
    await runner.cleanup()


async def warm_grammar_when_idle(engine: AsyncLLM, serving, idle_s: float = 0.5) -> None:
    """Builds the grammar compiler's llguidance tokenizer (so that the first structured request
    need not wait for it) at the first check, every idle_s, that finds no request in flight.
    llguidance holds the GIL while it builds (0.25 s for SmolLM2's 49k tokens, seconds for a 262k
    vocabulary): done at start-up it would hold up the first /health and requests; done while
    requests are in flight it would stall their steps. A structured request that comes first
    builds it itself."""
    while True:
        await asyncio.sleep(idle_s)
        if serving.active == 0:
            engine.parts.grammar_compiler.warm()
            return


def check_listen_address(host: str, port: int) -> None:
    """ValueError when host:port cannot be listened on (taken, or not an address of this machine):
    said before the model loads rather than after."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ValueError(f"--host {host}: {e.strerror}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server's own socket
        try:
            s.bind(address)
        except OSError as e:
            raise ValueError(f"cannot listen on {host}:{port}: {e.strerror}") from None


def read_chat_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as e:
        raise ValueError(f"--chat-template {path}: {e.strerror}") from None


def run(args: argparse.Namespace) -> int:
    if args.model_option is not None:
        if args.model is not None and args.model != args.model_option:
            raise ValueError(f"two models given: {args.model!r} and --model {args.model_option!r}")
        args.model = args.model_option
    if args.data_parallel_size < 1:
        raise ValueError(f"--data-parallel-size must be >= 1, got {args.data_parallel_size}")
    if args.max_stored_responses < 0:
        raise ValueError(f"--max-stored-responses must be >= 0, got {args.max_stored_responses}")
    if args.max_logprobs < -1:
        raise ValueError(f"--max-logprobs must be >= 0, or -1 (up to the vocabulary), got {args.max_logprobs}")
    torchrun = TorchrunPlace.from_environment()
    if torchrun is not None and (args.data_parallel_size > 1 or args.headless):
        raise ValueError("under torchrun, every process is a tensor-parallel rank: --data-parallel-size and "
                         "--headless do not apply")
    if torchrun is not None and torchrun.rank > 0:  # rank 0 serves; this rank runs its share of the model
        from corellm.worker.tp_workers import TensorParallelWorkers

        return TensorParallelWorkers.run_torchrun_rank(engine_config_from_args(args), torchrun.rank)
    if args.data_parallel_size > 1:
        if args.headless or args.nnodes > 1:
            raise ValueError("--data-parallel-size with --nnodes / --headless is not supported: run one "
                             "multi-node engine per server")
        config = engine_config_from_args(args)  # a bad argument is refused here, not by N replicas
        check_listen_address(args.host, args.port)
        from corellm.server.data_parallel import ReplicaPlacement, run_data_parallel

        return run_data_parallel(args.argv, ReplicaPlacement.of(config, args.data_parallel_size), args.host,
                                 args.port, args.api_key)
    if args.headless:
        config = engine_config_from_args(args)
        if config.node_rank == 0 or config.nnodes == 1:
            raise ValueError("--headless runs the ranks of a node other than node 0: give --nnodes N and "
                             "--node-rank K (K >= 1)")
        from corellm.worker.tp_workers import TensorParallelWorkers

        return TensorParallelWorkers.run_headless(config)
    check_tool_call_parser(args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser)
    started = time.perf_counter()
    config = engine_config_from_args(args)
    lora_modules = checked_lora_modules(args)
    check_listen_address(args.host, args.port)
    with startup_gc.lasting_objects():
        engine = AsyncLLM(config)
    name = args.served_model_name or engine.loaded.name
    load_lora_modules(engine, lora_modules, name)
    logger.info("model %s (%s, %s), context %d tokens", name, engine.loaded.path, engine.loaded.model.dtype,
                engine.max_model_len)
    labels = engine.loaded.config.classifier_labels
    if engine.loaded.config.encoder_only and not labels:
        logger.info("an encoder-only model (%s): it serves embeddings, /score and /rerank (cosine similarity), not "
                    "generation", engine.loaded.config.architecture)
    if labels:
        logger.info("a sequence classifier of %d label(s) (%s): it serves /classify%s and embeddings, not "
                    "generation", len(labels), ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else ""),
                    ", /score and /rerank (a cross-encoder)" if len(labels) == 1 else "")
    server_config = ServerConfig(served_model_name=name, api_key=args.api_key,
                                 allow_request_chat_template=args.allow_request_chat_template,
                                 chat_template=read_chat_template(args.chat_template),
                                 enable_auto_tool_choice=args.enable_auto_tool_choice,
                                 tool_call_parser=args.tool_call_parser,
                                 max_body_bytes=args.max_body_bytes, max_stored_responses=args.max_stored_responses,
                                 allow_unknown_fields=args.allow_unknown_fields, max_logprobs=args.max_logprobs,
                                 admission=AdmissionLimits(args.max_queued_requests, args.max_queued_tokens))
    try:
        asyncio.run(serve(engine, server_config, args.host, args.port, args.shutdown_timeout, started))
    except OSError as e:  # the address was taken while the model loaded
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror}") from None
    return 0
