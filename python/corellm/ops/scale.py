"""Scaling rows in place: x *= factor, the product in fp32 rounded once to the dtype (Granite's
residual_multiplier on a layer's attention and MLP outputs, as HF's bf16 product rounds)."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, row_stride


def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
    """x: [num_tokens, d] (rows may be strided), scaled in place; returned."""
    op = "scale"
    check(op, "x", x, ndim=2)
    if x.device.type == "cuda":  # torch's multiply: the same product, rounded once
        return x.mul_(factor)
    be = backend(op, x)
    be.kernels.scale(x.data_ptr(), row_stride(x), x.shape[0], x.shape[1], float(factor), be.dtype)
    return x
