"""TensorParallel: a model's place in its tensor-parallel group — its rank, the group's size and
the torch.distributed process group (gloo on the CPU, NCCL on CUDA) — and the collectives the
layers run through it. Passed explicitly to the model and its layers; size 1 (the default) is one
process with no group, and every collective is then the identity. On the CPU with every rank on
this machine, the all-reduce (two a layer) goes through shared memory (corellm._core.ShmAllReduce)
instead of gloo's loopback sockets."""

from __future__ import annotations

import datetime
import os
import secrets
from dataclasses import dataclass
from typing import Any

import torch

from corellm.native import _core

SHM_ALL_REDUCE_BUFFER_BYTES = 4 << 20  # per rank, twice; larger tensors go through in chunks
_SHM_DTYPES = {torch.float32: _core.kernels.DTYPE_F32, torch.bfloat16: _core.kernels.DTYPE_BF16}


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
    shm_all_reduce: Any = None  # _core.ShmAllReduce: every rank on this machine, on the CPU
    timeout_s: float = 60.0  # a collective's limit (collective_timeout(), read once at init)

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor-parallel rank {self.rank} is outside a group of {self.size}")

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over the group, in place (row-parallel layers' partial outputs)."""
        if self.size == 1:
            return t
        tag = _SHM_DTYPES.get(t.dtype)
        if self.shm_all_reduce is None or t.device.type != "cpu" or tag is None or not t.is_contiguous():
            torch.distributed.all_reduce(t, group=self.group)
            return t
        self.shm_all_reduce.all_reduce(t.data_ptr(), t.numel(), tag, self.timeout_s)
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


def init_tensor_parallel(rank: int, size: int, init_method: str, device: torch.device, *,
                         shm_all_reduce: bool = False) -> TensorParallel:
    """Joins the group (gloo on the CPU, NCCL on CUDA) through `init_method` (tcp://host:port, or
    env:// under torchrun). shm_all_reduce (every rank must be on this machine), on the CPU: the
    all-reduces go through a shared-memory segment that rank 0 creates and names to the others."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = collective_timeout()
    torch.distributed.init_process_group(backend, init_method=init_method, rank=rank, world_size=size, timeout=timeout)
    group = torch.distributed.group.WORLD
    if not (shm_all_reduce and device.type == "cpu" and size > 1):
        return TensorParallel(rank, size, group, timeout_s=timeout.total_seconds())
    reducer = None
    if rank == 0:
        name = f"/corellm-ar-{os.getpid()}-{secrets.token_hex(4)}"
        reducer = _core.ShmAllReduce.create(name, size=size, buffer_bytes=SHM_ALL_REDUCE_BUFFER_BYTES)
    names = [reducer.name if reducer is not None else None]
    torch.distributed.broadcast_object_list(names, src=0, group=group)
    if rank > 0:
        reducer = _core.ShmAllReduce.attach(names[0], rank=rank)
    torch.distributed.barrier(group=group)  # every rank has attached: the name can go
    if rank == 0:
        reducer.unlink_name()
    return TensorParallel(rank, size, group, reducer, timeout.total_seconds())
