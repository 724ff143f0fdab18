"""Speculative decoding against the same engine without it (SmolLM2, bf16, native stack): greedy
tokens and logprobs bit-identical with the n-gram proposer and with a draft model, in batches that
mix requests with and without drafts, under preemption and aborts, with stops (a repetition_detection
stop too) inside accepted drafts, and after rejections through the prefix cache; seeded sampling
draws the same tokens; the rejection rule's output distribution is the target's (chi-square);
configuration errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm import LLM, SamplingParams, ops
from corellm.config import SpeculativeConfig
from corellm.model import load_model
from tests.engine.prompts import PROMPTS

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
PARAGRAPH = ("The committee met on Tuesday to review the budget for the coming year. After a long discussion, the "
             "members agreed to increase spending on public libraries by ten percent, to repair the bridge over the "
             "river before winter, and to hire two more teachers for the primary school.")
COPY = [f"Copy this text exactly:\n\n{PARAGRAPH}\n\nCopy:\n", f"{PARAGRAPH}\n\nThe same again:\n"]
ENGINE = dict(max_model_len=512, kv_cache_memory=96 * 1024**2, max_num_seqs=16)


@pytest.fixture(scope="module")
def loaded():
    return load_model(progress=False)


@pytest.fixture(scope="module")
def plain(loaded):
    return LLM(loaded_model=loaded, **ENGINE)


@pytest.fixture(scope="module")
def ngram(loaded):
    return LLM(loaded_model=loaded, speculative_config=NGRAM, **ENGINE)


def run(llm: LLM, prompts: list[str], params: SamplingParams | list[SamplingParams]):
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].finish_reason,
             None if o.outputs[0].logprobs is None else [sorted((t, l.logprob) for t, l in s.items())
                                                         for s in o.outputs[0].logprobs]) for o in outs]


def spec_totals(llm: LLM) -> dict:
    return llm.get_metrics()


GREEDY = SamplingParams(temperature=0, max_tokens=48, logprobs=2)


def test_ngram_greedy_tokens_and_logprobs_are_identical(plain, ngram) -> None:
    prompts = COPY + PROMPTS[:6]  # copy-heavy prompts (drafts accepted) and free ones (few drafts)
    before = spec_totals(ngram)
    together = run(ngram, prompts, GREEDY)
    assert together == run(plain, prompts, GREEDY)
    assert [run(ngram, [p], GREEDY)[0] for p in prompts[:3]] == together[:3]
    after = spec_totals(ngram)
    drafts = after["corellm:spec_decode_num_draft_tokens"] - before["corellm:spec_decode_num_draft_tokens"]
    accepted = after["corellm:spec_decode_num_accepted_tokens"] - before["corellm:spec_decode_num_accepted_tokens"]
    assert drafts > 50 and accepted > drafts / 3, (drafts, accepted)  # the copies were speculated on
    named = SamplingParams(temperature=0, max_tokens=48, logprob_token_ids=[13, 260, 1010])  # scored on every draft row
    assert run(ngram, COPY, named) == run(plain, COPY, named)


def test_a_prediction_drafts_where_the_output_follows_it(plain, ngram) -> None:
    """OpenAI's Predicted Outputs: the prediction's tokens are the drafts where the output has reached
    in it. A free prompt (few n-gram drafts of its own), greedy: the same tokens and logprobs with
    the exact output, an edited one (words changed, a sentence dropped, one inserted) or an unrelated
    text as the prediction; the drafts accepted follow how much of the output the prediction holds."""
    prompt = PROMPTS[0]
    want = run(plain, [prompt], GREEDY)[0]
    text = plain.generate([prompt], GREEDY, use_tqdm=False)[0].outputs[0].text
    words = text.split(" ")
    edited = " ".join(words[:5] + ["entirely", "new", "words"] + words[5:12] + words[16:])
    accepted = {}
    for name, prediction in (("exact", text), ("edited", edited), ("unrelated", PARAGRAPH)):
        before = spec_totals(ngram)
        assert run(ngram, [prompt], SamplingParams(
            temperature=0, max_tokens=48, logprobs=2, prediction=prediction))[0] == want, name
        after = spec_totals(ngram)
        accepted[name] = after["corellm:spec_decode_num_accepted_tokens"] - before["corellm:spec_decode_num_accepted_tokens"]
    without = spec_totals(ngram)
    run(ngram, [prompt], GREEDY)
    accepted["none"] = spec_totals(ngram)["corellm:spec_decode_num_accepted_tokens"] - \
        without["corellm:spec_decode_num_accepted_tokens"]
    assert accepted["exact"] >= 0.75 * len(want[0]) - 1, accepted  # every step but the first takes its drafts
    assert accepted["exact"] >= accepted["edited"] > accepted["none"] + 10, accepted
    assert accepted["unrelated"] <= accepted["none"] + 4, accepted


def test_a_prediction_needs_drafts_it_can_be_used_for(plain, ngram) -> None:
    with pytest.raises(ValueError, match="prediction needs n-gram speculative decoding"):
        plain.generate([PROMPTS[0]], SamplingParams(max_tokens=4, prediction="Hello"), use_tqdm=False)
    from corellm.sampling_params import StructuredOutputsParams

    with pytest.raises(ValueError, match="prediction cannot speed up a request with structured output"):
        ngram.generate([PROMPTS[0]], SamplingParams(max_tokens=4, prediction="yes",
                                                    structured_outputs=StructuredOutputsParams(choice=["yes", "no"])),
                       use_tqdm=False)
    with pytest.raises(ValueError, match="prediction has 600 tokens, more than any output could hold"):
        ngram.generate([PROMPTS[0]], SamplingParams(max_tokens=4, prediction=" a" * 600), use_tqdm=False)
    with pytest.raises(ValueError, match="prediction must be a non-empty string"):
        SamplingParams(prediction="")


def test_seeded_sampling_draws_the_same_tokens(plain, ngram) -> None:
    params = [SamplingParams(temperature=0.8, top_p=0.95, top_k=50, seed=s, max_tokens=40, presence_penalty=0.3 * (s % 2),
                             min_tokens=5) for s in range(4)]
    prompts = [COPY[0], COPY[1], PROMPTS[2], COPY[0]]
    assert run(ngram, prompts, params) == run(plain, prompts, params)


def test_bad_words_inside_drafts(plain, ngram) -> None:
    """A copy whose drafts hold a bad phrase: each verified row bans after the drafts before it,
    so the tokens are those of decoding without drafts, and the phrase never appears."""
    tok = plain.get_tokenizer()
    params = [SamplingParams(temperature=0, max_tokens=60, bad_words=words)
              for words in (["the bridge", "public libraries"], ["teachers"], ["ten percent", "river"])]
    prompts = [COPY[0], COPY[1], COPY[0]]
    got = run(ngram, prompts, params)
    assert got == run(plain, prompts, params)
    free = run(plain, prompts, SamplingParams(temperature=0, max_tokens=60))
    for (tokens, _, _), (free_tokens, _, _), p in zip(got, free, params):
        text, free_text = tok.decode(tokens), tok.decode(free_tokens)
        assert all(w in free_text for w in p.bad_words), free_text  # the copy would have them
        # A bad word is a token sequence (vLLM's rule: as written and after a space), not a
        # substring: " ten percentage" may follow when " ten percent" is banned.
        for w in p.bad_words:
            for banned in (tok.encode(w, add_special_tokens=False), tok.encode(" " + w, add_special_tokens=False)):
                assert not any(list(tokens[i:i + len(banned)]) == banned for i in range(len(tokens))), (w, text)


def test_stops_inside_accepted_drafts(plain, ngram) -> None:
    tok = plain.get_tokenizer()
    stop_id = tok.encode(" bridge", add_special_tokens=False)[0]
    cases = [SamplingParams(temperature=0, max_tokens=200, stop_token_ids=[stop_id]),
             SamplingParams(temperature=0, max_tokens=200, stop=["teachers"]),
             SamplingParams(temperature=0, max_tokens=13)]
    for params in cases:
        got = run(ngram, [COPY[0]], params)
        assert got == run(plain, [COPY[0]], params)
    assert got[0][1] == "length" and len(got[0][0]) == 13


def test_repetition_detected_inside_accepted_drafts(plain, ngram) -> None:
    """A loop is where n-gram drafts are accepted most: the repetition rule still ends the output
    at the token where it first holds, the drafts accepted after it dropped."""
    params = SamplingParams(temperature=0, max_tokens=96, ignore_eos=True,
                            repetition_detection={"max_pattern_size": 6, "min_count": 3})
    prompts = ["1, 2, 1, 2, 1, 2,", "List the numbers: 7 7 7 7"]
    got = run(ngram, prompts, params)
    assert got == run(plain, prompts, params)
    assert all(finish == "repetition" for _, finish, _ in got)


def test_preemption_abort_and_prefix_cache_after_rejections(loaded, plain) -> None:
    # A cache of 24 blocks x 16 tokens for 8 requests of 70-140 tokens: preemptions with drafts in flight.
    small = dict(max_model_len=256, kv_cache_memory=24 * 16 * 30 * 2 * 3 * 64 * 2, max_num_seqs=8)
    spec = LLM(loaded_model=loaded, speculative_config=NGRAM, **small)
    prompts = (COPY + PROMPTS[:6])[:8]
    params = SamplingParams(temperature=0, max_tokens=64, ignore_eos=True)
    assert run(spec, prompts, params) == run(plain, prompts, params)
    assert spec.engine_core.stats().num_preemptions > 0
    spec.engine_core.scheduler.check_integrity()
    # The same prompts again: prefix-cache hits on blocks written by steps that rejected drafts.
    assert run(spec, prompts, params) == run(plain, prompts, params)
    # An abort while drafts are scheduled leaves a consistent scheduler.
    core = spec.engine_core
    processed = spec.input_processor.process("abort-me", COPY[0], SamplingParams(temperature=0, max_tokens=100))
    for sample in processed.samples:
        core.add_request(sample)
    for _ in range(6):
        core.step()
    core.abort_requests([s.request_id for s in processed.samples])
    core.step()
    core.scheduler.check_integrity()
    assert not core.has_unfinished_requests()


def test_rejection_rule_gives_the_target_distribution() -> None:
    """One request, one draft: the first new token must follow softmax(logits / T) whatever the
    draft (chi-square over 8 tokens, 20000 seeds), and the draft is accepted as often as p(draft)."""
    vocab, n, temperature = 8, 20000, 0.7
    torch.manual_seed(0)
    row0, row1 = torch.randn(vocab) * 1.5, torch.randn(vocab)
    p = torch.softmax(row0 / temperature, dim=0).double().numpy()
    draft = int(np.argsort(p)[-2])  # a plausible, not the likeliest, token
    logits = torch.stack([row0, row1]).repeat(n, 1).contiguous()  # n requests x (2 rows)
    md = ops.SamplingMetadata(temperature=torch.full((2 * n,), temperature),
                              seeds=torch.arange(n, dtype=torch.int64).repeat_interleave(2),
                              steps=torch.tensor([0, 1], dtype=torch.int64).repeat(n))
    sampled = ops.sample(logits, md).sampled_token_ids
    out = ops.rejection_sample(sampled, torch.ones(n, dtype=torch.int32), torch.full((n,), draft, dtype=torch.int32))
    first = out[:, 0].numpy()
    counts = np.bincount(first, minlength=vocab)
    expected = p * n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 24.3, (chi2, counts, expected)  # 7 degrees of freedom, p = 0.001
    accepted = (first == draft) & (out[:, 1].numpy() >= 0)
    assert abs(accepted.mean() - p[draft]) < 4 * np.sqrt(p[draft] * (1 - p[draft]) / n)
    assert ((out[:, 1].numpy() >= 0) == (first == draft)).all()  # a second token only after an acceptance


def test_rejection_sample_op_layout() -> None:
    target = torch.tensor([5, 6, 9, 7, 3, 8], dtype=torch.int32)  # request 0: rows 0-2, request 1: row 3, request 2: rows 4-5
    num_drafts = torch.tensor([2, 0, 1], dtype=torch.int32)
    drafts = torch.tensor([5, 6, 4], dtype=torch.int32)
    out = ops.rejection_sample(target, num_drafts, drafts)
    assert out.tolist() == [[5, 6, 9], [7, -1, -1], [3, -1, -1]]
    with pytest.raises(ValueError, match="draft_token_ids"):
        ops.rejection_sample(target, num_drafts, drafts[:2])


def test_draft_model_greedy_is_identical(loaded, plain, tmp_path) -> None:
    prompts = COPY[:1] + PROMPTS[:3]
    params = SamplingParams(temperature=0, max_tokens=32, logprobs=1)
    expected = run(plain, prompts, params)
    same = LLM(loaded_model=loaded, speculative_config={"model": loaded.path, "num_speculative_tokens": 3}, **ENGINE)
    assert run(same, prompts, params) == expected
    m = same.get_metrics()
    assert m["corellm:spec_decode_num_accepted_tokens"] >= 0.9 * m["corellm:spec_decode_num_draft_tokens"] > 0
    # A random draft with the same tokenizer: most drafts rejected, outputs unchanged.
    pytest.importorskip("transformers")
    from tests.model.tiny_models import make_tiny_model

    loaded.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))
    make_tiny_model("llama_tied", tmp_path, vocab_size=loaded.config.vocab_size, num_hidden_layers=2,
                    hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    rand = LLM(loaded_model=loaded, speculative_config={"method": "draft_model", "model": str(tmp_path),
                                                        "num_speculative_tokens": 2}, **ENGINE)
    assert run(rand, prompts, params) == expected


def test_configuration_errors(loaded, tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown key"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "lookahead": 3})
    with pytest.raises(ValueError, match="method must be one of"):
        SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig.from_dict({"method": "ngram"})
    with pytest.raises(ValueError, match="num_speculative_tokens must be >= 1"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 0})
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4,
                                     "prompt_lookup_max": 2})
    with pytest.raises(ValueError, match="takes no 'model'"):
        SpeculativeConfig.from_dict({"method": "ngram", "model": "x", "num_speculative_tokens": 2})
    with pytest.raises(ValueError, match="needs 'model'"):
        SpeculativeConfig.from_dict({"method": "draft_model", "num_speculative_tokens": 2})
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2}).prompt_lookup_min == 5
    assert SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2,
                                        "prompt_lookup_max": 3}).prompt_lookup_min == 3
    pytest.importorskip("transformers")
    from tests.model.tiny_models import make_tiny_model

    make_tiny_model("llama_tied", tmp_path, vocab_size=loaded.config.vocab_size, num_hidden_layers=1,
                    hidden_size=128, num_attention_heads=2, num_key_value_heads=1)
    loaded.tokenizer.backend.save(str(tmp_path / "tokenizer.json"))  # SmolLM2's, with one token renamed
    other = tmp_path / "tokenizer.json"
    other.write_text(other.read_text().replace('"<|endoftext|>"', '"<|end|>"', 1))
    with pytest.raises(ValueError, match="another tokenizer"):
        LLM(loaded_model=loaded, speculative_config={"model": str(tmp_path), "num_speculative_tokens": 2}, **ENGINE)


def test_small_budget_chunked_prefill_n_and_max_model_len(loaded, plain) -> None:
    """Drafts cut by a 6-token budget while prompts are chunked; n = 2 samples; requests that
    run into max_model_len with drafts in flight; prompt logprobs alongside: all as without."""
    spec = LLM(loaded_model=loaded, speculative_config=NGRAM, max_model_len=96, kv_cache_memory=96 * 1024**2,
               max_num_seqs=8, max_num_batched_tokens=6)
    base = LLM(loaded_model=loaded, max_model_len=96, kv_cache_memory=96 * 1024**2, max_num_seqs=8,
               max_num_batched_tokens=6)
    params = SamplingParams(temperature=0, max_tokens=200, n=2, prompt_logprobs=1)
    prompts = [COPY[1][:200], PROMPTS[0]]
    got, want = spec.generate(prompts, params, use_tqdm=False), base.generate(prompts, params, use_tqdm=False)
    for g, w in zip(got, want):
        assert [c.token_ids for c in g.outputs] == [c.token_ids for c in w.outputs]
        assert [c.finish_reason for c in g.outputs] == [c.finish_reason for c in w.outputs]
        assert [None if p is None else sorted(p) for p in g.prompt_logprobs] == \
            [None if p is None else sorted(p) for p in w.prompt_logprobs]
    assert any(c.finish_reason == "length" for o in got for c in o.outputs)  # max_model_len reached
    assert spec.get_metrics()["corellm:spec_decode_num_accepted_tokens"] > 0
    spec.engine_core.scheduler.check_integrity()
