"""vLLM's thinking_token_budget through the offline API (SmolLM2 standing in for a reasoning model:
with the deepseek_r1 parser its output is reasoning until it writes "</think>"). Greedy, against
the same request without a budget: the first N tokens are the same, then the output spells
"</think>"; a reasoning that ends by itself within the budget is left bit-identical; with a JSON
schema the answer after the forced end validates; a prompt that closed its block has no
reasoning to bound; and a budget without a reasoning parser is a ValueError naming it."""

from __future__ import annotations

import json

import jsonschema
import pytest

from corellm import LLM, SamplingParams, StructuredOutputsParams
from corellm.model import load_model

QUESTION = "Question: what is 2+2? Think step by step.\n<think>\n"
# A few-shot prompt whose answer closes its reasoning by itself after 5 tokens.
FEW_SHOT = ("Question: 2+2?\n<think>\nTwo plus two.\n</think>\nAnswer: 4\n\nQuestion: 3+3?\n<think>\nThree plus "
            "three.\n</think>\nAnswer: 6\n\nQuestion: 5+5?\n<think>\n")


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, progress=False)


@pytest.fixture(scope="module")
def llm(loaded):
    return LLM(loaded_model=loaded, max_model_len=1024, kv_cache_memory=128 * 1024**2, reasoning_parser="deepseek_r1")


def greedy(llm, prompt: str, **params):
    return llm.generate(prompt, SamplingParams(temperature=0, max_tokens=30, **params), use_tqdm=False)[0].outputs[0]


@pytest.mark.parametrize("budget", [0, 1, 6])
def test_the_reasoning_is_cut_after_its_budget(llm, budget):
    free = greedy(llm, QUESTION)
    cut = greedy(llm, QUESTION, thinking_token_budget=budget)
    assert cut.token_ids[:budget] == free.token_ids[:budget]
    tokenizer = llm.get_tokenizer()
    assert "</think>" not in tokenizer.decode(free.token_ids[:budget + 3])  # the end is the budget's doing
    assert tokenizer.decode(cut.token_ids[budget:]).startswith("</think>"), cut.text


def test_a_reasoning_that_ends_within_its_budget_is_left_as_it_was(llm):
    free = greedy(llm, FEW_SHOT)
    assert free.text.startswith("Five plus five.\n</think>")  # ends by itself, after 5 tokens
    assert greedy(llm, FEW_SHOT, thinking_token_budget=20).token_ids == free.token_ids
    assert greedy(llm, FEW_SHOT, thinking_token_budget=-1).token_ids == free.token_ids  # -1: no limit
    assert greedy(llm, FEW_SHOT, thinking_token_budget=3).text.startswith("Five plus five</think>")


def test_the_answer_after_a_forced_end_follows_the_requests_schema(llm):
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    out = llm.generate(QUESTION, SamplingParams(temperature=0, max_tokens=60, thinking_token_budget=8,
                                                structured_outputs=StructuredOutputsParams(json=schema)),
                       use_tqdm=False)[0].outputs[0]
    reasoning, answer = out.text.split("</think>")
    assert len(llm.get_tokenizer().encode(reasoning, add_special_tokens=False)) <= 8
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(answer), schema)


def test_a_prompt_that_closed_its_block_has_nothing_to_bound(llm):
    closed = QUESTION + "</think>\n"
    assert greedy(llm, closed, thinking_token_budget=2).token_ids == greedy(llm, closed).token_ids


def test_qwen3_counts_from_the_models_own_think(loaded):
    """qwen3: the model opens the block itself; an output that does not is all answer."""
    llm = LLM(loaded_model=loaded, max_model_len=1024, kv_cache_memory=64 * 1024**2, reasoning_parser="qwen3")
    plain = "Question: what is 2+2?\nAnswer:"
    assert greedy(llm, plain, thinking_token_budget=2).token_ids == greedy(llm, plain).token_ids
    opens = "Question: 2+2?\n<think>\nTwo plus two.\n</think>\nAnswer: 4\n\nQuestion: 5+5?\n"
    free = greedy(llm, opens)
    assert free.text.startswith("<think>\n")  # the model opens the block: 2 tokens, "<think>" and "\n"
    cut = greedy(llm, opens, thinking_token_budget=2)
    tokenizer = llm.get_tokenizer()
    opened_at = next(i for i in range(1, len(free.token_ids)) if "<think>" in tokenizer.decode(free.token_ids[:i]))
    assert cut.token_ids[:opened_at + 2] == free.token_ids[:opened_at + 2]
    assert tokenizer.decode(cut.token_ids[opened_at + 2:]).startswith("</think>"), cut.text


def test_a_budget_needs_a_reasoning_parser(loaded):
    llm = LLM(loaded_model=loaded, max_model_len=256, kv_cache_memory=32 * 1024**2)
    with pytest.raises(ValueError, match="thinking_token_budget needs a reasoning model"):
        llm.generate("x", SamplingParams(thinking_token_budget=4), use_tqdm=False)
    with pytest.raises(ValueError, match="thinking_token_budget must be a number of tokens"):
        SamplingParams(thinking_token_budget=-2)
