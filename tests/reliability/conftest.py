"""Servers and helpers for the reliability suite: the default model behind a subprocess server,
a tiny random model with SmolLM2's tokenizer and chat template (fast enough to fuzz), and
/metrics readers that show what the engine still holds."""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.server.conftest import Server


def call(url: str, body: bytes | dict | None, content_type: str | None = "application/json", headers=None,
         method: str = "POST", timeout: float = 60):
    """(status, parsed JSON body, headers) of one HTTP request; errors are returned, not raised."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    req = urllib.request.Request(url, data=body, method=method, headers=dict(headers or {}))
    if content_type:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null"), dict(r.headers)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            parsed = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw.decode(errors="replace")
        return e.code, parsed, dict(e.headers)


def assert_error(status, body, want_status, want_type="invalid_request_error", param=None, contains=None):
    assert status == want_status, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == want_type
    if param is not None:
        assert err["param"] == param, err
    if contains is not None:
        assert contains in err["message"], err["message"]


def metrics(url: str) -> dict[str, float]:
    """The server's /metrics as {name{labels}: value}, labels without model_name."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        key = re.sub(r'model_name="[^"]*",?', "", key).replace(",}", "}").replace("{}", "")
        out[key] = float(value)
    return out


def held(url: str) -> dict[str, float]:
    """What the engine holds: open request states per layer, queued requests, running and waiting."""
    m = metrics(url)
    states = {k: v for k, v in m.items() if k.startswith("corellm:open_request_states")}
    return {**states, "running": m["corellm:num_requests_running"], "waiting": m["corellm:num_requests_waiting"],
            "queued": m["corellm:num_requests_queued"], "free_blocks": m["corellm:kv_cache_free_blocks"]}


def wait_released(url: str, free_blocks: float, within_s: float) -> float:
    """Seconds until nothing is held and `free_blocks` are free again; fails after `within_s`."""
    start = time.monotonic()
    while True:
        h = held(url)
        if h["free_blocks"] == free_blocks and not any(v for k, v in h.items() if k != "free_blocks"):
            return time.monotonic() - start
        if time.monotonic() - start > within_s:
            raise AssertionError(f"still held after {within_s} s: {h} (free blocks wanted {free_blocks})")
        time.sleep(0.02)


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


def make_tiny_smollm_dir(directory: Path) -> Path:
    """A 2-layer random Llama with SmolLM2's full vocabulary, tokenizer and chat template."""
    import torch
    import transformers

    from corellm.model.loader import load_model

    tok = load_model(None).tokenizer
    config = transformers.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(directory, safe_serialization=True)
    tok.backend.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": tok.chat_template, "eos_token": tok.id_to_token(tok.eos_token_id),
        "bos_token": tok.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None}))
    return directory


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_smollm_dir(tmp_path_factory.mktemp("tiny_smollm"))


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir):
    s = Server(str(tiny_model_dir), "--served-model-name", "tiny", "--dtype", "float32")
    yield s
    s.stop()
