"""LoRA adapters through the server, as vLLM serves them: --lora-modules at start-up, a request's
`model` naming an adapter (completions, chat streamed or whole, tokens in, embeddings), the
adapters listed by /v1/models, loaded and unloaded at run time where allowed; the replies equal
the offline engine's with the same adapter (greedy, bf16: bit-identical whatever the batch)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from corellm.model.loader import load_model_config
from tests.lora_adapters import hf_shape, make_lora_adapter
from tests.reliability.conftest import call
from tests.server.conftest import Server
from tests.server.http_calls import post, stream

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora_server")
    config = hf_shape(load_model_config(None))
    make_lora_adapter(root / "a", config, rank=8, std=0.05, seed=1)
    make_lora_adapter(root / "b", config, rank=4, std=0.05, seed=2)
    return root


@pytest.fixture(scope="module")
def lora_server(adapters):
    server = Server("--enable-lora", "--max-loras", "2", "--lora-modules", f"a={adapters / 'a'}",
                    env={"CORELLM_ALLOW_RUNTIME_LORA_UPDATING": "true"})
    yield server
    server.stop()


def _post_text(server, path: str, body: dict) -> tuple[int, str]:
    """(status, text) of a POST whose success is plain text (vLLM's adapter routes answer so)."""
    req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _complete(server, model: str | None, **extra) -> dict:
    body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    status, reply = post(server, "/v1/completions", body)
    assert status == 200, reply
    return reply


def test_an_adapter_named_by_model_answers_as_the_offline_engine_with_it(lora_server, adapters):
    from corellm import LLM, LoRARequest, SamplingParams

    a = _complete(lora_server, "a")
    base = _complete(lora_server, None)
    assert a["model"] == "a" and a["choices"][0]["text"] != base["choices"][0]["text"]
    llm = LLM(enable_lora=True, kv_cache_memory=128 * 1024**2, max_model_len=512)
    params = SamplingParams(temperature=0, max_tokens=16)
    want = llm.generate(PROMPT, params, use_tqdm=False, lora_request=LoRARequest("a", 1, str(adapters / "a")))
    assert a["choices"][0]["text"] == want[0].outputs[0].text
    assert base["choices"][0]["text"] == llm.generate(PROMPT, params, use_tqdm=False)[0].outputs[0].text
    llm.shutdown()
    # chat, whole and streamed, and the tokens-in route take it too
    chat = {"model": "a", "messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 12,
            "temperature": 0}
    status, whole = post(lora_server, "/v1/chat/completions", chat)
    assert status == 200 and whole["model"] == "a"
    streamed = "".join(e["choices"][0]["delta"].get("content") or "" for e in stream(lora_server, "/v1/chat/completions", chat)
                       if e.get("choices"))
    assert streamed == whole["choices"][0]["message"]["content"]
    status, tokenized = post(lora_server, "/tokenize", {"prompt": PROMPT})
    status, generated = post(lora_server, "/inference/v1/generate",
                             {"model": "a", "token_ids": tokenized["tokens"],
                              "sampling_params": {"max_tokens": 16, "temperature": 0}})
    assert status == 200, generated
    with_text = post(lora_server, "/v1/completions", {"model": "a", "prompt": tokenized["tokens"], "max_tokens": 16,
                                                      "temperature": 0, "return_token_ids": True})[1]
    assert generated["choices"][0]["token_ids"] == with_text["choices"][0]["token_ids"]
    assert a["choices"][0]["text"] == with_text["choices"][0]["text"]
    status, vectors = post(lora_server, "/v1/embeddings", {"model": "a", "input": ["hello", "world"]})
    status_base, base_vectors = post(lora_server, "/v1/embeddings", {"input": ["hello", "world"]})
    assert status == status_base == 200 and vectors["model"] == "a"
    assert vectors["data"][0]["embedding"] != base_vectors["data"][0]["embedding"]


def test_models_lists_the_adapters_and_an_unknown_name_is_a_404(lora_server, adapters):
    status, models, _ = call(lora_server.url + "/v1/models", None, method="GET")
    base, a = models["data"][0], models["data"][1]
    assert status == 200 and a["id"] == "a" and a["parent"] == base["id"] and a["root"] == str(adapters / "a")
    status, card, _ = call(lora_server.url + "/v1/models/a", None, method="GET")
    assert status == 200 and card["parent"] == base["id"]
    status, reply = post(lora_server, "/v1/completions", {"model": "nope", "prompt": "x", "max_tokens": 1})
    assert status == 404 and reply["error"]["param"] == "model"


def test_adapters_load_and_unload_at_run_time(lora_server, adapters):
    status, text = _post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(adapters / "b")})
    assert status == 200 and "'b' added" in text
    b = _complete(lora_server, "b")["choices"][0]["text"]
    a = _complete(lora_server, "a")["choices"][0]["text"]
    assert b != a
    status, text = _post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(adapters / "b")})
    assert status == 400 and "already been loaded" in text
    status, reply = post(lora_server, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(adapters / "none")})
    assert status == 400 and reply["error"]["param"] == "lora_path" and "is not a directory" in reply["error"]["message"]
    status, reply = post(lora_server, "/v1/load_lora_adapter", {"lora_name": "c"})
    assert status == 400 and reply["error"]["param"] == "lora_path"
    # Reloaded in place from a's weights, "b" answers as "a" does (its old cache entries not reused).
    status, _ = _post_text(lora_server, "/v1/load_lora_adapter", {"lora_name": "b", "lora_path": str(adapters / "a"),
                                                                  "load_inplace": True})
    assert status == 200 and _complete(lora_server, "b")["choices"][0]["text"] == a
    status, text = _post_text(lora_server, "/v1/unload_lora_adapter", {"lora_name": "b"})
    assert status == 200
    status, reply = post(lora_server, "/v1/completions", {"model": "b", "prompt": "x", "max_tokens": 1})
    assert status == 404
    status, reply = post(lora_server, "/v1/unload_lora_adapter", {"lora_name": "b"})
    assert status == 404 and reply["error"]["param"] == "lora_name"


