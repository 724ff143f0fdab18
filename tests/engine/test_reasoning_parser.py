"""ReasoningParser alone: the reasoning and the answer of <think>-style outputs, fed whole and in
small pieces; a partial tag is held back; deepseek_r1's prompt-opened block and qwen3's own."""

from __future__ import annotations

import pytest

from corellm.reasoning_parser import ReasoningParser


def split(kind: str, text: str, piece: int) -> tuple[str, str]:
    parser = ReasoningParser(kind)
    reasoning, answer = [], []
    for i in range(0, len(text), piece):
        r, a = parser.feed(text[i:i + piece])
        reasoning.append(r)
        answer.append(a)
    r, a = parser.finish()
    return "".join(reasoning) + r, "".join(answer) + a


@pytest.mark.parametrize("piece", [1, 3, 1000])
@pytest.mark.parametrize("kind, text, want", [
    ("qwen3", "<think>\nA is 2.</think>\n\nThe answer is 2.", ("A is 2.", "The answer is 2.")),
    ("qwen3", "The answer is 2.", ("", "The answer is 2.")),  # thinking off: no block
    ("deepseek_r1", "A is 2.\n</think>\n\nThe answer is 2.", ("A is 2.\n", "The answer is 2.")),
    ("deepseek_r1", "<think>\nA is 2.</think>The answer.", ("A is 2.", "The answer.")),
    ("deepseek_r1", "Still thinking when cut", ("Still thinking when cut", "")),
    ("qwen3", "<think>x < y </thin", ("x < y </thin", "")),  # a partial closing tag at the end is reasoning
])
def test_reasoning_and_answer(kind, text, want, piece):
    assert split(kind, text, piece) == want


def test_an_unknown_parser_is_refused():
    with pytest.raises(ValueError, match="unknown reasoning parser 'r2'"):
        ReasoningParser("r2")
