"""rms_norm, fused_add_rms_norm, scale, silu_and_mul, gelu_tanh_and_mul and rotary_embedding against torch
references."""

from __future__ import annotations

import pytest
import torch

from corellm import ops
from tests.ops import reference as ref

TOL = {torch.float32: dict(atol=2e-5, rtol=2e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, hidden", [(1, 64), (7, 576), (300, 576), (33, 1000)])
def test_rms_norm(dtype, num_tokens, hidden):
    g = torch.Generator().manual_seed(num_tokens * hidden)
    x = torch.randn(num_tokens, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), ref.rms_norm(x, w, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_on_strided_rows(dtype):
    x = torch.randn(9, 3 * 64).to(dtype)
    view = x[:, 64:128]  # a row-strided view, e.g. k inside a fused qkv output
    w = torch.randn(64).to(dtype)
    torch.testing.assert_close(ops.rms_norm(view, w, 1e-6), ref.rms_norm(view, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens", [1, 5, 200])
def test_fused_add_rms_norm(dtype, num_tokens):
    x = torch.randn(num_tokens, 576).to(dtype)
    r = torch.randn(num_tokens, 576).to(dtype)
    w = torch.randn(576).to(dtype)
    want_res = (x.float() + r.float()).to(dtype)
    want_x = ref.rms_norm(want_res, w, 1e-6)
    got_x, got_res = ops.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-6)
    torch.testing.assert_close(got_res, want_res, atol=0, rtol=0)
    torch.testing.assert_close(got_x, want_x, **TOL[dtype])


@pytest.mark.parametrize("hidden", [576, 1000, 64])
def test_fused_add_rms_norm_is_add_then_rms_norm_bit_for_bit(hidden):
    """A layer's input norm is the fused kernel, the first layer's the plain one: for the same
    residual they must give the same bits (one pass over the sum and its squares, or two)."""
    g = torch.Generator().manual_seed(hidden)
    x, r = (4 * torch.randn(33, hidden, generator=g)).bfloat16(), torch.randn(33, hidden, generator=g).bfloat16()
    w = torch.randn(hidden, generator=g).bfloat16()
    got_x, got_res = ops.fused_add_rms_norm(x.clone(), r.clone(), w, 1e-5)
    res = (x.float() + r.float()).bfloat16()
    assert torch.equal(got_res.view(torch.int16), res.view(torch.int16))
    assert torch.equal(got_x.view(torch.int16), ops.rms_norm(res, w, 1e-5).view(torch.int16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, d", [(1, 576), (13, 100), (300, 576)])
def test_scale_is_torchs_product_bit_for_bit(dtype, num_tokens, d):
    """In place, on every row of a strided view: torch's x * factor (the product in fp32, rounded
    once), the other columns untouched."""
    base = torch.randn(num_tokens, d + 8).to(dtype)
    x = base.clone()
    assert ops.scale(x[:, :d], 0.22) is not None
    assert torch.equal(x[:, :d], base[:, :d] * 0.22) and torch.equal(x[:, d:], base[:, d:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, d", [(1, 1536), (13, 100), (257, 1536)])
def test_silu_and_mul(dtype, num_tokens, d):
    x = (3 * torch.randn(num_tokens, 2 * d)).to(dtype)
    torch.testing.assert_close(ops.silu_and_mul(x), ref.silu_and_mul(x), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_tokens, d", [(1, 2048), (13, 100), (257, 2048)])
def test_gelu_tanh_and_mul(dtype, num_tokens, d):
    x = (3 * torch.randn(num_tokens, 2 * d)).to(dtype)
    torch.testing.assert_close(ops.gelu_tanh_and_mul(x), ref.gelu_tanh_and_mul(x), **TOL[dtype])


def test_gelu_tanh_and_mul_matches_torch_gelu_in_float32():
    """The kernel's x / (1 + e^(-2u)) form against torch's own approximate="tanh" GELU."""
    x = torch.linspace(-12, 12, 2 * 4096).reshape(2, 4096)
    d = x.shape[1] // 2
    want = torch.nn.functional.gelu(x[:, :d], approximate="tanh") * x[:, d:]
    torch.testing.assert_close(ops.gelu_tanh_and_mul(x), want, atol=1e-5, rtol=1e-5)


def test_gelu_tanh_extremes_are_finite():
    x = torch.tensor([[-200.0, -20.0, 0.0, 20.0, 200.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    got = ops.gelu_tanh_and_mul(x)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0, 0.0, 20.0, 200.0]]), atol=1e-4, rtol=1e-6)


def test_silu_extremes_are_finite():
    x = torch.tensor([[-200.0, -88.0, 0.0, 88.0, 200.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    got = ops.silu_and_mul(x)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.0, 0.0, 88.0, 200.0]]), atol=1e-4, rtol=1e-6)


@pytest.mark.parametrize("op", [ops.silu_and_mul, ops.gelu_tanh_and_mul])
def test_gated_activation_bits_do_not_depend_on_the_width(op):
    """The bf16 loop takes whole registers of columns and the last few one at a time: a value gets
    the same bits either way (here all 256 in registers with d = 256, then each alone with d = 1)."""
    g = torch.Generator().manual_seed(5)
    gate = torch.cat([6 * torch.randn(200, generator=g), -120 * torch.rand(40, generator=g),
                      torch.tensor([0.0, -0.0, 88.7, -88.7, 100.0, -100.0, 1e-39, -1e-39, 3.0, -3.0, 5.5, -5.5,
                                    float("inf"), -float("inf"), 40.0, -40.0])])
    up = torch.cat([torch.randn(240, generator=g), 1e-3 * torch.rand(16, generator=g)])
    wide = op(torch.cat([gate, up]).reshape(1, -1).bfloat16())
    one_by_one = op(torch.stack([gate, up], dim=1).bfloat16())
    assert torch.equal(wide.view(torch.int16).reshape(-1), one_by_one.view(torch.int16).reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("heads, kv_heads, head_size, rot_dim", [(9, 3, 64, 64), (4, 4, 128, 64), (8, 2, 32, 32)])
def test_rotary_embedding(dtype, is_neox, heads, kv_heads, head_size, rot_dim):
    n = 17
    cache = ref.cos_sin_cache(4096, rot_dim)
    positions = torch.randint(0, 4096, (n,), dtype=torch.int32)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * head_size).to(dtype)
    q = qkv[:, : heads * head_size]
    k = qkv[:, heads * head_size : (heads + kv_heads) * head_size]
    want_q = ref.rotary(positions, q, head_size, cache, is_neox)
    want_k = ref.rotary(positions, k, head_size, cache, is_neox)
    v_before = qkv[:, (heads + kv_heads) * head_size :].clone()
    ops.rotary_embedding(positions, q, k, head_size, cache, is_neox)
    torch.testing.assert_close(q, want_q, **TOL[dtype])
    torch.testing.assert_close(k, want_k, **TOL[dtype])
    assert torch.equal(qkv[:, (heads + kv_heads) * head_size :], v_before)  # v untouched


def test_rotary_rejects_positions_outside_the_cache():
    cache = ref.cos_sin_cache(16, 64)
    q, k = torch.randn(1, 64), torch.randn(1, 64)
    with pytest.raises(ValueError, match=r"positions\[0\] = 16 is outside the rotary cache \[0, 16\)"):
        ops.rotary_embedding(torch.tensor([16], dtype=torch.int32), q, k, 64, cache)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: ops.rms_norm(torch.randn(2, 8, dtype=torch.float16), torch.randn(8, dtype=torch.float16), 1e-6),
         "dtype torch.float16 is not supported"),
        (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(8).bfloat16(), 1e-6), "weight must be torch.float32"),
        (lambda: ops.rms_norm(torch.randn(2, 8), torch.randn(9), 1e-6), r"weight must have shape \(8,\)"),
        (lambda: ops.rms_norm(torch.randn(8), torch.randn(8), 1e-6), "x must have 2 dimensions"),
        (lambda: ops.rms_norm(torch.randn(8, 2).t(), torch.randn(8), 1e-6), "contiguous within a row"),
        (lambda: ops.rms_norm([[1.0]], torch.randn(1), 1e-6), "x must be a torch.Tensor"),
        (lambda: ops.rms_norm(torch.randn(2, 8, device="meta"), torch.randn(8, device="meta"), 1e-6),
         "tensors on meta are not supported"),
        (lambda: ops.silu_and_mul(torch.randn(2, 7)), "must be even"),
        (lambda: ops.scale(torch.randn(4), 2.0), "x must have 2 dimensions"),
        (lambda: ops.fused_add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-6),
         r"residual must have shape \(2, 8\)"),
        (lambda: ops.rotary_embedding(torch.zeros(2, dtype=torch.int64), torch.randn(2, 64), torch.randn(2, 64), 64,
                                      ref.cos_sin_cache(8, 64)), "positions must be torch.int32"),
    ],
)
def test_bad_inputs_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_kernels_share_torchs_openmp_runtime():
    """One libgomp in a process that uses corellm: its kernels and torch's matmuls share one
    thread pool. (Checked in a fresh process: other test dependencies bring their own.)"""
    import subprocess
    import sys

    code = ("import corellm, torch; from corellm import ops; ops.rms_norm(torch.randn(2, 8), torch.randn(8), 1e-6); "
            "print(sorted({l.split()[-1] for l in open('/proc/self/maps') if 'libgomp' in l}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    libs = eval(out)  # noqa: S307 - our own printed list
    assert len(libs) == 1 and "torch" in libs[0], libs
