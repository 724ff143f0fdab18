"""HarmonyParser (gpt-oss's output format) alone and in a chat reply: the analysis channel as
reasoning, final and commentary bodies as the answer, messages to functions.NAME as tool calls,
fed whole and in small pieces (a partial marker held back); the reply's message and its stream
deltas as the server sends them."""

from __future__ import annotations

import json

import pytest

from corellm.harmony import HarmonyParser
from corellm.reasoning_parser import make_reasoning_parser
from corellm.server.assistant_message import AssistantMessage
from corellm.tool_calls import ToolCallArguments, ToolCallStart

ANALYSIS = "<|channel|>analysis<|message|>The user asks for 2 + 2. That is 4.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>2 + 2 = **4**."
CALL = ('<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
        '{"city": "Paris", "unit": "C"}')


def run(text: str, piece: int, tool_calls: bool = False) -> tuple[str, str, list[tuple[str, str]], HarmonyParser]:
    """(reasoning, answer text, calls as (name, arguments)) of text fed `piece` characters at a time."""
    parser = HarmonyParser(tool_calls)
    reasoning, answer, calls = [], [], []
    pieces = [text[i:i + piece] for i in range(0, len(text), piece)]
    for i in range(len(pieces) + 1):
        r, events = parser.feed(pieces[i]) if i < len(pieces) else parser.finish()
        reasoning.append(r)
        for e in events:
            if isinstance(e, str):
                answer.append(e)
            elif isinstance(e, ToolCallStart):
                calls.append([e.name, ""])
            else:
                assert isinstance(e, ToolCallArguments) and e.index == len(calls) - 1
                calls[-1][1] += e.text
    return "".join(reasoning), "".join(answer), [tuple(c) for c in calls], parser


@pytest.mark.parametrize("piece", [1, 2, 7, 10_000])
@pytest.mark.parametrize(("text", "tools", "want"), [
    (ANALYSIS + FINAL, False, ("The user asks for 2 + 2. That is 4.", "2 + 2 = **4**.", [])),
    (ANALYSIS + FINAL + "<|return|>", False, ("The user asks for 2 + 2. That is 4.", "2 + 2 = **4**.", [])),
    (ANALYSIS + CALL, True, ("The user asks for 2 + 2. That is 4.", "",
                             [("get_weather", '{"city": "Paris", "unit": "C"}')])),
    # the recipient before the channel, a preamble on commentary, then the call
    ("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant to=functions.lookup<|channel|>commentary "
     'json<|message|>{"q": "x"}', True, ("", "Checking.", [("lookup", '{"q": "x"}')])),
    (ANALYSIS + CALL, False, ("The user asks for 2 + 2. That is 4.", '{"city": "Paris", "unit": "C"}', [])),
    ("Plain text, no harmony at all.", False, ("", "Plain text, no harmony at all.", [])),
    ("<|channel|>analysis<|message|>cut off mid-thought <|en", False, ("cut off mid-thought <|en", "", [])),
    (ANALYSIS + "<|start|>assistant<|chan", False, ("The user asks for 2 + 2. That is 4.", "", [])),
])
def test_reasoning_answer_and_calls(text, tools, want, piece):
    assert run(text, piece, tools)[:3] == want


def test_where_the_output_is():
    parser = HarmonyParser()
    assert parser.part == "start" and not parser.opened
    parser.feed("<|channel|>analysis<|message|>hm")
    assert parser.part == "reasoning" and parser.opened and not parser.reasoning_ended
    parser.feed("<|end|><|start|>assistant<|channel|>final<|message|>")
    assert parser.part == "answer" and parser.reasoning_ended


def test_make_reasoning_parser_picks_the_format():
    assert isinstance(make_reasoning_parser("openai_gptoss", tool_calls=True), HarmonyParser)
    assert not isinstance(make_reasoning_parser("qwen3"), HarmonyParser)


def test_a_reply_with_reasoning_and_a_call():
    """The chat reply of an analysis then a call: reasoning_content, the call (content null), the
    stream's deltas in order (the reasoning, the call's name, its arguments)."""
    reply = AssistantMessage(HarmonyParser(tool_calls=True), None)
    text = ANALYSIS + CALL
    deltas = [d for i in range(0, len(text), 5) for d in reply.feed(text[i:i + 5])] + reply.finish()
    message = reply.message()
    assert message["reasoning_content"] == "The user asks for 2 + 2. That is 4."
    assert message["content"] is None and reply.has_tool_calls
    (call,) = message["tool_calls"]
    assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"]) == {
        "city": "Paris", "unit": "C"}
    kinds = [next(iter(d)) for d in deltas]
    assert kinds.index("tool_calls") > max(i for i, k in enumerate(kinds) if k == "reasoning_content")
    assert deltas[kinds.index("tool_calls")]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}


def test_a_reply_with_an_answer():
    reply = AssistantMessage(HarmonyParser(), None)
    reply.feed(ANALYSIS + FINAL)
    reply.finish()
    message = reply.message()
    assert message == {"role": "assistant", "content": "2 + 2 = **4**.", "reasoning_content":
                       "The user asks for 2 + 2. That is 4.", "reasoning": "The user asks for 2 + 2. That is 4."}
