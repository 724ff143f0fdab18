"""Argument checks shared by the ops: device, dtype, shape and layout, with clear errors."""

from __future__ import annotations

import torch


def check(
    op: str,
    name: str,
    t: object,
    *,
    ndim: int | None = None,
    dtype: torch.dtype | tuple[torch.dtype, ...] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
    inner_contiguous: bool = True,
) -> torch.Tensor:
    """Raises ValueError naming the op and the argument unless `t` fits."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None and t.dim() != ndim:
        raise ValueError(f"{op}: {name} must have {ndim} dimensions, got shape {tuple(t.shape)}")
    if dtype is not None:
        allowed = dtype if isinstance(dtype, tuple) else (dtype,)
        if t.dtype not in allowed:
            names = " or ".join(str(d) for d in allowed)
            raise ValueError(f"{op}: {name} must be {names}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device}, expected {device}")
    is_contiguous = t.is_contiguous()
    if contiguous and not is_contiguous:
        raise ValueError(f"{op}: {name} must be contiguous (strides {t.stride()}, shape {tuple(t.shape)})")
    if inner_contiguous and not is_contiguous and t.dim() > 0 and t.numel() > 0:
        # Every dimension but the first must be densely packed: rows may be strided views.
        expected = 1
        for size, stride in reversed(list(zip(t.shape[1:], t.stride()[1:]))):
            if size != 1 and stride != expected:
                raise ValueError(
                    f"{op}: {name} must be contiguous within a row (shape {tuple(t.shape)}, "
                    f"strides {t.stride()})"
                )
            expected *= size
    return t


def check_shape(op: str, name: str, t: torch.Tensor, shape: tuple) -> None:
    """`shape` may hold None for a free dimension."""
    if t.shape == shape:  # the common case, without a generator
        return
    if len(t.shape) != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = tuple("*" if s is None else s for s in shape)
        raise ValueError(f"{op}: {name} must have shape {want}, got {tuple(t.shape)}")


def row_stride(t: torch.Tensor) -> int:
    return t.stride(0) if t.dim() > 0 else 0
