"""Consistency under the engine's machinery (SmolLM2, fp32, greedy): each prompt's tokens are the
same — up to the first near-tie of its run alone — in a batch of 32 mixed-length prompts, with a
tiny token budget (chunked prefill), after a prefix-cache hit, and after preemption. On the CPU,
and on a GPU when there is one (CUDA graphs on: batches of other sizes replay other graphs)."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams
from corellm.model import load_model
from corellm.ops._backend import cuda_available
from tests.engine.prompts import PROMPTS

NUM_TOKENS, MARGIN = 16, 0.05
SYSTEM = "You are a helpful assistant. Answer briefly and precisely. "


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not (cuda_available() and torch.cuda.is_available()), reason="needs corellm._cuda and a CUDA GPU"))])
def model_fp32(request):
    return load_model(dtype="float32", device=request.param, progress=False)


def make_llm(model, **kw):
    args = dict(max_model_len=256, kv_cache_memory=128 * 1024**2, max_num_seqs=32)
    args.update(kw)
    return LLM(loaded_model=model, dtype="float32", device=model.model.device.type, **args)


def params(logprobs=None):
    return SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=logprobs)


@pytest.fixture(scope="module")
def prompts():
    # Half share a long system prefix (prefix-cache hits across requests), all lengths differ.
    return [(SYSTEM if i % 2 else "") + p for i, p in enumerate(PROMPTS)]


@pytest.fixture(scope="module")
def alone(model_fp32, prompts):
    """Each prompt run by itself: tokens and the position of its first near-tie."""
    llm = make_llm(model_fp32, enable_prefix_caching=False)
    result = []
    for p in prompts:
        out = llm.generate(p, params(logprobs=2), use_tqdm=False)[0].outputs[0]
        limit = NUM_TOKENS
        for t, pos in enumerate(out.logprobs):
            top = sorted((lp.logprob for lp in pos.values()), reverse=True)
            if len(top) > 1 and top[0] - top[1] < MARGIN:
                limit = t
                break
        result.append((out.token_ids, limit))
    return result


def check(alone, outputs, label):
    compared = 0
    for i, ((want, limit), out) in enumerate(zip(alone, outputs)):
        got = out.outputs[0].token_ids
        assert got[:limit] == want[:limit], f"{label}: prompt {i} differs before its first near-tie"
        compared += limit
    assert compared >= len(alone) * NUM_TOKENS // 2


def test_batch_of_32(model_fp32, prompts, alone):
    llm = make_llm(model_fp32)
    check(alone, llm.generate(prompts, params(), use_tqdm=False), "batch")


def test_chunked_prefill(model_fp32, prompts, alone):
    llm = make_llm(model_fp32, max_num_batched_tokens=16)
    check(alone, llm.generate(prompts, params(), use_tqdm=False), "chunked")


def test_after_prefix_cache_hit(model_fp32, prompts, alone):
    llm = make_llm(model_fp32)
    llm.generate(prompts, params(), use_tqdm=False)
    before = llm.engine_core.stats().prefix_cache_hits
    outs = llm.generate(prompts, params(), use_tqdm=False)
    assert llm.engine_core.stats().prefix_cache_hits > before
    # Every prompt with at least one full block before its last token is served from the cache.
    assert all(o.num_cached_tokens > 0 for o in outs if len(o.prompt_token_ids) > 16)
    check(alone, outs, "prefix hit")


def test_after_preemption(model_fp32, prompts, alone):
    # 40 blocks of 16 tokens cannot hold 32 requests of ~30-60 tokens at once.
    llm = make_llm(model_fp32, kv_cache_memory=40 * 16 * 30 * 2 * 3 * 64 * 4, max_model_len=128)
    outs = llm.generate(prompts, params(), use_tqdm=False)
    assert llm.engine_core.stats().num_preemptions > 0
    check(alone, outs, "preemption")
