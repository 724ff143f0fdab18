"""Every bad input gets its status and an OpenAI-shaped error; the API key guards every route but
/health."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from tests.server.conftest import Server


def call(url: str, body: bytes | None, content_type: str | None = "application/json", headers=None,
         method: str = "POST"):
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def assert_error(status, body, want_status, want_type="invalid_request_error", param=None, contains=None):
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == want_type
    if param is not None:
        assert err["param"] == param
    if contains is not None:
        assert contains in err["message"], err["message"]


CASES = [
    ("invalid JSON", b"{not json", "application/json", 400, None, "invalid JSON"),
    ("array body", b"[1, 2]", "application/json", 400, None, "must be a JSON object"),
    ("empty body", b"", "application/json", 400, None, "empty"),
    ("wrong content type", b'{"prompt": "x"}', "text/plain", 415, None, "application/json"),
    ("missing prompt", b"{}", "application/json", 400, "prompt", None),
    ("temperature out of range", b'{"prompt": "x", "temperature": 5}', "application/json", 400, "temperature", None),
    ("max_tokens zero", b'{"prompt": "x", "max_tokens": 0}', "application/json", 400, "max_tokens", None),
    ("logprobs too many", b'{"prompt": "x", "logprobs": 50}', "application/json", 400, "logprobs", None),
    ("n too large", b'{"prompt": "x", "n": 1000}', "application/json", 400, "n", None),
    ("prompt too long", json.dumps({"prompt": [5] * 600}).encode(), "application/json", 400, "prompt",
     "maximum context length is 512 tokens"),
    ("completion past context", json.dumps({"prompt": "hi", "max_tokens": 600}).encode(), "application/json", 400,
     "max_tokens", "maximum context length is 512 tokens"),
]


@pytest.mark.parametrize("name, body, ctype, status, param, contains", CASES, ids=[c[0] for c in CASES])
def test_completion_bad_inputs(server, name, body, ctype, status, param, contains):
    code, out = call(server.url + "/v1/completions", body, ctype)
    assert_error(code, out, status, param=param, contains=contains)


@pytest.mark.parametrize("messages", [None, "hello", [123], [{}], [], [{"role": "wizard", "content": "x"}]])
def test_chat_malformed_messages(server, messages):
    code, out = call(server.url + "/v1/chat/completions", json.dumps({"messages": messages}).encode())
    assert_error(code, out, 400)


def test_unknown_model_is_404(server):
    code, out = call(server.url + "/v1/completions", json.dumps({"prompt": "x", "model": "../../etc/passwd"}).encode())
    assert_error(code, out, 404, param="model")
    assert out["error"]["code"] == "model_not_found"


def test_oversized_body_is_413(server):
    big = json.dumps({"prompt": "x" * (3 * 1024 * 1024)}).encode()
    code, out = call(server.url + "/v1/completions", big)
    assert_error(code, out, 413)


def test_request_chat_template_refused_by_default(server):
    body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ messages }}"}
    code, out = call(server.url + "/v1/chat/completions", json.dumps(body).encode())
    assert_error(code, out, 400, param="chat_template")


def test_server_keeps_serving_after_errors(server):
    code, out = call(server.url + "/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2}).encode())
    assert code == 200 and out["choices"][0]["finish_reason"] in ("length", "stop")


@pytest.fixture(scope="module")
def keyed_server():
    s = Server("--api-key", "s3cret")
    yield s
    s.stop()


@pytest.mark.parametrize("path, method", [("/v1/models", "GET"), ("/v1/completions", "POST"), ("/metrics", "GET"),
                                          ("/tokenize", "POST"), ("/version", "GET"), ("/openapi.json", "GET")])
def test_api_key_guards_routes(keyed_server, path, method):
    body = json.dumps({"prompt": "x", "max_tokens": 1}).encode() if method == "POST" else None
    code, out = call(keyed_server.url + path, body, method=method, content_type="application/json" if body else None)
    assert_error(code, out, 401, "authentication_error")
    code, _ = call(keyed_server.url + path, body, method=method, content_type="application/json" if body else None,
                   headers={"Authorization": "Bearer wrong"})
    assert code == 401


def test_api_key_accepts_the_key_and_spares_health(keyed_server):
    code, out = call(keyed_server.url + "/v1/models", None, None, {"Authorization": "Bearer s3cret"}, "GET")
    assert code == 200 and out["data"]
    with urllib.request.urlopen(keyed_server.url + "/health") as r:
        assert r.status == 200


def test_sigterm_drains_in_flight_requests_then_exits():
    import signal
    import threading

    s = Server("--shutdown-timeout", "30")
    result = {}

    def long_request():
        body = json.dumps({"prompt": "Count: 1, 2,", "max_tokens": 60, "ignore_eos": True, "temperature": 0}).encode()
        result["status"], result["body"] = call(s.url + "/v1/completions", body)

    t = threading.Thread(target=long_request)
    t.start()
    import time

    time.sleep(0.5)  # the request is running
    s.proc.send_signal(signal.SIGTERM)
    t.join(timeout=60)
    assert result.get("status") == 200, result
    assert result["body"]["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(timeout=60) == 0
