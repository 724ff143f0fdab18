"""The API key guards every route but the probes /health and /ping; `model` is only compared; cache_salt keeps one
tenant's prompts out of another's prefix-cache hits."""

from __future__ import annotations

import urllib.request

import pytest

from tests.reliability.conftest import assert_error, call, metrics
from tests.server.conftest import Server


@pytest.fixture(scope="module")
def keyed_server():
    s = Server("--api-key", "s3cret")
    yield s
    s.stop()


ROUTES = [("/v1/models", "GET"), ("/v1/models/SmolLM2-135M-Instruct", "GET"), ("/load", "GET"), ("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/metrics", "GET"),
          ("/tokenize", "POST"), ("/detokenize", "POST"), ("/version", "GET"), ("/openapi.json", "GET"),
          ("/invocations", "POST"), ("/inference/v1/generate", "POST"), ("/v1/completions/render", "POST"),
          ("/v1/chat/completions/render", "POST")]


@pytest.mark.parametrize("path, method", ROUTES)
def test_api_key_guards_routes(keyed_server, path, method):
    body = {"prompt": "x", "max_tokens": 1} if method == "POST" else None
    ctype = "application/json" if body else None
    code, out, _ = call(keyed_server.url + path, body, ctype, method=method)
    assert_error(code, out, 401, "authentication_error")
    for header in ("Bearer wrong", "Bearer s3cre", "Bearer s3cret2", "s3cret", "Basic s3cret"):
        code, _, _ = call(keyed_server.url + path, body, ctype, headers={"Authorization": header}, method=method)
        assert code == 401, header


def test_api_key_accepts_the_key_and_spares_health(keyed_server):
    code, out, _ = call(keyed_server.url + "/v1/models", None, None, {"Authorization": "Bearer s3cret"}, "GET")
    assert code == 200 and out["data"]
    for probe in ("/health", "/ping"):
        with urllib.request.urlopen(keyed_server.url + probe) as r:
            assert r.status == 200


def test_model_name_is_only_compared(server):
    for name in ("../../etc/passwd", "/tmp", "SmolLM2-135M-Instruct/../x", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        code, out, _ = call(server.url + "/v1/completions", {"prompt": "x", "max_tokens": 1, "model": name})
        assert_error(code, out, 404, param="model")
        assert out["error"]["code"] == "model_not_found"


def test_cache_salt_isolates_prefix_cache_hits(server):
    prompt = "The tenant's secret system prompt: " + "alpha beta gamma delta " * 12

    def hits_after(body):
        before = metrics(server.url)["corellm:prefix_cache_hits_total"]
        code, out, _ = call(server.url + "/v1/completions", {"prompt": prompt, "max_tokens": 1, **body})
        assert code == 200, out
        return metrics(server.url)["corellm:prefix_cache_hits_total"] - before

    hits_after({"cache_salt": "tenant-a"})  # fills the cache under tenant a's salt
    assert hits_after({"cache_salt": "tenant-a"}) >= 32  # a's own repeat hits
    assert hits_after({"cache_salt": "tenant-b"}) == 0  # b shares nothing with a
    assert hits_after({}) == 0  # nor does an unsalted request
