"""Bad input never gets a 5xx: each malformed body, out-of-range field and over-limit ask gets a
400 (413, 415, 404) in OpenAI's error shape naming what was wrong, and the server keeps serving."""

from __future__ import annotations

import json
import socket

import pytest

from tests.reliability.conftest import assert_error, call
from tests.server.conftest import Server

X = {"prompt": "x", "max_tokens": 2}

MALFORMED = [
    ("invalid JSON", b"{not json", "application/json", 400, None, "invalid JSON"),
    ("array body", b"[1, 2]", "application/json", 400, None, "must be a JSON object"),
    ("string body", b'"prompt"', "application/json", 400, None, "must be a JSON object"),
    ("null body", b"null", "application/json", 400, None, "must be a JSON object"),
    ("empty body", b"", "application/json", 400, None, "empty"),
    ("not UTF-8", b'{"prompt": "\xff\xfe"}', "application/json", 400, None, "invalid JSON"),
    ("wrong content type", b'{"prompt": "x"}', "text/plain", 415, None, "application/json"),
    ("form content type", b"prompt=x", "application/x-www-form-urlencoded", 415, None, "application/json"),
    ("missing prompt", b"{}", "application/json", 400, "prompt", None),
]


@pytest.mark.parametrize("name, body, ctype, status, param, contains", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_completion_bodies(server, name, body, ctype, status, param, contains):
    code, out, _ = call(server.url + "/v1/completions", body, ctype)
    assert_error(code, out, status, param=param, contains=contains)


@pytest.mark.parametrize("messages", [None, "hello", [123], [{}], [], [None], [{"role": "user"}, 5],
                                      [{"role": "wizard", "content": "x"}], [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}]],
                         ids=lambda m: json.dumps(m))
def test_malformed_chat_messages(server, messages):
    code, out, _ = call(server.url + "/v1/chat/completions", {"messages": messages})
    assert_error(code, out, 400, param=None)
    assert out["error"]["param"].startswith("messages"), out


def nan_body(field: str) -> bytes:
    return b'{"prompt": "x", "%s": NaN}' % field.encode()


OUT_OF_RANGE = [
    ("temperature", {"temperature": -1}), ("temperature", {"temperature": 5}), ("temperature", nan_body("temperature")),
    ("temperature", b'{"prompt": "x", "temperature": Infinity}'), ("top_p", {"top_p": 0}), ("top_p", {"top_p": 2}),
    ("top_k", {"top_k": -2}), ("min_p", {"min_p": 2}), ("n", {"n": 0}), ("n", {"n": 17}),
    ("presence_penalty", {"presence_penalty": 3}), ("frequency_penalty", {"frequency_penalty": -3}),
    ("repetition_penalty", {"repetition_penalty": 0}), ("seed", {"seed": -1}), ("seed", {"seed": 2**64}),
    ("max_tokens", {"max_tokens": 0}), ("max_tokens", {"max_tokens": -1}), ("max_tokens", {"max_tokens": 10**9}),
    ("min_tokens", {"min_tokens": -1}), ("logprobs", {"logprobs": 21}), ("logprobs", {"logprobs": -1}),
    ("prompt_logprobs", {"prompt_logprobs": 21}), ("prompt_logprobs", {"prompt_logprobs": 1, "stream": True}),
    ("stop", {"stop": ["s"] * 17}), ("stop", {"stop": "s" * 513}), ("stop", {"stop": ["s" * 513]}),
    ("stop", {"stop": [""]}), ("stop", {"stop": 5}),
    ("stop_token_ids", {"stop_token_ids": [-1]}), ("stop_token_ids", {"stop_token_ids": [10**9]}),
    ("stop_token_ids", {"stop_token_ids": list(range(65))}),
    ("logit_bias", {"logit_bias": {str(i): 1 for i in range(1025)}}), ("logit_bias", {"logit_bias": {"-1": 1}}),
    ("logit_bias", {"logit_bias": {"999999": 1}}), ("logit_bias", {"logit_bias": {"5": 101}}),
    ("logit_bias", {"logit_bias": {"abc": 1}}), ("cache_salt", {"cache_salt": ""}),
    ("cache_salt", {"cache_salt": "s" * 257}), ("prompt", {"prompt": []}), ("prompt", {"prompt": [[]]}),
    ("prompt", {"prompt": [-1]}), ("prompt", {"prompt": [10**9]}), ("prompt", {"prompt": 5}),
    ("prompt", {"prompt": [5] * 600}), ("max_tokens", {"prompt": "hi", "max_tokens": 600}),
    ("echo", {"echo": True, "logprobs": 1, "stream": True}), ("model", {"model": "../../etc/passwd"}),
    ("stream_options", {"stream_options": {"include_usage": True}}),  # without stream: OpenAI refuses it too
    ("allowed_token_ids", {"allowed_token_ids": []}), ("allowed_token_ids", {"allowed_token_ids": [-1]}),
    ("allowed_token_ids", {"allowed_token_ids": [5, 10**9]}),
    # constraints that leave nothing to sample (found by schemathesis: they were 500s)
    ("guided_choice", {"allowed_token_ids": [5], "guided_choice": [""]}),
    ("allowed_token_ids", {"allowed_token_ids": [2], "min_tokens": 2}),
]


