"""reshape_and_cache and paged_attention against the float64 torch reference, over block sizes,
GQA ratios, head sizes, prefix (context) lengths, dtypes, sliding windows and batch mixes, on
every instruction-set path this CPU runs (avx2: bf16 caches a span at a time, each pair widened,
fp32 ones through the generic fold; avx512: per token, fp32 caches read in place; avx512bf16 and
amx: bf16 caches a span at a time on their dot products); Gemma 2's soft-capped scores on each."""

from __future__ import annotations

import math
import random

import pytest
import torch

from corellm import ops
from corellm.native import _core
from tests.ops import reference as ref

ISAS = _core.kernels.supported_cpu_isas()

TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.bfloat16: dict(atol=1.5e-2, rtol=2e-2)}


def make_batch(seqs, num_kv_heads, head_size, block_size, dtype, seed):
    """seqs: list of (seq_len, query_len). Random caches, shuffled block tables."""
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(L / block_size) for L, _ in seqs]
    num_blocks = sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=g).to(torch.int32)
    max_blocks = max(blocks_per_seq) + 2
    table = torch.full((len(seqs), max_blocks), -1, dtype=torch.int32)
    used = 0
    for i, nb in enumerate(blocks_per_seq):
        table[i, :nb] = perm[used : used + nb]
        used += nb
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, num_kv_heads, head_size, block_size, dtype)
    key_cache = torch.randn(k_shape, generator=g).to(dtype)
    value_cache = torch.randn(v_shape, generator=g).to(dtype)
    seq_lens = torch.tensor([L for L, _ in seqs], dtype=torch.int32)
    qsl = torch.tensor([0] + list(torch.cumsum(torch.tensor([n for _, n in seqs]), 0)), dtype=torch.int32)
    return key_cache, value_cache, table, seq_lens, qsl


CASES = [
    # (seqs [(seq_len, query_len)], num_heads, num_kv_heads, head_size, block_size)
    ([(37, 37)], 4, 4, 64, 16),  # whole prefill, MHA
    ([(100, 100), (5, 5)], 9, 3, 64, 16),  # SmolLM2 GQA
    ([(64, 16)], 9, 3, 64, 16),  # chunk after a block-aligned prefix hit
    ([(70, 9)], 8, 2, 128, 32),  # chunk after an unaligned prefix
    ([(1, 1), (300, 1), (17, 1)], 9, 3, 64, 16),  # decode
    ([(2048, 1)], 9, 3, 64, 16),  # one long decode: the KV range is split across threads
    ([(513, 1), (44, 20), (90, 90), (1, 1)], 16, 4, 64, 8),  # mixed batch, GQA 4
    ([(33, 33), (65, 2)], 6, 2, 32, 16),
    ([(200, 1), (130, 70), (3, 1)], 9, 3, 64, 64),  # large blocks (decode and a chunk)
    ([(300, 1), (129, 129)], 8, 2, 128, 128),
    ([(300, 300), (40, 1), (77, 13)], 4, 1, 256, 16),  # Gemma 3: head size 256, one KV head
    ([(90, 90), (260, 1)], 8, 2, 256, 32),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_paged_attention_matches_reference(dtype, case, isa):
    seqs, heads, kv_heads, head_size, block_size = CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, dtype, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size).to(dtype)
    scale = head_size**-0.5
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, cpu_isa=isa)
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale)
    torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [1, 7, 16, 50, 150])
def test_paged_attention_sliding_window(window, dtype, isa):
    seqs = [(80, 80), (200, 1), (120, 30), (300, 300)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, 64, 16, dtype, seed=window)
    q = torch.randn(int(qsl[-1]), 4 * 64).to(dtype)
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sliding_window=window, cpu_isa=isa)
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sliding_window=window)
    torch.testing.assert_close(got.double(), want, **TOL[dtype])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [0, 1, 9, 65])
