"""SamplingState alone: each running request's parameters kept by batch row and gathered into the
step's SamplingMetadata in the scheduler's order; min_tokens bans the request's stop tokens and
EOS; penalties carry the token lists they need, and only then; record() counts each sampled token
once."""

from __future__ import annotations

import numpy as np

from corellm.engine_core_request import EngineCoreRequest
from corellm.sampling_params import SamplingParams
from corellm.worker.sampling_state import SamplingState


def request(req_id: str, prompt: list[int], stop_token_ids=(), eos=2, seed=7, **params) -> EngineCoreRequest:
    return EngineCoreRequest(request_id=req_id, prompt_token_ids=prompt, sampling_params=SamplingParams(**params),
                             eos_token_id=eos, stop_token_ids=list(stop_token_ids), arrival_time=0.0, seed=seed)


def test_metadata_gathers_the_rows_in_the_schedulers_order():
    state = SamplingState(max_rows=8)
    state.add(request("a", [1, 2], temperature=0.0), row=5, output_token_ids=[])
    state.add(request("b", [3], temperature=0.7, top_k=20, top_p=0.9, seed=2**63 + 5), row=1, output_token_ids=[9, 9])
    md = state.metadata(["b", "a"], np.array([1, 5], dtype=np.int32))
    assert md.temperature.tolist() == [np.float32(0.7), 0.0]
    assert md.top_k.tolist() == [20, 0] and md.top_p.tolist() == [np.float32(0.9), 1.0]
    assert md.steps.tolist() == [2, 0]  # outputs so far: the position in each request's random stream
    assert md.seeds[0].item() == np.int64(np.uint64(2**63 + 5).view(np.int64))  # 64-bit seeds survive
    assert md.min_p is None and md.presence_penalty is None and md.banned_token_ids is None
    assert md.num_logprobs == -1


def test_min_tokens_bans_stop_tokens_and_eos_until_reached():
    state = SamplingState(max_rows=4)
    state.add(request("a", [1], stop_token_ids=[5, 6], eos=2, min_tokens=2, max_tokens=8), row=0, output_token_ids=[])
    state.add(request("b", [1], stop_token_ids=[7]), row=1, output_token_ids=[])
    rows = np.array([0, 1], dtype=np.int32)
    banned = state.metadata(["a", "b"], rows).banned_token_ids
    assert banned.offsets.tolist() == [0, 3, 3] and banned.ids.tolist() == [5, 6, 2]
    for _ in range(2):
        state.record(["a", "b"], rows, np.array([[11], [12]]))
    assert state.metadata(["a", "b"], rows).banned_token_ids is None  # min_tokens reached


def test_penalties_carry_the_lists_they_need():
    state = SamplingState(max_rows=4)
    state.add(request("rep", [4, 4, 8], repetition_penalty=1.3), row=0, output_token_ids=[1])
    state.add(request("freq", [5], frequency_penalty=0.5), row=1, output_token_ids=[2, 2])
    state.add(request("plain", [6]), row=2, output_token_ids=[3])
    md = state.metadata(["rep", "freq", "plain"], np.array([0, 1, 2], dtype=np.int32))
    assert md.repetition_penalty.tolist() == [np.float32(1.3), 1.0, 1.0]
    assert md.frequency_penalty.tolist() == [0.0, 0.5, 0.0]
    # Prompts only where the repetition penalty reads them; outputs kept only where a penalty does.
    assert md.prompt_token_ids.ids.tolist() == [4, 4, 8] and md.prompt_token_ids.offsets.tolist() == [0, 3, 3, 3]
    assert md.output_token_ids.offsets.tolist() == [0, 1, 3, 4]
    state.record(["rep", "freq", "plain"], np.array([0, 1, 2], dtype=np.int32), np.array([[9], [-1], [9]]))
    assert state.requests["rep"].output_token_ids == [1, 9]
    assert state.requests["freq"].output_token_ids == [2, 2]  # it sampled nothing this step
    assert state.requests["plain"].output_token_ids == [3]  # no penalty: nothing kept
    assert state.steps[[0, 1, 2]].tolist() == [2, 2, 2]


