"""`corellm run-batch`: a file of requests in OpenAI's batch format, run offline. Each output line
is the reply `corellm serve` gives the same request (the server fixture, the same prompts with a
cache_salt of their own so that both run them from a cold prefix cache), in the input's order; a
refused request is its error reply; a malformed file is refused, naming the line, before the model
loads."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from corellm.server.run_batch import read_batch
from tests.server.http_calls import post

SALT = {"cache_salt": "run-batch-test"}
LINES = [
    ("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 8,
                                      "temperature": 0, **SALT}),
    ("completion", "/v1/completions", {"prompt": ["The capital of France is", "Two plus two is"], "max_tokens": 6,
                                       "temperature": 0, **SALT}),
    ("embedding", "/v1/embeddings", {"input": ["a cat", "a dog"]}),
    ("rerank", "/rerank", {"query": "a pet", "documents": ["a cat", "a car"]}),
    ("refused", "/v1/chat/completions", {"messages": [], "max_tokens": 8}),
    # (the Messages API has no cache_salt: a system prompt of its own keeps its prefix apart)
    ("message", "/v1/messages", {"max_tokens": 8, "temperature": 0, "system": "A run-batch test.",
                                 "messages": [{"role": "user", "content": "Hi"}]}),
]


def run(tmp_path, lines: list[str], *args: str) -> subprocess.CompletedProcess:
    source = tmp_path / "in.jsonl"
    source.write_text("\n".join(lines) + "\n")
    return subprocess.run([sys.executable, "-m", "corellm.cli", "run-batch", "-i", str(source), "-o",
                           str(tmp_path / "out.jsonl"), "--max-model-len", "512", "--kv-cache-memory",
                           str(256 * 1024**2), "--max-concurrency", "4", *args], capture_output=True, text=True,
                          timeout=300)


def without_ids(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def test_each_line_gets_the_servers_reply_in_order(tmp_path, server):
    lines = [json.dumps({"custom_id": cid, "method": "POST", "url": url, "body": body}) for cid, url, body in LINES]
    done = run(tmp_path, lines)
    assert done.returncode == 0, done.stderr
    outputs = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [o["custom_id"] for o in outputs] == [cid for cid, _, _ in LINES]
    assert "ran 6 requests" in done.stderr and "5 answered, 1 refused" in done.stderr
    for (cid, url, body), out in zip(LINES, outputs):
        status, want = post(server, url, body)
        response = out["response"]
        assert out["error"] is None and out["id"].startswith("batch_req_") and response["request_id"]
        assert response["status_code"] == status, (cid, response)
        assert without_ids(response["body"]) == without_ids(want), cid


@pytest.mark.parametrize("line, words", [
    ("not json", "line 2: not JSON"),
    ('["a"]', "line 2: a request is a JSON object"),
    ('{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {}}', "custom_id 'x' is given twice"),
    ('{"custom_id": "y", "method": "GET", "url": "/v1/models", "body": {}}', "method must be POST"),
    ('{"custom_id": "y", "method": "POST", "url": "v1/completions", "body": {}}', "url must be a route"),
    ('{"custom_id": "y", "method": "POST", "url": "/v1/completions", "body": {"stream": true}}', "not streamed"),
    ('{"custom_id": "", "method": "POST", "url": "/v1/completions", "body": {}}', "custom_id must be"),
    ('{"custom_id": "y", "method": "POST", "url": "/v1/completions", "body": {}, "extra": 1}', "unknown field"),
])
def test_a_malformed_line_is_named(line, words):
    first = '{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"prompt": "a"}}'
    with pytest.raises(ValueError, match=words):
        read_batch([first, line])


def test_a_malformed_file_is_refused_before_the_model_loads(tmp_path):
    done = run(tmp_path, ['{"custom_id": "x", "method": "POST", "url": "/v1/completions", "body": {"stream": true}}'])
    assert done.returncode == 2 and "line 1: a batch's requests are not streamed" in done.stderr
    assert "weights:" not in done.stderr  # refused before loading