def test_bidirectional_attention_matches_the_reference(window, dtype, isa):
    """causal=False (an encoder's attention): every query sees its whole sequence, or the keys less
    than `window` positions away on either side; whole inputs of many lengths, chunks and a decode
    too, head sizes 32 and 64."""
    for seqs, heads, kv_heads, head_size in (([(37, 37), (1, 1), (300, 300), (16, 16)], 12, 12, 32),
                                             ([(130, 130), (64, 20), (90, 1)], 9, 3, 64)):
        kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, 16, dtype, seed=window)
        q = torch.randn(int(qsl[-1]), heads * head_size).to(dtype)
        scale = head_size**-0.5
        got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, sliding_window=window, cpu_isa=isa,
                                  causal=False)
        want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, sliding_window=window, causal=False)
        torch.testing.assert_close(got.double(), want, **TOL[dtype])


def test_an_input_is_the_same_alone_and_beside_others_bidirectionally():
    """An encoder's input gets the same bits whatever else the step holds."""
    seqs = [(200, 200), (33, 33), (77, 77)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, 64, 16, torch.bfloat16, seed=3)
    q = torch.randn(int(qsl[-1]), 4 * 64).to(torch.bfloat16)
    together = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, causal=False)
    for i in range(len(seqs)):
        a, b = int(qsl[i]), int(qsl[i + 1])
        alone = ops.paged_attention(q[a:b], kc, vc, table[i:i + 1], seq_lens[i:i + 1],
                                    torch.tensor([0, b - a], dtype=torch.int32), 0.125, causal=False)
        assert torch.equal(alone.view(torch.int16), together[a:b].view(torch.int16))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [1, 4, 6, 10])
@pytest.mark.parametrize("softcap", [5.0, 50.0])
def test_soft_capped_scores_match_the_reference(softcap, case, dtype, isa):
    """softcap * tanh(s / softcap) of the scaled scores before the softmax, on every fold: the span
    folds (block sizes 16), the per-token and generic ones (block size 8). Scores of sd 4 (the scale
    4 / sqrt(head_size)) are large enough for a cap of 5 to change many of them; at the scale 1 (sd
    sqrt(head_size), up to 16) fp32's own rounding of the dot products reached the fp32 tolerance
    (a head of 256: 2e-5 at about one run in six)."""
    seqs, heads, kv_heads, head_size, block_size = CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, dtype, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size).to(dtype)
    scale = 4.0 * head_size**-0.5
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, cpu_isa=isa, softcap=softcap)
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, softcap=softcap)
    uncapped = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale)
    torch.testing.assert_close(got.double(), want, **TOL[dtype])
    if softcap == 5.0:  # the cap changed the result well beyond the tolerance
        assert (want - uncapped).abs().max() > 0.2


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("case", [1, 4, 5, 6, 10])
def test_attention_sinks_match_the_reference(case, dtype, isa):
    """gpt-oss's sinks, a logit per head in each row's softmax denominator: on every fold, the
    split long decode's combine step (case 5) included. The sinks range from far below the rows'
    scores (no effect) to far above (the outputs shrink towards 0; the kernel's max then the
    sink's), sd-4 scores as in the soft-cap test."""
    seqs, heads, kv_heads, head_size, block_size = CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, dtype, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size).to(dtype)
    scale = 4.0 * head_size**-0.5
    sinks = torch.linspace(-30.0, 40.0, heads)
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, cpu_isa=isa, sinks=sinks)
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale, sinks=sinks)
    without = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, scale)
    torch.testing.assert_close(got.double(), want, **TOL[dtype])
    assert (want - without).abs().max() > 0.2  # the sinks changed the result well beyond the tolerance


def test_bad_sinks_are_refused():
    kc, vc, table, seq_lens, qsl = make_batch([(10, 10)], 1, 64, 16, torch.float32, seed=0)
    q = torch.randn(10, 128)
    with pytest.raises(ValueError, match=r"sinks must have shape \(2,\)"):
        ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sinks"):
        ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sinks=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="attention sink of head 1 is not finite: nan"):
        ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sinks=torch.tensor([0.0, float("nan")]))


def test_a_bad_softcap_is_refused():
    kc, vc, table, seq_lens, qsl = make_batch([(10, 10)], 1, 64, 16, torch.float32, seed=0)
    q = torch.randn(10, 64)
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="softcap must be 0"):
            ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, softcap=bad)


