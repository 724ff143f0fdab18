"""POST /inference/v1/generate (vLLM's tokens-in, tokens-out route). The oracle is the server's own
completions path on the same prompt ids: the same token ids (greedy and seeded), finish reasons and
logprobs; streamed, the events' token ids join to the whole; output_mode "text" adds the completion's
text; a missing max_tokens runs to the end of the context; what is wrong is a 400 naming the field
inside sampling_params."""

from __future__ import annotations

import dataclasses

import pytest

from tests.server.http_calls import post, stream

MODEL = "SmolLM2-135M-Instruct"
PROMPT = [504, 3575, 282, 4649, 314]  # "The capital of France is"


def completion(server, **fields) -> dict:
    status, body = post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "return_token_ids": True,
                                                    "return_tokens_as_token_ids": True, **fields})
    assert status == 200, body
    return body


def generate(server, sampling_params: dict, **fields) -> dict:
    status, body = post(server, "/inference/v1/generate", {"model": MODEL, "token_ids": PROMPT,
                                                           "sampling_params": sampling_params, **fields})
    assert status == 200, body
    return body


def test_greedy_and_seeded_tokens_are_the_completions(server):
    completion(server, max_tokens=12, temperature=0)  # fills the prefix cache: the compared calls hit it alike
    want = completion(server, max_tokens=12, temperature=0)
    got = generate(server, {"max_tokens": 12, "temperature": 0})
    assert got["request_id"].startswith("generate-tokens-") and got["output_mode"] == "tokens"
    [choice] = got["choices"]
    assert choice["token_ids"] == want["choices"][0]["token_ids"]
    assert choice["finish_reason"] == want["choices"][0]["finish_reason"] and "text" not in choice
    assert got["usage"] == want["usage"] and "prompt_token_ids" not in got
    sampled = {"max_tokens": 10, "temperature": 1.0, "seed": 11, "n": 2}
    want = completion(server, **sampled)
    got = generate(server, sampled)
    assert [c["token_ids"] for c in got["choices"]] == [c["token_ids"] for c in want["choices"]]


def test_logprobs_name_tokens_by_id_with_the_sampled_one_first(server):
    completion(server, max_tokens=6, temperature=0, logprobs=3)
    want = completion(server, max_tokens=6, temperature=0, logprobs=3)["choices"][0]["logprobs"]
    got = generate(server, {"max_tokens": 6, "temperature": 0, "logprobs": 3})["choices"][0]
    content = got["logprobs"]["content"]
    assert [p["token_id"] for p in content] == got["token_ids"]
    for pos, token, logprob, top in zip(content, want["tokens"], want["token_logprobs"], want["top_logprobs"]):
        assert f"token_id:{pos['token_id']}" == token and pos["logprob"] == logprob and pos["rank"] == 1
        assert len(pos["top_logprobs"]) == 3 and pos["top_logprobs"][0]["token_id"] == pos["token_id"]
        assert {f"token_id:{t['token_id']}": t["logprob"] for t in pos["top_logprobs"]} == top
        assert [t["rank"] for t in pos["top_logprobs"]] == [1, 2, 3]


def test_logprob_token_ids_list_the_named_tokens_after_the_sampled_one(server):
    got = generate(server, {"max_tokens": 4, "temperature": 0, "logprob_token_ids": [28, 11]})["choices"][0]
    for pos in got["logprobs"]["content"]:
        top = pos["top_logprobs"]
        assert top[0]["token_id"] == pos["token_id"] and {t["token_id"] for t in top[1:]} == {28, 11} - {pos["token_id"]}


def test_the_stream_joins_to_the_whole(server):
    whole = generate(server, {"max_tokens": 8, "temperature": 0})
    events = stream(server, "/inference/v1/generate", {
        "model": MODEL, "token_ids": PROMPT, "sampling_params": {"max_tokens": 8, "temperature": 0},
        "stream_options": {"include_usage": True}, "return_token_ids": True})
    assert events[0]["prompt_token_ids"] == PROMPT and all("prompt_token_ids" not in e for e in events[1:])
    tokens = [t for e in events for c in e["choices"] for t in c["token_ids"]]
    assert tokens == whole["choices"][0]["token_ids"]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 8


def test_text_mode_adds_the_completions_text(server):
    want = completion(server, max_tokens=8, temperature=0, stop=["."])["choices"][0]
    got = generate(server, {"max_tokens": 8, "temperature": 0, "stop": ["."]}, output_mode="text")["choices"][0]
    assert got["text"] == want["text"] and got["stop_reason"] == "." and got["finish_reason"] == "stop"
    choice = generate(server, {"max_tokens": 4, "temperature": 0, "structured_outputs": {"choice": ["yes", "no"]}},
                      output_mode="text")["choices"][0]
    assert choice["text"] in ("yes", "no")


