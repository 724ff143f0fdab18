"""LLM(data_parallel_size=2): two engine replicas (this process and one more; each tensor-parallel
too, in one test), each taking a contiguous share of the prompts; the outputs come back in prompt order, with unique request ids,
equal to one engine's (greedy, fp32); what it cannot do is refused by name; a bad prompt is
refused before any replica starts, and the replicas serve the next call."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from corellm import LLM, SamplingParams  # noqa: E402
from tests.model.tiny_models import make_tiny_model  # noqa: E402

ENGINE = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2)


def test_two_replicas_answer_as_one_engine(tmp_path, tokenizer_json):
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5)
    prompts = [{"prompt_token_ids": [5 + i, 17, 40 + 2 * i, 41, 3]} for i in range(5)]
    params = [SamplingParams(temperature=0, max_tokens=4 + i, ignore_eos=True) for i in range(5)]
    one = LLM(str(tmp_path), **ENGINE)
    try:
        want = one.generate(prompts, params, use_tqdm=False)
    finally:
        one.shutdown()
    two = LLM(str(tmp_path), data_parallel_size=2, **ENGINE)
    try:
        for _ in range(2):  # a second call reuses the replicas
            got = two.generate(prompts, params, use_tqdm=False)
            assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
            assert [len(o.outputs[0].token_ids) for o in got] == [4, 5, 6, 7, 8]
            assert len({o.request_id for o in got}) == 5
        bad = prompts[:4] + [{"prompt_token_ids": [10**6]}]  # the last share's: refused before any replica starts
        with pytest.raises(ValueError, match="1000000"):
            two.generate(bad, params, use_tqdm=False)
        assert len(two.generate(prompts[:1], params[:1], use_tqdm=False)) == 1  # a share may be empty
    finally:
        two.shutdown()


def test_two_tensor_parallel_replicas_answer_as_one_engine(tmp_path, tokenizer_json):
    """data_parallel_size=2 x tensor_parallel_size=3: each replica (this process, and one more) runs
    three ranks of its own, meeting at a port of their own; greedy tokens as one plain engine's."""
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    prompts = [{"prompt_token_ids": [5 + i, 17, 40 + 2 * i, 41, 3]} for i in range(4)]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    one = LLM(str(tmp_path), **ENGINE)
    try:
        want = [o.outputs[0].token_ids for o in one.generate(prompts, params, use_tqdm=False)]
    finally:
        one.shutdown()
    both = LLM(str(tmp_path), data_parallel_size=2, tensor_parallel_size=3, **ENGINE)
    try:
        assert both.engine_core.model_runner.tp_workers is not None
        assert [o.outputs[0].token_ids for o in both.generate(prompts, params, use_tqdm=False)] == want
    finally:
        both.shutdown()


def test_what_data_parallelism_refuses(tmp_path, tokenizer_json):
    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5)
    with pytest.raises(ValueError, match="data_parallel_size must be an integer >= 1"):
        LLM(str(tmp_path), data_parallel_size=0, **ENGINE)
    with pytest.raises(ValueError, match="nnodes must be 1 and master_port 0"):
        LLM(str(tmp_path), data_parallel_size=2, tensor_parallel_size=2, master_port=29500, **ENGINE)
