"""The CUDA kernels against the float64 references (the same ones the CPU kernels are held to),
in bfloat16, float16 and float32. Skipped without a GPU or without corellm._cuda."""

from __future__ import annotations

import pytest
import torch

from corellm import ops
from corellm.ops._backend import cuda_available
from tests.ops import reference
from tests.ops.test_attention import CASES as ATTENTION_CASES
from tests.ops.test_attention import make_batch

pytestmark = pytest.mark.skipif(not (cuda_available() and torch.cuda.is_available()),
                                reason="needs corellm._cuda and a CUDA GPU")

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
TOL = {torch.bfloat16: 2e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def close(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(got.cpu().double(), want.cpu().double(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, hidden", [(1, 576), (7, 4096), (130, 896), (3, 5120)])
def test_rms_norm(dtype, tokens, hidden):
    g = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
    got = ops.rms_norm(x.cuda(), w.cuda(), 1e-5)
    close(got, reference.rms_norm(x, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_add_rms_norm_in_place(dtype):
    g = torch.Generator().manual_seed(1)
    x, r = torch.randn(33, 576, generator=g).to(dtype), torch.randn(33, 576, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(576, generator=g)).to(dtype)
    xc, rc = x.cuda(), r.cuda()
    out, res = ops.fused_add_rms_norm(xc, rc, w.cuda(), 1e-5)
    want_res = (x.double() + r.double()).to(dtype)
    assert out.data_ptr() == xc.data_ptr() and res.data_ptr() == rc.data_ptr()
    close(res, want_res, dtype)
    close(out, reference.rms_norm(want_res, w, 1e-5), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, d", [(1, 1536), (64, 1536), (5, 300)])
def test_silu_and_mul(dtype, tokens, d):
    x = torch.randn(tokens, 2 * d, generator=torch.Generator().manual_seed(d)).to(dtype)
    close(ops.silu_and_mul(x.cuda()), reference.silu_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, d", [(1, 2048), (64, 2048), (5, 300)])
def test_gelu_tanh_and_mul(dtype, tokens, d):
    x = (3 * torch.randn(tokens, 2 * d, generator=torch.Generator().manual_seed(d))).to(dtype)
    close(ops.gelu_tanh_and_mul(x.cuda()), reference.gelu_tanh_and_mul(x), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("rot_dim", [64, 32])
def test_rotary_on_strided_qkv_views(dtype, is_neox, rot_dim):
    g = torch.Generator().manual_seed(rot_dim)
    n, heads, kv_heads, head = 17, 9, 3, 64
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head, generator=g).to(dtype)
    positions = torch.randint(0, 2048, (n,), generator=g, dtype=torch.int32)
    cache = reference.cos_sin_cache(2048, rot_dim)
    want_q = reference.rotary(positions, qkv[:, : heads * head], head, cache, is_neox)
    want_k = reference.rotary(positions, qkv[:, heads * head : (heads + kv_heads) * head], head, cache, is_neox)
    dev = qkv.cuda()
    q, k = dev[:, : heads * head], dev[:, heads * head : (heads + kv_heads) * head]
    ops.rotary_embedding(positions.cuda(), q, k, head, cache.cuda(), is_neox=is_neox)
    close(q, want_q, dtype)
    close(k, want_k, dtype)
    assert torch.equal(dev[:, (heads + kv_heads) * head :].cpu(), qkv[:, (heads + kv_heads) * head :])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("block_size", [16, 32])
def test_reshape_and_cache_matches_the_cpu_layout(dtype, block_size):
    g = torch.Generator().manual_seed(block_size)
    nb, kv_heads, head, n = 8, 3, 64, 20
    k_shape, v_shape = ops.kv_cache_shapes(nb, kv_heads, head, block_size, dtype)
    slots = torch.randperm(nb * block_size, generator=g)[:n].to(torch.int32)
    slots[3] = -1  # a padded token: skipped
    key = torch.randn(n, kv_heads * head, generator=g).to(dtype)
    value = torch.randn(n, kv_heads * head, generator=g).to(dtype)
    kc, vc = torch.zeros(k_shape, dtype=dtype), torch.zeros(v_shape, dtype=dtype)
    kg, vg = kc.cuda(), vc.cuda()
    ops.reshape_and_cache(key.cuda(), value.cuda(), kg, vg, slots.cuda())
    if dtype != torch.float16:  # the CPU kernels have no fp16: compare with them where they exist
        ops.reshape_and_cache(key, value, kc, vc, slots)
        assert torch.equal(kg.cpu(), kc) and torch.equal(vg.cpu(), vc)
    k_all, v_all = ops.unpack_kv_cache(kg.cpu(), vg.cpu())
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            b, o = divmod(slot, block_size)
            assert torch.equal(k_all[b, o].reshape(-1), key[t]) and torch.equal(v_all[b, o].reshape(-1), value[t])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(ATTENTION_CASES)))
@pytest.mark.parametrize("pass_max_query_len", [True, False])
def test_paged_attention(dtype, case, pass_max_query_len):
    """The CPU kernel's cases: prefill, chunks after prefix hits, decode, long contexts, GQA."""
    seqs, heads, kv_heads, head_size, block_size = ATTENTION_CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, block_size, dtype, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size, generator=torch.Generator().manual_seed(case)).to(dtype)
    scale = head_size**-0.5
    max_q = max(n for _, n in seqs) if pass_max_query_len else None
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), scale,
                              max_query_len=max_q)
    want = reference.paged_attention(q, kc, vc, table, seq_lens, qsl, scale)
    close(got, want, dtype)


@pytest.mark.parametrize("window", [1, 7, 16, 50])
def test_paged_attention_sliding_window(window):
    seqs = [(80, 80), (200, 1), (120, 30)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, 64, 16, torch.bfloat16, seed=window)
    q = torch.randn(int(qsl[-1]), 4 * 64).bfloat16()
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), 0.125,
                              sliding_window=window)
    want = reference.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sliding_window=window)
    close(got, want, torch.bfloat16)