def test_a_path_this_cpu_cannot_run_or_an_unknown_one_is_refused():
    kc, vc, table, seq_lens, qsl = make_batch([(5, 5)], 1, 64, 16, torch.bfloat16, seed=0)
    q = torch.randn(5, 64).bfloat16()
    with pytest.raises(ValueError, match="unknown instruction-set path 'sse2'"):
        ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, cpu_isa="sse2")
    for isa in ("avx2", "avx512", "avx512bf16", "amx"):
        if isa not in ISAS:
            with pytest.raises(ValueError, match=f"paged_attention: this CPU cannot run the {isa} path"):
                ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, cpu_isa=isa)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("context", [100, 300, 1000, 2048])
def test_a_decode_is_the_same_alone_and_in_a_batch(context, isa):
    """A long decode's KV range is split at fixed points: alone or beside two others (few work
    units: each split an item of its own, on any thread, merged afterwards) or in a batch of many
    (each sequence's item folds its splits itself), its row gets the same bits."""
    many = 8 * torch.get_num_threads()
    seqs = [(context, 1), (50, 1), (700, 1)] + [(40 + 7 * i, 1) for i in range(many)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 3, 64, 16, torch.bfloat16, seed=1)
    q = torch.randn(len(seqs), 9 * 64, generator=torch.Generator().manual_seed(2)).bfloat16()
    batch = ops.paged_attention(q[:3], kc, vc, table[:3], seq_lens[:3], qsl[:4], 0.125, cpu_isa=isa)
    alone = ops.paged_attention(q[:1], kc, vc, table[:1], seq_lens[:1], qsl[:2], 0.125, cpu_isa=isa)
    crowd = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, cpu_isa=isa)
    assert torch.equal(alone[0], batch[0])
    assert torch.equal(alone[0], crowd[0])
    assert torch.equal(batch[2], crowd[2])
    want = ref.paged_attention(q[:1], kc, vc, table[:1], seq_lens[:1], qsl[:2], 0.125)
    torch.testing.assert_close(alone.double(), want, **TOL[torch.bfloat16])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("block_size", [16, 32])
def test_a_token_is_the_same_in_any_chunk(block_size, isa):
    """A prefill of 300 tokens at once, and the same tokens in chunks of 5, 1, 17, 17, 1, 259
    (a chunk's queries see the keys up to them): every token's row gets the same bits, whether
    it shares its work item with 15 others or is alone like a decode."""
    L = 300
    kc, vc, table, seq_lens, qsl = make_batch([(L, L)], 3, 64, block_size, torch.bfloat16, seed=5)
    q = torch.randn(L, 9 * 64, generator=torch.Generator().manual_seed(6)).bfloat16()
    whole = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, cpu_isa=isa)
    bounds = [0, 5, 6, 23, 40, 41, L]
    for a, b in zip(bounds, bounds[1:]):
        chunk = ops.paged_attention(q[a:b], kc, vc, table, torch.tensor([b], dtype=torch.int32),
                                    torch.tensor([0, b - a], dtype=torch.int32), 0.125, cpu_isa=isa)
        assert torch.equal(chunk, whole[a:b]), f"tokens [{a}, {b})"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_random_batches(dtype):
    """Random shapes; in bf16 they reach the per-token fold (one query token), the span fold
    (several) and the generic path (block sizes under 16, head size 80)."""
    rng = random.Random(0 if dtype == torch.float32 else 1)
    for trial in range(25):
        kv_heads = rng.choice([1, 2, 3])
        heads = kv_heads * rng.choice([1, 2, 3, 4])
        head_size = rng.choice([32, 64, 80, 128, 256])
        block_size = rng.choice([4, 8, 16, 32, 64, 128])
        seqs = []
        for _ in range(rng.randrange(1, 6)):
            L = rng.randrange(1, 300)
            seqs.append((L, rng.choice([1, L, rng.randrange(1, L + 1)])))
        kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, dtype, trial)
        q = torch.randn(int(qsl[-1]), heads * head_size).to(dtype)
        got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.1)
        want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.1)
        torch.testing.assert_close(got.double(), want, **TOL[dtype], msg=f"trial {trial}: {seqs}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [2, 16, 32])
def test_reshape_and_cache_writes_each_slot(dtype, block_size):
    num_blocks, kv_heads, head_size, n = 40, 3, 64, 20
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, kv_heads, head_size, block_size, dtype)
    kc, vc = torch.zeros(k_shape, dtype=dtype), torch.zeros(v_shape, dtype=dtype)
    slots = torch.randperm(num_blocks * block_size)[:n].to(torch.int32)
    slots[3] = -1  # padding: skipped
    kv = torch.randn(n, 2 * kv_heads * head_size).to(dtype)
    key, value = kv[:, : kv_heads * head_size], kv[:, kv_heads * head_size :]  # strided views
    ops.reshape_and_cache(key, value, kc, vc, slots)
    k_all, v_all = ops.unpack_kv_cache(kc, vc)  # [blocks, block_size, kv_heads, head_size]
    for t in range(n):
        s = int(slots[t])
        if s < 0:
            continue
        b, o = divmod(s, block_size)
        assert torch.equal(k_all[b, o], key[t].view(kv_heads, head_size))
        assert torch.equal(v_all[b, o], value[t].view(kv_heads, head_size))
    written = (k_all != 0).any(dim=-1).sum().item()
    assert written == (n - 1) * kv_heads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size", [2, 16, 32])
