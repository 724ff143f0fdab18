"""POST /v1/responses through the official openai client. The oracle is the server's own chat path:
a response (greedy) gives the same text, reasoning, tool calls and usage as the chat completion of
the same conversation; streamed, its events come in order with consecutive sequence numbers and
their deltas join to the whole; instructions, developer and assistant turns, function calls and
their outputs and reasoning items given back in `input` are the chat messages they stand for;
with include ["message.output_text.logprobs"] the message's tokens carry chat's logprobs (the
reasoning's left out), whole and in the stream's deltas; what corellm does not make (summaries,
other tool types, logprobs beside tools) is a 400 naming the field. Stored
responses: test_responses_store.py."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.server.test_tools_api import ADD, SCHEMAS, WEATHER

MODEL = "SmolLM2-135M-Instruct"


def respond(client, **kw):
    return client.responses.create(model=MODEL, **{"max_output_tokens": 24, "temperature": 0, **kw})


def chat(client, messages, **kw):
    return client.chat.completions.create(model=MODEL, messages=messages,
                                          **{"max_tokens": 24, "temperature": 0, **kw})


def test_a_response_is_the_chat_completion_of_its_conversation(client):
    out = respond(client, instructions="You are terse.", input="What is the capital of France?")
    want = chat(client, [{"role": "system", "content": "You are terse."},
                         {"role": "user", "content": "What is the capital of France?"}])
    assert out.output_text == want.choices[0].message.content
    assert out.id.startswith("resp_") and out.object == "response" and out.model == MODEL
    assert out.status == ("incomplete" if want.choices[0].finish_reason == "length" else "completed")
    assert (out.usage.input_tokens, out.usage.output_tokens) == (want.usage.prompt_tokens,
                                                                 want.usage.completion_tokens)
    [item] = out.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"


def test_a_cut_response_is_incomplete(client):
    out = respond(client, input="Tell me a long story.", max_output_tokens=3)
    assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 3


def test_the_stream_is_the_whole_response_in_events(client):
    whole = respond(client, input="Say hello.")
    events = list(respond(client, input="Say hello.", stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens


def test_input_items_are_the_messages_they_stand_for(client):
    items = [{"role": "developer", "content": "Answer with one word."},
             {"role": "user", "content": [{"type": "input_text", "text": "A colour?"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
             {"role": "user", "content": "Another?"}]
    out = respond(client, input=items)
    want = chat(client, [{"role": "system", "content": "Answer with one word."},
                         {"role": "user", "content": "A colour?"}, {"role": "assistant", "content": "Blue."},
                         {"role": "user", "content": "Another?"}])
    assert out.output_text == want.choices[0].message.content


def test_text_format_holds_the_output_to_a_schema(client):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    out = respond(client, input="Name a city, as JSON.", max_output_tokens=40,
                  text={"format": {"type": "json_schema", "name": "city", "schema": schema, "strict": True}})
    assert out.status == "completed"
    jsonschema.validate(json.loads(out.output_text), schema)


@pytest.mark.parametrize("extras", [
    {"stop": [" Paris", "."], "include_stop_str_in_output": True},
    {"ignore_eos": True, "logit_bias": {"28": 5.0}, "cache_salt": "tenant-r", "priority": 0},
    {"structured_outputs": {"choice": ["red", "green", "blue"]}},
    {"skip_special_tokens": False, "stop": "Paris"},
])
def test_vllms_extras_act_as_on_chat(client, extras):
    """vLLM's extras of its Responses API (stop, ignore_eos, logit_bias, structured_outputs, ...):
    the response is the chat completion with the same extras."""
    question = "What is the capital of France?"
    out = respond(client, input=question, extra_body=extras)
    want = chat(client, [{"role": "user", "content": question}], extra_body=extras)
    assert out.output_text == want.choices[0].message.content
    assert out.usage.output_tokens == want.usage.completion_tokens


@pytest.mark.parametrize("fields, param", [
    ({"include": ["file_search_call.results"]}, "include"),
    ({"stop": ["x"] * 65}, "stop"),  # vLLM's extras are checked as chat's fields of the same names
    ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "structured_outputs"),
    ({"enable_response_messages": True}, "enable_response_messages"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without include's logprobs it would give nothing
    ({"include": ["message.output_text.logprobs"], "top_logprobs": 21}, "top_logprobs"),
    ({"truncation": "auto"}, "truncation"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"input": [{"type": "reasoning", "summary": [], "encrypted_content": "not base64!"},
                {"role": "assistant", "content": "y"}]}, "input[0].encrypted_content"),
    ({"include": ["reasoning.encrypted_content", "code_interpreter_call.outputs"]}, "include"),
    ({"include": ["message.output_text.logprobs"], "tools": [{"type": "function", "name": "f"}]}, "include"),
    ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "hmm"}]}]}, "input"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"),
    ({"max_output_tokens": 10**6}, "max_output_tokens"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),  # SmolLM2's template does not read it
])
def test_what_is_not_made_is_a_400_naming_it(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        respond(client, input="Hi", extra_body=fields)
    assert err.value.body["param"].startswith(param), err.value.body


def flat(tool: dict) -> dict:
    """A chat tool in the Responses API's flat form."""
    return {"type": "function", **tool["function"]}


