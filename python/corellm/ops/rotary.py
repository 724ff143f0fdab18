"""Rotary position embedding, in place on q and k (NeoX and GPT-J styles)."""

from __future__ import annotations

import torch

from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def rotary_embedding(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    head_size: int,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
) -> None:
    """q [num_tokens, num_heads * head_size], k [num_tokens, num_kv_heads * head_size] (rows
    may be strided views of a fused QKV output); cos_sin_cache [max_position, rot_dim] fp32
    with cos in the first half and sin in the second. Rotates the first rot_dim dims of each head."""
    op = "rotary_embedding"
    check(op, "q", q, ndim=2)
    be = backend(op, q)
    check(op, "k", k, ndim=2, dtype=q.dtype, device=q.device)
    check(op, "positions", positions, ndim=1, dtype=torch.int32, device=q.device, contiguous=True)
    check(op, "cos_sin_cache", cos_sin_cache, ndim=2, dtype=torch.float32, device=q.device, contiguous=True)
    n = positions.shape[0]
    if head_size <= 0 or q.shape[1] % head_size or k.shape[1] % head_size:
        raise ValueError(f"{op}: q ({q.shape[1]}) and k ({k.shape[1]}) widths must be multiples of "
                         f"head_size {head_size}")
    check_shape(op, "q", q, (n, None))
    check_shape(op, "k", k, (n, None))
    rot_dim = cos_sin_cache.shape[1]
    be.kernels.rotary_embedding(positions.data_ptr(), q.data_ptr(), row_stride(q), k.data_ptr(), row_stride(k),
                                   cos_sin_cache.data_ptr(), cos_sin_cache.shape[0], n, q.shape[1] // head_size,
                                   k.shape[1] // head_size, head_size, rot_dim, bool(is_neox), be.dtype, *be.extra)
