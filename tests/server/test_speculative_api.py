"""The server with speculative decoding (--speculative-config): streamed and plain completions
equal a server without it under greedy, the spec_decode counters move, and a bad JSON config
stops the server at start with a message naming the problem. A chat's `prediction` (OpenAI's
Predicted Outputs) gives the same reply, with completion_tokens_details; where no draft could
come of it, a 400 naming it."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
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


def test_a_prediction_gives_the_same_reply_faster(server, spec_server) -> None:
    openai = pytest.importorskip("openai")
    plain, spec = (openai.OpenAI(base_url=s.url + "/v1", api_key="-", max_retries=0) for s in (server, spec_server))
    ask = dict(model="SmolLM2-135M-Instruct", max_tokens=60, temperature=0,
               messages=[{"role": "user", "content": "Write a haiku about the sea."}])
    want = plain.chat.completions.create(**ask)
    text = want.choices[0].message.content
    # (Whether the step verifies the drafts is the cost model's call, which a loaded machine moves:
    # tests/engine/test_speculative.py counts them on an engine of its own.)
    got = spec.chat.completions.create(**ask, prediction={"type": "content", "content": text})
    assert got.choices[0].message.content == text
    details = got.usage.completion_tokens_details
    predicted = details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert details.accepted_prediction_tokens >= 0.9 * predicted > 0
    # streamed, the prediction as content parts; the usage at the end
    chunks = list(spec.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True},
                                               prediction={"type": "content", "content": [
                                                   {"type": "text", "text": text[:20]}, {"type": "text", "text": text[20:]}]}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens_details.accepted_prediction_tokens == details.accepted_prediction_tokens
    # an unrelated prediction: the same reply, all of it rejected but what the two share
    other = spec.chat.completions.create(**ask, prediction={"type": "content", "content": PROMPT})
    assert other.choices[0].message.content == text
    unrelated = other.usage.completion_tokens_details
    assert unrelated.rejected_prediction_tokens > unrelated.accepted_prediction_tokens


@pytest.mark.parametrize("where, body, param", [
    ("plain", {"prediction": {"type": "content", "content": "Hi"}}, "prediction"),  # no speculative decoding
    ("spec", {"prediction": {"type": "content", "content": "{}"}, "response_format": {"type": "json_object"}},
     "prediction"),
    ("spec", {"prediction": {"type": "content", "content": []}}, "prediction.content"),
    ("spec", {"prediction": {"type": "text", "content": "Hi"}}, "prediction.type"),
])
def test_a_prediction_no_draft_comes_of_is_a_400(server, spec_server, where, body, param) -> None:
    url = (server if where == "plain" else spec_server).url
    data = json.dumps({"model": "SmolLM2-135M-Instruct", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "Hi"}], **body}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 400 and json.loads(err.value.read())["error"]["param"].startswith(param)
    completion_req = urllib.request.Request(url + "/v1/completions", json.dumps(
        {"prompt": "Hi", "max_tokens": 2, "prediction": {"type": "content", "content": "x"}}).encode(),
        {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:  # chat's alone
        urllib.request.urlopen(completion_req, timeout=60)
    assert json.loads(err.value.read())["error"]["param"] == "prediction"