def test_a_missing_max_tokens_runs_to_the_end_of_the_context(server):
    prompt = [504] * 500  # of the test server's 512
    status, body = post(server, "/inference/v1/generate", {"token_ids": prompt,
                                                           "sampling_params": {"ignore_eos": True, "temperature": 0}})
    assert status == 200 and body["usage"]["completion_tokens"] == 12
    assert body["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("fields, param", [
    ({"sampling_params": {"temprature": 0}}, "sampling_params.temprature"),
    ({"sampling_params": {"temperature": -1}}, "sampling_params.temperature"),
    ({"sampling_params": {"max_tokens": 600}}, "sampling_params.max_tokens"),
    ({"sampling_params": {"structured_outputs": {"choice": ["a"], "regex": "b"}}}, "sampling_params.structured_outputs"),
    ({"sampling_params": {"detokenize": False}, "output_mode": "text"}, "sampling_params.detokenize"),
    ({"token_ids": []}, "token_ids"),
    ({"token_ids": [-1]}, "token_ids"),
    ({"token_ids": [49152]}, "token_ids"),
    ({"features": {"mm_hashes": {}, "mm_placeholders": {}}}, "features"),
    ({"output_mode": "bytes"}, "output_mode"),
])
def test_what_is_wrong_is_a_400_naming_the_field(server, fields, param):
    status, body = post(server, "/inference/v1/generate", {"token_ids": PROMPT, "sampling_params": {}, **fields})
    assert status == 400 and body["error"]["param"].startswith(param), body


# The render routes: a chat or completion made ready and given back as the request above.

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 10,
        "temperature": 0.7, "top_p": 0.9, "frequency_penalty": 0.5, "seed": 5, "n": 2}


def test_a_rendered_chat_generates_the_chats_tokens(server):
    status, chat = post(server, "/v1/chat/completions", {**CHAT, "return_token_ids": True})
    assert status == 200, chat
    status, rendered = post(server, "/v1/chat/completions/render", CHAT)
    assert status == 200, rendered
    assert rendered["request_id"].startswith("chatcmpl-") and rendered["model"] == MODEL
    assert rendered["token_ids"] == chat["prompt_token_ids"]
    params = rendered["sampling_params"]
    assert (params["temperature"], params["top_p"], params["frequency_penalty"], params["max_tokens"]) == (0.7, 0.9, 0.5, 10)
    status, generated = post(server, "/inference/v1/generate", rendered)
    assert status == 200, generated
    assert [c["token_ids"] for c in generated["choices"]] == [c["token_ids"] for c in chat["choices"]]


def test_a_rendered_completion_is_one_request_per_prompt(server):
    body = {"model": MODEL, "prompt": ["The capital of France is", "Two plus two is"], "max_tokens": 6, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    status, rendered = post(server, "/v1/completions/render", body)
    assert status == 200 and len(rendered) == 2, rendered
    assert all(r["request_id"].startswith("cmpl-") and r["stream"] is True for r in rendered)
    assert rendered[0]["stream_options"]["include_usage"] is True
    for r, prompt in zip(rendered, body["prompt"]):
        want = completion(server, prompt=prompt, max_tokens=6, temperature=0)["choices"][0]["token_ids"]
        events = stream(server, "/inference/v1/generate", r)
        assert [t for e in events for c in e["choices"] for t in c["token_ids"]] == want


@pytest.mark.parametrize("route, fields, status, param", [
    ("/v1/chat/completions/render", {"model": "other"}, 404, "model"),
    ("/v1/chat/completions/render", {"use_beam_search": True, "n": 2}, 400, "use_beam_search"),
    ("/v1/chat/completions/render", {"include_reasoning": False}, 400, "include_reasoning"),
    ("/v1/chat/completions/render", {"max_tokens": 600}, 400, "max_tokens"),
    ("/v1/completions/render", {"echo": True}, 400, "echo"),
    ("/v1/completions/render", {"prompt": "x" * 3000}, 400, "prompt"),
])
def test_what_a_rendered_request_cannot_carry_is_refused(server, route, fields, status, param):
    base = ({"messages": [{"role": "user", "content": "Hi"}]} if "chat" in route else {"prompt": "Hi"})
    got, body = post(server, route, {"model": MODEL, **base, **fields})
    assert got == status and body["error"]["param"] == param, body


def test_sampling_params_round_trip_through_json():
    import json

    from corellm import SamplingParams, StructuredOutputsParams
    from corellm.server.generate_tokens import GenerateRequest, sampling_params_of
    from corellm.server.render import sampling_params_json

    for params in [SamplingParams(max_tokens=16), SamplingParams(max_tokens=None, temperature=0.3, stop=["x"], seed=4),
                   SamplingParams(logit_bias={28: -2.5}, allowed_token_ids=[1, 2, 28], logprobs=2, n=3),
                   SamplingParams(structured_outputs=StructuredOutputsParams(json={"type": "object"}), min_tokens=2),
                   SamplingParams(repetition_detection={"max_pattern_size": 4, "min_count": 3}, bad_words=["no"])]:
        wire = json.loads(json.dumps(sampling_params_json(params)))
        again = sampling_params_of(GenerateRequest(token_ids=[1], sampling_params=wire), context_left=100)
        assert dataclasses.replace(again, output_kind=params.output_kind) == params, wire
