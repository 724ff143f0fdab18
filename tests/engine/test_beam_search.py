"""Beam search (beam_search.py, vLLM's algorithm) against HF transformers' beam search on a tiny
random Llama (fp32), without EOS: the same sequences, best first, and their cumulative logprobs
within 1e-4; EOS ends a beam (completed beams compete by length-penalised score); the parameter
checks."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, BeamSearchParams
from corellm.beam_search import BeamSearch, BeamSearchSequence, beam_score
from corellm.outputs import CompletionOutput, Logprob, RequestOutput
from tests.engine.test_tiny_oracle import write_tokenizer
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    hf = make_tiny_model("llama3", path, seed=11)
    write_tokenizer(path)
    llm = LLM(str(path), dtype="float32", max_model_len=256, kv_cache_memory=32 * 1024**2)
    return hf, llm


@pytest.mark.parametrize("width", [2, 4])
def test_beams_equal_transformers_beam_search(tiny, width):
    hf, llm = tiny
    g = torch.Generator().manual_seed(width)
    prompts = [torch.randint(0, 384, (int(n),), generator=g).tolist() for n in torch.randint(4, 30, (3,), generator=g)]
    tokens = 10
    ours = llm.beam_search([{"prompt_token_ids": p} for p in prompts],
                           BeamSearchParams(beam_width=width, max_tokens=tokens, ignore_eos=True))
    for prompt, out in zip(prompts, ours):
        with torch.no_grad():
            ref = hf.generate(torch.tensor([prompt]), num_beams=width, num_return_sequences=width, do_sample=False,
                              max_new_tokens=tokens, min_new_tokens=tokens, eos_token_id=None, pad_token_id=0,
                              length_penalty=1.0, output_scores=True, return_dict_in_generate=True)
        assert len(out.sequences) == width
        for k, seq in enumerate(out.sequences):
            assert seq.tokens == ref.sequences[k].tolist(), f"beam {k}"
            # transformers' score: the sum of logprobs over the generated length
            assert abs(seq.cum_logprob - float(ref.sequences_scores[k]) * tokens) < 1e-4 * tokens
            assert seq.finish_reason == "length" and len(seq.logprobs) == tokens
        assert out.sequences[0].text == llm.get_tokenizer().decode(out.sequences[0].tokens)


def one_token_outputs(candidates: list[dict[int, float]]) -> list[RequestOutput]:
    return [RequestOutput("r", None, [], None, [CompletionOutput(0, "", [max(c, key=c.get)], None,
                                                                 [{t: Logprob(lp) for t, lp in c.items()}])], True)
            for c in candidates]


def test_eos_completes_a_beam_scored_by_its_length():
    eos = 9
    search = BeamSearch([1, 2], BeamSearchParams(beam_width=2, max_tokens=3, length_penalty=1.0), eos, max_model_len=64)
    search.advance(one_token_outputs([{eos: -0.1, 5: -0.5, 6: -0.7, 7: -3.0}]))
    assert [b.tokens for b in search.beams] == [[1, 2, 5], [1, 2, 6]] and search.completed[0].tokens == [1, 2, eos]
    search.advance(one_token_outputs([{5: -2.0, 6: -2.5, 7: -3.0, eos: -4.0}, {5: -0.2, 6: -3.0, 7: -3.5, eos: -4.0}]))
    assert [b.tokens for b in search.beams] == [[1, 2, 6, 5], [1, 2, 5, 5]]
    search.advance(one_token_outputs([{5: -0.1, 6: -1.0, 7: -2.0, 8: -3.0}] * 2))
    assert search.prompts() == []
    best = search.best()
    # [1, 2, eos]: -0.1 over 2 tokens (EOS not counted) beats every longer beam
    assert best[0].tokens == [1, 2, eos] and best[0].finish_reason == "stop" and best[0].stop_reason == eos
    assert best[1].tokens == [1, 2, 6, 5, 5] and best[1].finish_reason == "length"
    assert beam_score(BeamSearchSequence([1, 2, eos], cum_logprob=-0.1), eos, 1.0) == pytest.approx(-0.05)
    assert search.generated_text_tokens(best[0]) == []  # the EOS is not in the text


def test_parameters_are_checked(tiny):
    _, llm = tiny
    for bad in (dict(beam_width=0, max_tokens=4), dict(beam_width=2, max_tokens=0),
                dict(beam_width=2, max_tokens=4, temperature=-1.0)):
        with pytest.raises(ValueError):
            BeamSearchParams(**bad)
    with pytest.raises(ValueError, match="takes a BeamSearchParams"):
        llm.beam_search(["w1 w2"], {"beam_width": 2})
    out = llm.beam_search("w1 w2 w3", BeamSearchParams(beam_width=3, max_tokens=300))  # the context ends it
    assert all(len(s.tokens) == 256 for s in out[0].sequences)
