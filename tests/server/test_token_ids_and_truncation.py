"""vLLM's token-level request fields on /v1/completions and /v1/chat/completions: return_token_ids
(the prompt's and each choice's token ids beside the text; streamed: the prompt's with the first
chunk, each chunk its delta's), return_tokens_as_token_ids, truncate_prompt_tokens (the prompt's
last k tokens; its first with truncation_side "right"), allowed_token_ids (only those sampled),
bad_words (never in the output), spaces_between_special_tokens (special tokens joined without
spaces either way, as vLLM's fast detokenizer); and continuous_usage_stats."""

from __future__ import annotations

import pytest

from tests.server.http_calls import post, stream

CHAT = [{"role": "user", "content": "Name three colors."}]


def tokenize(server, **body) -> list[int]:
    return post(server, "/tokenize", body)[1]["tokens"]


def detokenize(server, ids: list[int]) -> str:
    return post(server, "/detokenize", {"tokens": ids})[1]["prompt"]


def test_completion_token_ids_whole_and_streamed(server, model_name):
    body = {"model": model_name, "prompt": "The three primary colors are", "max_tokens": 8, "temperature": 0,
            "return_token_ids": True}
    status, out = post(server, "/v1/completions", body)
    assert status == 200, out
    choice = out["choices"][0]
    assert choice["prompt_token_ids"] == tokenize(server, prompt=body["prompt"])
    assert len(choice["token_ids"]) == out["usage"]["completion_tokens"]
    assert detokenize(server, choice["token_ids"]) == choice["text"]
    events = stream(server, "/v1/completions", body)
    assert events[0]["choices"][0]["prompt_token_ids"] == choice["prompt_token_ids"]
    assert all(e["choices"][0]["prompt_token_ids"] is None for e in events[1:])
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == choice["token_ids"]
    status, plain = post(server, "/v1/completions", {**body, "return_token_ids": False})
    assert "token_ids" not in plain["choices"][0] and "prompt_token_ids" not in plain["choices"][0]


