"""The CUDA sampler against the CPU sampler (itself held to torch references in test_sampler.py):
the same processed logits, greedy tokens, logprobs and ranks, the same seeded draws on peaked
distributions, and chi-square tests of the sampled distribution. Skipped without a GPU or
without corellm._cuda."""

from __future__ import annotations

import pytest
import torch

from corellm import ops
from corellm.ops import SamplingMetadata, TokenLists
from corellm.ops._backend import cuda_available
from tests.ops.test_sampler import check_sampled_distribution, metadata, ref_probs

pytestmark = pytest.mark.skipif(not (cuda_available() and torch.cuda.is_available()),
                                reason="needs corellm._cuda and a CUDA GPU")


def both(logits: torch.Tensor, md: SamplingMetadata):
    """(CPU output, CPU processed logits, CUDA output on the host, CUDA processed logits)."""
    cpu_logits, gpu_logits = logits.clone(), logits.cuda()
    cpu = ops.sample(cpu_logits, md)
    gpu = ops.sample(gpu_logits, md.to(torch.device("cuda")))
    torch.cuda.synchronize()
    host = {f: None if getattr(gpu, f) is None else getattr(gpu, f).cpu()
            for f in ("sampled_token_ids", "logprobs", "ranks", "top_token_ids", "top_logprobs")}
    return cpu, cpu_logits, host, gpu_logits.cpu()


@pytest.mark.parametrize("vocab", [1000, 49152, 151936])
def test_greedy_matches_with_lowest_id_on_ties(vocab):
    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(vocab))
    logits[2, 10] = logits[2, vocab - 3] = 50.0
    logits[5] = 0.0  # all tied: id 0
    cpu, _, gpu, _ = both(logits, metadata(8))
    assert torch.equal(gpu["sampled_token_ids"], cpu.sampled_token_ids)
    assert int(gpu["sampled_token_ids"][2]) == 10 and int(gpu["sampled_token_ids"][5]) == 0


def test_processing_matches_the_cpu_exactly():
    g = torch.Generator().manual_seed(1)
    n, V = 3, 5000
    logits = torch.randn(n, V, generator=g) * 3
    prompts = [[1, 2, 3] * 50, [4], [5, 5, 6]]
    outputs = [[2, 2, 7] + list(range(100, 1300)), [], [6, 8, 8, 8]]
    md = metadata(
        n,
        presence_penalty=torch.tensor([0.5, 0.0, -0.25]), frequency_penalty=torch.tensor([0.1, 0.0, 0.3]),
        repetition_penalty=torch.tensor([1.3, 1.0, 0.8]),
        output_token_ids=TokenLists.from_lists(outputs), prompt_token_ids=TokenLists.from_lists(prompts),
        logit_bias=TokenLists.from_lists([[9, 9], [], [0, 4999]], [[5.0, 1.0], [], [-2.0, 1.5]]),
        banned_token_ids=TokenLists.from_lists([[], [3, 4], []]),
    )
    cpu, cpu_logits, gpu, gpu_logits = both(logits, md)
    # Bit-equal by construction: each processed logit takes the same IEEE operations in the same
    # order on both sides (bias adds in list order, one division or product by the repetition
    # penalty, one explicit fma for presence + frequency x count: no contraction left to the
    # compilers), and greedy picks by comparisons alone.
    torch.testing.assert_close(gpu_logits, cpu_logits, atol=0, rtol=0)
    assert torch.equal(gpu["sampled_token_ids"], cpu.sampled_token_ids)


@pytest.mark.parametrize("k", [0, 1, 5, 20])
def test_logprobs_match(k):
    logits = torch.randn(4, 32000, generator=torch.Generator().manual_seed(k)) * 4
    logits[3, :40] = 30.0  # 40 ties at the top: the top 20 are the lowest ids
    md = metadata(4, temperature=0.7, seed=3, num_logprobs=k)
    cpu, _, gpu, _ = both(logits, md)
    # The top n come from the raw logits by comparisons alone (ties: lower id), so the ids are
    # exact; their logprobs differ by the log-sum-exp's rounding (another summation order).
    assert torch.equal(gpu["top_token_ids"], cpu.top_token_ids)
    torch.testing.assert_close(gpu["top_logprobs"], cpu.top_logprobs, atol=1e-4, rtol=0)
    # The draws themselves are not held equal: the weights are exp(x - max) by __expf summed in
    # fixed point here and by fast_exp summed in float on the CPU, so a draw whose u falls within
    # rounding of a CDF boundary may pick the neighbour (test_seeded_draws_match_the_cpu_on_peaked_rows
    # measures how often). Each side's sampled logprob and rank describe its own token exactly.
    raw = torch.log_softmax(logits.double(), -1)
    for side, tokens, logprobs, ranks in (("cuda", gpu["sampled_token_ids"], gpu["logprobs"], gpu["ranks"]),
                                          ("cpu", cpu.sampled_token_ids, cpu.logprobs, cpu.ranks)):
        for i in range(4):
            t = int(tokens[i])
            assert abs(float(logprobs[i]) - float(raw[i, t])) < 1e-4, side
            assert int(ranks[i]) == int((logits[i] > logits[i, t]).sum()) + 1, side


@pytest.mark.parametrize("top_k, top_p, min_p", [(0, 1.0, 0.0), (50, 1.0, 0.0), (0, 0.9, 0.0), (0, 1.0, 0.05),
                                                 (40, 0.8, 0.02)])