def test_lora_modules_without_enable_lora_is_refused_at_start():
    done = subprocess.run([sys.executable, "-m", "corellm.cli", "serve", "--lora-modules", "a=/tmp"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--lora-modules needs --enable-lora" in done.stderr + done.stdout
    done = subprocess.run([sys.executable, "-m", "corellm.cli", "serve", "--enable-lora", "--lora-modules", "a"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "'a' is not NAME=PATH" in done.stderr + done.stdout


def test_lora_modules_take_vllms_two_forms_and_name_what_is_wrong():
    from corellm.server.lora_adapters import lora_modules_of

    spec = '{"name": "sql", "path": "/a/sql", "base_model_name": "base"}'
    assert lora_modules_of(["chat=/a/chat", spec]) == [("chat", "/a/chat", None), ("sql", "/a/sql", "base")]
    for bad, message in (("chat", "is not NAME=PATH"), ("=/a", "is not NAME=PATH"), ("{not json", "is not valid JSON"),
                         ('{"name": "x"}', "with a name and a path"),
                         ('{"name": "x", "path": "/p", "rank": 8}', r"unknown keys \['rank'\]")):
        with pytest.raises(ValueError, match=message):
            lora_modules_of([bad])
    with pytest.raises(ValueError, match=r"names an adapter twice: \['a'\]"):
        lora_modules_of(["a=/x", "a=/y"])


def test_corellm_generate_takes_lora_as_llama_cli_does(adapters):
    def generate(*extra):
        done = subprocess.run([sys.executable, "-m", "corellm.cli", "generate", PROMPT, "--max-tokens", "16", *extra],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    with_a = generate("--lora", str(adapters / "a"))
    assert with_a != generate()
    from corellm import LLM, LoRARequest, SamplingParams

    llm = LLM(enable_lora=True, kv_cache_memory=128 * 1024**2, max_model_len=512)
    want = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False,
                        lora_request=LoRARequest("a", 1, str(adapters / "a")))[0].outputs[0].text
    llm.shutdown()
    assert with_a == PROMPT + want + "\n"
