"""BroadcastChannel: rank 0's messages to the other ranks of its tensor-parallel group (each step's
inputs, collective_rpc calls and STOP: worker/step_message.py). A message is a header of
HEADER_VALUES int64 values and an int32 payload.

Two transports, chosen when the group starts:

- every rank on this machine: a ring of slots in shared memory (corellm._core.ShmBroadcast): rank
  0 copies the message's parts into a slot and wakes the workers, each copies it out — ~10 us
  between two processes, ~0.06-0.12 ms for a whole step with the Python around it, where two gloo
  broadcasts over loopback sockets take 0.6-0.9 ms (bench/tp_overhead.py);
- ranks on other machines: a header broadcast, then the payload's, over a gloo group of the
  channel's own.

A message too large for a slot goes over the group too (the slot carries its header). The group's
timeout is long: a worker waits on the channel for as long as the engine is idle (on the model's
group, whose collectives time out after a minute, an idle minute would end the workers). A worker
waiting on the ring checks every second that rank 0 is still alive, and raises if not."""

from __future__ import annotations

import datetime
import os
import secrets
from collections.abc import Callable

import numpy as np
import torch

from corellm.distributed.parallel_state import TensorParallel
from corellm.native import _core

HEADER_VALUES = 10
# A worker waits for the next message as long as the engine is idle: a year stands for "no limit"
# (gloo takes a finite timeout); a rank that dies still ends the wait at once (its socket closes).
IDLE_TIMEOUT = datetime.timedelta(days=365)
RING_SLOTS = 2  # rank 0 is at most one step ahead: each step's collectives pair the ranks up
RING_SLOT_BYTES = 1 << 20  # a decode step of 256 requests with ~1000 KV blocks each; larger: the group
_WIRE = 2 + HEADER_VALUES  # the payload's int32 count, whether it travels on the group, the header
_POLL_S = 1.0  # how often a waiting worker checks that rank 0 lives
_SEND_TIMEOUT_S = 60.0  # a worker that does not take a message in this time hangs


def new_ring(num_readers: int) -> _core.ShmBroadcast:
    """Rank 0's end of a shared-memory ring for its `num_readers` workers on this machine."""
    name = f"/corellm-tp-{os.getpid()}-{secrets.token_hex(4)}"
    return _core.ShmBroadcast.create(name, num_readers=num_readers, num_slots=RING_SLOTS, slot_bytes=RING_SLOT_BYTES)


class BroadcastChannel:
    def __init__(self, tp: TensorParallel, *, shared_memory: bool, writer_alive: Callable[[], bool] = lambda: True):
        """Every rank of the group constructs its channel at the same point (it is made
        collectively). shared_memory (every rank on this machine): rank 0 makes the ring and names
        it to the others, which attach to it. writer_alive: a worker's check that rank 0 still lives."""
        self.tp = tp
        self.ring: _core.ShmBroadcast | None = None
        self._writer_alive = writer_alive
        if shared_memory:
            self.ring = new_ring(tp.size - 1) if tp.rank == 0 else None
            names = [self.ring.name if self.ring is not None else None]
            torch.distributed.broadcast_object_list(names, src=0, group=tp.group)
            if tp.rank > 0:
                self.ring = _core.ShmBroadcast.attach(names[0], reader=tp.rank - 1)
        self.group = torch.distributed.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        if self.ring is not None and tp.rank == 0:
            self.ring.unlink_name()  # every worker attached before it joined the group: nothing to leave behind

    @property
    def transport(self) -> str:
        return "shared memory" if self.ring is not None else "gloo"

    def send(self, header: list[int], payload: list[np.ndarray] = ()) -> None:
        """Rank 0: the header (up to HEADER_VALUES ints, zero-padded) and an int32 payload — the
        given arrays one after the other — to every other rank."""
        if len(header) > HEADER_VALUES:
            raise ValueError(f"a channel header holds {HEADER_VALUES} values, got {len(header)}")
        parts = [np.ascontiguousarray(a, dtype=np.int32).reshape(-1) for a in payload]
        size = sum(a.size for a in parts)
        wire = np.zeros(_WIRE, np.int64)
        wire[0] = size
        wire[2:2 + len(header)] = header
        if self.ring is None:
            torch.distributed.broadcast(torch.from_numpy(wire), src=0, group=self.group)
        else:
            fits = wire.nbytes + 4 * size <= self.ring.slot_capacity
            wire[1] = 0 if fits else 1
            if not self.ring.publish([wire, *parts] if fits else wire, _SEND_TIMEOUT_S):
                raise RuntimeError(f"a tensor-parallel worker did not take a step message in {_SEND_TIMEOUT_S:.0f} s")
            if fits:
                return
        if size:
            torch.distributed.broadcast(torch.from_numpy(np.concatenate(parts)), src=0, group=self.group)

    def receive(self) -> tuple[list[int], np.ndarray]:
        """Another rank: the next message's header values and payload, waiting as long as it takes."""
        if self.ring is None:
            wire_t = torch.empty(_WIRE, dtype=torch.int64)
            torch.distributed.broadcast(wire_t, src=0, group=self.group)
            wire, rest = wire_t.numpy(), None
        else:
            while (message := self.ring.receive(_POLL_S)) is None:
                if not self._writer_alive():
                    raise RuntimeError("rank 0 (the engine's process) exited; this worker stops")
            wire = message[:8 * _WIRE].view(np.int64)  # views of the received (writable) bytes: no copy
            rest = None if wire[1] else message[8 * _WIRE:].view(np.int32)
        size = int(wire[0])
        if rest is None:
            rest = np.empty(size, np.int32)
            if size:
                torch.distributed.broadcast(torch.from_numpy(rest), src=0, group=self.group)
        if rest.size != size:
            raise RuntimeError(f"a step message's payload has {rest.size} values, its header says {size}")
        return wire[2:].tolist(), rest