def test_reshape_and_cache_writes_runs_of_consecutive_slots(dtype, block_size):
    """A prefill's tokens take consecutive slots: runs starting on odd and even slots, crossing
    blocks, a token alone between runs, a padded token inside a run; every other slot stays zero."""
    num_blocks, kv_heads, head_size = 12, 3, 64
    k_shape, v_shape = ops.kv_cache_shapes(num_blocks, kv_heads, head_size, block_size, dtype)
    kc, vc = torch.zeros(k_shape, dtype=dtype), torch.zeros(v_shape, dtype=dtype)
    runs = [range(3, 3 + 2 * block_size + 1), range(4 * block_size, 4 * block_size + 6), [7 * block_size + 1],
            range(8 * block_size, 8 * block_size + 5)]
    slots = torch.tensor([s for run in runs for s in run], dtype=torch.int32)
    slots[-3] = -1  # padding inside the last run: its neighbours are written alone
    n = len(slots)
    kv = torch.randn(n, 2 * kv_heads * head_size).to(dtype)
    key, value = kv[:, : kv_heads * head_size], kv[:, kv_heads * head_size :]
    ops.reshape_and_cache(key, value, kc, vc, slots)
    k_all, v_all = ops.unpack_kv_cache(kc, vc)
    want_k, want_v = torch.zeros_like(k_all), torch.zeros_like(v_all)
    for t in range(n):
        if int(slots[t]) >= 0:
            b, o = divmod(int(slots[t]), block_size)
            want_k[b, o], want_v[b, o] = key[t].view(kv_heads, head_size), value[t].view(kv_heads, head_size)
    assert torch.equal(k_all, want_k)
    assert torch.equal(v_all, want_v)