def test_seeded_draws_match_the_cpu_on_peaked_rows(top_k, top_p, min_p):
    # Peaked rows keep CDF boundaries far apart, so the two kernels' float rounding (fixed-point
    # sums here, float sums there) cannot move a draw across one.
    n, V = 128, 151936
    logits = torch.randn(n, V, generator=torch.Generator().manual_seed(top_k + int(100 * top_p))) * 4
    md = SamplingMetadata(temperature=torch.full((n,), 0.9), seeds=torch.arange(n, dtype=torch.int64) * 7919,
                          steps=torch.arange(n, dtype=torch.int64),
                          top_k=torch.full((n,), top_k, dtype=torch.int32), top_p=torch.full((n,), top_p),
                          min_p=torch.full((n,), min_p))
    cpu, _, gpu, _ = both(logits, md)
    same = (gpu["sampled_token_ids"] == cpu.sampled_token_ids).float().mean().item()
    assert same >= 0.98, f"only {same:.1%} of the draws match the CPU's"
    for i in range(n):  # and every draw is in the kept set
        p = ref_probs(logits[i], 0.9, top_k, top_p, min_p)
        assert p[int(gpu["sampled_token_ids"][i])] > 0


@pytest.mark.parametrize(
    "temperature, top_k, top_p, min_p",
    [(1.0, 0, 1.0, 0.0), (0.5, 0, 1.0, 0.0), (1.5, 5, 1.0, 0.0), (1.0, 0, 0.8, 0.0),
     (1.0, 0, 1.0, 0.1), (0.8, 10, 0.9, 0.05)],
)
def test_sampled_distribution_chi_square(temperature, top_k, top_p, min_p):
    cuda = torch.device("cuda")
    check_sampled_distribution(lambda logits, md: ops.sample(logits.to(cuda), md.to(cuda)).sampled_token_ids,
                               temperature, top_k, top_p, min_p)


def test_top_p_over_a_large_flat_vocabulary():
    V = 151936
    md = metadata(64, 1.0, seed=5, top_p=torch.full((64,), 0.5))
    md.steps = torch.arange(64, dtype=torch.int64)
    tokens = ops.sample(torch.zeros(64, V, device="cuda"), md.to(torch.device("cuda"))).sampled_token_ids.cpu()
    assert bool(((tokens >= 0) & (tokens < V // 2 + 1)).all())
    assert len(set(tokens.tolist())) > 32  # draws spread over the kept half


def test_nan_row_fails_only_that_request():
    logits = torch.randn(3, 100)
    logits[1, 5] = float("nan")
    _, _, gpu, _ = both(logits, metadata(3, num_logprobs=2))
    assert int(gpu["sampled_token_ids"][1]) == -1
    assert int(gpu["sampled_token_ids"][0]) >= 0 and int(gpu["sampled_token_ids"][2]) >= 0


def test_too_many_logprobs_is_a_clear_error():
    md = metadata(1, num_logprobs=2000).to(torch.device("cuda"))
    with pytest.raises(ValueError, match="CUDA sampler's limit of 1024"):
        ops.sample(torch.randn(1, 5000, device="cuda"), md)


def test_bitmask_matches_the_cpu():
    from tests.ops.test_sampler import pack_bitmask

    g = torch.Generator().manual_seed(4)
    n, V = 6, 151936
    logits = torch.randn(n, V, generator=g) * 3
    allowed = torch.rand(4, V, generator=g) < 0.01
    allowed[3] = False
    allowed[3, V - 1] = True
    md = metadata(n, num_logprobs=2)
    md.allowed_token_bitmask = pack_bitmask(allowed)
    md.bitmask_rows = torch.tensor([0, -1, 1, 2, 3, -1], dtype=torch.int32)
    cpu, cpu_logits, gpu, gpu_logits = both(logits, md)
    # Masking writes -inf or keeps the logit: exact on both sides; greedy then compares.
    torch.testing.assert_close(gpu_logits, cpu_logits, atol=0, rtol=0)
    assert torch.equal(gpu["sampled_token_ids"], cpu.sampled_token_ids)
    assert int(gpu["sampled_token_ids"][4]) == V - 1
    sampled = metadata(n, temperature=1.0, seed=9)
    sampled.allowed_token_bitmask, sampled.bitmask_rows = md.allowed_token_bitmask, md.bitmask_rows
    tokens = ops.sample(logits.cuda(), sampled.to(torch.device("cuda"))).sampled_token_ids.cpu()
    for i, row in enumerate(md.bitmask_rows.tolist()):
        if row >= 0:
            assert allowed[row, int(tokens[i])]


@pytest.mark.parametrize("num_reqs", [1, 37, 2500])  # 2500: past one block's 1024 requests per chunk
def test_rejection_sample_matches_the_cpu(num_reqs: int) -> None:
    g = torch.Generator().manual_seed(num_reqs)
    num_drafts = torch.randint(0, 5, (num_reqs,), generator=g, dtype=torch.int32)
    drafts = torch.randint(0, 4, (int(num_drafts.sum()),), generator=g, dtype=torch.int32)
    target = torch.randint(-1, 4, (int(num_drafts.sum()) + num_reqs,), generator=g, dtype=torch.int32)
    cpu = ops.rejection_sample(target, num_drafts, drafts)
    gpu = ops.rejection_sample(target.cuda(), num_drafts.cuda(), drafts.cuda())
    assert torch.equal(gpu.cpu(), cpu)