def test_logit_bias_and_logprobs():
    state = SamplingState(max_rows=2)
    state.add(request("a", [1], logit_bias={3: 1.5, 7: -2.0}, logprobs=4), row=0, output_token_ids=[])
    state.add(request("b", [1], logprobs=1), row=1, output_token_ids=[])
    md = state.metadata(["a", "b"], np.array([0, 1], dtype=np.int32))
    assert md.logit_bias.ids.tolist() == [3, 7] and md.logit_bias.values.tolist() == [1.5, -2.0]
    assert md.logit_bias.offsets.tolist() == [0, 2, 2]
    assert md.num_logprobs == 4  # the batch's largest; each request's own n is cut by the runner


def test_draft_rows_are_sampled_as_their_output_positions():
    """A request verifying d drafts gets d + 1 rows: row j at output position steps + j, with the
    drafts before it counted as outputs (penalties) and toward min_tokens."""
    state = SamplingState(max_rows=4)
    state.add(request("a", [4], presence_penalty=0.5, stop_token_ids=[5], eos=2, min_tokens=3, max_tokens=9), row=2,
              output_token_ids=[7])
    state.add(request("b", [4]), row=0, output_token_ids=[])
    md = state.metadata(["a", "b"], np.array([2, 0], dtype=np.int32), np.array([2, 0], dtype=np.int32),
                        np.array([8, 9], dtype=np.int32))
    assert md.steps.tolist() == [1, 2, 3, 0]
    assert md.presence_penalty.tolist() == [0.5, 0.5, 0.5, 0.0]
    assert md.output_token_ids.offsets.tolist() == [0, 1, 3, 6, 6]
    assert md.output_token_ids.ids.tolist() == [7, 7, 8, 7, 8, 9]
    assert md.banned_token_ids.offsets.tolist() == [0, 2, 4, 4, 4]  # positions 1 and 2 are below min_tokens 3
    state.record(["a", "b"], np.array([2, 0], dtype=np.int32), np.array([[8, 1, -1], [3, -1, -1]]))
    assert state.steps[[2, 0]].tolist() == [3, 1]
    assert state.requests["a"].output_token_ids == [7, 8, 1]


def _plain_fields(md):
    return {name: getattr(md, name) for name in ("top_k", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                                                 "repetition_penalty", "output_token_ids", "prompt_token_ids",
                                                 "logit_bias", "banned_token_ids")}


def test_requests_of_temperature_alone_take_the_short_way_with_the_same_metadata():
    """While every request asks for a temperature alone, metadata() and record() skip their full
    ways: the same metadata as when a request with extras keeps the full way on."""
    def run(with_extra: bool):
        state = SamplingState(max_rows=8)
        state.add(request("a", [1], temperature=0.0), row=4, output_token_ids=[])
        state.add(request("b", [2], temperature=0.8, seed=2**63 + 1), row=2, output_token_ids=[5, 6])
        if with_extra:
            state.add(request("x", [3], top_k=5), row=7, output_token_ids=[])
        assert bool(state.with_extras) == with_extra
        rows = np.array([2, 4], dtype=np.int32)
        state.record(["b", "a"], rows, np.array([[7], [-1]], dtype=np.int32))  # a sampled nothing
        md = state.metadata(["b", "a"], rows)
        return md, state
    short, state = run(False)
    full, _ = run(True)
    for name in ("temperature", "seeds", "steps"):
        assert getattr(short, name).tolist() == getattr(full, name).tolist(), name
    assert short.steps.tolist() == [3, 0]
    assert short.num_logprobs == full.num_logprobs == -1
    assert all(v is None for v in _plain_fields(short).values()) and _plain_fields(short) == _plain_fields(full)
    assert state.requests["b"].output_token_ids == [5, 6]  # nothing kept without a penalty


def test_every_extra_takes_the_full_way():
    extras = [dict(top_k=3), dict(top_p=0.5), dict(min_p=0.1), dict(presence_penalty=0.5),
              dict(frequency_penalty=-0.5), dict(repetition_penalty=1.1), dict(logit_bias={3: 1.0}),
              dict(min_tokens=1, max_tokens=4), dict(logprobs=0)]
    for params in extras:
        state = SamplingState(max_rows=2)
        state.add(request("r", [1], **params), row=0, output_token_ids=[])
        assert state.with_extras == {"r"}, params
        state.remove("r")
        assert not state.with_extras
    state = SamplingState(max_rows=2)
    r = request("w", [1])
    r.bad_words_token_ids = [[4]]
    state.add(r, row=0, output_token_ids=[])
    assert state.with_extras == {"w"}