@pytest.mark.parametrize("param, fields", OUT_OF_RANGE,
                         ids=[f"{p}={f if isinstance(f, bytes) else json.dumps(f)[:40]}" for p, f in OUT_OF_RANGE])
def test_out_of_range_fields_name_the_parameter(server, param, fields):
    body = fields if isinstance(fields, bytes) else json.dumps({**X, **fields}).encode()
    code, out, _ = call(server.url + "/v1/completions", body)
    assert code in (400, 404), out
    err = out["error"]
    assert param in (err["param"] or "") or param in err["message"], err


CHAT_OUT_OF_RANGE = [("top_logprobs", {"logprobs": True, "top_logprobs": 21}),
                     ("top_logprobs", {"top_logprobs": 2}),
                     ("max_completion_tokens", {"max_completion_tokens": 0}),
                     ("chat_template", {"chat_template": "{{ messages }}"})]


@pytest.mark.parametrize("param, fields", CHAT_OUT_OF_RANGE, ids=[p for p, _ in CHAT_OUT_OF_RANGE])
def test_chat_out_of_range_fields(server, param, fields):
    code, out, _ = call(server.url + "/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "x"}], **fields})
    assert_error(code, out, 400)
    assert param in (out["error"]["param"] or "") or param in out["error"]["message"], out


SEVERAL_FORMS = [({"prompt": ""}, "prompt", "prompt: String should have at least 1 character"),
                 ({"prompt": ["a", ""]}, "prompt.1", "prompt.1: String should have at least 1 character"),
                 ({"prompt": [1.5]}, "prompt.0", "prompt.0: Input should be a valid string; Input should be a "
                                                 "valid integer; Input should be a valid list"),
                 ({"prompt": 5}, "prompt", "prompt: Input should be a valid string; Input should be a valid list"),
                 ({"stop": [""]}, "stop.0", "stop.0: String should have at least 1 character"),
                 ({"stop": ""}, "stop", "stop must be a list of non-empty strings, got ['']."),
                 ({"top_p": 1.5}, "top_p", None)]


@pytest.mark.parametrize("fields, param, message", SEVERAL_FORMS, ids=[json.dumps(f) for f, _, _ in SEVERAL_FORMS])
def test_the_400_names_where_the_value_failed(server, fields, param, message):
    """A field of several forms (prompt: a string, strings, token ids, lists of them) names the place
    in the value that failed, without pydantic's tags of the forms; SamplingParams' own checks name
    their field too."""
    code, out, _ = call(server.url + "/v1/completions", {**X, **fields})
    assert_error(code, out, 400, param=param)
    if message is not None:
        assert out["error"]["message"] == message, out


def test_a_validators_sentence_comes_without_pydantics_prefix(server):
    code, out, _ = call(server.url + "/v1/completions", {**X, "stream_options": {"include_usage": True}})
    assert_error(code, out, 400, param="stream_options")
    assert out["error"]["message"] == "stream_options: stream_options is only allowed when stream is true", out


def test_10mb_body_is_413(server):
    big = json.dumps({"prompt": "x" * (10 * 1024 * 1024)}).encode()
    code, out, _ = call(server.url + "/v1/completions", big)
    assert_error(code, out, 413, contains="too large")


def test_oversized_header_is_refused(server):
    """aiohttp refuses header lines over 8 KiB before any handler runs."""
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
        reply = s.recv(4096).decode(errors="replace")
    status = int(reply.split(" ", 2)[1])
    assert status in (400, 431), reply
    assert "header" in reply.lower() or "8190" in reply, reply


def test_server_keeps_serving_after_bad_input(server):
    code, out, _ = call(server.url + "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert code == 200 and out["choices"][0]["finish_reason"] in ("length", "stop")


# Fields of the OpenAI or vLLM API that corellm does not honour yet: a 400 naming the field, never
# a 200 that pretends (an agent asking for a tool call must not get plain text).
NOT_HONOURED = [
    ("/v1/chat/completions", "functions", {"functions": [{"name": "f", "parameters": {}}]}),
    ("/v1/chat/completions", "function_call", {"function_call": {"name": "f"}}),
    ("/v1/completions", "tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}),
    ("/v1/completions", "best_of", {"best_of": 3}),
    ("/v1/completions", "logits_processors", {"logits_processors": ["my_module.Processor"]}),
    ("/v1/completions", "prompt_embeds", {"prompt_embeds": "AAAA"}),
    ("/v1/completions", "guided_decoding_backend", {"guided_regex": "a+", "guided_decoding_backend": "xgrammar"}),
    ("/v1/chat/completions", "kv_transfer_params", {"kv_transfer_params": {"do_remote_decode": True}}),
    ("/v1/completions", "suffix", {"suffix": " the end."}),
    ("/v1/completions", "ec_transfer_params", {"ec_transfer_params": {"do_remote_encode": True}}),
    ("/v1/chat/completions", "media_io_kwargs", {"media_io_kwargs": {"image": {"mode": "RGB"}}}),
    ("/v1/completions", "return_token_offsets", {"return_token_offsets": True}),
]


@pytest.mark.parametrize("route, param, fields", NOT_HONOURED, ids=[p for _, p, _ in NOT_HONOURED])
def test_fields_corellm_does_not_honour_are_refused_by_name(server, route, param, fields):
    base = X if route == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}
    code, out, _ = call(server.url + route, {**base, **fields})
    assert_error(code, out, 400, param=param, contains="not supported")
    assert out["error"]["code"] == "unsupported_field"


def test_values_that_mean_leaving_a_field_out_are_accepted(server):
    body = {"messages": [{"role": "user", "content": "x"},
                         {"role": "assistant", "content": "y", "tool_calls": [], "refusal": None, "annotations": []},
                         {"role": "user", "content": "z"}],
            "max_tokens": 2, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
            "user": "u-1", "metadata": {"k": "v"}, "parallel_tool_calls": True, "store": False}
    code, out, _ = call(server.url + "/v1/chat/completions", body)
    assert code == 200, out
    code, out, _ = call(server.url + "/v1/completions", {**X, "best_of": 1, "use_beam_search": False,
                                                         "return_token_offsets": False})
    assert code == 200, out


CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}

# Request arguments corellm does not know, as a typo makes them: a 400 naming the argument, as
# OpenAI's API answers ("Unrecognized request argument supplied"), not a 200 for a request other
# than the one sent.
UNKNOWN = [
    ("/v1/chat/completions", {**CHAT, "temprature": 0}, "temprature"),
    ("/v1/chat/completions", {**CHAT, "stream": True, "include_usage": True}, "include_usage"),
    ("/v1/completions", {**X, "max_token": 5}, "max_token"),
    ("/v1/responses", {"input": "x", "max_output_token": 2}, "max_output_token"),
    ("/v1/embeddings", {"input": "x", "dimension": 8}, "dimension"),
    ("/tokenize", {"prompt": "x", "add_special_token": False}, "add_special_token"),
]


@pytest.mark.parametrize("route, body, param", UNKNOWN, ids=[p for _, _, p in UNKNOWN])
def test_arguments_corellm_does_not_know_are_refused_by_name(server, route, body, param):
    code, out, _ = call(server.url + route, body)
    assert_error(code, out, 400, param=param, contains="--allow-unknown-fields")
    assert out["error"]["code"] == "unknown_field"


def test_keys_of_a_requests_parts_that_corellm_does_not_know_are_ignored(server):
    """As OpenAI's API does (vLLM refused them once, and clients such as editor plugins that keep an
    id and UI options on each message broke): a message's keys, a content part's. What corellm does
    not honour is still refused wherever it is."""
    body = {**CHAT, "messages": [{"role": "system", "content": "s", "id": 17, "opts": {"visible": False}},
                                 {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": {}}]}]}
    code, out, _ = call(server.url + "/v1/chat/completions", body)
    assert code == 200 and out["choices"][0]["finish_reason"] in ("length", "stop"), out
    code, out, _ = call(server.url + "/v1/chat/completions", {
        **CHAT, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "audio": {"id": "a"}},
                             {"role": "user", "content": "z"}]})
    assert_error(code, out, 400, param="messages[1].audio", contains="not supported")


def request_schemas_take_more(url: str) -> dict[str, bool]:
    """additionalProperties of each request schema in the server's /openapi.json."""
    code, spec, _ = call(url + "/openapi.json", None, None, method="GET")
    assert code == 200, spec
    return {name: s["additionalProperties"] for name, s in spec["components"]["schemas"].items() if "properties" in s}


BODIES = {"CompletionRequest", "ChatCompletionRequest", "ResponsesRequest", "EmbeddingRequest", "TokenizeRequest"}


def test_openapi_says_request_bodies_take_no_other_arguments(server):
    takes = request_schemas_take_more(server.url)
    assert BODIES <= set(takes) and all(takes[b] is False for b in BODIES), takes
    assert takes["ChatMessage"] is True and takes["StreamOptions"] is True, takes


def test_allow_unknown_fields_ignores_them_and_logs_each_name():
    """--allow-unknown-fields: vLLM's rule for request arguments (ignored, each name logged once);
    fields corellm does not honour are still refused."""
    server = Server("--allow-unknown-fields")
    try:
        for _ in range(2):
            code, out, _ = call(server.url + "/v1/chat/completions",
                                {**CHAT, "a_clients_extension": 1,
                                 "messages": [{"role": "user", "content": "x", "x_trace": "t"}]})
            assert code == 200 and out["choices"][0]["finish_reason"] in ("length", "stop"), out
        log = server.output()
        assert log.count("ignoring the request field 'a_clients_extension'") == 1, log
        assert log.count("ignoring the request field 'x_trace'") == 1, log
        code, out, _ = call(server.url + "/v1/completions", {**X, "best_of": 3})
        assert_error(code, out, 400, param="best_of", contains="not supported")
        assert all(request_schemas_take_more(server.url)[b] is True for b in BODIES)
    finally:
        server.stop()


def test_max_logprobs_raises_the_cap():
    """--max-logprobs 40 (vLLM's): up to 40 top logprobs a position; 41 is a 400 naming the flag."""
    server = Server("--max-logprobs", "40")
    try:
        code, out, _ = call(server.url + "/v1/completions", {**X, "logprobs": 40})
        assert code == 200 and all(len(top) >= 40 for top in out["choices"][0]["logprobs"]["top_logprobs"]), out
        code, out, _ = call(server.url + "/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 40})
        assert code == 200 and all(len(t["top_logprobs"]) == 40 for t in out["choices"][0]["logprobs"]["content"])
        for route, body, param in (("/v1/completions", {**X, "logprobs": 41}, "logprobs"),
                                   ("/v1/completions", {**X, "prompt_logprobs": 41}, "prompt_logprobs"),
                                   ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": 41},
                                    "top_logprobs")):
            code, out, _ = call(server.url + route, body)
            assert_error(code, out, 400, param=param, contains="--max-logprobs")
    finally:
        server.stop()


def test_priority_needs_the_priority_policy(server):
    code, out, _ = call(server.url + "/v1/completions", {**X, "priority": 2})
    assert_error(code, out, 400, param="priority", contains="--scheduling-policy priority")
    code, out, _ = call(server.url + "/v1/completions", {**X, "priority": 0})
    assert code == 200, out
