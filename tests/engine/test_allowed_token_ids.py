"""allowed_token_ids (vLLM's sampling parameter): only the listed tokens may be sampled — the
most likely of them when greedy, whatever the temperature; with a grammar, the tokens both
allow. Logprobs still describe the model's raw distribution."""

from __future__ import annotations

import pytest

from corellm import LLM, SamplingParams
from corellm.model import load_model
from corellm.sampling_params import StructuredOutputsParams

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def llm():
    return LLM(loaded_model=load_model(None, progress=False), max_model_len=256, kv_cache_memory=64 * 1024**2)


def first_position(llm: LLM, **kw):
    out = llm.generate([PROMPT], SamplingParams(max_tokens=1, temperature=0, logprobs=5, **kw), use_tqdm=False)
    c = out[0].outputs[0]
    return c.token_ids[0], c.logprobs[0]


def test_greedy_takes_the_most_likely_allowed_token(llm):
    top, position = first_position(llm)
    ranked = sorted(position.items(), key=lambda kv: -kv[1].logprob)
    second, third = ranked[1][0], ranked[2][0]
    chosen, constrained_position = first_position(llm, allowed_token_ids=[third, 7, second])
    assert chosen == second != top
    assert constrained_position[chosen].logprob == position[second].logprob  # the raw logits' logprob


def test_every_sampled_token_is_allowed(llm):
    allowed = llm.get_tokenizer().encode(" one two three four five six seven eight nine ten", add_special_tokens=False)
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, allowed_token_ids=allowed, n=2)
    for c in llm.generate([PROMPT, "Count:"], params, use_tqdm=False)[0].outputs:
        assert len(c.token_ids) == 12 and set(c.token_ids) <= set(allowed)


def test_with_a_grammar_the_tokens_both_allow(llm):
    choice = StructuredOutputsParams(choice=["yes", "no"])
    free = llm.generate([PROMPT + " Paris? Answer:"], SamplingParams(max_tokens=4, temperature=0,
                                                                     structured_outputs=choice), use_tqdm=False)
    picked = free[0].outputs[0].text
    other = "no" if picked == "yes" else "yes"
    tok = llm.get_tokenizer()
    allowed = tok.encode(other, add_special_tokens=False) + [tok.eos_token_id]
    out = llm.generate([PROMPT + " Paris? Answer:"], SamplingParams(max_tokens=4, temperature=0, structured_outputs=choice,
                                                                    allowed_token_ids=allowed), use_tqdm=False)
    assert picked in ("yes", "no") and out[0].outputs[0].text == other


def test_bad_lists_are_refused_naming_the_parameter(llm):
    with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list of token ids"):
        SamplingParams(allowed_token_ids=[])
    with pytest.raises(ValueError, match="allowed_token_ids must be a non-empty list of token ids"):
        SamplingParams(allowed_token_ids=[-1])
    with pytest.raises(ValueError, match=r"allowed_token_ids has token id 49152 outside the vocabulary \[0, 49152\)"):
        llm.generate([PROMPT], SamplingParams(allowed_token_ids=[5, 49152]), use_tqdm=False)
