"""/v1/completions with echo, as vLLM serves it and lm-evaluation-harness's loglikelihood uses it
(token-id prompts, echo, logprobs 1, max_tokens 1): each choice's text starts with its prompt,
its logprobs with the prompt's tokens (the first without a logprob) — the same numbers the
engine gives as prompt_logprobs — then the completion's. And vLLM's chat echo: a reply that
continues the last message starts with it."""

from __future__ import annotations

import math

import pytest

from tests.reliability.conftest import call
from tests.server.http_calls import post, stream


def test_echo_scores_token_prompts_as_lm_eval_reads_them(server, model_name):
    prompts = [[504, 3575, 282, 4649, 314], [1782, 253, 1345, 30, 378, 2261]]
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": prompts, "max_tokens": 1, "temperature": 0,
                                "logprobs": 1, "echo": True, "seed": 1234})
    assert status == 200, out
    for prompt, choice in zip(prompts, sorted(out["choices"], key=lambda c: c["index"])):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(prompt) + 1
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        # The prompt's part: the engine's prompt logprobs of the same tokens.
        status, scored = post(server, "/v1/completions", {"model": model_name, "prompt": prompt, "max_tokens": 1, "temperature": 0,
                                       "prompt_logprobs": 1})
        assert status == 200, scored
        reference = scored["choices"][0]["prompt_logprobs"]
        for j in range(1, len(prompt)):
            want = reference[j][str(prompt[j])]
            assert math.isclose(lp["token_logprobs"][j], want["logprob"], abs_tol=1e-4)
            top = lp["top_logprobs"][j]
            assert want["decoded_token"] in top and len(top) == (1 if want["rank"] == 1 else 2)
            assert max(top.values()) >= lp["token_logprobs"][j]  # lm-eval's is_greedy test reads this
        # The text: the prompt's, then the completion's token; offsets follow the token texts.
        assert choice["text"] == "".join(lp["tokens"]) and choice["text"].startswith(lp["tokens"][0])
        assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


def test_echo_text_with_n_and_streamed(server, model_name):
    prompt = "The capital of France is"
    body = {"model": model_name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
    status, plain = post(server, "/v1/completions", body)
    status2, echoed = post(server, "/v1/completions", {**body, "echo": True, "n": 2})
    assert status == status2 == 200
    assert [c["text"] for c in echoed["choices"]] == [prompt + plain["choices"][0]["text"]] * 2
    assert echoed["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]  # the prompt counted once
    assert echoed["usage"]["completion_tokens"] == 2 * plain["usage"]["completion_tokens"]
    events = stream(server, "/v1/completions", {**body, "echo": True})
    assert events[0]["choices"][0]["text"].startswith(prompt)
    assert "".join(e["choices"][0]["text"] for e in events) == prompt + plain["choices"][0]["text"]


@pytest.mark.parametrize("fields, param", [({"logprobs": 1, "stream": True}, "echo"),
                                           ({"logprobs": 1, "prompt_logprobs": 2}, "prompt_logprobs")])
def test_echo_refusals_name_the_field(server, model_name, fields, param):
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": "Hi", "max_tokens": 1, "echo": True, **fields})
    assert status == 400 and out["error"]["param"] == param, out


def test_lm_eval_loglikelihood_through_the_server_alone(server, model_name):
    """lm-evaluation-harness's local-completions with its remote tokenizer: /tokenizer_info (it needs
    eos_token), /tokenize without special tokens, then context + continuation echoed with logprobs 1;
    the continuation's log-likelihood is the sum of its tokens' logprobs, greedy when each is the
    top one. Here it equals the logprob the engine gives " Paris" when it generates it."""
    _, info, _ = call(server.url + "/tokenizer_info", None, method="GET")
    assert info["eos_token"] == "<|im_end|>" and info["chat_template"] and info["model_max_length"] > 0

    def tokenize(text: str) -> list[int]:
        return post(server, "/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]

    context, continuation = tokenize("The capital of France is"), tokenize(" Paris")
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": [context + continuation], "max_tokens": 1,
                                "temperature": 0, "logprobs": 1, "echo": True, "seed": 1234})
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    scored = lp["token_logprobs"][len(context):-1]
    is_greedy = all(t == max(top.values()) for t, top in zip(scored, lp["top_logprobs"][len(context):-1]))
    status, generated = post(server, "/v1/completions", {"model": model_name, "prompt": [context], "max_tokens": 1, "temperature": 0,
                                      "logprobs": 1})
    assert generated["choices"][0]["logprobs"]["tokens"] == [" Paris"]
    assert is_greedy and math.isclose(sum(scored), generated["choices"][0]["logprobs"]["token_logprobs"][0],
                                      abs_tol=1e-3)


@pytest.mark.parametrize("streamed", [False, True])
def test_max_tokens_0_with_echo_scores_the_prompt_alone(server, model_name, streamed):
    prompt = "The capital of France is"
    body = {"model": model_name, "prompt": prompt, "max_tokens": 0, "echo": True}
    if not streamed:
        status, out = post(server, "/v1/completions", {**body, "logprobs": 2})
        assert status == 200, out
        choice = out["choices"][0]
        assert choice["text"] == prompt and choice["finish_reason"] == "length"
        assert len(choice["logprobs"]["tokens"]) == out["usage"]["prompt_tokens"] == 5
        assert out["usage"]["completion_tokens"] == 0
        return
    events = stream(server, "/v1/completions", body)
    assert "".join(e["choices"][0]["text"] for e in events) == prompt
    assert events[-1]["choices"][0]["finish_reason"] == "length"


def test_max_tokens_0_without_echo_is_refused(server, model_name):
    status, out = post(server, "/v1/completions", {"model": model_name, "prompt": "Hi", "max_tokens": 0})
    assert status == 400 and out["error"]["param"] == "max_tokens" and "only with echo" in out["error"]["message"]


CONTINUE = [{"role": "user", "content": "Name a color."}, {"role": "assistant", "content": "My favourite color is"}]


def test_chat_echo_starts_the_reply_with_the_message_it_continues(server, model_name):
    body = {"model": model_name, "messages": CONTINUE, "max_tokens": 6, "temperature": 0,
            "add_generation_prompt": False, "continue_final_message": True}
    status, plain = post(server, "/v1/chat/completions", body)
    assert status == 200, plain
    status, echoed = post(server, "/v1/chat/completions", {**body, "echo": True})
    assert status == 200, echoed
    continuation = plain["choices"][0]["message"]["content"]
    assert echoed["choices"][0]["message"]["content"] == CONTINUE[-1]["content"] + continuation
    assert all(echoed["usage"][k] == plain["usage"][k] for k in ("prompt_tokens", "completion_tokens"))
    events = stream(server, "/v1/chat/completions", {**body, "echo": True})
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices")]
    assert deltas[1] == CONTINUE[-1]["content"] and "".join(deltas) == CONTINUE[-1]["content"] + continuation


def test_chat_echo_after_a_generation_prompt_echoes_only_an_assistant_message(server, model_name):
    body = {"model": model_name, "messages": CONTINUE[:1], "max_tokens": 4, "temperature": 0}
    status, plain = post(server, "/v1/chat/completions", body)
    status2, echoed = post(server, "/v1/chat/completions", {**body, "echo": True})
    assert status == status2 == 200
    assert echoed["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]  # a user's
