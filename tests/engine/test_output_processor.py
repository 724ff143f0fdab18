"""OutputProcessor alone (SmolLM2's tokenizer), fed EngineCoreOutputs by hand: FINAL_ONLY delivers
once, CUMULATIVE the whole text each time, DELTA only what is new (joining to the whole, the finish
reported once; with stream_interval, the first token, then that many at a time); the n samples of
a request are grouped, the request finishing with its last sample; a stop string ends its sample
and asks the engine to abort it; logprobs accumulate; a request whose output cannot be built ends
with an error, the engine asked to abort it."""

from __future__ import annotations

import pytest

from corellm.engine.engine_core_outputs import EngineCoreOutput
from corellm.engine.input_processor import InputProcessor
from corellm.engine.output_processor import OutputProcessor
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.loader import default_model_path
from corellm.sampling_params import RequestOutputKind, SamplingParams
from corellm.worker.model_runner_output import SampledTokenLogprobs


@pytest.fixture(scope="module")
def tok():
    return GGUFModelFile(default_model_path()).tokenizer()


def start(tok, kind: RequestOutputKind, stream_interval: int = 1, **params):
    """(processor, the request's sample ids, the token ids of ' The sky is blue today.')."""
    inputs = InputProcessor(tok, vocab_size=49152, max_model_len=256)
    processed = inputs.process("r", "Say:", SamplingParams(output_kind=kind, max_tokens=32, **params))
    processor = OutputProcessor(tok, stream_interval)
    processor.add_request(processed)
    return processor, [s.request_id for s in processed.samples], tok.encode(" The sky is blue today.",
                                                                          add_special_tokens=False)


def feed(processor, sample_id: str, tokens: list[int], finish: str | None = None):
    """The token(s) one step produced for one sample; the last one finishes it with `finish`."""
    results = []
    for i, t in enumerate(tokens):
        last = i == len(tokens) - 1
        outs, to_abort = processor.process_outputs([EngineCoreOutput(sample_id, [t], finish if last else None)])
        results.append((outs, to_abort))
    return results


def test_final_only_delivers_once(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.FINAL_ONLY)
    results = feed(processor, sid, ids, finish="length")
    assert all(outs == [] for outs, _ in results[:-1])
    (final,), _ = results[-1]
    assert final.finished and final.outputs[0].text == " The sky is blue today." and final.outputs[0].token_ids == ids
    assert not processor.has_unfinished_requests()


def test_cumulative_gives_the_whole_text_each_time(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.CUMULATIVE)
    texts = [outs[0].outputs[0].text for outs, _ in feed(processor, sid, ids, finish="length")]
    assert texts[-1] == " The sky is blue today."
    assert all(texts[-1].startswith(t) for t in texts) and texts == sorted(texts, key=len)


def test_delta_joins_to_the_whole_and_reports_the_finish_once(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.DELTA)
    deltas = [outs[0].outputs[0] for outs, _ in feed(processor, sid, ids, finish="length")]
    assert "".join(d.text for d in deltas) == " The sky is blue today."
    assert [t for d in deltas for t in d.token_ids] == ids
    assert [d.finish_reason for d in deltas] == [None] * (len(ids) - 1) + ["length"]


@pytest.mark.parametrize("interval", [2, 3, 100])
def test_stream_interval_sends_the_first_token_then_that_many_at_a_time(tok, interval):
    processor, (sid,), ids = start(tok, RequestOutputKind.DELTA, stream_interval=interval)
    results = feed(processor, sid, ids, finish="length")
    deltas = [outs[0].outputs[0] for outs, _ in results if outs]
    assert len(deltas[0].token_ids) == 1  # the first token at once
    assert all(len(d.token_ids) == interval for d in deltas[1:-1]) and 1 <= len(deltas[-1].token_ids) <= interval
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == " The sky is blue today."
    assert [t for d in deltas for t in d.token_ids] == ids
    assert len(deltas) == 1 + -(-(len(ids) - 1) // interval)


def test_the_engines_stop_token_keeps_its_id_not_its_text(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.FINAL_ONLY)
    (final,), _ = feed(processor, sid, ids, finish="stop")[-1]  # the engine stopped on the last token
    assert final.outputs[0].token_ids == ids and final.outputs[0].text == " The sky is blue today"


def test_n_samples_are_grouped_and_finish_together(tok):
    processor, sids, ids = start(tok, RequestOutputKind.DELTA, n=2, temperature=1.0)
    assert len(sids) == 2
    outs, _ = processor.process_outputs([EngineCoreOutput(sids[0], [ids[0]]), EngineCoreOutput(sids[1], [ids[1]])])
    (out,) = outs  # one RequestOutput for both samples' news
    assert [c.index for c in out.outputs] == [0, 1] and not out.finished
    outs, _ = processor.process_outputs([EngineCoreOutput(sids[0], [ids[2]], "length")])
    (out,) = outs
    assert [c.index for c in out.outputs] == [0] and not out.finished  # DELTA: only the sample with news
    outs, _ = processor.process_outputs([EngineCoreOutput(sids[1], [ids[3]], "length")])
    assert outs[0].finished and not processor.has_unfinished_requests()


def test_a_stop_string_ends_its_sample_and_asks_for_an_abort(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.FINAL_ONLY, stop=["blue"])
    results = feed(processor, sid, ids)  # the engine does not know stop strings: no finish from it
    hit = next(i for i, (outs, _) in enumerate(results) if outs)
    (final,), to_abort = results[hit]
    assert to_abort == [sid] and final.outputs[0].finish_reason == "stop" and final.outputs[0].stop_reason == "blue"
    assert final.outputs[0].text == " The sky is "
    assert all(outs == [] for outs, _ in results[hit + 1:])  # later outputs for it are dropped


def test_logprobs_accumulate(tok):
    processor, (sid,), ids = start(tok, RequestOutputKind.FINAL_ONLY, logprobs=1)
    out = None
    for i, t in enumerate(ids[:3]):
        lp = SampledTokenLogprobs(t, -0.5 * (i + 1), 1, [t], [-0.5 * (i + 1)])
        outs, _ = processor.process_outputs([EngineCoreOutput(sid, [t], "length" if i == 2 else None,
                                                              new_logprobs=[lp])])
        out = outs[0] if outs else out
    c = out.outputs[0]
    assert c.cumulative_logprob == pytest.approx(-3.0)
    assert [pos[t].logprob for pos, t in zip(c.logprobs, ids)] == [-0.5, -1.0, -1.5]


def test_a_failure_while_building_the_output_ends_that_request_with_an_error(tok, monkeypatch):
    processor, (sid,), ids = start(tok, RequestOutputKind.DELTA)
    sample = processor.requests[sid].samples[sid]

    def broken(finished):
        raise UnicodeError("bad bytes")

    monkeypatch.setattr(sample.detokenizer, "text", broken)
    (out,), to_abort = processor.process_outputs([EngineCoreOutput(sid, [ids[0]])])
    assert out.finished and out.outputs[0].finish_reason == "error" and "bad bytes" in out.metrics["error"]
    assert to_abort == [sid] and not processor.has_unfinished_requests()
