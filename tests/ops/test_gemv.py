"""corellm's bf16 GEMV (decode-time x W^T) against torch, over shapes with and without a 32-wide
tail, with and without bias, 1 to 4 rows."""

from __future__ import annotations

import pytest
import torch

from corellm import _core

k = _core.kernels
pytestmark = pytest.mark.skipif(not k.bf16_gemv_available(), reason="needs AVX512-BF16")


def pack(w: torch.Tensor) -> torch.Tensor:
    n, kk = w.shape
    packed = torch.full((k.bf16_gemv_packed_size(n, kk),), float("nan"), dtype=torch.bfloat16)
    k.bf16_gemv_pack(w.data_ptr(), packed.data_ptr(), n, kk)
    return packed


def test_pack_layout():
    """Groups of four rows, chunk by chunk: 32 columns of each row side by side, zero padding."""
    n, kk = 6, 40
    w = torch.arange(n * kk, dtype=torch.float32).view(n, kk).bfloat16()
    p = pack(w).view(2, 2, 4, 32)  # groups, chunks, rows, columns
    padded = torch.zeros(8, 64, dtype=torch.bfloat16)
    padded[:n, :kk] = w
    assert torch.equal(p, padded.view(2, 4, 2, 32).permute(0, 2, 1, 3))


@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("n, kk", [(960, 576), (37, 70), (5, 31), (1000, 1536), (3, 1), (4, 32)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_matches_torch(m, n, kk, bias):
    g = torch.Generator().manual_seed(n * kk + m)
    x = torch.randn(m, kk, generator=g).bfloat16()
    w = torch.randn(n, kk, generator=g).bfloat16()
    b = torch.randn(n, generator=g).bfloat16() if bias else None
    y = torch.empty(m, n, dtype=torch.bfloat16)
    packed = pack(w)  # held: a temporary's memory could be reused before the kernel reads it
    k.bf16_gemv(x.data_ptr(), kk, packed.data_ptr(), 0 if b is None else b.data_ptr(), y.data_ptr(), n, m, n, kk)
    want = torch.nn.functional.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(y.double(), want, atol=0.05 * want.abs().max().item() / 8, rtol=1e-2)


def test_gemv_rejects_too_many_rows():
    x = torch.zeros(5, 32, dtype=torch.bfloat16)
    w = torch.zeros(8, 32, dtype=torch.bfloat16)
    y = torch.empty(5, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="takes 1 to 4 rows, got 5"):
        packed = pack(w)
        k.bf16_gemv(x.data_ptr(), 32, packed.data_ptr(), 0, y.data_ptr(), 8, 5, 8, 32)
