"""BroadcastChannel: rank 0's messages to the other ranks of its tensor-parallel group (each step's
inputs, collective_rpc calls and STOP: worker/step_message.py). A message is a header of
HEADER_VALUES int64 values and an int32 payload.

Two transports, chosen when the group starts:

- every rank on this machine: a ring of slots in shared memory (corellm._core.ShmBroadcast): rank
  0's publish_values writes the header and copies the payload's arrays straight into a slot, and
  wakes the workers; each views its message in place until its next receive — ~55-120 us for a
  whole decode step with the Python around it (1-256 requests), where two gloo broadcasts over
  loopback take 0.8-1.5 ms (bench/tp_overhead.py);
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

HEADER_VALUES = 11
# A worker waits for the next message as long as the engine is idle: a year stands for "no limit"
# (gloo takes a finite timeout); a rank that dies still ends the wait at once (its socket closes).
IDLE_TIMEOUT = datetime.timedelta(days=365)
RING_SLOTS = 2  # rank 0 is at most one step ahead: each step's collectives pair the ranks up
RING_SLOT_BYTES = 1 << 20  # a decode step of 256 requests with ~1000 KV blocks each; larger: the group
_ZEROS = (0,) * HEADER_VALUES
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
        given arrays' values one after the other — to every other rank. An array is contiguous, or
        2-D with contiguous rows (its rows' values are sent, row after row)."""
        if len(header) > HEADER_VALUES:
            raise ValueError(f"a channel header holds {HEADER_VALUES} values, got {len(header)}")
        header = [*header, *_ZEROS[len(header):]]
        if self.ring is not None:  # its binding checks the arrays are int32 before it publishes
            in_ring = self.ring.publish_values(header, payload, _SEND_TIMEOUT_S)
            if in_ring is None:
                raise RuntimeError(f"a tensor-parallel worker did not take a step message in {_SEND_TIMEOUT_S:.0f} s")
            if in_ring:
                return  # else the ring carried the header alone: the payload follows on the group
        else:
            if any(a.dtype != np.int32 for a in payload):
                raise TypeError(f"a channel's payload is int32 arrays, got {[str(a.dtype) for a in payload]}")
            size = sum(a.size for a in payload)
            torch.distributed.broadcast(torch.tensor([size, *header], dtype=torch.int64), src=0, group=self.group)
        if any(a.size for a in payload):
            flat = np.concatenate([a.reshape(-1) for a in payload])
            torch.distributed.broadcast(torch.from_numpy(flat), src=0, group=self.group)

    def receive(self) -> tuple[list[int], np.ndarray]:
        """Another rank: the next message's header values and payload, waiting as long as it takes.
        On the ring the payload is a view of the message where it lies in shared memory, valid
        until this rank's next receive (which gives its slot back to rank 0): what must outlive
        the step is copied."""
        if self.ring is None:
            wire = torch.empty(1 + HEADER_VALUES, dtype=torch.int64)
            torch.distributed.broadcast(wire, src=0, group=self.group)
            size, *header = wire.tolist()
            payload = None
        else:
            while (message := self.ring.receive_values_in_place(_POLL_S)) is None:
                if not self._writer_alive():
                    raise RuntimeError("rank 0 (the engine's process) exited; this worker stops")
            header, payload, size = message
        if payload is None:
            payload = np.empty(size, np.int32)
            if size:
                torch.distributed.broadcast(torch.from_numpy(payload), src=0, group=self.group)
        return header, payload
