"""The engine's integrity under failure and pressure (SmolLM2, bf16, greedy): a failed forward
leaks nothing into later requests through the prefix cache, priorities reach the scheduler from
LLM.generate, and under KV pressure with the priority policy every request finishes equal to its
solo run."""

from __future__ import annotations

import pytest

from corellm import LLM, SamplingParams
from corellm.model import load_model

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, progress=False)


def make_llm(loaded, **kw) -> LLM:
    args = dict(max_model_len=256, kv_cache_memory=64 * 1024**2, max_num_seqs=16)
    args.update(kw)
    return LLM(loaded_model=loaded, **args)


def test_a_failed_forward_leaks_nothing_through_the_prefix_cache(loaded):
    llm = make_llm(loaded)
    prefix = list(range(1000, 1064))  # 64 tokens: 4 full blocks
    runner = llm.engine_core.model_runner

    def failing(scheduler_output):
        raise RuntimeError("injected failure")

    runner.forward = failing  # the step's forward, whichever path it would take
    try:
        failed = llm.generate({"prompt_token_ids": prefix + [5]}, GREEDY, use_tqdm=False)[0]
    finally:
        del runner.forward
    assert failed.outputs[0].finish_reason == "error"
    got = llm.generate({"prompt_token_ids": prefix + [7]}, GREEDY, use_tqdm=False)[0].outputs[0]
    want = make_llm(loaded).generate({"prompt_token_ids": prefix + [7]}, GREEDY, use_tqdm=False)[0].outputs[0]
    assert got.token_ids == want.token_ids
    assert llm.engine_core.stats().num_free_blocks == llm.engine_core.scheduler_config.num_blocks


def test_priority_under_kv_pressure_finishes_everything_as_alone(loaded):
    prompts = [{"prompt_token_ids": list(range(300 + 7 * i, 340 + 9 * i))} for i in range(10)]
    priorities = [(7 * i) % 4 for i in range(10)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    solo = make_llm(loaded)
    alone = [solo.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
    # 24 blocks of 16 tokens for 10 requests that each grow to 64-145 tokens: preemption is certain.
    per_block = 2 * 30 * 3 * 64 * 16 * 2  # SmolLM2's bf16 K and V over 30 layers, 3 KV heads of 64
    llm = make_llm(loaded, scheduling_policy="priority", kv_cache_memory=24 * per_block, max_model_len=256)
    outs = llm.generate(prompts, params, use_tqdm=False, priority=priorities)
    assert llm.engine_core.stats().num_preemptions > 0
    assert [o.outputs[0].token_ids for o in outs] == alone
    assert all(o.outputs[0].finish_reason == "length" for o in outs)


def test_priority_needs_the_priority_policy(loaded):
    llm = make_llm(loaded)
    with pytest.raises(ValueError, match="priority 3 needs the priority scheduling policy"):
        llm.generate("Hello", GREEDY, use_tqdm=False, priority=[3])
    with pytest.raises(ValueError, match="got 2 priorities for 1 prompts"):
        llm.generate("Hello", GREEDY, use_tqdm=False, priority=[0, 1])
    with pytest.raises(ValueError, match="priority must be a 32-bit integer"):
        make_llm(loaded, scheduling_policy="priority").generate("Hello", GREEDY, use_tqdm=False, priority=[2**40])
    assert not llm.engine_core.has_unfinished_requests()


def test_a_request_the_scheduler_refuses_ends_alone(loaded):
    """The scheduler's checks are the last word: a request that passed the InputProcessor but not
    them (here one made by hand) ends with an error; the engine serves on."""
    from corellm.engine_core_request import EngineCoreRequest

    llm = make_llm(loaded)
    bad = EngineCoreRequest("bad", [1, 2, 3], SamplingParams(max_tokens=4, min_tokens=0), None, [], 0.0, 0)
    bad.sampling_params.min_tokens = 9  # past max_tokens: the scheduler refuses it
    llm.engine_core.add_request(bad)
    out = llm.engine_core.step()
    assert [(o.req_id, o.finish_reason) for o in out.outputs] == [("bad", "error")]
    assert "min_tokens" in out.outputs[0].error
    assert llm.generate("Still serving", GREEDY, use_tqdm=False)[0].finished


def test_min_tokens_beyond_the_context_left_is_refused(loaded):
    llm = make_llm(loaded)
    with pytest.raises(ValueError, match=r"min_tokens \(9999\) exceeds the .* tokens the context leaves"):
        llm.generate("Hello", SamplingParams(max_tokens=None, min_tokens=9999), use_tqdm=False)
