"""ops.token_logprobs (token_logprobs.h on the CPU): the logprob, rank and top tokens of
given tokens under raw logits, against a float64 reference; the same bits the sampler gives a token
it samples; each row independent of the others; bad input refused by name. And the engine's prompt
logprobs, scored in pieces of the logits buffer's rows, the same whatever the piece size.

Bound: log Z is a float32 sum of exp over the vocabulary (the sampler's arithmetic), within ~1e-5
of float64 for logits of a few units over 49,152 tokens; 5e-5 is allowed."""

from __future__ import annotations

import pytest
import torch

from corellm import LLM, SamplingParams, ops
from corellm.model import load_model
from corellm.ops.token_logprobs import _with_torch

VOCAB = 49152


def logits_and_ids(n: int, vocab: int = VOCAB, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, vocab, generator=gen) * 3, torch.randint(0, vocab, (n,), generator=gen)


def test_against_float64():
    x, ids = logits_and_ids(40)
    ids[0] = int(x[0].argmax())  # a rank-1 token
    got = ops.token_logprobs(x, ids, 5)
    lp = torch.log_softmax(x.double(), -1)
    chosen = lp.gather(1, ids[:, None])[:, 0]
    assert (got.logprobs.double() - chosen).abs().max() < 5e-5
    assert torch.equal(got.ranks.long(), (x > x.gather(1, ids[:, None])).sum(-1) + 1)
    assert int(got.ranks[0]) == 1
    order = torch.sort(-x.double(), dim=-1, stable=True).indices[:, :5]  # descending, ties to the lower id
    assert torch.equal(got.top_token_ids.long(), order)
    assert (got.top_logprobs.double() - lp.gather(1, order)).abs().max() < 5e-5


def test_ties_go_to_the_lower_id_and_num_top_zero():
    x = torch.zeros(2, 10)
    x[:, 3] = x[:, 7] = 2.0  # a tie for the top
    got = ops.token_logprobs(x, torch.tensor([7, 0]), 3)
    assert got.top_token_ids.tolist() == [[3, 7, 0], [3, 7, 0]]
    assert got.ranks.tolist() == [1, 3]  # 7: none above it; 0: 3 and 7 above
    none = ops.token_logprobs(x, torch.tensor([7, 0]), 0)
    assert none.top_token_ids.shape == (2, 0) and torch.equal(none.logprobs, got.logprobs)


def test_the_sampler_gives_a_sampled_token_the_same_bits():
    x, _ = logits_and_ids(12, seed=1)
    md = ops.SamplingMetadata(temperature=torch.zeros(12), seeds=torch.zeros(12, dtype=torch.int64),
                              steps=torch.zeros(12, dtype=torch.int64), num_logprobs=4)
    sampled = ops.sample(x.clone(), md)
    got = ops.token_logprobs(x, sampled.sampled_token_ids, 4)
    assert torch.equal(got.logprobs, sampled.logprobs)
    assert torch.equal(got.ranks, sampled.ranks)
    assert torch.equal(got.top_token_ids, sampled.top_token_ids)
    assert torch.equal(got.top_logprobs, sampled.top_logprobs)


def test_rows_are_independent_and_logits_unchanged():
    x, ids = logits_and_ids(33, vocab=5000, seed=2)
    before = x.clone()
    whole = ops.token_logprobs(x, ids, 2)
    assert torch.equal(x, before)
    for i in (0, 17, 32):
        alone = ops.token_logprobs(x[i : i + 1].contiguous(), ids[i : i + 1], 2)
        assert torch.equal(alone.logprobs, whole.logprobs[i : i + 1])
        assert torch.equal(alone.top_token_ids, whole.top_token_ids[i : i + 1])


def test_the_torch_way_other_devices_take_agrees():
    x, ids = logits_and_ids(8, vocab=3000, seed=3)
    got, ref = ops.token_logprobs(x, ids, 3), _with_torch(x, ids, 3)
    assert (got.logprobs - ref.logprobs).abs().max() < 5e-5
    assert torch.equal(got.ranks, ref.ranks) and torch.equal(got.top_token_ids, ref.top_token_ids)


def test_bad_input_is_refused_by_name():
    x, ids = logits_and_ids(3, vocab=100)
    with pytest.raises(ValueError, match=r"row 1's token id 100 is outside the vocabulary \[0, 100\)"):
        ops.token_logprobs(x, torch.tensor([0, 100, 5]), 1)
    with pytest.raises(ValueError, match=r"num_top must be in \[0, 100\], got 101"):
        ops.token_logprobs(x, ids, 101)
    with pytest.raises(ValueError, match="logits"):
        ops.token_logprobs(x.double(), ids, 1)
    with pytest.raises(ValueError, match="token_ids"):
        ops.token_logprobs(x, ids[:2], 1)


@pytest.fixture(scope="module")
def loaded():
    return load_model(None, progress=False)


def test_engine_prompt_logprobs_do_not_depend_on_the_piece_size(loaded):
    """max_num_seqs 2: the logits buffer holds 2 rows, so a 40-token prompt is scored in 20 pieces;
    max_num_seqs 64: in one. The same bits (each row's logits do not depend on the batch)."""
    prompt = {"prompt_token_ids": [(11 * j) % 3000 + 20 for j in range(40)]}
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=3)

    def scored(max_num_seqs: int):
        llm = LLM(loaded_model=loaded, max_model_len=128, kv_cache_memory=32 * 1024**2, max_num_seqs=max_num_seqs)
        assert llm.engine_core.model_runner.logits_buffer.max_rows == max_num_seqs
        out = llm.generate(prompt, params, use_tqdm=False)[0]
        return [None if p is None else sorted((t, lp.logprob, lp.rank) for t, lp in p.items())
                for p in out.prompt_logprobs]

    small, whole = scored(2), scored(64)
    assert small[0] is None and len(small) == 40 and all(p for p in small[1:])
    assert small == whole