ASK = [{"role": "user", "content": "What is the weather in Paris, in celsius?"}]


def test_function_calls_come_as_items_and_go_back_as_input(tools_client):
    out = respond(tools_client, input=ASK, tools=[flat(WEATHER), flat(ADD)], tool_choice="required",
                  parallel_tool_calls=False, max_output_tokens=120)
    [call] = [item for item in out.output if item.type == "function_call"]
    want = chat(tools_client, ASK, tools=[WEATHER, ADD], tool_choice="required", parallel_tool_calls=False,
                max_tokens=120).choices[0].message.tool_calls[0]
    assert (call.name, call.arguments) == (want.function.name, want.function.arguments) and call.call_id
    jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
    events = list(respond(tools_client, input=ASK, tools=[flat(WEATHER)], tool_choice="required",
                          parallel_tool_calls=False, max_output_tokens=120, stream=True))
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and "".join(pieces) == events[-1].response.output[0].arguments
    # The call and its result given back: the same prompt as chat's assistant tool_calls and tool message.
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    back = respond(tools_client, input=ASK + [call.model_dump(exclude_none=True), result], tools=[flat(WEATHER)],
                   tool_choice="none", max_output_tokens=30)
    again = chat(tools_client, ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "21 C, sunny"}], tools=[WEATHER], tool_choice="none",
        max_tokens=30)
    assert back.output_text == again.choices[0].message.content


def test_reasoning_comes_as_its_own_item(reasoning_client):
    ask = [{"role": "user", "content": "Is 7 prime?"}]
    out = respond(reasoning_client, input=ask, extra_body={"thinking_token_budget": 6})
    want = chat(reasoning_client, ask, extra_body={"thinking_token_budget": 6}).choices[0].message
    reasoning, message = out.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == want.model_extra["reasoning_content"]
    assert message.type == "message" and out.output_text == want.content
    # its budget, then the tokens of "</think>" (at most one a character)
    assert 6 < out.usage.output_tokens_details.reasoning_tokens <= min(6 + len("</think>"), out.usage.output_tokens)
    events = list(respond(reasoning_client, input=ask, stream=True, extra_body={"thinking_token_budget": 6},
                          include=["reasoning.encrypted_content"]))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning.content[0].text
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == out.output_text
    # A reply that is all reasoning (cut before it ended) still has its message item, empty, whole or streamed.
    cut = respond(reasoning_client, input=ask, max_output_tokens=3)
    streamed = list(respond(reasoning_client, input=ask, max_output_tokens=3, stream=True))[-1].response
    assert [i.type for i in cut.output] == [i.type for i in streamed.output] == ["reasoning", "message"]
    assert cut.output_text == streamed.output_text == "" and cut.status == "incomplete"
    # A client that keeps no server state (store false) gives the reasoning back as it got it:
    # the next turn's prompt is chat's with the assistant's reasoning_content.
    [done] = [e.item for e in events if e.type == "response.output_item.done" and e.item.type == "reasoning"]
    assert done.encrypted_content
    given_back = {"type": "reasoning", "summary": [], "encrypted_content": done.encrypted_content}
    follow = [{"role": "user", "content": "And 9?"}]
    nxt = respond(reasoning_client, input=ask + [given_back, {"role": "assistant", "content": out.output_text}] + follow)
    want = chat(reasoning_client, ask + [{"role": "assistant", "content": out.output_text,
                                          "reasoning_content": reasoning.content[0].text}] + follow)
    assert nxt.output[-1].content[0].text == want.choices[0].message.content


