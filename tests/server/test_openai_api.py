"""The server through the official openai client: streaming equals non-streaming, n, logprobs,
usage, UTF-8-safe deltas, stop strings, concurrency, disconnects, and the other routes."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from tests.server.http_calls import post


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def metric(server, name: str) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    raise KeyError(name)


def wait_idle(server, timeout: float = 5.0) -> float:
    """Seconds until no request runs and no KV block is used."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if metric(server, "corellm:num_requests_running") == 0 and metric(server, "corellm:kv_cache_usage_perc") == 0:
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError("the server did not return to idle: running %s, kv usage %s" % (
        metric(server, "corellm:num_requests_running"), metric(server, "corellm:kv_cache_usage_perc")))


def test_models_health_version(server, client, model_name):
    assert model_name == "SmolLM2-135M-Instruct"
    assert get_json(server.url + "/health") == {"status": "ok"}
    assert "version" in get_json(server.url + "/version")
    spec = get_json(server.url + "/openapi.json")
    assert "/v1/chat/completions" in spec["paths"]


# bf16 logits depend on the GEMM shapes, and a prefix-cache hit changes them (only the tail is
# computed): a first call fills the cache so that the compared calls run the same shapes.


def test_completion_streaming_equals_non_streaming(client, model_name):
    args = dict(model=model_name, prompt="The three primary colors are", max_tokens=24, temperature=0, seed=1)
    client.completions.create(**args)
    whole = client.completions.create(**args)
    chunks = list(client.completions.create(stream=True, **args))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert whole.choices[0].finish_reason == "length"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert whole.usage.completion_tokens == 24


def test_chat_streaming_equals_non_streaming(client, model_name):
    args = dict(model=model_name, messages=[{"role": "user", "content": "Name three fruits."}], max_tokens=30,
                temperature=0)
    client.chat.completions.create(**args)
    whole = client.chat.completions.create(**args)
    stream = client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    usage = chunks[-1].usage
    assert usage.prompt_tokens == whole.usage.prompt_tokens and usage.completion_tokens == whole.usage.completion_tokens


def test_n_choices(client, model_name):
    out = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=8, n=3, temperature=1.0,
                                    seed=5)
    assert sorted(c.index for c in out.choices) == [0, 1, 2]
    assert all(c.finish_reason in ("length", "stop") for c in out.choices)
    finishes = {}
    for chunk in client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=6, n=3, stream=True, temperature=1.0, seed=5):
        for c in chunk.choices:
            if c.finish_reason:
                assert c.index not in finishes
                finishes[c.index] = c.finish_reason
    assert sorted(finishes) == [0, 1, 2]


def test_logprobs_and_usage(server, client, model_name):
    out = client.completions.create(model=model_name, prompt="Hello, my name is", max_tokens=5, logprobs=3,
                                    temperature=0)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert all(len(t) >= 3 for t in lp.top_logprobs)
    req = urllib.request.Request(server.url + "/tokenize", data=json.dumps({"prompt": "Hello, my name is"}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        count = json.loads(r.read())["count"]
    assert out.usage.prompt_tokens == count and out.usage.total_tokens == count + 5
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          logprobs=True, top_logprobs=2, temperature=0)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 for c in content)


def test_usage_reports_the_cached_prompt_tokens(client, model_name):
    """usage.prompt_tokens_details.cached_tokens: the prompt tokens served from the prefix cache,
    streamed or not; each prompt counted once whatever n."""
    prompt = "A long shared instruction that the prefix cache keeps: " * 8
    args = dict(model=model_name, max_tokens=2, temperature=0)
    first = client.completions.create(prompt=prompt + "one", **args)
    again = client.completions.create(prompt=prompt + "two", n=2, **args)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens == first.usage.prompt_tokens  # once, not once per sample
    assert again.usage.prompt_tokens_details.cached_tokens >= 64  # whole 16-token blocks of the shared part
    chat = dict(messages=[{"role": "system", "content": prompt}, {"role": "user", "content": "Hi"}], **args)
    client.chat.completions.create(**chat)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **chat))
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens >= 64


def test_utf8_deltas_join_without_replacement_chars(client, model_name):
    args = dict(model=model_name, messages=[{"role": "user", "content": "Write 日本語 and emoji 🎉🔥 words."}],
                max_tokens=40, temperature=0.9, seed=3)
    client.chat.completions.create(**args)
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **args) if c.choices]
    joined = "".join(deltas)
    assert "\ufffd" not in joined
    assert joined == client.chat.completions.create(**args).choices[0].message.content


