"""bad_words (vLLM's sampling parameter): a tiny random Llama (fp32) against HF transformers with
its own NoBadWordsLogitsProcessor — greedy tokens equal wherever the reference's top-2 margin is
clear, logprobs those of the raw logits; the words never appear in the output; the parameter's
checks."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams
from tests.engine.test_tiny_oracle import write_tokenizer
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")

NUM_TOKENS = 24


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    hf = make_tiny_model("llama3", path, seed=11)
    write_tokenizer(path)  # word-level: "w17" is token 17
    llm = LLM(str(path), dtype="float32", max_model_len=256, kv_cache_memory=32 * 1024**2)
    return hf, llm


def hf_greedy_without(model, prompt: list[int], bad_words_ids: list[list[int]]):
    """(tokens, raw logprobs of them, top-2 margins of the constrained logits) of greedy decoding
    through transformers' NoBadWordsLogitsProcessor."""
    ban = transformers.NoBadWordsLogitsProcessor(bad_words_ids, eos_token_id=None)
    ids = list(prompt)
    tokens, logprobs, margins = [], [], []
    with torch.no_grad():
        for _ in range(NUM_TOKENS):
            logits = model(torch.tensor([ids])).logits[:, -1].double()
            allowed = ban(torch.tensor([ids]), logits.clone())[0]
            top2 = torch.topk(allowed, 2).values
            margins.append(float(top2[0] - top2[1]))
            tokens.append(int(allowed.argmax()))
            logprobs.append(float(torch.log_softmax(logits[0], -1)[tokens[-1]]))
            ids.append(tokens[-1])
    return tokens, logprobs, margins


def contains(tokens: list[int], words: list[int]) -> bool:
    return any(tokens[i:i + len(words)] == words for i in range(len(tokens) - len(words) + 1))


def test_greedy_equals_transformers_no_bad_words_processor(tiny):
    hf, llm = tiny
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 384, (int(n),), generator=g).tolist() for n in torch.randint(4, 40, (6,), generator=g)]
    free = llm.generate([{"prompt_token_ids": p} for p in prompts],
                        SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True), use_tqdm=False)
    compared = 0
    for prompt, out in zip(prompts, free):
        before = list(out.outputs[0].token_ids)
        # A word the free output has early, and a two-word phrase from later in it.
        single, pair = [before[2]], before[8:10]
        # transformers matches a phrase against the prompt too, vLLM's rule against the output
        # only: the two agree unless the prompt ends with the phrase's first word.
        assert prompt[-1] != pair[0]
        bad_words = [f"w{single[0]}", f"w{pair[0]} w{pair[1]}"]
        got = llm.generate([{"prompt_token_ids": prompt}], SamplingParams(
            temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True, logprobs=0, bad_words=bad_words),
            use_tqdm=False)[0].outputs[0]
        assert not contains(list(got.token_ids), single) and not contains(list(got.token_ids), pair)
        want, want_lp, margins = hf_greedy_without(hf, prompt, [single, pair])
        for t in range(NUM_TOKENS):
            if margins[t] < 1e-4:
                break
            assert got.token_ids[t] == want[t], f"step {t}"
            assert abs(got.logprobs[t][want[t]].logprob - want_lp[t]) < 1e-4
            compared += 1
    assert compared >= 3 * NUM_TOKENS


def test_words_are_checked(tiny):
    _, llm = tiny
    for bad in (["ok", "  "], "w5", [5]):
        with pytest.raises(ValueError, match="bad_words must be a list of words"):
            SamplingParams(bad_words=bad)
    out = llm.generate([{"prompt_token_ids": [5, 6, 7]}], SamplingParams(max_tokens=4, temperature=0,
                                                                         bad_words=["w9"]), use_tqdm=False)
    assert 9 not in out[0].outputs[0].token_ids