def test_chat_token_ids_whole_and_streamed(server, model_name):
    body = {"model": model_name, "messages": CHAT, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 200, out
    assert out["prompt_token_ids"] == tokenize(server, messages=CHAT)
    ids = out["choices"][0]["token_ids"]
    assert len(ids) == out["usage"]["completion_tokens"]
    assert detokenize(server, ids).startswith(out["choices"][0]["message"]["content"])
    events = stream(server, "/v1/chat/completions", body)
    assert events[0]["prompt_token_ids"] == out["prompt_token_ids"]
    assert all("prompt_token_ids" not in e for e in events[1:])
    assert [t for e in events for t in e["choices"][0]["token_ids"]] == ids


def test_truncate_prompt_tokens_keeps_the_last_ones(server, model_name):
    prompt = "One two three four five six seven eight nine ten"
    ids = tokenize(server, prompt=prompt)
    body = {"model": model_name, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    status, cut = post(server, "/v1/completions", {**body, "prompt": prompt, "truncate_prompt_tokens": 4})
    assert status == 200, cut
    assert cut["usage"]["prompt_tokens"] == 4 and cut["choices"][0]["prompt_token_ids"] == ids[-4:]
    status, same = post(server, "/v1/completions", {**body, "prompt": ids[-4:]})
    assert same["choices"][0]["token_ids"] == cut["choices"][0]["token_ids"]
    status, whole = post(server, "/v1/completions", {**body, "prompt": prompt, "truncate_prompt_tokens": -1})
    assert whole["usage"]["prompt_tokens"] == len(ids)  # -1: as much as the context holds, here all of it
    status, chat = post(server, "/v1/chat/completions", {**body, "messages": CHAT, "truncate_prompt_tokens": 5})
    assert status == 200 and chat["prompt_token_ids"] == tokenize(server, messages=CHAT)[-5:]


def test_truncation_side_right_keeps_the_first_ones(server, model_name):
    prompt = "One two three four five six seven eight nine ten"
    ids = tokenize(server, prompt=prompt)
    body = {"model": model_name, "max_tokens": 6, "temperature": 0, "return_token_ids": True, "prompt": prompt,
            "truncate_prompt_tokens": 4}
    status, right = post(server, "/v1/completions", {**body, "truncation_side": "right"})
    assert status == 200 and right["choices"][0]["prompt_token_ids"] == ids[:4], right
    status, left = post(server, "/v1/completions", {**body, "truncation_side": "left"})
    assert status == 200 and left["choices"][0]["prompt_token_ids"] == ids[-4:], left
    chat_body = {k: v for k, v in body.items() if k != "prompt"} | {"messages": CHAT, "truncate_prompt_tokens": 5}
    status, chat = post(server, "/v1/chat/completions", {**chat_body, "truncation_side": "right"})
    assert status == 200 and chat["prompt_token_ids"] == tokenize(server, messages=CHAT)[:5], chat
    status, cut = post(server, "/v1/embeddings", {"model": model_name, "input": prompt, "truncate_prompt_tokens": 4,
                                                  "truncation_side": "right"})
    status, first = post(server, "/v1/embeddings", {"model": model_name, "input": ids[:4]})
    assert status == 200 and cut["data"][0]["embedding"] == first["data"][0]["embedding"], cut
    assert cut["usage"]["prompt_tokens"] == 4
    for route, extra in (("/v1/completions", {"prompt": prompt}), ("/v1/chat/completions", {"messages": CHAT}),
                         ("/v1/embeddings", {"input": prompt})):
        status, out = post(server, route, {"model": model_name, "truncation_side": "right", **extra})
        assert status == 400 and out["error"]["param"] == "truncation_side", out  # no count: it would cut nothing
    status, out = post(server, "/v1/completions", {**body, "truncation_side": "middle"})
    assert status == 400 and out["error"]["param"] == "truncation_side", out


@pytest.mark.parametrize("value", [0, -2])
def test_truncate_prompt_tokens_out_of_range_is_a_400(server, model_name, value):
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": "Hi", "truncate_prompt_tokens": value})
    assert status == 400 and out["error"]["param"] == "truncate_prompt_tokens", out


def test_logprobs_name_tokens_by_id_when_asked(server, model_name):
    body = {"model": model_name, "max_tokens": 4, "temperature": 0, "return_token_ids": True,
            "return_tokens_as_token_ids": True}
    status, out = post(server, "/v1/completions", {**body, "prompt": "Hello", "logprobs": 2, "echo": True})
    assert status == 200, out
    choice, lp = out["choices"][0], out["choices"][0]["logprobs"]
    ids = choice["prompt_token_ids"] + choice["token_ids"]
    assert lp["tokens"] == [f"token_id:{t}" for t in ids]
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"][1:] for k in top)
    status, chat = post(server, "/v1/chat/completions", {**body, "messages": CHAT, "logprobs": True,
                                                          "top_logprobs": 2})
    content = chat["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == [f"token_id:{t}" for t in chat["choices"][0]["token_ids"]]
    assert all(t["token"].startswith("token_id:") for c in content for t in c["top_logprobs"])


@pytest.mark.parametrize("path, prompt", [("/v1/completions", {"prompt": "Count: one, two,"}),
                                          ("/v1/chat/completions", {"messages": CHAT})])
def test_continuous_usage_stats_in_every_chunk(server, model_name, path, prompt):
    body = {"model": model_name, "max_tokens": 6, "temperature": 0, "ignore_eos": True, **prompt,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    events = stream(server, path, body)
    counted = [e["usage"]["completion_tokens"] for e in events]
    assert counted == sorted(counted) and counted[-1] == 6 and events[-1]["choices"] == []
    assert len({e["usage"]["prompt_tokens"] for e in events}) == 1
    plain = stream(server, path, {**body, "stream_options": {"include_usage": True}})
    assert all("usage" not in e for e in plain[:-1]) and plain[-1]["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("path, prompt", [("/v1/completions", {"prompt": "Count: one, two,"}),
                                          ("/v1/chat/completions", {"messages": CHAT})])
def test_allowed_token_ids_bound_every_sampled_token(server, model_name, path, prompt):
    allowed = tokenize(server, prompt=" red green blue", add_special_tokens=False)
    body = {"model": model_name, "max_tokens": 6, "temperature": 1.0, "seed": 5, "ignore_eos": True,
            "return_token_ids": True, "allowed_token_ids": allowed, **prompt}
    status, out = post(server, path, body)
    assert status == 200, out
    assert len(out["choices"][0]["token_ids"]) == 6 and set(out["choices"][0]["token_ids"]) <= set(allowed)


@pytest.mark.parametrize("path, prompt", [("/v1/completions", {"prompt": "Count: one, two,"}),
                                          ("/v1/chat/completions", {"messages": CHAT})])
def test_bad_words_never_appear(server, model_name, path, prompt):
    body = {"model": model_name, "max_tokens": 12, "temperature": 0, **prompt}
    status, free = post(server, path, body)
    assert status == 200, free
    text = lambda out: out["choices"][0].get("text") or out["choices"][0]["message"]["content"]  # noqa: E731
    words = text(free).split()[:2]  # what the free answer says first
    status, out = post(server, path, {**body, "bad_words": words})
    assert status == 200, out
    assert not any(w in text(out).split() for w in words), (words, text(out))
    status, out = post(server, path, {**body, "bad_words": ["ok", "  "]})
    assert status == 400 and "bad_words must be a list of words" in out["error"]["message"], out


@pytest.mark.parametrize("spaces", [False, True])
def test_special_tokens_kept_in_the_text_are_joined_without_spaces(server, model_name, spaces):
    specials = tokenize(server, prompt="<|im_start|><|im_end|>", add_special_tokens=False)
    assert len(specials) == 2
    body = {"model": model_name, "prompt": "Hi", "max_tokens": 4, "temperature": 1.0, "seed": 3, "ignore_eos": True,
            "allowed_token_ids": specials, "skip_special_tokens": False, "return_token_ids": True,
            "spaces_between_special_tokens": spaces}
    status, out = post(server, "/v1/completions", body)
    assert status == 200, out
    choice = out["choices"][0]
    assert choice["text"] == "".join(detokenize(server, [t]) for t in choice["token_ids"]) and " " not in choice["text"]
