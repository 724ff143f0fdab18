"""The sampler against a torch reference: greedy, exact processing (penalties, logit_bias,
banned tokens), logprobs, seeded reproducibility, and chi-square tests of the sampled
distribution under temperature / top-k / top-p / min-p."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from corellm import _core, ops
from corellm.ops import SamplingMetadata, TokenLists


def metadata(n, temperature=0.0, seed=0, step=0, **kw):
    return SamplingMetadata(
        temperature=torch.full((n,), temperature, dtype=torch.float32),
        seeds=torch.full((n,), seed, dtype=torch.int64),
        steps=torch.full((n,), step, dtype=torch.int64),
        **kw,
    )


def ref_probs(logits, temperature, top_k=0, top_p=1.0, min_p=0.0):
    """The distribution the sampler must draw from (float64)."""
    x = logits.double() / temperature
    p = torch.softmax(x, -1)
    keep = torch.ones_like(p, dtype=torch.bool)
    if min_p > 0:
        keep &= p >= min_p * p.max()
    if 0 < top_k < len(p):
        keep &= x >= torch.topk(x, top_k).values[-1]
    p = torch.where(keep, p, 0)
    if top_p < 1:
        order = torch.argsort(p, descending=True, stable=True)
        cum = torch.cumsum(p[order], 0)
        n_keep = int((cum < top_p * p.sum()).sum()) + 1
        mask = torch.zeros_like(keep)
        mask[order[:n_keep]] = True
        p = torch.where(mask, p, 0)
    return p / p.sum()


def test_greedy_is_argmax_with_lowest_id_on_ties():
    logits = torch.randn(6, 999)
    logits[2, 10] = logits[2, 700] = 50.0
    logits[3, 998] = 60.0  # the largest in the tail past the last whole 32 logits
    logits[4, :] = float("-inf")
    logits[4, 37] = -1e30
    out = ops.sample(logits.clone(), metadata(6))
    expected = logits.argmax(-1).to(torch.int32)
    expected[2] = 10
    assert torch.equal(out.sampled_token_ids, expected)


def test_processing_is_exact():
    torch.manual_seed(1)
    n, V = 3, 50
    logits = torch.randn(n, V) * 3
    prompts = [[1, 2, 3], [4], [5, 5, 6]]
    outputs = [[2, 2, 7], [], [6, 8, 8, 8]]
    bias = [[9], [], [0, 49]]
    bias_vals = [[5.0], [], [-2.0, 1.5]]
    banned = [[], [3, 4], []]
    rep = torch.tensor([1.3, 1.0, 0.8])
    pres = torch.tensor([0.5, 0.0, -0.25])
    freq = torch.tensor([0.1, 0.0, 0.3])
    md = metadata(
        n,
        presence_penalty=pres, frequency_penalty=freq, repetition_penalty=rep,
        output_token_ids=TokenLists.from_lists(outputs), prompt_token_ids=TokenLists.from_lists(prompts),
        logit_bias=TokenLists.from_lists(bias, bias_vals), banned_token_ids=TokenLists.from_lists(banned),
    )
    want = logits.clone()
    for i in range(n):
        want[i, banned[i]] = float("-inf")
        for t, v in zip(bias[i], bias_vals[i]):
            want[i, t] += v
        for t in sorted(set(prompts[i]) | set(outputs[i])):
            want[i, t] = want[i, t] / rep[i] if want[i, t] > 0 else want[i, t] * rep[i]
        for t in set(outputs[i]):
            want[i, t] -= pres[i] + freq[i] * outputs[i].count(t)
    got = logits.clone()
    out = ops.sample(got, md)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)  # processed in place, greedy rows
    assert torch.equal(out.sampled_token_ids, want.argmax(-1).to(torch.int32))


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_logprobs_describe_the_raw_distribution(k):
    logits = torch.randn(4, 3000) * 4
    md = metadata(4, temperature=0.7, seed=3, num_logprobs=k)
    md.repetition_penalty = torch.full((4,), 2.0)
    md.output_token_ids = TokenLists.from_lists([[1], [2], [3], [4]])
    md.prompt_token_ids = TokenLists.from_lists([[], [], [], []])
    out = ops.sample(logits.clone(), md)
    lp = torch.log_softmax(logits.double(), -1)
    for i in range(4):
        t = int(out.sampled_token_ids[i])
        assert abs(float(out.logprobs[i]) - float(lp[i, t])) < 1e-4
        assert int(out.ranks[i]) == int((logits[i] > logits[i, t]).sum()) + 1
        top = torch.topk(lp[i], k)
        assert out.top_token_ids[i].tolist() == top.indices.tolist()
        torch.testing.assert_close(out.top_logprobs[i].double(), top.values, atol=1e-4, rtol=0)


def test_seeded_requests_reproduce_whatever_the_batch():
    V = 500
    row = torch.randn(V)
    alone = ops.sample(row[None].clone(), metadata(1, 1.0, seed=42, step=7)).sampled_token_ids[0]
    batch = torch.randn(5, V)
    batch[3] = row
    md = metadata(5, 1.0, seed=1, step=0)
    md.seeds[3], md.steps[3] = 42, 7
    assert ops.sample(batch, md).sampled_token_ids[3] == alone
    # Different steps of one stream give different draws.
    draws = {int(ops.sample(row[None].clone(), metadata(1, 1.0, seed=42, step=s)).sampled_token_ids[0])
             for s in range(40)}
    assert len(draws) > 10


def test_philox_stream_is_uniform():
    u = np.array([_core.kernels.philox_uniform(123, c) for c in range(20000)])
    assert u.min() >= 0 and u.max() < 1
    assert stats.kstest(u, "uniform").pvalue > 1e-3


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [(1.0, 0, 1.0, 0.0), (0.5, 0, 1.0, 0.0), (1.5, 5, 1.0, 0.0), (1.0, 0, 0.8, 0.0),
     (1.0, 0, 1.0, 0.1), (0.8, 10, 0.9, 0.05)],
)
def test_sampled_distribution_chi_square(temperature, top_k, top_p, min_p):
    check_sampled_distribution(lambda logits, md: ops.sample(logits, md).sampled_token_ids,
                               temperature, top_k, top_p, min_p)


def check_sampled_distribution(sample_tokens, temperature, top_k, top_p, min_p, V=30, N=30000):
    """N draws (one seeded stream, steps 0..N-1) from one row: nothing filtered out is drawn and the
    counts pass a chi-square test against the reference distribution. sample_tokens(logits, md)
    -> the sampled ids (on any device)."""
    row = torch.randn(V, generator=torch.Generator().manual_seed(7)) * 1.5
    md = SamplingMetadata(
        temperature=torch.full((N,), temperature), seeds=torch.full((N,), 2024, dtype=torch.int64),
        steps=torch.arange(N, dtype=torch.int64), top_k=torch.full((N,), top_k, dtype=torch.int32),
        top_p=torch.full((N,), top_p), min_p=torch.full((N,), min_p),
    )
    tokens = sample_tokens(row.repeat(N, 1), md).cpu()
    counts = torch.bincount(tokens.long(), minlength=V).double()
    p = ref_probs(row, temperature, top_k, top_p, min_p)
    assert counts[p == 0].sum() == 0, "a filtered-out token was sampled"
    kept = p > 0
    chi2, pvalue = stats.chisquare(counts[kept].numpy(), (p[kept] * N).numpy())
    assert pvalue > 1e-4, f"chi2 {chi2:.1f}, p {pvalue:.2e}"


def test_top_p_over_a_large_flat_vocabulary():
    # Needs more than the first 256/4096 sorted candidates: the widening path.
    V = 49152
    logits = torch.zeros(1, V)
    md = metadata(1, 1.0, seed=5, top_p=torch.tensor([0.5]))
    t = int(ops.sample(logits, md).sampled_token_ids[0])
    assert 0 <= t < V // 2 + 1


@pytest.mark.parametrize("k", [1, 7, 100, 4999])
def test_top_k_keeps_the_k_largest_and_their_ties(k):
    # Logits rounded to one decimal: many ties, at the k-th largest too (all of which are kept).
    V, N = 5000, 4000
    row = (torch.randn(V, generator=torch.Generator().manual_seed(k)) * 3).round(decimals=1)
    kth = torch.topk(row, k).values[-1]
    md = SamplingMetadata(temperature=torch.full((N,), 50.0), seeds=torch.full((N,), 11, dtype=torch.int64),
                          steps=torch.arange(N, dtype=torch.int64), top_k=torch.full((N,), k, dtype=torch.int32))
    drawn = ops.sample(row.repeat(N, 1), md).sampled_token_ids.long()
    assert bool((row[drawn] >= kth).all()), "a token below the k-th largest was drawn"
    kept = int((row >= kth).sum())
    if kept <= 20:  # at temperature 50 every kept token is drawn, the ties at the boundary too
        assert len(set(drawn.tolist())) == kept


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_top_p_on_peaked_rows_of_a_large_vocabulary(top_p):
    # Peaked rows (a few hundred tokens within 2^-10 of the largest weight): the kept set from the
    # gathered tokens alone; every draw is within the float64 reference's kept set (or the one
    # token past its boundary, which float rounding may move) and the draws follow its weights.
    V, N = 49152, 3000
    row = torch.randn(V, generator=torch.Generator().manual_seed(3)) * 4
    md = metadata(N, 1.0, seed=9, top_p=torch.full((N,), top_p))
    md.steps = torch.arange(N, dtype=torch.int64)
    drawn = ops.sample(row.repeat(N, 1), md).sampled_token_ids.long()
    p = ref_probs(row, 1.0, 0, top_p, 0.0)
    order = torch.argsort(row, descending=True)
    rank = torch.empty(V, dtype=torch.long)
    rank[order] = torch.arange(V)
    assert int(rank[drawn].max()) <= int((p > 0).sum()), "a token past the top-p boundary was drawn"
    top = order[:5]  # the heaviest tokens' counts against the reference
    counts = torch.stack([(drawn == t).sum() for t in top]).double()
    expected = (p[top] * N)
    assert torch.all((counts - expected).abs() <= 5 * expected.sqrt() + 5), (counts, expected)


@pytest.mark.parametrize("nan_at", [5, 13, 21, 29, 70, 992, 1006])  # each of the 4 running maxima, the tail
def test_nan_row_fails_only_that_request(nan_at):
    logits = torch.randn(3, 1007)
    logits[1, nan_at] = float("nan")
    out = ops.sample(logits, metadata(3, num_logprobs=2))
    assert int(out.sampled_token_ids[1]) == -1
    assert int(out.sampled_token_ids[0]) >= 0 and int(out.sampled_token_ids[2]) >= 0


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda md: setattr(md, "temperature", torch.tensor([-1.0, 1.0])), "temperature must be finite and >= 0"),
        (lambda md: setattr(md, "top_p", torch.tensor([0.0, 1.0])), r"top_p must be in \(0, 1\]"),
        (lambda md: setattr(md, "min_p", torch.tensor([1.5, 0.0])), r"min_p must be in \[0, 1\]"),
        (lambda md: setattr(md, "logit_bias", TokenLists.from_lists([[5000], []], [[1.0], []])),
         "logit_bias token id 5000 is outside the vocabulary"),
        (lambda md: setattr(md, "presence_penalty", torch.tensor([0.5, 0.0])), "output_token_ids is required"),
        (lambda md: setattr(md, "top_k", torch.tensor([1, 2])), "top_k must be torch.int32"),
        (lambda md: setattr(md, "seeds", torch.tensor([1])), r"seeds must have shape \(2,\)"),
    ],
)
def test_bad_sampling_inputs(change, message):
    md = metadata(2)
    change(md)
    with pytest.raises(ValueError, match=message):
        ops.sample(torch.randn(2, 100), md)


def pack_bitmask(allowed: torch.Tensor) -> torch.Tensor:
    """bool [rows, vocab] -> int32 [rows, ceil(vocab / 32)], bit t % 32 of word t / 32 (the reference packing)."""
    rows, vocab = allowed.shape
    words = (vocab + 31) // 32
    padded = torch.zeros(rows, words * 32, dtype=torch.int64)
    padded[:, :vocab] = allowed.long()
    packed = (padded.view(rows, words, 32) << torch.arange(32)).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def test_bitmask_constrains_greedy_and_leaves_logprobs_raw():
    g = torch.Generator().manual_seed(3)
    V = 1000
    logits = torch.randn(4, V, generator=g) * 3
    allowed = torch.rand(3, V, generator=g) < 0.05
    allowed[2, :] = False
    allowed[2, 777] = True  # one token left: it must be chosen whatever its logit
    md = metadata(4, num_logprobs=3)
    md.allowed_token_bitmask = pack_bitmask(allowed)
    md.bitmask_rows = torch.tensor([1, -1, 0, 2], dtype=torch.int32)  # request 1 is unconstrained
    out = ops.sample(logits.clone(), md)
    tokens = out.sampled_token_ids.tolist()
    for i, row in ((0, 1), (2, 0), (3, 2)):
        masked = torch.where(allowed[row], logits[i], torch.tensor(float("-inf")))
        assert tokens[i] == int(masked.argmax())
    assert tokens[1] == int(logits[1].argmax())
    assert tokens[3] == 777
    raw = torch.log_softmax(logits.double(), -1)  # logprobs and ranks describe the raw logits
    for i, t in enumerate(tokens):
        assert abs(float(out.logprobs[i]) - float(raw[i, t])) < 1e-4
        assert int(out.ranks[i]) == int((logits[i] > logits[i, t]).sum()) + 1
        assert out.top_token_ids[i].tolist() == torch.topk(raw[i], 3).indices.tolist()


def test_bitmask_sampling_draws_only_allowed_tokens_in_proportion():
    V, N = 40, 20000
    row = torch.randn(V, generator=torch.Generator().manual_seed(9))
    allowed = torch.zeros(V, dtype=torch.bool)
    allowed[[1, 5, 6, 20, 33, 39]] = True
    md = SamplingMetadata(temperature=torch.full((N,), 0.8), seeds=torch.full((N,), 11, dtype=torch.int64),
                          steps=torch.arange(N, dtype=torch.int64), top_p=torch.full((N,), 0.95))
    md.allowed_token_bitmask = pack_bitmask(allowed[None])
    md.bitmask_rows = torch.zeros(N, dtype=torch.int32)
    tokens = ops.sample(row.repeat(N, 1), md).sampled_token_ids
    counts = torch.bincount(tokens.long(), minlength=V).double()
    assert counts[~allowed].sum() == 0
    p = ref_probs(torch.where(allowed, row, torch.tensor(float("-inf"))), 0.8, top_p=0.95)
    kept = p > 0
    _, pvalue = stats.chisquare(counts[kept].numpy(), (p[kept] * N).numpy())
    assert pvalue > 1e-4


def test_a_bitmask_that_allows_nothing_fails_that_request():
    md = metadata(2, num_logprobs=1)
    md.allowed_token_bitmask = torch.zeros(1, 4, dtype=torch.int32)
    md.bitmask_rows = torch.tensor([0, -1], dtype=torch.int32)
    out = ops.sample(torch.randn(2, 100), md)
    assert out.sampled_token_ids.tolist()[0] == -1 and out.sampled_token_ids.tolist()[1] >= 0
    with pytest.raises(ValueError, match="bitmask_rows points past"):
        md.bitmask_rows = torch.tensor([1, -1], dtype=torch.int32)
        ops.sample(torch.randn(2, 100), md)
