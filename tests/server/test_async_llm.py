"""AsyncLLM directly: concurrent generators, abort by id and by cancelling, DELTA outputs that
join to the full text, and blocks back in the pool afterwards; stream_interval's chunks through
the server; the engine thread's wait for the event loop to take each step's outputs (and its
bound); a program that ends without shutdown() exits cleanly."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

import pytest

from corellm.config import EngineConfig
from corellm.engine import async_llm
from corellm.engine.async_llm import AsyncLLM, engine_takes_every_core
from corellm.sampling_params import RequestOutputKind, SamplingParams


@pytest.fixture(scope="module")
def engine():
    return AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=128 * 1024**2))


def test_generate_cancel_abort(engine):
    async def run():
        params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
        deltas = [o.outputs[0].text async for o in engine.generate("Hello there,", params, "a")]
        final = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, output_kind=RequestOutputKind.FINAL_ONLY)
        outs = [o async for o in engine.generate("Hello there,", final, "b")]
        assert len(outs) == 1 and "".join(deltas) == outs[0].outputs[0].text

        long = SamplingParams(temperature=0, max_tokens=400, ignore_eos=True)
        gen = engine.generate("Count:", long, "c")
        await gen.__anext__()
        await gen.aclose()  # the caller walked away
        q = engine.add_request("Count again:", long, "d")
        await q.get()
        assert engine.abort("d") and not engine.abort("d")
        for _ in range(100):
            if engine.stats.num_running == 0 and engine.stats.kv_cache_usage == 0:
                break
            await asyncio.sleep(0.05)
        assert engine.stats.num_running == 0 and engine.stats.kv_cache_usage == 0
        with pytest.raises(ValueError, match="too long"):
            engine.process("e", {"prompt_token_ids": [1] * 600}, long)
        await engine.shutdown()

    asyncio.run(run())


def test_priorities_reach_the_scheduler_through_the_server():
    """--scheduling-policy priority: the request field `priority` is honoured (and a bad one is a
    400 naming it); requests of every priority complete."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from corellm.server.app import create_app
    from corellm.server.serving import ServerConfig

    async def run():
        engine = AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=64 * 1024**2, scheduling_policy="priority"))
        server = TestServer(create_app(engine, ServerConfig(served_model_name="m")))
        await server.start_server()
        try:
            async with aiohttp.ClientSession(str(server.make_url(""))) as s:
                async def complete(priority):
                    body = {"prompt": "Count to ten:", "max_tokens": 6, "ignore_eos": True, "priority": priority}
                    async with s.post("/v1/completions", json=body) as r:
                        return r.status, await r.json()

                results = await asyncio.gather(*(complete(p) for p in (3, -1, 0, 7)))
                assert all(status == 200 and out["choices"][0]["finish_reason"] == "length" for status, out in results)
                status, out = await complete(2**40)
                assert status == 400 and out["error"]["param"] == "priority", out
        finally:
            await server.close()

    asyncio.run(run())


def test_stream_interval_sends_tokens_that_many_at_a_time_through_the_server():
    """stream_interval 4 (--stream-interval 4): a stream's first chunk holds the first token, the
    others 4 tokens each but the last; they join to the reply not streamed."""
    import json

    import aiohttp
    from aiohttp.test_utils import TestServer

    from corellm.server.app import create_app
    from corellm.server.serving import ServerConfig

    async def run():
        engine = AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=64 * 1024**2, stream_interval=4))
        server = TestServer(create_app(engine, ServerConfig(served_model_name="m")))
        await server.start_server()
        try:
            async with aiohttp.ClientSession(str(server.make_url(""))) as s:
                body = {"prompt": "Count to ten:", "max_tokens": 14, "ignore_eos": True, "temperature": 0,
                        "return_token_ids": True}
                async with s.post("/v1/completions", json=body) as r:
                    whole = (await r.json())["choices"][0]
                async with s.post("/v1/completions", json={**body, "stream": True}) as r:
                    events = [json.loads(line[6:]) for line in (await r.text()).splitlines()
                              if line.startswith("data: {")]
                sizes = [len(e["choices"][0]["token_ids"]) for e in events if e["choices"][0]["token_ids"]]
                assert sizes == [1, 4, 4, 4, 1], sizes
                assert "".join(e["choices"][0]["text"] for e in events) == whole["text"]
                assert events[-1]["choices"][0]["finish_reason"] == "length"
        finally:
            await server.close()

    asyncio.run(run())
    with pytest.raises(ValueError, match="stream_interval"):
        EngineConfig(stream_interval=0)
    from corellm import LLM

    with pytest.raises(ValueError, match="applies to streamed outputs"):  # LLM returns whole outputs
        LLM(stream_interval=4)


