"""The model runner's side of the step (SmolLM2): the two-phase protocol (execute_model, then
sample_tokens; an empty schedule runs no forward), the one choice of forward path, and
ModelRunnerOutput's per-request logprobs cut to each request's own n."""

from __future__ import annotations

import numpy as np
import pytest

from corellm import LLM, SamplingParams
from corellm.model import load_model
from corellm.native import _core


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, progress=False)


def make_llm(loaded, **kw) -> LLM:
    return LLM(loaded_model=loaded, max_model_len=256, kv_cache_memory=32 * 1024**2, max_num_seqs=8, **kw)


def test_protocol(loaded):
    runner = make_llm(loaded).engine_core.model_runner
    empty = _core.Scheduler(_core.SchedulerConfig(num_blocks=64, max_model_len=256)).schedule()  # nothing to do
    calls = []
    original = runner.forward
    runner.forward = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        assert runner.execute_model(empty) is None
        with pytest.raises(RuntimeError, match=r"sample_tokens\(\) must be called after execute_model\(\) returns None"):
            runner.execute_model(empty)
        assert runner.sample_tokens().req_ids == []
        with pytest.raises(RuntimeError, match=r"sample_tokens\(\) called without a preceding execute_model\(\)"):
            runner.sample_tokens()
        assert calls == []  # an empty schedule runs no forward
    finally:
        del runner.forward


@pytest.mark.skipif(not _core.kernels.bf16_gemm_available(), reason="the native stack needs AVX2 and FMA")
def test_one_choice_of_forward_path(loaded):
    """bf16 on this CPU: the native decoder stack; fp32: the per-op layers; CUDA graphs only on a
    GPU. Both CPU paths give the same tokens (the stack is bit-identical to the layers in bf16)."""
    bf16 = make_llm(loaded)
    assert bf16.engine_core.model_runner.native_stack is not None
    assert bf16.engine_core.model_runner.cuda_graphs is None
    fp32 = LLM(dtype="float32", max_model_len=256, kv_cache_memory=32 * 1024**2)
    assert fp32.engine_core.model_runner.native_stack is None
    runner = bf16.engine_core.model_runner
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    native = bf16.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0].token_ids
    runner.native_stack, stack = None, runner.native_stack
    try:
        layers = bf16.generate("The capital of France is", params, use_tqdm=False)[0].outputs[0].token_ids
    finally:
        runner.native_stack = stack
    assert native == layers


def test_logprobs_are_cut_to_each_requests_n(loaded):
    llm = make_llm(loaded)
    core = llm.engine_core
    asks = {"none": None, "zero": 0, "two": 2, "five": 5}
    for name, k in asks.items():
        processed = llm.input_processor.process(name, "Hello there", SamplingParams(temperature=0, max_tokens=1,
                                                                                   logprobs=k))
        for sample in processed.samples:
            core.add_request(sample)
    so = core.scheduler.schedule()
    core.model_runner.execute_model(so)
    mro = core.model_runner.sample_tokens()
    core.scheduler.update_from_output(so, mro.sampled_token_ids)
    by_name = {req_id.split("-")[0]: lps[0] for req_id, lps in mro.logprobs.items()}  # one token each
    assert set(by_name) == {"zero", "two", "five"}
    for name, lp in by_name.items():
        assert len(lp.top_token_ids) == len(lp.top_logprobs) == asks[name]
        i = list(mro.req_ids).index(next(r for r in mro.req_ids if r.startswith(name)))
        assert lp.token_id == int(mro.sampled_token_ids[i, 0]) and lp.rank == 1  # greedy: the top token
        assert np.isfinite(lp.logprob)