# Decode batches (one query token per sequence, 16-bit) take the split-K kernel: contexts cut into
# partitions of 512 keys dealt to a few thread blocks each (cuda/decode_attention.cu), merged by a
# second kernel.
DECODE_CASES = [
    # (seq_lens, num_heads, num_kv_heads, head_size)
    ([1, 511, 512, 513, 2000, 4097], 9, 3, 64),  # SmolLM2; lengths at the partitions' edges
    ([3000, 17, 1024], 32, 8, 128),  # Llama-3-8B shape
    ([1500, 40], 16, 8, 128),  # Qwen3-0.6B shape
    ([1025, 700, 5], 8, 1, 32),  # one KV head for 8 query heads
    ([999, 64], 4, 4, 64),  # MHA
    ([600 + 3 * i for i in range(200)], 8, 4, 64),  # a batch wide enough for one split per sequence
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(DECODE_CASES)))
@pytest.mark.parametrize("grid", ["exact", "graph"])
def test_decode_attention_over_partitions(dtype, case, grid):
    """grid 'graph': sized for 8192 keys, as a captured graph's is (the extra partitions idle)."""
    lens, heads, kv_heads, head_size = DECODE_CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch([(n, 1) for n in lens], kv_heads, head_size, 16, dtype, seed=case)
    q = torch.randn(len(lens), heads * head_size, generator=torch.Generator().manual_seed(case)).to(dtype)
    scale = head_size**-0.5
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), scale,
                              max_query_len=1, max_seq_len=max(lens) if grid == "exact" else 8192)
    close(got, reference.paged_attention(q, kc, vc, table, seq_lens, qsl, scale), dtype)


