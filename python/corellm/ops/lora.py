"""LoRA's update of a projection's output, token by token by each token's adapter (the CPU kernel
of cpp/include/corellm/kernels/lora.h: y += (x A^T) B^T * scale in fp32, rounded once)."""

from __future__ import annotations

import torch

from corellm.native import _core
from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


def lora_add(y: torch.Tensor, x: torch.Tensor, slots: torch.Tensor,
             by_slot: list[_core.model.LoraLinear | None], cpu_isa: str = "") -> torch.Tensor:
    """y [m, n] (in place) += the update of x [m, k] by by_slot[slots[t]] for each token t whose
    slot is >= 0; by_slot[s]: slot s's adapter's update of this projection, or None. Returns y.
    cpu_isa: the instruction-set path to run (default: the process's)."""
    op = "lora_add"
    check(op, "y", y, ndim=2)
    be = backend(op, y, cuda=False)
    check(op, "x", x, ndim=2, dtype=y.dtype, device=y.device)
    check(op, "slots", slots, ndim=1, dtype=torch.int32, device=y.device, contiguous=True)
    m = y.shape[0]
    check_shape(op, "x", x, (m, None))
    check_shape(op, "slots", slots, (m,))
    for s, lora in enumerate(by_slot):
        if lora is not None and lora.parts and lora.k != x.shape[1]:
            raise ValueError(f"{op}: slot {s}'s update takes rows of {lora.k}, x's are {x.shape[1]}")
    if m and int(slots.max()) >= len(by_slot):
        raise ValueError(f"{op}: a token names slot {int(slots.max())} of {len(by_slot)}")
    be.kernels.lora_add(y.data_ptr(), row_stride(y), x.data_ptr(), row_stride(x), m, slots.data_ptr(), by_slot,
                        y.shape[1], be.dtype, cpu_isa)
    return y
