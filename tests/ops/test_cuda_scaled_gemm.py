"""The scaled W8A8 GEMM on the GPU (cuda/scaled_gemm.cu, CUTLASS's sm_90a kernels) and the per-row
activation quantization that feeds it, against float64 references computed on the same quantized
values. Skipped without a Hopper GPU and a corellm._cuda built with CUTLASS.

Error bounds: int8 sums are exact (int32), so the only error is the bf16 rounding of the output
(relative 2^-8). fp8 runs with fast accumulation (the tensor cores' own sums, which keep about 14
bits, not promoted to full fp32): the bound is the bf16 rounding plus 2^-13 of sum_k |a_ik b_jk|
for each of the k / 32 tensor-core steps (a worst case; random data stays far inside it)."""

from __future__ import annotations

import pytest
import torch

from corellm import ops
from corellm.ops.scaled_gemm import SCALED_TYPES, scaled_gemm_built

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and scaled_gemm_built() and torch.cuda.get_device_capability() == (9, 0)),
    reason="needs a Hopper GPU (compute capability 9.0) and corellm._cuda built with CUTLASS")

TYPES = list(SCALED_TYPES)


def reference_quantize_rows(x: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    dtype, limit = SCALED_TYPES[qtype]
    x = x.float()
    amax = x.abs().amax(dim=1)
    scales = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
    q = torch.clamp(x / scales[:, None], -limit, limit)
    return (q.to(dtype) if qtype == "fp8" else torch.round(q).to(dtype)), scales


def random_operands(m: int, n: int, k: int, qtype: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4
    w = torch.randn(n, k, generator=g) * torch.rand(n, 1, generator=g)
    a, a_scales = reference_quantize_rows(x, qtype)
    b, b_scales = reference_quantize_rows(w, qtype)
    return a, a_scales, b, b_scales


def check_product(got: torch.Tensor, a, a_scales, b, b_scales, qtype: str) -> None:
    a64, b64 = a.double(), b.double()
    scale = a_scales.double().reshape(-1, 1) * b_scales.double().reshape(1, -1)
    want = scale * (a64 @ b64.T)
    steps = a.shape[1] / 32
    accumulation = steps * 2**-13 if qtype == "fp8" else 0.0
    bound = want.abs() * 2**-8 + scale * (a64.abs() @ b64.abs().T) * accumulation + 1e-30
    err = (got.cpu().double() - want).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{qtype}: error {worst:.2f}x the bound"


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_quantize_rows_equals_the_reference(qtype, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(37, 1000, generator=g) * 3).to(dtype)
    x[5] = 0  # a row of zeros: scale 1, zeros
    wide = torch.zeros(37, 1100, dtype=dtype)
    wide[:, :1000] = x
    q, scales = ops.quantize_rows(wide.cuda()[:, :1000], qtype)  # strided rows
    want_q, want_scales = reference_quantize_rows(x, qtype)
    torch.testing.assert_close(scales.cpu(), want_scales, rtol=0, atol=0)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m, n, k", [(1, 128, 64), (7, 136, 576), (64, 960, 576), (65, 256, 80),
                                     (300, 1536, 576), (1024, 4096, 4096)])
def test_scaled_gemm_per_token_per_channel(qtype, m, n, k):
    a, a_scales, b, b_scales = random_operands(m, n, k, qtype, seed=m + n + k)
    got = ops.scaled_gemm(a.cuda(), a_scales.cuda(), b.cuda(), b_scales.cuda())
    assert got.dtype == torch.bfloat16 and got.shape == (m, n)
    check_product(got, a, a_scales, b, b_scales, qtype)


@pytest.mark.parametrize("qtype", TYPES)
def test_scaled_gemm_per_tensor_scales_and_a_column_slice(qtype):
    m, n, k = 33, 264, 256
    a, _, b, _ = random_operands(m, n, k, qtype, seed=5)
    a_scale, b_scale = torch.tensor([0.0125]), torch.tensor([0.003])
    out = torch.full((m, n + 16), 7.0, dtype=torch.bfloat16, device="cuda")
    ops.scaled_gemm(a.cuda(), a_scale.cuda(), b.cuda(), b_scale.cuda(), out=out[:, 8 : 8 + n])
    check_product(out[:, 8 : 8 + n], a, a_scale, b, b_scale, qtype)
    assert (out[:, :8] == 7).all() and (out[:, 8 + n :] == 7).all()  # nothing written outside the slice


def test_scaled_gemm_with_no_rows():
    a, a_scales, b, b_scales = random_operands(1, 128, 64, "fp8", seed=1)
    got = ops.scaled_gemm(a[:0].cuda(), a_scales[:0].cuda(), b.cuda(), b_scales.cuda())
    assert got.shape == (0, 128)


def test_scaled_gemm_rejects_what_it_cannot_run():
    a, a_scales, b, b_scales = random_operands(4, 128, 64, "int8", seed=2)
    a, a_scales, b, b_scales = a.cuda(), a_scales.cuda(), b.cuda(), b_scales.cuda()
    with pytest.raises(ValueError, match="k a multiple of 16"):
        ops.scaled_gemm(a[:, :40].contiguous(), a_scales, b[:, :40].contiguous(), b_scales)
    with pytest.raises(ValueError, match="b must be torch.int8"):
        ops.scaled_gemm(a, a_scales, b.float().to(torch.float8_e4m3fn), b_scales)
    with pytest.raises(ValueError, match="a_scales must have 1 or m = 4 values"):
        ops.scaled_gemm(a, a_scales[:2], b, b_scales)
    with pytest.raises(ValueError, match="runs on CUDA tensors only"):
        ops.scaled_gemm(a.cpu(), a_scales.cpu(), b.cpu(), b_scales.cpu())


@pytest.mark.parametrize("qtype", TYPES)
def test_scaled_weight_matmul_is_near_the_bf16_product(qtype):
    """End to end (quantize_rows, then the GEMM) against the unquantized product: the quantization
    error itself, a few percent of the output's scale."""
    from corellm.model.scaled_weight import ScaledWeight

    g = torch.Generator().manual_seed(9)
    x = torch.randn(48, 576, generator=g).to(torch.bfloat16).cuda()
    w = (torch.randn(960, 576, generator=g) * 0.05).to(torch.bfloat16).cuda()
    got = ScaledWeight.quantize(w, qtype).matmul(x).float()
    want = x.float() @ w.float().T
    rel = (got - want).norm() / want.norm()
    assert rel < (0.05 if qtype == "fp8" else 0.02), f"{qtype}: relative error {rel:.4f}"
