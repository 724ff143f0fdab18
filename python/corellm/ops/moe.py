"""A mixture-of-experts MLP's routing and combining steps (the CPU kernels of
cpp/include/corellm/kernels/moe.h): each token's top-k experts and weights from its router logits,
and the chosen experts' outputs summed by those weights, in fp32, rounded once."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def moe_route(logits: torch.Tensor, top_k: int, renormalize: bool, selection_bias: torch.Tensor | None = None,
              renormalize_min: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: float32 [m, num_experts] -> (expert_ids int32 [m, top_k], weights float32 [m, top_k]):
    softmax over the experts, the top_k highest (ties: the lower index first), their probabilities
    renormalized to sum to 1 when `renormalize` (divided by at least renormalize_min). With
    selection_bias (float32 [num_experts]: ERNIE 4.5's), the top_k of p + bias, their weights p."""
    op = "moe_route"
    check(op, "logits", logits, ndim=2, dtype=torch.float32)
    be = backend(op, logits, cuda=False)
    m, num_experts = logits.shape
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"{op}: top_k ({top_k}) must be in [1, {num_experts}] (the router's experts)")
    if selection_bias is not None:
        check(op, "selection_bias", selection_bias, ndim=1, dtype=torch.float32, device=logits.device,
              contiguous=True)
        check_shape(op, "selection_bias", selection_bias, (num_experts,))
    if logits.stride(1) != 1:
        logits = logits.contiguous()
    ids = torch.empty((m, top_k), dtype=torch.int32)
    weights = torch.empty((m, top_k), dtype=torch.float32)
    be.kernels.moe_route(logits.data_ptr(), logits.stride(0), m, num_experts, top_k, renormalize, ids.data_ptr(),
                         weights.data_ptr(), selection_bias=0 if selection_bias is None else selection_bias.data_ptr(),
                         renormalize_min=float(renormalize_min))
    return ids, weights


def moe_combine(rows: torch.Tensor, weights: torch.Tensor, out: torch.Tensor | None = None,
                shared: torch.Tensor | None = None, shared_gate: torch.Tensor | None = None) -> torch.Tensor:
    """rows [m * top_k, hidden] (row t * top_k + j: token t's j-th expert's output), weights float32
    [m, top_k] -> out [m, hidden] = sum_j weights[t, j] * rows[t * top_k + j], then (a shared expert,
    Qwen2-MoE) + sigmoid(shared_gate[t]) * shared[t] (without shared_gate, ERNIE 4.5's: + shared[t]):
    in fp32 in that order, rounded once to rows' dtype. shared [m, hidden] in rows' dtype,
    shared_gate float32 [m] (logits), which needs shared."""
    op = "moe_combine"
    check(op, "rows", rows, ndim=2)
    be = backend(op, rows, cuda=False)
    check(op, "weights", weights, ndim=2, dtype=torch.float32, device=rows.device, contiguous=True)
    m, top_k = weights.shape
    hidden = rows.shape[1]
    check_shape(op, "rows", rows, (m * top_k, hidden))
    if shared is None and shared_gate is not None:
        raise ValueError(f"{op}: a shared expert's gate without its rows")
    if shared is not None:
        check(op, "shared", shared, ndim=2, dtype=rows.dtype, device=rows.device)
        check_shape(op, "shared", shared, (m, hidden))
    if shared_gate is not None:
        check(op, "shared_gate", shared_gate, ndim=1, dtype=torch.float32, device=rows.device, contiguous=True)
        check_shape(op, "shared_gate", shared_gate, (m,))
    if out is None:
        out = torch.empty((m, hidden), dtype=rows.dtype)
    check(op, "out", out, ndim=2, dtype=rows.dtype, device=rows.device)
    check_shape(op, "out", out, (m, hidden))
    be.kernels.moe_combine(out.data_ptr(), row_stride(out), rows.data_ptr(), row_stride(rows), weights.data_ptr(), m,
                           top_k, hidden, be.dtype, shared_rows=0 if shared is None else shared.data_ptr(),
                           shared_stride=0 if shared is None else row_stride(shared),
                           shared_gate=0 if shared_gate is None else shared_gate.data_ptr())
    return out