def test_input_items_become_chat_messages():
    from corellm.server.responses_protocol import ResponsesRequest, reasoning_content

    req = ResponsesRequest.model_validate({"instructions": "Be brief.", "input": [
        {"role": "developer", "content": "No lists."},
        {"role": "user", "content": [{"type": "input_text", "text": "Weather "}, {"type": "input_text", "text": "in Oslo?"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": reasoning_content("I should call the tool. ✓")},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "-3 C"},
        {"type": "function_call_output", "call_id": "c2", "output": "09:00"},
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Now answer."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Cold."}]}]})
    assert req.messages() == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "No lists."},
        {"role": "user", "content": [{"type": "text", "text": "Weather "}, {"type": "text", "text": "in Oslo?"}]},
        {"role": "assistant", "content": None, "reasoning_content": "I should call the tool. ✓", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "-3 C"}, {"role": "tool", "tool_call_id": "c2", "content": "09:00"},
        {"role": "assistant", "content": [{"type": "text", "text": "Cold."}], "reasoning_content": "Now answer."}]


LOGPROBS = ["message.output_text.logprobs"]


def same_logprobs(got, want):
    assert [e.token for e in got] == [e.token for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-5)
    for g, w in zip(got, want):
        assert [t.token for t in g.top_logprobs] == [t.token for t in w.top_logprobs]


def test_logprobs_are_the_chat_completions(client):
    ask = [{"role": "user", "content": "Name three colours."}]
    out = respond(client, input=ask, include=LOGPROBS, top_logprobs=3)
    want = chat(client, ask, logprobs=True, top_logprobs=3).choices[0].logprobs.content
    got = out.output[0].content[0].logprobs
    assert len(got) == out.usage.output_tokens and all(len(e.top_logprobs) == 3 for e in got)
    same_logprobs(got, want)
    events = list(respond(client, input=ask, include=LOGPROBS, top_logprobs=3, stream=True))
    streamed = [e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs]
    [done] = [ev for ev in events if ev.type == "response.output_text.done"]
    same_logprobs(streamed, want)
    same_logprobs(done.logprobs, want)
    same_logprobs(events[-1].response.output[0].content[0].logprobs, want)
    # without include: none
    assert respond(client, input=ask).output[0].content[0].logprobs == []


def test_logprobs_leave_the_reasoning_out(reasoning_client):
    ask = [{"role": "user", "content": "Is 7 prime?"}]
    extra = {"thinking_token_budget": 6}
    out = respond(reasoning_client, input=ask, include=LOGPROBS, extra_body=extra)
    want = chat(reasoning_client, ask, logprobs=True, extra_body=extra).choices[0].logprobs.content
    reasoning = out.usage.output_tokens_details.reasoning_tokens
    got = out.output[-1].content[0].logprobs
    assert 0 < reasoning and len(got) == out.usage.output_tokens - reasoning
    same_logprobs(got, want[reasoning:])
    events = list(respond(reasoning_client, input=ask, include=LOGPROBS, extra_body=extra, stream=True))
    same_logprobs([e for ev in events if ev.type == "response.output_text.delta" for e in ev.logprobs], want[reasoning:])


@pytest.mark.parametrize("parser, pieces, reasoning", [
    ("qwen3", ["Hello", " world"], 0),  # thinking off: no block, all of it the answer
    ("qwen3", ["<think>", "hm", "</think>", "Hi"], 3),
    ("qwen3", ["\n", "<", "think>", "x", "</think>", "A"], 5),  # undecided until the tag is whole
    ("qwen3", ["\n", "Hi"], 0),
    ("deepseek_r1", ["a", "b"], 2),  # the prompt opened the block, never closed
    ("deepseek_r1", ["a", "</think>", "\n", "b"], 2),
])
def test_reasoning_tokens_are_those_of_the_block(parser, pieces, reasoning):
    from types import SimpleNamespace

    from corellm.server.responses import _ReplyTokens

    tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens: pieces[ids[0]])
    tokens = _ReplyTokens(SimpleNamespace(tokenizer=tokenizer), SimpleNamespace(reasoning_parser=parser),
                          SimpleNamespace(output_logprobs=False, top_logprobs=None))
    tokens.feed(list(range(len(pieces))), None)
    tokens.finish()
    assert tokens.reasoning == reasoning
