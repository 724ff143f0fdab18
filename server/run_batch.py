"""`corellm run-batch -i INPUT.jsonl -o OUTPUT.jsonl`: a file of requests in OpenAI's batch format
run offline, as vLLM's run-batch runs them.

    input   one request a line: {"custom_id": "...", "method": "POST", "url": "/v1/chat/completions",
            "body": {...}} — any POST route of the server (chat, completions, responses, messages,
            embeddings, score, rerank, tokens in); every line is checked before the model loads (a
            custom_id given twice, a method other than POST, a body that asks to be streamed: an
            error naming the line)
    output  one line a request, in the input's order: {"id": "batch_req_...", "custom_id": ...,
            "response": {"status_code", "request_id", "body"}, "error": null} — a request the
            server refuses is its error reply (status_code 400 and the error body), as OpenAI's
            batches write it; "-" is stdout for either

The requests go to the server's own application (server/app.py) on a Unix socket of this process,
up to --max-concurrency at a time, so a line is answered exactly as `corellm serve` would answer it."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from aiohttp import web

from corellm.engine.async_llm import AsyncLLM
from corellm.server.app import create_app
from corellm.server.lora_adapters import add_lora_modules_arg, checked_lora_modules, load_lora_modules
from corellm.server.serving import ServerConfig

logger = logging.getLogger("corellm.server")


@dataclass
class BatchLine:
    number: int  # in the input file, from 1
    custom_id: str
    url: str
    body: dict[str, Any]


def read_batch(lines: list[str]) -> list[BatchLine]:
    """The batch's requests; a ValueError names the first line that is not one."""
    batch, seen = [], set()
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"line {number}: not JSON ({e})") from None
        if not isinstance(item, dict):
            raise ValueError(f"line {number}: a request is a JSON object, got {type(item).__name__}")
        unknown = sorted(set(item) - {"custom_id", "method", "url", "body"})
        if unknown:
            raise ValueError(f"line {number}: unknown field {unknown[0]!r} (a line has custom_id, method, url, body)")
        custom_id, method, url, body = (item.get(k) for k in ("custom_id", "method", "url", "body"))
        if not isinstance(custom_id, str) or not custom_id:
            raise ValueError(f"line {number}: custom_id must be a non-empty string")
        if custom_id in seen:
            raise ValueError(f"line {number}: custom_id {custom_id!r} is given twice")
        if method != "POST":
            raise ValueError(f"line {number}: method must be POST, got {method!r}")
        if not isinstance(url, str) or not url.startswith("/"):
            raise ValueError(f"line {number}: url must be a route of the server (such as /v1/chat/completions), "
                             f"got {url!r}")
        if not isinstance(body, dict):
            raise ValueError(f"line {number}: body must be a JSON object")
        if body.get("stream"):
            raise ValueError(f"line {number}: a batch's requests are not streamed (leave stream out)")
        seen.add(custom_id)
        batch.append(BatchLine(number, custom_id, url, body))
    return batch


class OrderedWriter:
    """Writes each request's output line as soon as those before it are written."""

    def __init__(self, out: TextIO):
        self.out = out
        self.next = 0
        self.waiting: dict[int, dict[str, Any]] = {}

    def add(self, position: int, line: dict[str, Any]) -> None:
        self.waiting[position] = line
        while self.next in self.waiting:
            self.out.write(json.dumps(self.waiting.pop(self.next), ensure_ascii=False) + "\n")
            self.next += 1
        self.out.flush()


async def run_batch(engine: AsyncLLM, config: ServerConfig, batch: list[BatchLine], out: TextIO,
                    max_concurrency: int) -> dict[str, int]:
    """Runs the batch through the server's application; returns how many lines were answered 200 and not."""
    runner = web.AppRunner(create_app(engine, config), access_log=None)
    await runner.setup()  # starts the engine (the app's startup)
    counts = {"ok": 0, "failed": 0}
    try:
        with tempfile.TemporaryDirectory(prefix="corellm-batch-") as tmp:
            socket_path = str(Path(tmp) / "server.sock")
            await web.UnixSite(runner, socket_path).start()
            writer, gate = OrderedWriter(out), asyncio.Semaphore(max_concurrency)
            timeout = aiohttp.ClientTimeout(total=None)
            async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path),
                                             timeout=timeout) as session:

                async def one(position: int, line: BatchLine) -> None:
                    request_id = f"batch-{uuid.uuid4().hex}"
                    async with gate, session.post(f"http://corellm{line.url}", json=line.body,
                                                  headers={"X-Request-Id": request_id}) as reply:
                        try:
                            body = await reply.json(content_type=None)
                        except ValueError:
                            body = {"error": {"message": (await reply.text())[:1000], "type": "internal_error"}}
                    counts["ok" if reply.status == 200 else "failed"] += 1
                    writer.add(position, {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
                                          "response": {"status_code": reply.status, "request_id": request_id,
                                                       "body": body}, "error": None})

                await asyncio.gather(*(one(i, line) for i, line in enumerate(batch)))
    finally:
        await runner.cleanup()  # stops the engine
    return counts


