"""use_beam_search (vLLM's) on /v1/completions and /v1/chat/completions: n beams back as n
choices, best first, as LLM.beam_search finds them (tests/engine/test_beam_search.py holds the
algorithm against transformers); the fields beam search has no use for are 400s naming them."""

from __future__ import annotations

import pytest

from tests.server.http_calls import post

CHAT = [{"role": "user", "content": "Name three colors."}]


@pytest.mark.parametrize("path, prompt", [("/v1/completions", {"prompt": ["The sky is", "Water is"]}),
                                          ("/v1/chat/completions", {"messages": CHAT})])
def test_n_beams_come_back_as_n_choices(server, model_name, path, prompt):
    body = {"model": model_name, "use_beam_search": True, "n": 3, "max_tokens": 6, "ignore_eos": True,
            "return_token_ids": True, **prompt}
    status, out = post(server, path, body)
    assert status == 200, out
    prompts = len(prompt["prompt"]) if "prompt" in prompt else 1
    assert [c["index"] for c in out["choices"]] == list(range(3 * prompts))
    for p in range(prompts):
        beams = [tuple(c["token_ids"]) for c in out["choices"][3 * p:3 * p + 3]]
        assert len(set(beams)) == 3 and all(len(b) == 6 for b in beams)
    assert all(c["finish_reason"] == "length" for c in out["choices"])
    assert out["usage"]["completion_tokens"] == 18 * prompts


def test_a_beam_ends_at_eos(server, model_name):
    body = {"model": model_name, "messages": CHAT, "use_beam_search": True, "n": 2, "max_tokens": 64,
            "return_token_ids": True}
    status, out = post(server, "/v1/chat/completions", body)
    assert status == 200, out
    best = out["choices"][0]
    assert best["finish_reason"] == "stop" and len(best["token_ids"]) < 64  # the answer ends well before 64
    assert "<|im_end|>" not in best["message"]["content"]


@pytest.mark.parametrize("field, value", [("stream", True), ("logprobs", 2), ("stop", ["x"]), ("top_p", 0.5),
                                          ("seed", 3), ("bad_words", ["x"]), ("guided_regex", "a+"),
                                          ("structural_tag", {"triggers": ["<f"], "structures": []}),
                                          ("guided_whitespace_pattern", " "), ("thinking_token_budget", 4),
                                          ("repetition_detection", {"max_pattern_size": 4, "min_count": 2}),
                                          ("logprob_token_ids", [5])])
def test_fields_beam_search_has_no_use_for_are_refused(server, model_name, field, value):
    body = {"model": model_name, "prompt": "Hi", "use_beam_search": True, "n": 2, "max_tokens": 4, field: value}
    status, out = post(server, "/v1/completions", body)
    assert status == 400 and out["error"]["param"] == field, out
    assert "is not available with use_beam_search" in out["error"]["message"]


def test_the_context_bounds_a_beam_search_as_any_request(server, model_name):
    body = {"model": model_name, "prompt": "Hi", "use_beam_search": True, "n": 2, "max_tokens": 10**6}
    status, out = post(server, "/v1/completions", body)
    assert status == 400 and out["error"]["code"] == "context_length_exceeded", out


def test_length_penalty_needs_beam_search(server, model_name):
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": "Hi", "length_penalty": 0.5})
    assert status == 400 and out["error"]["param"] == "length_penalty", out