@pytest.mark.parametrize("window", [1, 100, 600, 1500])
def test_decode_attention_sliding_window_across_partitions(window):
    lens = [2000, 513, 90]
    kc, vc, table, seq_lens, qsl = make_batch([(n, 1) for n in lens], 2, 64, 16, torch.bfloat16, seed=window)
    q = torch.randn(len(lens), 4 * 64).bfloat16()
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), 0.125,
                              sliding_window=window)
    want = reference.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.125, sliding_window=window)
    close(got, want, torch.bfloat16)


# Sequences of 16 query tokens or more (16-bit, head 64 / 128, block 16) take the tensor-core
# kernel (cuda/prefill_attention.cu); shorter ones in the same batch the scalar one.
PREFILL_CASES = [
    # (seqs [(seq_len, query_len)], num_heads, num_kv_heads, head_size)
    ([(1000, 1000)], 9, 3, 64),  # a whole prompt: many query and key tiles
    ([(700, 100), (64, 64), (17, 16)], 16, 8, 128),  # chunks after prefixes; tile edges
    ([(300, 1), (520, 200), (90, 2), (33, 33)], 32, 8, 128),  # mixed with decode rows
    ([(129, 129), (65, 65)], 4, 4, 64),  # MHA
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", range(len(PREFILL_CASES)))
def test_prefill_attention_on_tensor_cores(dtype, case):
    seqs, heads, kv_heads, head_size = PREFILL_CASES[case]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, kv_heads, head_size, 16, dtype, seed=case)
    q = torch.randn(int(qsl[-1]), heads * head_size, generator=torch.Generator().manual_seed(case)).to(dtype)
    scale = head_size**-0.5
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), scale,
                              max_query_len=max(n for _, n in seqs))
    close(got, reference.paged_attention(q, kc, vc, table, seq_lens, qsl, scale), dtype)


@pytest.mark.parametrize("window", [1, 40, 300])
def test_prefill_attention_sliding_window_on_tensor_cores(window):
    seqs = [(500, 500), (300, 64)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, 128, 16, torch.bfloat16, seed=window)
    q = torch.randn(int(qsl[-1]), 4 * 128).bfloat16()
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), 0.088,
                              sliding_window=window)
    want = reference.paged_attention(q, kc, vc, table, seq_lens, qsl, 0.088, sliding_window=window)
    close(got, want, torch.bfloat16)


# Every head size the CUDA attention is built for, in each of its kernels: a prompt of 40 tokens
# (16-bit: the tensor-core kernel, or the scalar one where its tiles do not fit the device's shared
# memory), a 5-token chunk after a prefix (scalar), decode rows in the same batch (scalar) and alone
# (16-bit: the split-K kernel where the head size divides 128, else the scalar one).
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_size", [16, 32, 64, 80, 96, 128, 256])
@pytest.mark.parametrize("batch", ["mixed", "decode"])
def test_paged_attention_every_head_size(dtype, head_size, batch):
    seqs = [(40, 40), (70, 5), (600, 1)] if batch == "mixed" else [(600, 1), (33, 1), (1100, 1)]
    kc, vc, table, seq_lens, qsl = make_batch(seqs, 2, head_size, 16, dtype, seed=head_size)
    q = torch.randn(int(qsl[-1]), 4 * head_size, generator=torch.Generator().manual_seed(head_size)).to(dtype)
    scale = head_size**-0.5
    got = ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), scale,
                              max_query_len=max(n for _, n in seqs), max_seq_len=max(n for n, _ in seqs))
    close(got, reference.paged_attention(q, kc, vc, table, seq_lens, qsl, scale), dtype)


def test_paged_attention_names_an_unsupported_head_size():
    kc, vc, table, seq_lens, qsl = make_batch([(20, 20)], 1, 72, 16, torch.bfloat16, seed=0)
    q = torch.randn(20, 72).bfloat16()
    with pytest.raises(ValueError, match="head_size 72 is not supported on CUDA"):
        ops.paged_attention(q.cuda(), kc.cuda(), vc.cuda(), table.cuda(), seq_lens.cuda(), qsl.cuda(), 0.1)