def test_prefill_then_decode_through_the_cache_equals_dense_attention():
    """Write K/V with reshape_and_cache step by step, attend, compare with dense causal attention."""
    torch.manual_seed(0)
    heads, kv_heads, hd, bs, L = 6, 2, 64, 16, 45
    k_shape, v_shape = ops.kv_cache_shapes(8, kv_heads, hd, bs, torch.float32)
    kc, vc = torch.zeros(k_shape), torch.zeros(v_shape)
    table = torch.tensor([[5, 2, 7, 0]], dtype=torch.int32)
    K, V, Q = torch.randn(L, kv_heads * hd), torch.randn(L, kv_heads * hd), torch.randn(L, heads * hd)
    slot = lambda p: int(table[0, p // bs]) * bs + p % bs  # noqa: E731
    outs = []
    for lo, hi in [(0, 30), (30, 31), (31, 40), (40, 45)]:  # prefill, decode, chunk, chunk
        ops.reshape_and_cache(K[lo:hi], V[lo:hi], kc, vc, torch.tensor([slot(p) for p in range(lo, hi)], dtype=torch.int32))
        outs.append(ops.paged_attention(Q[lo:hi], kc, vc, table, torch.tensor([hi], dtype=torch.int32),
                                        torch.tensor([0, hi - lo], dtype=torch.int32), hd**-0.5))
    got = torch.cat(outs)
    q = Q.view(L, heads, hd).transpose(0, 1)
    k = K.view(L, kv_heads, hd).repeat_interleave(3, 1).transpose(0, 1)
    v = V.view(L, kv_heads, hd).repeat_interleave(3, 1).transpose(0, 1)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1).reshape(L, -1)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def test_attention_rejects_bad_metadata():
    kc, vc, table, seq_lens, qsl = make_batch([(20, 20)], 2, 64, 16, torch.float32, 0)
    q = torch.randn(20, 4 * 64)
    with pytest.raises(ValueError, match="block_table\\[1\\] = 99 is outside the cache"):
        bad = table.clone()
        bad[0, 1] = 99
        ops.paged_attention(q, kc, vc, bad, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="query_start_loc\\[-1\\] = 20 but q has 19 tokens"):
        ops.paged_attention(q[:19], kc, vc, table, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="21 query tokens but seq_len 20"):
        ops.paged_attention(torch.randn(21, 256), kc, vc, table, seq_lens, torch.tensor([0, 21], dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="q must be torch.float32"):
        ops.paged_attention(q.bfloat16(), kc, vc, table, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="not a multiple of num_kv_heads"):
        ops.paged_attention(torch.randn(20, 3 * 64), kc, vc, table, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="key_cache must be contiguous"):
        ops.paged_attention(q, kc.transpose(2, 3), vc, table, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="last dimension must be 2"):
        bf_k, bf_v = ops.kv_cache_shapes(8, 2, 64, 16, torch.float32)
        ops.paged_attention(q.bfloat16(), torch.zeros(bf_k, dtype=torch.bfloat16),
                            torch.zeros(bf_v, dtype=torch.bfloat16), table, seq_lens, qsl, 0.1)
    with pytest.raises(ValueError, match="is outside the cache's"):
        ops.reshape_and_cache(torch.randn(1, 128), torch.randn(1, 128), kc, vc,
                              torch.tensor([10**6], dtype=torch.int32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seqs", [[(21, 21)], [(37, 1)], [(50, 7)], [(100, 100)]])
def test_stale_nan_slots_past_the_sequence_do_not_leak(dtype, seqs, isa):
    """Slots of the last block beyond seq_len hold whatever an earlier owner left (here NaN); the
    kernels must not let them reach the output, on any path, in neither the per-token nor the span fold."""
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 3, 64, 16, dtype, seed=4)
    L = seqs[0][0]
    last_block, used = int(table[0, (L - 1) // 16]), (L - 1) % 16 + 1
    x = ops.kv_pack(dtype)
    kc.view(kc.shape[0], 3, 64 // x, 16, x)[last_block, :, :, used:, :] = float("nan")  # keys past L
    vc_rows = vc.permute(0, 2, 4, 1, 3).reshape(vc.shape[0], 16, 3, 64).clone()  # [blocks, slot, head, dim]
    vc_rows[last_block, used:] = float("nan")
    vc.copy_(vc_rows.view(vc.shape[0], 16 // x, x, 3, 64).permute(0, 3, 1, 4, 2))
    k_all, v_all = ops.unpack_kv_cache(kc, vc)
    assert torch.isnan(k_all[last_block, used:]).all() and torch.isnan(v_all[last_block, used:]).all()
    q = torch.randn(int(qsl[-1]), 9 * 64).to(dtype)
    got = ops.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, cpu_isa=isa)
    assert not torch.isnan(got).any()
    want = ref.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125)
    torch.testing.assert_close(got.double(), want, **TOL[dtype])
