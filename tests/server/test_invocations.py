"""POST /invocations (SageMaker's one inference route, as vLLM serves it): each kind of body gets
the answer its own route gives (a chat completion, a completion, embeddings, a rerank, a score),
streamed when asked; a body of one kind with a bad field is that kind's 400, naming the field, and
a body of no kind a 400 naming the fields that tell them apart."""

from __future__ import annotations

import pytest

from tests.reliability.conftest import call
from tests.server.http_calls import post, stream

MODEL = "SmolLM2-135M-Instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8, "temperature": 0}
COMPLETION = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
DOCS = ["Paris is the capital of France.", "Bananas are yellow.", "France's capital city is Paris."]


def without_ids(body: dict) -> dict:
    """A reply without what differs between two calls (its id and creation time)."""
    return {k: v for k, v in body.items() if k not in ("id", "created")}


@pytest.mark.parametrize("route, body", [
    ("/v1/chat/completions", CHAT),
    ("/v1/completions", COMPLETION),
    ("/v1/embeddings", {"model": MODEL, "input": ["a cat", "a dog"]}),
    ("/rerank", {"model": MODEL, "query": "What is France's capital?", "documents": DOCS, "top_n": 2}),
    ("/score", {"model": MODEL, "queries": "What is France's capital?", "documents": DOCS}),
    ("/score", {"model": MODEL, "text_1": "What is France's capital?", "text_2": DOCS}),
])
def test_each_kind_of_body_gets_its_routes_answer(server, route, body):
    post(server, route, body)  # fills the prefix cache: the two compared calls then hit it alike
    status, direct = post(server, route, body)
    assert status == 200, direct
    status, invoked = post(server, "/invocations", body)
    assert status == 200, invoked
    assert without_ids(invoked) == without_ids(direct)


def test_a_streamed_chat_through_invocations(server):
    events = stream(server, "/invocations", CHAT)
    assert events[0]["object"] == "chat.completion.chunk"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e["choices"])
    _, whole = post(server, "/v1/chat/completions", CHAT)
    assert text == whole["choices"][0]["message"]["content"]


@pytest.mark.parametrize("body, param", [
    ({**CHAT, "max_tokens": -1}, "max_tokens"),
    ({**CHAT, "prompt": "both"}, "prompt"),  # a chat body (it has messages) with a completion's field
    ({**COMPLETION, "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "query": "q"}, "documents"),
])
def test_a_body_of_one_kind_is_checked_as_that_kind(server, body, param):
    status, error = post(server, "/invocations", body)
    assert status == 400 and error["error"]["param"] == param, error


def test_a_body_of_no_kind_names_the_fields_that_tell_them_apart(server):
    status, error = post(server, "/invocations", {"model": MODEL, "max_tokens": 4})
    assert status == 400
    message = error["error"]["message"]
    assert all(f"`{field}`" in message for field in ("messages", "prompt", "input", "query", "queries", "text_1"))
    status, error, _ = call(server.url + "/invocations", b'["messages"]')
    assert status == 400 and "must be a JSON object" in error["error"]["message"]
