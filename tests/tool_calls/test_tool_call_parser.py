"""ToolCallParser alone, on crafted outputs of each format, fed whole and in every split of
small pieces: content and calls come out the same; a partial trigger is held back, never shown as
content; a trigger without a call is content; a call cut short keeps what arrived."""

from __future__ import annotations

import json

import pytest

from corellm.tool_calls import TOOL_CALL_FORMATS, ToolCallArguments, ToolCallParser, ToolCallStart

NAMES = ["get_weather", "add"]
WEATHER = {"city": "Paris \"la ville\" {x}", "unit": "celsius"}


def run(fmt: str, mode: str, text: str, piece: int, named: str | None = None):
    parser = ToolCallParser(TOOL_CALL_FORMATS[fmt], NAMES, mode, named)
    events = []
    for i in range(0, len(text), piece):
        events += parser.feed(text[i:i + piece])
    events += parser.finish()
    content = "".join(e for e in events if isinstance(e, str))
    calls = {}
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index not in calls  # the name comes once, first
            calls[e.index] = [e.name, ""]
        elif isinstance(e, ToolCallArguments):
            calls[e.index][1] += e.text
    return content, [(name, json.loads(args)) for name, args in calls.values()]


def call(fmt: str, name: str, args: dict) -> str:
    f = TOOL_CALL_FORMATS[fmt]
    return f.begin(name) + json.dumps(args) + f.end


@pytest.mark.parametrize("piece", [1, 2, 5, 1000])
@pytest.mark.parametrize("fmt", sorted(TOOL_CALL_FORMATS))
def test_auto_text_and_calls(fmt, piece):
    text = "Let me check. " + call(fmt, "get_weather", WEATHER) + "\n" + call(fmt, "add", {"a": 1, "b": 2})
    content, calls = run(fmt, "auto", text, piece)
    assert content.strip() == "Let me check."
    assert calls == [("get_weather", WEATHER), ("add", {"a": 1, "b": 2})]


@pytest.mark.parametrize("piece", [1, 3, 1000])
def test_required_drops_the_whitespace_between_calls(piece):
    text = call("hermes", "add", {"a": 1, "b": 2}) + "\n\n" + call("hermes", "add", {"a": 3, "b": 4})
    content, calls = run("hermes", "required", text, piece)
    assert content == "" and calls == [("add", {"a": 1, "b": 2}), ("add", {"a": 3, "b": 4})]


@pytest.mark.parametrize("piece", [1, 4, 1000])
def test_a_named_function_is_all_arguments(piece):
    content, calls = run("hermes", "named", json.dumps(WEATHER), piece, named="get_weather")
    assert content == "" and calls == [("get_weather", WEATHER)]


def test_a_partial_trigger_is_held_back_and_a_lone_trigger_is_text():
    parser = ToolCallParser(TOOL_CALL_FORMATS["hermes"], NAMES, "auto")
    assert parser.feed("a < b, and <tool_") == ["a < b, and "]  # "<tool_" may open a call: held back
    assert parser.feed("call>\n{") == []  # the trigger, and what may be a call's beginning: undecided
    assert "".join(parser.feed(" is a tag")) == "<tool_call>\n{ is a tag"  # the beginning of no function
    assert parser.finish() == [] and parser.calls == []


def test_a_call_cut_short_keeps_what_arrived():
    parser = ToolCallParser(TOOL_CALL_FORMATS["hermes"], NAMES, "auto")
    parser.feed(TOOL_CALL_FORMATS["hermes"].begin("add") + '{"a": 1, "b"')
    parser.finish()
    assert [(c.name, c.arguments) for c in parser.calls] == [("add", '{"a": 1, "b"')]
