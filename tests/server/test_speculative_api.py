"""The server with speculative decoding (--speculative-config): streamed and plain completions
equal a server without it under greedy, the spec_decode counters move, and a bad JSON config
stops the server at start with a message naming the problem."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request

import pytest

from tests.server.conftest import Server

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PROMPT = ("Copy this text exactly:\n\nThe bridge over the river was repaired before winter, and the school hired two "
          "more teachers.\n\nCopy:\n")


@pytest.fixture(scope="module")
def spec_server():
    s = Server("--speculative-config", json.dumps(SPEC))
    yield s
    s.stop()


def completion(url: str, stream: bool) -> str:
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": stream}).encode()
    req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        raw = r.read().decode()
    if not stream:
        return json.loads(raw)["choices"][0]["text"]
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def test_same_text_as_without_and_counters(server, spec_server) -> None:
    expected = completion(server.url, stream=False)
    assert completion(spec_server.url, stream=False) == expected
    assert completion(spec_server.url, stream=True) == expected
    with urllib.request.urlopen(spec_server.url + "/metrics", timeout=10) as r:
        metrics = r.read().decode()
    values = {line.split("{")[0]: float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
              if line.startswith("corellm:spec_decode_num_") and "_total{" in line and "per_pos" not in line}
    assert values["corellm:spec_decode_num_draft_tokens_total"] > 0
    assert 0 < values["corellm:spec_decode_num_accepted_tokens_total"] <= values["corellm:spec_decode_num_draft_tokens_total"]
    assert 'corellm:spec_decode_num_accepted_tokens_per_pos_total{model_name=' in metrics


@pytest.mark.parametrize("config, message", [
    ("{not json", "--speculative-config is not valid JSON"),
    ('{"method": "ngram"}', "speculative_config needs 'num_speculative_tokens'"),
    ('{"method": "medusa", "num_speculative_tokens": 2}', "method must be one of"),
])
def test_bad_config_is_a_clear_start_error(config: str, message: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "corellm.cli", "serve", "--speculative-config", config],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert message in proc.stderr, proc.stderr
