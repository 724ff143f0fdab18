"""The gated activations of Llama-family MLPs: SiLU-and-multiply (SwiGLU), for Gemma
GELU(tanh)-and-multiply (GeGLU), and gpt-oss's clamped SwiGLU. Each computes act(gate) * up in
fp32 and rounds once."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def _gated(op: str, x: torch.Tensor, out: torch.Tensor | None, *params: float) -> torch.Tensor:
    """x: [num_tokens, 2d] (gate then up) -> out [num_tokens, d], by the backend's kernel `op`."""
    check(op, "x", x, ndim=2)
    be = backend(op, x)
    if x.shape[1] % 2:
        raise ValueError(f"{op}: x's last dimension must be even (gate and up halves), got {x.shape[1]}")
    d = x.shape[1] // 2
    if out is None:
        out = torch.empty((x.shape[0], d), dtype=x.dtype, device=x.device)
    check(op, "out", out, ndim=2, dtype=x.dtype, device=x.device)
    check_shape(op, "out", out, (x.shape[0], d))
    if params and be.extra:
        raise ValueError(f"{op} is not implemented in the CUDA kernels")
    getattr(be.kernels, op)(out.data_ptr(), row_stride(out), x.data_ptr(), row_stride(x), x.shape[0], d, be.dtype,
                            *be.extra, *params)
    return out


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2d] (gate then up) -> out [num_tokens, d] = silu(gate) * up."""
    return _gated("silu_and_mul", x, out)


def gelu_tanh_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2d] (gate then up) -> out [num_tokens, d] = gelu(gate, approximate="tanh") * up."""
    return _gated("gelu_tanh_and_mul", x, out)


def swigluoai_and_mul(x: torch.Tensor, alpha: float, limit: float, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2d] (gate then up) -> out [num_tokens, d] = (u + 1) * g * sigmoid(alpha g), g
    the gate clamped above at limit and u the up half clamped to [-limit, limit] (gpt-oss's; the CPU
    kernels only)."""
    return _gated("swigluoai_and_mul", x, out, float(alpha), float(limit))