def test_engine_takes_every_core_counts_the_threads_of_every_local_rank():
    cores = len(os.sched_getaffinity(0))
    assert engine_takes_every_core("cpu", cores)
    assert engine_takes_every_core("cpu", cores + 3)
    assert not engine_takes_every_core("cuda", cores)
    if cores > 1:
        assert not engine_takes_every_core("cpu", cores - 1)
        assert engine_takes_every_core("cpu", (cores + 1) // 2, local_ranks=2)


def _steps_while_the_loop_is_blocked(monkeypatch, wait_s: float, blocked_s: float) -> int:
    """Outputs (one a step) that one decoding request's queue holds once the event loop, blocked
    for blocked_s after its first token, runs again: the steps the engine took meanwhile."""
    monkeypatch.setattr(async_llm, "engine_takes_every_core", lambda *args: True)
    monkeypatch.setattr(async_llm, "HANDOFF_WAIT_S", wait_s)

    async def run() -> int:
        engine = AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=64 * 1024**2))
        try:
            q = engine.add_request("Count:", SamplingParams(temperature=0, max_tokens=300, ignore_eos=True))
            await q.get()
            time.sleep(blocked_s)  # the loop takes no outputs meanwhile
            for _ in range(3):  # the steps' posted callbacks run
                await asyncio.sleep(0)
            return q.qsize()
        finally:
            await engine.shutdown()

    return asyncio.run(run())


def test_the_engine_waits_for_the_event_loop_to_take_a_steps_outputs(monkeypatch):
    """With the wait on and no bound to speak of, the engine does not run ahead of an event loop that
    does not take its outputs: one step's outputs posted, then it waits."""
    assert _steps_while_the_loop_is_blocked(monkeypatch, wait_s=30.0, blocked_s=0.5) <= 1


def test_the_wait_for_the_event_loop_is_bounded(monkeypatch):
    """A busy event loop holds each step up at most HANDOFF_WAIT_S: the engine goes on decoding."""
    assert _steps_while_the_loop_is_blocked(monkeypatch, wait_s=0.01, blocked_s=0.5) >= 5


# Requests still decoding when the program's event loop ends, and no shutdown().
ENDS_WITHOUT_SHUTDOWN = r"""
import asyncio
from corellm.config import EngineConfig
from corellm.engine import async_llm
from corellm.engine.async_llm import AsyncLLM, engine_takes_every_core
from corellm.sampling_params import SamplingParams

async def main():
    engine = AsyncLLM(EngineConfig(max_model_len=512, kv_cache_memory=64 * 1024**2))
    engine.start()
    async def one(i):
        params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
        async for _ in engine.generate({"prompt_token_ids": [1000 + i] * 50}, params):
            pass
    tasks = [asyncio.create_task(one(i)) for i in range(8)]
    await asyncio.sleep(0.5)
    print("leaving", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("run", range(3))
def test_a_program_that_ends_without_shutdown_exits_cleanly(run):
    """The engine thread is stopped and joined at exit: ended by the interpreter's finalization in
    the middle of a step, it died through a C++ frame and took the process with it (std::terminate,
    exit code 134, in 5 of 6 runs before)."""
    done = subprocess.run([sys.executable, "-c", ENDS_WITHOUT_SHUTDOWN], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "leaving", done.stderr[-2000:]
    assert "terminate called" not in done.stderr and "engine thread died" not in done.stderr, done.stderr[-2000:]