def add_run_batch_args(p: argparse.ArgumentParser) -> None:
    from corellm.engine_args import add_engine_args
    from corellm.tool_calls import TOOL_CALL_PARSERS

    p.add_argument("-i", "--input-file", required=True, help="the batch's requests, one JSON line each ('-': stdin)")
    p.add_argument("-o", "--output-file", required=True, help="where the outputs go, one JSON line each ('-': stdout)")
    p.add_argument("--model", default=None, help="HF model directory, .gguf file, Hugging Face Hub id in the "
                   "local HF cache, or SmolLM2-135M-Instruct (default)")
    p.add_argument("--served-model-name", default=None, help="the name the bodies' `model` may give")
    add_engine_args(p)  # offline's defaults (corellm generate's, LLM's): a full batch over latency
    add_lora_modules_arg(p)
    p.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at once (default: twice --max-num-seqs, so that the engine's batch "
                        "stays full)")
    p.add_argument("--chat-template", default=None, metavar="FILE",
                   help="a Jinja chat template file, for models without one (or to replace theirs)")
    p.add_argument("--allow-request-chat-template", action="store_true",
                   help="let requests bring their own chat template (rendered in the sandbox)")
    p.add_argument("--enable-auto-tool-choice", action="store_true",
                   help='let requests with tools use tool_choice "auto" (needs --tool-call-parser)')
    p.add_argument("--tool-call-parser", default=None, choices=list(TOOL_CALL_PARSERS))
    p.add_argument("--max-logprobs", type=int, default=ServerConfig.max_logprobs, metavar="N")
    p.add_argument("--allow-unknown-fields", action="store_true",
                   help="ignore (and log once) request arguments corellm does not know instead of answering 400")


def main(args: argparse.Namespace) -> int:
    from corellm import startup_gc
    from corellm.engine_args import engine_config_from_args
    from corellm.server.main import read_chat_template

    config = engine_config_from_args(args)
    lora_modules = checked_lora_modules(args)
    if config.torchrun:
        raise ValueError("corellm run-batch does not run under torchrun (every rank would run it): give "
                         "--tensor-parallel-size instead")
    from corellm.server.chat_tools import check_tool_call_parser

    check_tool_call_parser(args.tool_call_parser, args.enable_auto_tool_choice, args.reasoning_parser)
    if args.max_concurrency is not None and args.max_concurrency < 1:
        raise ValueError(f"--max-concurrency must be >= 1, got {args.max_concurrency}")
    try:
        text = sys.stdin.read() if args.input_file == "-" else Path(args.input_file).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"--input-file {args.input_file}: {e.strerror}") from None
    batch = read_batch(text.splitlines())
    chat_template = read_chat_template(args.chat_template)
    try:  # before the model loads: a path that cannot be written is said at once
        out = sys.stdout if args.output_file == "-" else open(args.output_file, "w", encoding="utf-8")  # noqa: SIM115
    except OSError as e:
        raise ValueError(f"--output-file {args.output_file}: {e.strerror}") from None
    started = time.perf_counter()
    try:
        with startup_gc.lasting_objects():
            engine = AsyncLLM(config)
        load_lora_modules(engine, lora_modules, args.served_model_name or engine.loaded.name)
        server_config = ServerConfig(served_model_name=args.served_model_name or engine.loaded.name,
                                     allow_request_chat_template=args.allow_request_chat_template,
                                     chat_template=chat_template, enable_auto_tool_choice=args.enable_auto_tool_choice,
                                     tool_call_parser=args.tool_call_parser, max_logprobs=args.max_logprobs,
                                     allow_unknown_fields=args.allow_unknown_fields)
        concurrency = args.max_concurrency or 2 * config.max_num_seqs
        counts = asyncio.run(run_batch(engine, server_config, batch, out, concurrency))
    finally:
        if out is not sys.stdout:
            out.close()
    logger.info("ran %d requests in %.1f s: %d answered, %d refused or failed (their error replies are in the "
                "output)", len(batch), time.perf_counter() - started, counts["ok"], counts["failed"])
    return 0
