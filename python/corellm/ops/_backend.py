"""Which native module runs an op on a tensor: corellm._core's C++ kernels for CPU tensors,
corellm._cuda's for CUDA tensors (when this installation built it). Both take the same arguments
in the same order; the CUDA launchers take one more at the end, the stream to enqueue on
(torch's current stream for the tensor's device)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from corellm.native import _core, _cuda

_CPU_TAGS = {torch.float32: _core.kernels.DTYPE_F32, torch.bfloat16: _core.kernels.DTYPE_BF16}
_CUDA_TAGS = {} if _cuda is None else {torch.float32: _cuda.DTYPE_F32, torch.bfloat16: _cuda.DTYPE_BF16,
                                       torch.float16: _cuda.DTYPE_F16}


@dataclass(frozen=True)
class Backend:
    kernels: Any  # the module whose functions launch the kernels
    dtype: int  # the dtype tag it expects
    extra: tuple  # trailing arguments: () on the CPU, (stream,) on CUDA


_CPU_BACKENDS = {dtype: Backend(_core.kernels, tag, ()) for dtype, tag in _CPU_TAGS.items()}


def cuda_available() -> bool:
    """Whether corellm._cuda was built (a GPU is another matter: torch.cuda.is_available())."""
    return _cuda is not None


def cuda_attention_head_sizes() -> tuple[int, ...]:
    """The head sizes corellm._cuda's paged attention is built for (empty without the module)."""
    return () if _cuda is None else tuple(_cuda.ATTENTION_HEAD_SIZES)


def backend(op: str, t: torch.Tensor, cuda: bool = True) -> Backend:
    """The backend for an op on `t`'s device and dtype; ValueError / NotImplementedError naming
    the op otherwise. cuda=False: the op has no CUDA kernel yet."""
    if t.is_cpu:
        cpu = _CPU_BACKENDS.get(t.dtype)
        if cpu is None:
            raise ValueError(f"{op}: dtype {t.dtype} is not supported on the CPU (float32 or bfloat16)")
        return cpu
    device = t.device.type
    if device == "cuda":
        if _cuda is None:
            raise NotImplementedError(f"{op}: CUDA tensors need corellm._cuda, which is not built in this "
                                      f"installation (build with nvcc present, or CORELLM_CUDA=ON)")
        if not cuda:
            raise NotImplementedError(f"{op}: no CUDA kernel yet; run it on the CPU")
        tag = _CUDA_TAGS.get(t.dtype)
        if tag is None:
            raise ValueError(f"{op}: dtype {t.dtype} is not supported on CUDA (bfloat16, float16 or float32)")
        return Backend(_cuda, tag, (torch.cuda.current_stream(t.device).cuda_stream,))
    raise ValueError(f"{op}: tensors on {t.device} are not supported")
