"""Memory pressure: with a KV cache far too small for the offered load, requests are preempted
and recomputed, and each greedy output equals the same request run alone — compared up to the
first position where the lone run's top-2 logprob margin is a near-tie (fp32)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.reliability.conftest import call, metrics, wait_released
from tests.server.conftest import Server

BLOCK, BLOCKS = 16, 24
FP32_BYTES_PER_TOKEN = 30 * 2 * 3 * 64 * 4  # SmolLM2-135M: layers x (K, V) x kv heads x head dim x fp32
PROMPTS = [f"Question {i}: what is {i} plus {i + 3}? Explain step by step." for i in range(8)]
MAX_TOKENS = 60
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def tight_server():
    s = Server("--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", "8",
               "--kv-cache-memory", str(BLOCKS * BLOCK * FP32_BYTES_PER_TOKEN))
    yield s
    s.stop()


def greedy(server, prompt: str, logprobs: int | None = None) -> dict:
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
    if logprobs:
        body["logprobs"] = logprobs
    code, out, _ = call(server.url + "/v1/completions", body, timeout=300)
    assert code == 200, out
    return out["choices"][0]


def test_preempted_requests_equal_their_lone_runs(tight_server):
    alone = [greedy(tight_server, p, logprobs=2) for p in PROMPTS]
    assert metrics(tight_server.url)["corellm:num_preemptions_total"] == 0

    async def together():
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            async def one(p):
                body = {"prompt": p, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "logprobs": 2}
                async with session.post(tight_server.url + "/v1/completions", json=body) as r:
                    assert r.status == 200
                    return (await r.json())["choices"][0]
            return await asyncio.gather(*(one(p) for p in PROMPTS))

    loaded = asyncio.run(together())
    assert metrics(tight_server.url)["corellm:num_preemptions_total"] > 0, "the load did not exhaust the cache"
    compared = 0
    for lone, busy in zip(alone, loaded):
        lp = lone["logprobs"]
        for pos, (want, got) in enumerate(zip(lp["tokens"], busy["logprobs"]["tokens"], strict=True)):
            top = sorted(lp["top_logprobs"][pos].values(), reverse=True)
            if len(top) > 1 and top[0] - top[1] < NEAR_TIE:
                break  # a near-tie: either token is right, and the texts may part from here
            assert got == want, (lone["text"], busy["text"], pos)
            compared += 1
    assert compared >= len(PROMPTS) * MAX_TOKENS // 2
    wait_released(tight_server.url, BLOCKS, within_s=5)


def test_a_request_longer_than_the_cache_is_refused_at_startup():
    with pytest.raises(RuntimeError, match=r"max_model_len \(512\) exceeds the KV cache capacity"):
        Server("--dtype", "float32", "--max-model-len", "512",
               "--kv-cache-memory", str(BLOCKS * BLOCK * FP32_BYTES_PER_TOKEN))
