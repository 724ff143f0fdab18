"""RMSNorm and residual-add + RMSNorm."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """out[t] = weight * x[t] / sqrt(mean(x[t]^2) + eps). x: [num_tokens, hidden]."""
    op = "rms_norm"
    check(op, "x", x, ndim=2)
    be = backend(op, x)
    check(op, "weight", weight, ndim=1, dtype=x.dtype, device=x.device, contiguous=True)
    check_shape(op, "weight", weight, (x.shape[1],))
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    check(op, "out", out, ndim=2, dtype=x.dtype, device=x.device)
    check_shape(op, "out", out, tuple(x.shape))
    be.kernels.rms_norm(out.data_ptr(), row_stride(out), x.data_ptr(), row_stride(x), weight.data_ptr(),
                        x.shape[0], x.shape[1], float(eps), be.dtype, *be.extra)
    return out


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """In place: residual = x + residual; x = rms_norm(residual). Returns (x, residual)."""
    op = "fused_add_rms_norm"
    check(op, "x", x, ndim=2)
    be = backend(op, x)
    check(op, "residual", residual, ndim=2, dtype=x.dtype, device=x.device)
    check_shape(op, "residual", residual, tuple(x.shape))
    check(op, "weight", weight, ndim=1, dtype=x.dtype, device=x.device, contiguous=True)
    check_shape(op, "weight", weight, (x.shape[1],))
    be.kernels.fused_add_rms_norm(x.data_ptr(), row_stride(x), residual.data_ptr(), row_stride(residual),
                                  weight.data_ptr(), x.shape[0], x.shape[1], float(eps), be.dtype, *be.extra)
    return x, residual
