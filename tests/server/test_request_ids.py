"""vLLM's request ids: a completion's or chat's body `request_id`, or an `X-Request-Id` header (which
wins), names the response ("cmpl-" / "chatcmpl-" and the id, streamed chunks included) and comes
back as the reply's X-Request-Id header; without either, the header gives the generated id. Two
requests that name themselves alike at the same time each get their own output (the engine's ids
stay unique). A request_id that could not be a header value is a 400 naming it."""

from __future__ import annotations

import concurrent.futures

import openai
import pytest


def test_the_body_request_id_names_the_response_and_its_header(client, model_name):
    raw = client.chat.completions.with_raw_response.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, temperature=0,
        extra_body={"request_id": "trace-42"})
    assert raw.parse().id == "chatcmpl-trace-42" and raw.headers["X-Request-Id"] == "trace-42"
    raw = client.completions.with_raw_response.create(model=model_name, prompt="Hi", max_tokens=4, temperature=0,
                                                      extra_body={"request_id": "trace-43"})
    assert raw.parse().id == "cmpl-trace-43" and raw.headers["X-Request-Id"] == "trace-43"


def test_the_header_wins_and_streams_carry_the_id(client, model_name):
    raw = client.completions.with_raw_response.create(
        model=model_name, prompt="Hi", max_tokens=4, temperature=0, stream=True,
        extra_body={"request_id": "from-body"}, extra_headers={"X-Request-Id": "from-header"})
    assert raw.headers["X-Request-Id"] == "from-header"
    chunks = list(raw.parse())
    assert chunks and {c.id for c in chunks} == {"cmpl-from-header"}


def test_without_an_id_the_header_gives_the_generated_one(client, model_name):
    raw = client.chat.completions.with_raw_response.create(
        model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2, temperature=0)
    out = raw.parse()
    assert out.id.startswith("chatcmpl-") and raw.headers["X-Request-Id"] == out.id.removeprefix("chatcmpl-")
    assert client.models.with_raw_response.list(extra_headers={"X-Request-Id": "m-1"}).headers["X-Request-Id"] == "m-1"


def test_requests_named_alike_at_once_each_get_their_own_output(client, model_name):
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,"]

    def complete(prompt: str, **extra) -> str:
        return client.completions.create(model=model_name, prompt=prompt, max_tokens=16, temperature=0,
                                         extra_body=extra).choices[0].text

    alone = [complete(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(lambda p: complete(p, request_id="same"), prompts))
    assert together == alone


@pytest.mark.parametrize("request_id", ["two words", "x" * 257, "", "tab\there"])
def test_a_request_id_that_cannot_be_a_header_is_refused(client, model_name, request_id):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_name, prompt="Hi", max_tokens=2, extra_body={"request_id": request_id})
    assert err.value.body["param"] == "request_id", err.value.body
