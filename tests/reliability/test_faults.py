"""Faults inside the engine, injected in-process: a request whose logits turn NaN, whose
detokenizer raises, or whose step's forward fails ends with an error while the others complete
and the engine keeps serving; an engine thread that dies is reported by /health (503) and every
request gets a 503 instead of hanging."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
import pytest
import torch
from aiohttp.test_utils import TestServer

from corellm.config import EngineConfig
from corellm.engine.async_llm import AsyncLLM
from corellm.model.loader import load_model
from corellm.server.app import create_app
from corellm.server.serving import ServerConfig

POISON = "POISON:"


@pytest.fixture(scope="module")
def loaded():
    return load_model(None)


def poisoned_ids(engine: AsyncLLM) -> set[str]:
    """Engine-core ids of the requests whose prompt starts with POISON (filled as they arrive)."""
    marker = engine.tokenizer.encode(POISON)
    ids: set[str] = set()
    core = engine.engine_core
    add = core.add_request

    def add_request(request):
        if list(request.prompt_token_ids[:len(marker)]) == marker:
            ids.add(request.request_id)
        add(request)

    core.add_request = add_request
    return ids


@contextlib.asynccontextmanager
async def serving(loaded, inject):
    engine = AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=64 * 1024**2, max_num_seqs=16), loaded=loaded)
    inject(engine)
    server = TestServer(create_app(engine, ServerConfig(served_model_name="m")))
    await server.start_server()
    try:
        async with aiohttp.ClientSession(str(server.make_url("")), timeout=aiohttp.ClientTimeout(total=60)) as s:
            yield engine, s
    finally:
        await server.close()


async def complete(session, prompt: str, stream: bool = False) -> tuple[int, object]:
    body = {"prompt": prompt, "max_tokens": 12, "ignore_eos": True, "stream": stream}
    async with session.post("/v1/completions", json=body) as r:
        if not stream:
            return r.status, await r.json()
        return r.status, [line async for line in r.content if line.startswith(b"data: ")]


async def one_bad_among_good(session) -> None:
    results = await asyncio.gather(complete(session, f"{POISON} x"), complete(session, f"{POISON} y", stream=True),
                                   *(complete(session, f"Good request {i}:") for i in range(4)))
    (bad_status, bad), (stream_status, events), *good = results
    assert bad_status == 500 and bad["error"]["type"] == "internal_error", bad
    assert stream_status == 200 and b'"error"' in events[-2] and events[-1] == b"data: [DONE]\n", events[-3:]
    for status, out in good:
        assert status == 200 and out["choices"][0]["finish_reason"] == "length", out
    status, out = await complete(session, "And the engine still serves:")
    assert status == 200, out


async def assert_nothing_held(engine: AsyncLLM, session) -> None:
    for _ in range(100):
        if not any(engine.open_request_states().values()):
            break
        await asyncio.sleep(0.01)
    assert not any(engine.open_request_states().values()), engine.open_request_states()
    async with session.get("/health") as r:
        assert r.status == 200


def check_isolated(loaded, inject) -> None:
    """With `inject` applied, the poisoned requests fail alone and nothing stays held."""
    async def run():
        async with serving(loaded, inject) as (engine, session):
            await one_bad_among_good(session)
            await assert_nothing_held(engine, session)

    asyncio.run(run())


def test_nan_logits_end_only_that_request(loaded):
    def inject(engine):
        ids = poisoned_ids(engine)
        runner = engine.engine_core.model_runner
        execute = runner.execute_model

        def execute_model(so):
            execute(so)
            state = runner._state
            if state is not None and state.logits is not None:
                with torch.inference_mode():  # the logits are an inference tensor
                    for row, req_id in enumerate(so.req_ids):
                        if req_id in ids:
                            state.logits[row] = float("nan")

        runner.execute_model = execute_model

    check_isolated(loaded, inject)


def test_detokenizer_failure_ends_only_that_request(loaded):
    def inject(engine):
        processor = engine.output_processor
        add = processor.add_request

        def add_request(processed):
            add(processed)
            if (processed.prompt or "").startswith(POISON):
                for sample in processed.samples:
                    def boom(token_ids, stop_terminated=False):
                        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected detokenizer failure")
                    processor.requests[sample.request_id].samples[sample.request_id].detokenizer.update = boom

        processor.add_request = add_request

    check_isolated(loaded, inject)


def test_failed_forward_ends_its_step_and_the_engine_serves_on(loaded):
    failed = []

    def inject(engine):
        runner = engine.engine_core.model_runner
        execute = runner.execute_model

        def execute_model(so):
            if not failed:
                failed.append(so.num_reqs)
                raise RuntimeError("injected forward failure")
            execute(so)

        runner.execute_model = execute_model

    async def run():
        async with serving(loaded, inject) as (engine, session):
            status, out = await complete(session, "The first step fails:")
            assert status == 500 and "injected forward failure" in out["error"]["message"], out
            status, out = await complete(session, "The next one works:")
            assert status == 200, out
            await assert_nothing_held(engine, session)

    asyncio.run(run())


def test_dead_engine_thread_is_reported_not_hidden(loaded, caplog):
    def inject(engine):
        core = engine.engine_core
        step = core.step

        def dying_step():
            if core.scheduler.stats().num_running:
                raise SystemError("injected engine crash")
            return step()

        core.step = dying_step

    async def run():
        async with serving(loaded, inject) as (engine, session):
            status, out = await complete(session, "This request meets the crash:")
            assert status == 503 and "injected engine crash" in out["error"]["message"], out
            async with session.get("/health") as r:
                assert r.status == 503
                assert (await r.json())["status"] == "dead"
            status, out = await complete(session, "So does this one:")
            assert status == 503, out

    asyncio.run(run())
    assert "the engine thread died" in caplog.text
