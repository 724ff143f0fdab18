"""TensorParallel: a model's place in its tensor-parallel group — its rank, the group's size and
the torch.distributed process group (gloo on the CPU, NCCL on CUDA) — and the collectives the
layers run through it. Passed explicitly to the model and its layers; size 1 (the default) is one
process with no group, and every collective is then the identity."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from typing import Any

import torch


def collective_timeout() -> datetime.timedelta:
    """How long a collective of the model may take before it raises (a peer died or hangs)
    instead of blocking the engine forever: $CORELLM_COLLECTIVE_TIMEOUT_S seconds, 60 by default.
    (Waiting for the next step while the engine is idle is not a collective of the model: see
    distributed/broadcast_channel.py.)"""
    text = os.environ.get("CORELLM_COLLECTIVE_TIMEOUT_S", "60")
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise ValueError(f"CORELLM_COLLECTIVE_TIMEOUT_S must be a number of seconds > 0, got {text!r}")
    return datetime.timedelta(seconds=seconds)


@dataclass(frozen=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # torch.distributed.ProcessGroup (None when size is 1)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside a group of {self.size}")

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over the group, in place (row-parallel layers' partial outputs)."""
        if self.size > 1:
            torch.distributed.all_reduce(t, group=self.group)
        return t

    def gather_last_dim(self, t: torch.Tensor) -> torch.Tensor | None:
        """Rank 0: every rank's t concatenated along the last dimension (vocabulary-parallel
        logits); the other ranks: None."""
        if self.size == 1:
            return t
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.size)] if self.rank == 0 else None
        torch.distributed.gather(t, parts, dst=0, group=self.group)
        return torch.cat(parts, dim=-1) if parts is not None else None


def init_tensor_parallel(rank: int, size: int, init_method: str, device: torch.device) -> TensorParallel:
    """Joins the group (gloo on the CPU, NCCL on CUDA) through `init_method` (tcp://host:port, or
    env:// under torchrun)."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=size,
                                         timeout=collective_timeout())
    return TensorParallel(rank, size, torch.distributed.group.WORLD)
