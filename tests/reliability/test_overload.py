"""Admission control: at 5x what the server runs and queues, every request either completes (200)
or is refused at once (429 with Retry-After); none hangs, none errors, and the server serves
normally afterwards."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.reliability.conftest import assert_error, call, held, wait_released
from tests.server.conftest import Server

MAX_SEQS, MAX_QUEUED = 2, 4


@pytest.fixture(scope="module")
def small_server():
    s = Server("--max-num-seqs", str(MAX_SEQS), "--max-queued-requests", str(MAX_QUEUED),
               "--max-queued-tokens", "2000")
    yield s
    s.stop()


async def _one(session: aiohttp.ClientSession, url: str, i: int, stream: bool) -> tuple[int, dict]:
    body = {"prompt": f"Request {i}: count to twenty.", "max_tokens": 24, "ignore_eos": True, "stream": stream}
    async with session.post(url + "/v1/completions", json=body) as r:
        if r.status != 200:
            return r.status, {"body": await r.json(), "retry_after": r.headers.get("Retry-After")}
        if not stream:
            return 200, await r.json()
        finish, lines = None, []
        async for line in r.content:
            lines.append(line)
            if line.startswith(b"data: {") and b'"finish_reason": "length"' in line:
                finish = "length"
        return 200, {"finish": finish, "lines": lines[-6:]}


def test_overload_gives_only_200s_and_429s(small_server):
    sent = 5 * (MAX_SEQS + MAX_QUEUED)

    async def run():
        timeout = aiohttp.ClientTimeout(total=120)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            return await asyncio.gather(*(_one(session, small_server.url, i, i % 2 == 0) for i in range(sent)))

    started = time.monotonic()
    results = asyncio.run(run())
    assert time.monotonic() - started < 120
    statuses = [s for s, _ in results]
    completed, rejected = statuses.count(200), statuses.count(429)
    assert completed + rejected == sent, statuses
    assert completed >= MAX_QUEUED and rejected >= 1, statuses
    for status, out in results:
        if status == 429:
            assert_error(429, out["body"], 429, "rate_limit_exceeded")
            assert out["body"]["error"]["code"] == "server_overloaded"
            assert int(out["retry_after"]) >= 1
        elif "finish" in out:
            assert out["finish"] == "length", out["lines"]
        else:
            assert out["choices"][0]["finish_reason"] == "length"
    wait_released(small_server.url, held(small_server.url)["free_blocks"], within_s=5)
    code, out, _ = call(small_server.url + "/v1/completions", {"prompt": "after", "max_tokens": 2})
    assert code == 200, out


def test_a_request_bigger_than_the_token_queue_is_400(small_server):
    code, out, _ = call(small_server.url + "/v1/completions", {"prompt": [5] * 300, "max_tokens": 2, "n": 8})
    assert_error(code, out, 400, param="prompt", contains="2000")
