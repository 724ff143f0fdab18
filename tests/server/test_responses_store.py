"""Stored responses through the official openai client: a response is kept unless store is false;
GET reads it back as it was made, input_items lists the conversation that led to it, DELETE
forgets it. The oracle for previous_response_id is the same conversation sent whole in `input`: a
greedy continuation gives the same text (and the same prompt: input_tokens). Background responses
are made while the client polls, can be cancelled, and fail without taking the server down; the
store puts out its least recently used responses beyond --max-stored-responses."""

from __future__ import annotations

import time

import openai
import pytest

from tests.server.conftest import Server, _client_of

MODEL = "SmolLM2-135M-Instruct"


def respond(client, **kw):
    return client.responses.create(model=MODEL, **{"max_output_tokens": 16, "temperature": 0, **kw})


def test_a_response_is_kept_and_read_back(client):
    out = respond(client, input="Name a fruit.")
    assert out.store is True
    got = client.responses.retrieve(out.id)
    assert got.model_dump() == out.model_dump()
    [item] = client.responses.input_items.list(out.id).data
    assert item.type == "message" and item.role == "user" and item.content[0].text == "Name a fruit."
    # store false: answered, not kept
    gone = respond(client, input="Name a fruit.", store=False)
    assert gone.store is False and gone.output_text == out.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(gone.id)


def test_a_streamed_response_is_kept_as_it_ended(client):
    events = list(respond(client, input="Name a colour.", stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).model_dump() == final.model_dump()


def test_previous_response_id_continues_the_conversation(client):
    first = respond(client, instructions="Answer in one word.", input="A colour of the sky?")
    second = respond(client, previous_response_id=first.id, input="And of grass?")
    # The same conversation sent whole: the previous instructions are not carried over (OpenAI's rule).
    whole = respond(client, input=[{"role": "user", "content": "A colour of the sky?"},
                                   {"role": "assistant", "content": first.output_text},
                                   {"role": "user", "content": "And of grass?"}])
    assert second.output_text == whole.output_text
    assert second.usage.input_tokens == whole.usage.input_tokens
    assert second.previous_response_id == first.id
    # A third turn walks the whole chain; input_items lists it, newest first by default.
    third = respond(client, previous_response_id=second.id, input="And of snow?")
    items = client.responses.input_items.list(third.id, order="asc").data
    texts = [part.text for item in items for part in item.content]
    assert texts == ["A colour of the sky?", first.output_text, "And of grass?", second.output_text, "And of snow?"]
    newest_first = client.responses.input_items.list(third.id).data
    assert [i.id for i in newest_first] == [i.id for i in items][::-1]
    page = client.responses.input_items.list(third.id, order="asc", limit=2, after=items[0].id)
    assert [i.id for i in page.data] == [items[1].id, items[2].id] and page.has_more
    # Deleting an earlier response leaves the later ones whole; continuing the deleted one is a 400.
    assert client.responses.delete(first.id) is None
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    assert [i.id for i in client.responses.input_items.list(third.id, order="asc").data] == [i.id for i in items]
    with pytest.raises(openai.BadRequestError) as err:
        respond(client, previous_response_id=first.id, input="Hi")
    assert err.value.body["param"] == "previous_response_id"
    assert err.value.body["code"] == "previous_response_not_found"


def test_function_calls_continue_through_previous_response_id(tools_client):
    weather = {"type": "function", "name": "get_weather", "description": "The weather in a city",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    ask = "What is the weather in Paris?"
    first = respond(tools_client, input=ask, tools=[weather], tool_choice="required", parallel_tool_calls=False,
                    max_output_tokens=60)
    [call] = [item for item in first.output if item.type == "function_call"]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, sunny"}
    nxt = respond(tools_client, previous_response_id=first.id, input=[result], tools=[weather], tool_choice="none",
                  max_output_tokens=30)
    whole = respond(tools_client, input=[{"role": "user", "content": ask}, call.model_dump(exclude_none=True), result],
                    tools=[weather], tool_choice="none", max_output_tokens=30)
    assert nxt.output_text == whole.output_text and nxt.usage.input_tokens == whole.usage.input_tokens


def wait_done(client, response_id: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = client.responses.retrieve(response_id)
        if got.status not in ("queued", "in_progress"):
            return got
        time.sleep(0.05)
    raise AssertionError(f"{response_id} still {got.status}")


def test_a_background_response_is_made_while_the_client_polls(client):
    started = respond(client, input="Name a fruit.", background=True)
    assert started.status in ("queued", "in_progress") and started.background and started.output == []
    done = wait_done(client, started.id)
    assert done.status in ("completed", "incomplete")
    assert done.output_text == respond(client, input="Name a fruit.", store=False).output_text
    # cancelling a finished one answers it as it is
    assert client.responses.cancel(started.id).status == done.status


def test_a_background_response_can_be_cancelled(client):
    started = respond(client, input="Count to one thousand.", background=True, max_output_tokens=400)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(started.id).status == "cancelled"
    # the engine let it go: a request after it is served at once
    assert respond(client, input="Hi", store=False, max_output_tokens=2).status == "incomplete"
    with pytest.raises(openai.BadRequestError) as err:  # only background responses can be cancelled
        client.responses.cancel(respond(client, input="Hi", max_output_tokens=2).id)
    assert err.value.body["param"] == "response_id"


@pytest.mark.parametrize("fields, param", [
    ({"background": True, "stream": True}, "background"),
    ({"background": True, "store": False}, "background"),
    ({"previous_response_id": "resp_nothing"}, "previous_response_id"),
])
def test_what_cannot_be_kept_is_a_400_naming_it(client, fields, param):
    with pytest.raises(openai.BadRequestError) as err:
        respond(client, **{"input": "Hi", **fields})
    assert err.value.body["param"] == param, err.value.body


def test_unknown_ids_and_query_parameters(server, client):
    import urllib.error
    import urllib.request

    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_nothing")
    with pytest.raises(openai.NotFoundError):
        client.responses.delete("resp_nothing")
    kept = respond(client, input="Hi", max_output_tokens=2)
    for query, param in (("?stream=true", "stream"), ("?include[]=x", "include[]")):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.url}/v1/responses/{kept.id}{query}")
        assert err.value.code == 400 and param in err.value.read().decode()
    for kw, param in (({"limit": 0}, "limit"), ({"after": "msg_nothing"}, "after")):
        with pytest.raises(openai.BadRequestError) as err:
            client.responses.input_items.list(kept.id, **kw)
        assert err.value.body["param"] == param


def test_the_store_keeps_the_most_recently_used():
    server = Server("--max-stored-responses", "2")
    try:
        client = _client_of(server)
        a, b = (respond(client, input=text, max_output_tokens=2) for text in ("One", "Two"))
        client.responses.retrieve(a.id)  # a is now the more recently used
        respond(client, input="Three", max_output_tokens=2)
        assert client.responses.retrieve(a.id).id == a.id
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(b.id)
    finally:
        server.stop()
    server = Server("--max-stored-responses", "0")
    try:
        client = _client_of(server)
        out = respond(client, input="Hi", max_output_tokens=2)  # store left out: answered, not kept
        assert out.store is False
        for fields in ({"store": True}, {"background": True}):
            with pytest.raises(openai.BadRequestError) as err:
                respond(client, input="Hi", **fields)
            assert err.value.body["param"] == next(iter(fields))
    finally:
        server.stop()
