"""Tool calling through the server and the official openai client (SmolLM2 with a ChatML template
that shows tools, --enable-auto-tool-choice --tool-call-parser hermes): a named function and
"required" constrain the output to valid calls (arguments valid against their schemas), streamed
or not, with finish_reason "tool_calls"; streaming sends the name first, then the arguments in
pieces that join to the whole; "auto" answers in text or in calls; the history with the
assistant's calls and the tool results reaches the template; the 400s name the field."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"type": "string", "minLength": 1, "maxLength": 30},
                                                "unit": {"enum": ["celsius", "fahrenheit"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {"name": "add", "description": "Adds two integers",
                                        "parameters": {"type": "object", "properties": {
                                            "a": {"type": "integer", "minimum": -1000, "maximum": 1000},
                                            "b": {"type": "integer", "minimum": -1000, "maximum": 1000}},
                                            "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def create(client, **kw):
    return client.chat.completions.create(model="SmolLM2-135M-Instruct", **{"max_tokens": 120, "temperature": 0, **kw})


def assert_valid_calls(calls, count=None):
    assert calls and (count is None or len(calls) == count)
    for call in calls:
        assert call.type == "function" and call.id
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_named_function(tools_client):
    out = create(tools_client, messages=ASK, tools=TOOLS,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert [c.function.name for c in choice.message.tool_calls] == ["get_weather"]
    assert_valid_calls(choice.message.tool_calls, 1)


@pytest.mark.parametrize("parallel", [True, False])
def test_required(tools_client, parallel):
    out = create(tools_client, messages=ASK, tools=TOOLS, tool_choice="required", parallel_tool_calls=parallel)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert_valid_calls(choice.message.tool_calls, None if parallel else 1)


def test_streamed_calls_send_the_name_first_then_argument_pieces(tools_client):
    chunks = list(create(tools_client, messages=ASK, tools=TOOLS, tool_choice="required", stream=True,
                         parallel_tool_calls=False))
    deltas = [c.choices[0].delta for c in chunks if c.choices and c.choices[0].delta.tool_calls]
    first = deltas[0].tool_calls[0]
    assert first.index == 0 and first.id and first.function.name in SCHEMAS and first.function.arguments == ""
    pieces = [d.tool_calls[0].function.arguments for d in deltas[1:]]
    assert len(pieces) > 1  # the arguments arrive as they are generated
    jsonschema.validate(json.loads("".join(pieces)), SCHEMAS[first.function.name])
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_auto_answers_in_text_or_in_valid_calls(tools_client):
    for messages in (ASK, [{"role": "user", "content": "Say hello to me."}]):
        choice = create(tools_client, messages=messages, tools=TOOLS).choices[0]  # tool_choice: auto
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert_valid_calls(choice.message.tool_calls)
        else:
            assert choice.message.content and choice.finish_reason in ("stop", "length")


def test_the_history_of_calls_and_results_reaches_the_template(tools_client):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": json.dumps({"city": "Paris", "unit": "celsius"})}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "21 degrees, sunny"}]
    out = create(tools_client, messages=history, tools=TOOLS, tool_choice="none", max_tokens=30)
    assert out.choices[0].message.content and out.choices[0].message.tool_calls is None
    assert out.usage.prompt_tokens > create(tools_client, messages=ASK, tools=TOOLS, tool_choice="none",
                                            max_tokens=1).usage.prompt_tokens


@pytest.mark.parametrize("kw, param", [
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    (dict(tool_choice="required"), "tool_choice"),
    (dict(tools=[WEATHER, WEATHER]), "tools"),
    (dict(tools=[{"type": "function", "function": {"name": "bad", "parameters": {"type": "array",
                                                                                   "uniqueItems": True}}}],
          tool_choice="required"), "tools"),
    (dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
])
def test_bad_tool_requests_are_400s_naming_the_field(tools_client, kw, param):
    with pytest.raises(openai.BadRequestError) as err:
        create(tools_client, messages=ASK, **kw)
    assert err.value.body["param"] == param, err.value.body


def test_auto_needs_the_server_flags(client, model_name):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=ASK, tools=TOOLS, tool_choice="auto", max_tokens=5)
    assert err.value.body["param"] == "tool_choice" and "--enable-auto-tool-choice" in err.value.body["message"]