def test_stop_string_spanning_tokens_never_leaks(client, model_name):
    args = dict(model=model_name, prompt="1, 2, 3, 4, 5, 6,", max_tokens=20, temperature=0)
    client.completions.create(**args)
    full = client.completions.create(**args).choices[0].text
    stop = full[3:7]  # crosses token boundaries of ", 7, 8"
    assert len(stop) == 4
    cut = full[: full.index(stop)]
    whole = client.completions.create(stop=[stop], **args).choices[0]
    assert whole.text == cut and whole.finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stop=[stop], stream=True, **args)
                       if c.choices)
    assert streamed == cut


def test_repetition_detection_ends_a_looping_reply(server, client, model_name):
    """(vLLM's repetition_detection; where the rule first holds: tests/engine/test_llm_api.py.)"""
    rule = {"max_pattern_size": 8, "min_count": 3}
    args = dict(model=model_name, prompt="1, 2, 1, 2, 1, 2,", max_tokens=48, temperature=0)
    loop = client.completions.create(**args).choices[0]
    assert loop.finish_reason == "length"
    cut = client.completions.create(**args, extra_body={"repetition_detection": rule}).choices[0]
    assert cut.finish_reason == "repetition" and cut.model_extra["stop_reason"] == "repetition_detected"
    assert loop.text.startswith(cut.text) and len(cut.text) < len(loop.text)
    chunks = [c for c in client.completions.create(stream=True, **args, extra_body={"repetition_detection": rule})
              if c.choices]
    assert "".join(c.choices[0].text for c in chunks) == cut.text
    assert chunks[-1].choices[0].finish_reason == "repetition"
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say 1, 2, 1, 2"}],
                                          max_tokens=48, temperature=0, extra_body={"repetition_detection": rule})
    assert chat.choices[0].finish_reason in ("repetition", "stop", "length")  # the model decides; a 200 either way
    for bad, param in (({"max_pattern_size": 4, "min_count": 1}, "repetition_detection"),
                       ({"max_pattern_size": 2, "min_pattern_size": 3, "min_count": 2}, "repetition_detection"),
                       ({"max_size": 4, "min_count": 2}, "repetition_detection.max_size"),
                       ({"max_pattern_size": "4", "min_count": 2}, "repetition_detection.max_pattern_size")):
        code, out = post(server, "/v1/completions", {**args, "repetition_detection": bad})
        assert code == 400 and out["error"]["param"] == param, (bad, out)


def test_logprob_token_ids_name_the_scored_tokens(server, model_name):
    """(vLLM's logprob_token_ids; its values against oracles: tests/engine/test_llm_api.py.)"""
    named = [post(server, "/tokenize", {"prompt": w, "add_special_tokens": False})[1]["tokens"][0]
             for w in (" Paris", " London", " banana")]
    args = {"model": model_name, "prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}
    code, out = post(server, "/v1/completions", {**args, "logprobs": 1, "logprob_token_ids": named})
    assert code == 200, out
    lp = out["choices"][0]["logprobs"]
    assert all(len(top) in (3, 4) and {" Paris", " London", " banana"} <= set(top) for top in lp["top_logprobs"]), lp
    messages = [{"role": "user", "content": "Name a city."}]
    code, chat = post(server, "/v1/chat/completions", {"model": model_name, "messages": messages, "max_tokens": 3,
                                                       "temperature": 0, "logprobs": True, "logprob_token_ids": named})
    assert code == 200, chat
    for entry in chat["choices"][0]["logprobs"]["content"]:
        assert sorted(t["token"] for t in entry["top_logprobs"]) == [" London", " Paris", " banana"]
        assert [t["logprob"] for t in entry["top_logprobs"]] == sorted((t["logprob"] for t in entry["top_logprobs"]),
                                                                       reverse=True)
    for body, param in (({**args, "logprob_token_ids": named}, "logprob_token_ids"),  # no logprobs
                        ({**args, "logprobs": 1, "echo": True, "logprob_token_ids": named}, "logprob_token_ids"),
                        ({**args, "logprobs": 1, "logprob_token_ids": [10**7]}, "logprob_token_ids"),
                        ({**args, "logprobs": 1, "logprob_token_ids": []}, "logprob_token_ids")):
        code, out = post(server, "/v1/completions", body)
        assert code == 400 and out["error"]["param"] == param, (body, out)


def test_32_concurrent_streams(server, model_name):
    openai = pytest.importorskip("openai")

    async def run():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=300)

        async def one(i):
            stream = await client.completions.create(model=model_name, prompt=f"Story number {i}:", max_tokens=16,
                                                     temperature=0.8, seed=i, stream=True)
            finish = None
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
            return finish

        return await asyncio.gather(*(one(i) for i in range(32)))

    finishes = asyncio.run(run())
    assert all(f in ("length", "stop") for f in finishes)
    wait_idle(server)


