"""SiLU-and-multiply, the SwiGLU activation of Llama-family MLPs."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2d] (gate then up) -> out [num_tokens, d] = silu(gate) * up."""
    op = "silu_and_mul"
    check(op, "x", x, ndim=2)
    be = backend(op, x)
    if x.shape[1] % 2:
        raise ValueError(f"{op}: x's last dimension must be even (gate and up halves), got {x.shape[1]}")
    d = x.shape[1] // 2
    if out is None:
        out = torch.empty((x.shape[0], d), dtype=x.dtype, device=x.device)
    check(op, "out", out, ndim=2, dtype=x.dtype, device=x.device)
    check_shape(op, "out", out, (x.shape[0], d))
    be.kernels.silu_and_mul(out.data_ptr(), row_stride(out), x.data_ptr(), row_stride(x), x.shape[0], d, be.dtype,
                            *be.extra)
    return out
