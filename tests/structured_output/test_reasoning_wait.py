"""ReasoningWait (the wait for the end of a reasoning block, and thinking_token_budget's count)
token by token, and ForcedReasoningEnd's grammar: "</think>" and then the answer's grammar, for
each kind of answer (SmolLM2's tokenizer; each text fed to a fresh matcher)."""

from __future__ import annotations

import pytest

from corellm.sampling_params import StructuredOutputsParams
from corellm.structured_output.reasoning_wait import ForcedReasoningEnd, ReasoningBudget, ReasoningWait
from tests.structured_output.conftest import accepts


def states(wait: ReasoningWait, pieces: list[str]) -> list[str]:
    return [wait.feed(p) for p in pieces]


def test_an_open_block_counts_from_the_first_token():
    assert states(ReasoningWait(ReasoningBudget(3, opened=True)), ["a", " b", " c"]) == [
        "waiting", "waiting", "exhausted"]


def test_an_end_within_the_budget_ends_the_wait_even_split_over_tokens():
    assert states(ReasoningWait(ReasoningBudget(5, opened=True)), ["a", "</", "think", ">"]) == [
        "waiting", "waiting", "waiting", "ended"]
    assert states(ReasoningWait(), ["x"] * 100 + ["</think>"])[-2:] == ["waiting", "ended"]  # no budget


def test_a_block_the_model_opens_counts_after_its_think():
    wait = ReasoningWait(ReasoningBudget(2, opened=False))
    assert states(wait, ["\n", "<", "think", ">", "\n", "Hmm"]) == [
        "waiting", "waiting", "waiting", "waiting", "waiting", "exhausted"]


def test_a_budget_of_zero_ends_the_block_before_its_first_token():
    assert ReasoningWait(ReasoningBudget(0, opened=True)).exhausted_at_start
    wait = ReasoningWait(ReasoningBudget(0, opened=False))
    assert not wait.exhausted_at_start and states(wait, ["<think>"]) == ["exhausted"]
    assert not ReasoningWait().exhausted_at_start


TAG = {"type": "structural_tag", "triggers": ["<f="], "structures": [
    {"begin": "<f=a>", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}, "end": "</f>"}]}


@pytest.mark.parametrize("answer, good, bad", [
    (None, "</think>\n\nAnything at all.", "Anything at all."),
    (StructuredOutputsParams(json={"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
     '</think>{"n": 4}', '</think>{"m": 4}'),
    (StructuredOutputsParams(regex="[0-9]+"), "</think>42", "</think>4a"),
    (StructuredOutputsParams(choice=["yes", "no"]), "</think>no", "</think>maybe"),
    (StructuredOutputsParams(grammar='start: "(" NUM ")"\nNUM: /[0-9]+/'), "</think>(7)", "</think>7"),
    (StructuredOutputsParams(grammar='root ::= "A" | "B"'), "</think>B", "</think>C"),
    (StructuredOutputsParams(structural_tag=TAG), '</think>Call <f=a>{"x": 1}</f>', '</think><f=a>{"x": "1"}</f>'),
])
def test_the_forced_end_is_the_marker_then_the_answers_grammar(compiler, answer, good, bad):
    spec = ForcedReasoningEnd(answer)
    assert accepts(compiler, spec, good) and not accepts(compiler, spec, bad)
    assert not accepts(compiler, spec, good.removeprefix("</think>"))  # the marker comes first
    matcher = compiler.matcher_future(spec).result()
    forced = compiler.tokenizer.decode(matcher.compute_ff_tokens())
    assert forced and ("</think>".startswith(forced) or forced.startswith("</think>"))  # llguidance forces it


def test_each_answer_has_its_own_forced_end():
    keys = {ForcedReasoningEnd(a).key() for a in (None, StructuredOutputsParams(regex="a"),
                                                     StructuredOutputsParams(regex="b"))}
    assert len(keys) == 3