def test_dropped_streams_free_their_blocks(server, client, model_name):
    for _ in range(3):
        stream = client.completions.create(model=model_name, prompt="Count forever: 1, 2,", max_tokens=400,
                                           stream=True, extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
    assert wait_idle(server) < 5


def test_non_streaming_timeout_aborts(server, model_name):
    openai = pytest.importorskip("openai")
    impatient = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model=model_name, prompt="Write a long essay:", max_tokens=450,
                                     extra_body={"ignore_eos": True})
    assert wait_idle(server) < 5


def test_a_request_not_streamed_leaves_the_queue_at_its_first_token_and_its_latencies_are_measured(
        server, client, model_name):
    """The queued load (what --max-queued-requests bounds) and the first-token time come from the
    engine's steps: a request that is not streamed is running, not queued, once its first token came,
    and its TTFT is not its whole latency. Its inter-token gaps and per-token time reach /metrics."""
    import threading

    def count(name: str) -> float:
        return metric(server, name + "_count")

    before = {name: count(name) for name in ("corellm:inter_token_latency_seconds",
                                             "corellm:request_time_per_output_token_seconds",
                                             "corellm:request_generation_tokens")}
    ttft_sum, e2e_sum = metric(server, "corellm:time_to_first_token_seconds_sum"), metric(
        server, "corellm:e2e_request_latency_seconds_sum")
    generated = metric(server, "corellm:generation_tokens_total")
    done = threading.Event()
    thread = threading.Thread(target=lambda: (client.completions.create(
        model=model_name, prompt="Tell me a story", max_tokens=200, temperature=0, extra_body={"ignore_eos": True}),
        done.set()))
    thread.start()
    seen_running = False
    while not done.is_set():
        if metric(server, "corellm:generation_tokens_total") > generated + 5:
            running = metric(server, "corellm:num_requests_running")
            queued = metric(server, "corellm:num_requests_queued")
            if running == 1 and not done.is_set():
                assert queued == 0, "a running request that is not streamed still counted as queued"
                seen_running = True
                break
        time.sleep(0.01)
    thread.join()
    assert seen_running, "the request finished before it could be seen running"
    assert count("corellm:inter_token_latency_seconds") - before["corellm:inter_token_latency_seconds"] == 199
    assert count("corellm:request_time_per_output_token_seconds") == before[
        "corellm:request_time_per_output_token_seconds"] + 1
    assert count("corellm:request_generation_tokens") == before["corellm:request_generation_tokens"] + 1
    ttft = metric(server, "corellm:time_to_first_token_seconds_sum") - ttft_sum
    e2e = metric(server, "corellm:e2e_request_latency_seconds_sum") - e2e_sum
    assert 0 < ttft < e2e / 2, (ttft, e2e)


def test_a_model_is_retrieved_by_name_and_an_unknown_name_is_a_404(server, client, model_name):
    openai = pytest.importorskip("openai")
    card = client.models.retrieve(model_name)
    assert card.id == model_name and card.object == "model" and card.model_extra["max_model_len"] == 512
    assert card.model_dump() | {"created": 0} == client.models.list().data[0].model_dump() | {"created": 0}
    with pytest.raises(openai.NotFoundError, match="The model `org/other` does not exist"):
        client.models.retrieve("org/other")  # a name with a slash reaches the route too


def test_ping_answers_as_health_on_get_and_post(server):
    assert get_json(server.url + "/ping") == {"status": "ok"}
    status, body = post(server, "/ping", {})
    assert status == 200 and body == {"status": "ok"}


def test_load_counts_the_model_requests_in_flight(server, model_name):
    """GET /load (vLLM's): a stream counts from its arrival until its last event, a quick request
    too, and nothing once they are answered."""
    openai = pytest.importorskip("openai")
    assert get_json(server.url + "/load") == {"server_load": 0}
    slow = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    streams = [slow.completions.create(model=model_name, prompt=f"Count to a hundred, take {i}:", max_tokens=300,
                                       stream=True, extra_body={"ignore_eos": True}) for i in range(2)]
    try:
        for stream in streams:
            next(iter(stream))  # each has begun
        assert get_json(server.url + "/load") == {"server_load": 2}
    finally:
        for stream in streams:
            stream.close()
    deadline = time.monotonic() + 10
    while get_json(server.url + "/load")["server_load"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert get_json(server.url + "/load") == {"server_load": 0}
    wait_idle(server)


def test_tokenize_detokenize(server):
    def post(path, body):
        req = urllib.request.Request(server.url + path, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req) as r:
            return json.loads(r.read())

    tokens = post("/tokenize", {"prompt": "Hello world"})["tokens"]
    assert post("/detokenize", {"tokens": tokens})["prompt"] == "Hello world"
    chat = post("/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    assert chat["count"] > 5
