"""Clients that leave: 50 streams dropped mid-generation and non-streaming requests whose client
timed out are aborted, and every KV block and request state is released within a second."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from tests.reliability.conftest import held, wait_released


def test_50_dropped_streams_release_everything_within_1s(server):
    baseline = held(server.url)["free_blocks"]
    assert baseline > 0

    async def drop(session: aiohttp.ClientSession, i: int) -> None:
        body = {"prompt": f"Stream {i}: count forever, 1, 2,", "max_tokens": 400, "ignore_eos": True, "stream": True}
        resp = await session.post(server.url + "/v1/completions", json=body)
        assert resp.status == 200
        chunks = 0
        async for line in resp.content:
            chunks += line.startswith(b"data: {")
            if chunks == 2:
                break
        resp.close()  # drops the connection mid-stream

    async def run() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            await asyncio.gather(*(drop(session, i) for i in range(50)))

    asyncio.run(run())
    assert wait_released(server.url, baseline, within_s=1.0) < 1.0


def test_client_timeouts_abort_non_streaming_requests(server):
    baseline = held(server.url)["free_blocks"]

    async def impatient(session: aiohttp.ClientSession, i: int) -> None:
        body = {"prompt": f"Essay {i}:", "max_tokens": 400, "ignore_eos": True}
        try:
            async with session.post(server.url + "/v1/completions", json=body,
                                    timeout=aiohttp.ClientTimeout(total=0.5)) as r:
                await r.read()
        except asyncio.TimeoutError:
            return
        raise AssertionError("a 400-token request finished within 0.5 s")

    async def run() -> None:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*(impatient(session, i) for i in range(10)))

    started = time.monotonic()
    asyncio.run(run())
    assert time.monotonic() - started < 5
    assert wait_released(server.url, baseline, within_s=1.0) < 1.0
