"""POST /v1/messages (Anthropic's Messages API) through Anthropic's official SDK. The oracle is the
server's own chat path: a message (greedy) gives the same text, reasoning, tool calls and token
counts as the chat completion of the same conversation; streamed, the SDK assembles the same
message from the events; stop_sequences, max_tokens and tool use give the API's stop reasons; tool
results and thinking given back are the chat messages they stand for; count_tokens counts the
prompt chat would run; errors have the API's shape (the SDK raises its own exception types)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.server.test_tools_api import SCHEMAS, WEATHER

anthropic = pytest.importorskip("anthropic")

MODEL = "SmolLM2-135M-Instruct"
ASK = [{"role": "user", "content": "What is the capital of France?"}]
TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"],
        "input_schema": WEATHER["function"]["parameters"]}


def sdk(openai_client) -> "anthropic.Anthropic":
    """An Anthropic client of the server the openai client talks to."""
    root = str(openai_client.base_url).rstrip("/").removesuffix("/v1")
    return anthropic.Anthropic(base_url=root, api_key="unused", max_retries=0, timeout=120)


# Greedy: this SDK's create() no longer names temperature (Anthropic's newest models fix it), the
# API and corellm still take it.
GREEDY = {"temperature": 0}


def message(client, **kw):
    return sdk(client).messages.create(**{"model": MODEL, "max_tokens": 24, "messages": ASK, "extra_body": GREEDY, **kw})


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages, **{"max_tokens": 24, "temperature": 0, **kw})


def test_a_message_is_the_chat_completion_of_its_conversation(client):
    out = message(client, system="You are terse.")
    want = chat(client, [{"role": "system", "content": "You are terse."}, *ASK])
    assert out.type == "message" and out.role == "assistant" and out.id.startswith("msg_") and out.model == MODEL
    [block] = out.content
    assert block.type == "text" and block.text == want.choices[0].message.content
    assert out.stop_reason == ("max_tokens" if want.choices[0].finish_reason == "length" else "end_turn")
    usage = out.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == want.usage.prompt_tokens
    assert usage.output_tokens == want.usage.completion_tokens
    # the system prompt as text blocks is the same prompt
    again = message(client, system=[{"type": "text", "text": "You are "}, {"type": "text", "text": "terse."}])
    assert again.content[0].text == block.text


def test_stop_sequences_and_max_tokens_are_the_stop_reasons(client):
    out = message(client, stop_sequences=[" Paris"])
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == " Paris"
    assert " Paris" not in out.content[0].text
    cut = message(client, max_tokens=3)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3


def test_the_stream_assembles_the_whole_message(client):
    whole = message(client, max_tokens=16)
    with sdk(client).messages.stream(model=MODEL, max_tokens=16, messages=ASK, extra_body=GREEDY) as stream:
        texts = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(texts) > 1 and "".join(texts) == whole.content[0].text
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens


def test_count_tokens_counts_the_prompt_chat_runs(client):
    counted = sdk(client).messages.count_tokens(model=MODEL, messages=ASK, system="Be brief.")
    want = chat(client, [{"role": "system", "content": "Be brief."}, *ASK], max_tokens=1)
    assert counted.input_tokens == want.usage.prompt_tokens


def test_tool_use_comes_as_blocks_and_its_result_goes_back(tools_client):
    out = message(tools_client, messages=[{"role": "user", "content": "What is the weather in Paris, in celsius?"}],
                  tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather"}, max_tokens=120)
    [call] = [b for b in out.content if b.type == "tool_use"]
    assert out.stop_reason == "tool_use" and call.name == "get_weather" and call.id
    jsonschema.validate(call.input, SCHEMAS["get_weather"])
    with sdk(tools_client).messages.stream(model=MODEL, max_tokens=120, extra_body=GREEDY, tools=[TOOL],
                                           tool_choice={"type": "tool", "name": "get_weather"},
                                           messages=[{"role": "user", "content": "What is the weather in Paris, "
                                                                                 "in celsius?"}]) as stream:
        pieces = [e.partial_json for e in stream if e.type == "input_json" or getattr(e, "type", "") == "input_json"]
        streamed = stream.get_final_message()
    [streamed_call] = [b for b in streamed.content if b.type == "tool_use"]
    assert streamed_call.input == call.input and len(pieces) > 1
    # The call and its result given back: the prompt of chat's assistant tool_calls and tool message.
    history = [{"role": "user", "content": "What is the weather in Paris, in celsius?"},
               {"role": "assistant", "content": [{"type": "tool_use", "id": call.id, "name": call.name,
                                                  "input": call.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21 C, sunny"}]}]
    back = message(tools_client, messages=history, tools=[TOOL], tool_choice={"type": "none"}, max_tokens=30)
    again = chat(tools_client, [history[0],
                                {"role": "assistant", "content": None, "tool_calls": [
                                    {"id": call.id, "type": "function", "function": {
                                        "name": call.name, "arguments": json.dumps(call.input)}}]},
                                {"role": "tool", "tool_call_id": call.id, "content": "21 C, sunny"}],
                 tools=[WEATHER], tool_choice="none", max_tokens=30)
    assert back.content[0].text == again.choices[0].message.content


def test_thinking_comes_as_its_own_block(reasoning_client):
    ask = [{"role": "user", "content": "Is 7 prime?"}]
    out = message(reasoning_client, messages=ask, thinking={"type": "enabled", "budget_tokens": 6})
    want = chat(reasoning_client, ask, extra_body={"thinking_token_budget": 6}).choices[0].message
    thinking, *text = out.content  # (SmolLM2 ends its turn right after the forced </think>)
    assert thinking.type == "thinking" and thinking.thinking == want.model_extra["reasoning_content"]
    assert [(b.type, b.text) for b in text] == ([("text", want.content)] if want.content else [])
    with sdk(reasoning_client).messages.stream(model=MODEL, max_tokens=24, extra_body=GREEDY, messages=ask,
                                               thinking={"type": "enabled", "budget_tokens": 6}) as stream:
        final = stream.get_final_message()
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in out.content]
    # a thinking block given back is the assistant's reasoning_content
    back = message(reasoning_client, messages=ask + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "7 has no divisors.", "signature": ""},
                                          {"type": "text", "text": "Yes."}]},
        {"role": "user", "content": "And 9?"}])
    again = chat(reasoning_client, ask + [{"role": "assistant", "content": "Yes.",
                                           "reasoning_content": "7 has no divisors."},
                                          {"role": "user", "content": "And 9?"}])
    reply = again.choices[0].message
    assert "".join(b.text for b in back.content if b.type == "text") == (reply.content or "")
    assert "".join(b.thinking for b in back.content if b.type == "thinking") == reply.model_extra["reasoning_content"]


def test_output_config_format_holds_the_output_to_a_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    out = message(client, messages=[{"role": "user", "content": "Name a city, as JSON."}], max_tokens=40,
                  output_config={"format": {"type": "json_schema", "schema": schema}})
    assert out.stop_reason == "end_turn"
    jsonschema.validate(json.loads(out.content[0].text), schema)


def test_omitted_thinking_is_left_out(reasoning_client):
    ask = [{"role": "user", "content": "Is 7 prime?"}]
    shown = message(reasoning_client, messages=ask, thinking={"type": "adaptive"})
    omitted = message(reasoning_client, messages=ask, thinking={"type": "adaptive", "display": "omitted"})
    assert shown.content[0].type == "thinking" and "thinking" not in [b.type for b in omitted.content]
    text = lambda out: "".join(b.text for b in out.content if b.type == "text")  # noqa: E731
    assert text(omitted) == text(shown)


def test_the_api_key_may_come_as_x_api_key():
    from tests.server.conftest import Server

    server = Server("--api-key", "k-9")
    try:
        keyed = anthropic.Anthropic(base_url=server.url, api_key="k-9", max_retries=0, timeout=60)
        assert keyed.messages.create(model=MODEL, max_tokens=2, messages=ASK).content
        wrong = anthropic.Anthropic(base_url=server.url, api_key="k-8", max_retries=0, timeout=60)
        with pytest.raises(anthropic.AuthenticationError) as err:
            wrong.messages.create(model=MODEL, max_tokens=2, messages=ASK)
        assert err.value.body["error"]["type"] == "authentication_error"
    finally:
        server.stop()


@pytest.mark.parametrize("fields, error, words", [
    ({"max_tokens": 0}, "BadRequestError", "max_tokens"),
    ({"model": "other"}, "NotFoundError", "does not exist"),
    ({"stop_sequences": ["x"] * 65}, "BadRequestError", "stop_sequences"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, "BadRequestError", "images"),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search", "input_schema": {}}]}, "BadRequestError", "tools"),
    ({"tool_choice": {"type": "tool"}}, "BadRequestError", "tool_choice"),
    ({"thinking": {"type": "enabled"}}, "BadRequestError", "budget_tokens"),
    ({"thinking": {"type": "between_tools"}}, "BadRequestError", "thinking"),
    ({"speed": "fast"}, "BadRequestError", "speed"),
    ({"container": "c-1"}, "BadRequestError", "container"),
    ({"output_config": {"effort": "max"}}, "BadRequestError", "effort"),
    ({"extra_body": {"temprature": 0}}, "BadRequestError", "temprature"),
    ({"messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "xyz"}]}]},
     "BadRequestError", "redacted_thinking"),
])
def test_errors_have_the_apis_shape(client, fields, error, words):
    with pytest.raises(getattr(anthropic, error)) as err:
        message(client, **fields)
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] in ("invalid_request_error", "not_found_error")
    assert words in body["error"]["message"], body
