"""A server for gpt-oss's harmony format (--reasoning-parser openai_gptoss --tool-call-parser openai,
vLLM's flags), SmolLM2 standing in: its output opens no harmony message, so all of it is the answer,
as the same request's text with the special tokens kept; what harmony does not take is a 400 naming
the field (tool_choice "required" or a named function, structured outputs); the flags that do not go
together stop the server at start. The parser itself: tests/engine/test_harmony.py."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import Server, TOOLS_TEMPLATE, _client_of

ASK = [{"role": "user", "content": "Is 7 prime?"}]
TOOLS = [{"type": "function", "function": {"name": "is_prime", "parameters": {
    "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}}]


@pytest.fixture(scope="module")
def harmony_client():
    server = Server("--chat-template", str(TOOLS_TEMPLATE), "--reasoning-parser", "openai_gptoss",
                    "--enable-auto-tool-choice", "--tool-call-parser", "openai")
    try:
        yield _client_of(server)
    finally:
        server.stop()


def test_an_unformatted_reply_is_the_answer(harmony_client):
    args = dict(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=16, temperature=0)
    message = harmony_client.chat.completions.create(**args, tools=TOOLS).choices[0].message
    raw = harmony_client.chat.completions.create(**args, tools=TOOLS, extra_body={"skip_special_tokens": False})
    assert message.content and message.content == raw.choices[0].message.content
    assert message.model_extra["reasoning_content"] is None and not message.tool_calls
    chunks = list(harmony_client.chat.completions.create(stream=True, **args, tools=TOOLS))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == message.content


def test_the_responses_api_reads_it_too(harmony_client):
    chat = harmony_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=16,
                                                  temperature=0).choices[0].message
    response = harmony_client.responses.create(model="SmolLM2-135M-Instruct", input=ASK, max_output_tokens=16,
                                               temperature=0)
    assert response.output_text == chat.content


@pytest.mark.parametrize(("extra", "param"), [
    (dict(tools=TOOLS, tool_choice="required"), "tool_choice"),
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "is_prime"}}), "tool_choice"),
    (dict(response_format={"type": "json_object"}), "response_format"),
])
def test_what_harmony_does_not_take_is_named(harmony_client, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        harmony_client.chat.completions.create(model="SmolLM2-135M-Instruct", messages=ASK, max_tokens=4, **extra)
    assert err.value.body["param"] == param


@pytest.mark.parametrize("flags", [("--tool-call-parser", "openai"),
                                   ("--reasoning-parser", "openai_gptoss", "--tool-call-parser", "hermes")])
def test_flags_that_do_not_go_together_stop_the_server(flags):
    with pytest.raises(RuntimeError, match="gpt-oss's harmony format takes --tool-call-parser openai with "
                                           "--reasoning-parser openai_gptoss"):
        Server(*flags)
