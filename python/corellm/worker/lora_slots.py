"""LoraSlots: the LoRA adapters the model runner holds at once (max_loras), each in a slot that a
step's tokens name (the native decoder stack's set_lora; the per-op layers' LoraBatch). Under
tensor parallelism every rank holds the slot's adapter, each its own share of it (the model
runner's `hold`: tensor_parallel.shard_lora_adapter).

A request's adapter is placed when the request enters the scheduler (EngineCore): into the slot
that holds it already, else an empty slot, else the least recently placed slot whose requests have
all finished. When every slot holds an adapter some unfinished request uses, the request waits
(place returns None) — as vLLM's scheduler holds back a request whose adapter would exceed
max_loras in the batch. A slot's users are the ids of the requests placed there; whether each is
still unfinished is asked only when a slot is needed."""

from __future__ import annotations

import itertools
from collections.abc import Callable

from corellm.lora.lora_adapter import LoraAdapter

# hold(slot, adapter): puts the adapter into the slot wherever the model runs (the native decoder
# stack, the other tensor-parallel ranks) and returns what this process computes with: the adapter,
# or its share under tensor parallelism.
Hold = Callable[[int, LoraAdapter], LoraAdapter]


class LoraSlots:
    def __init__(self, max_loras: int, hold: Hold = lambda slot, adapter: adapter):
        if max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {max_loras}")
        self.adapters: list[LoraAdapter | None] = [None] * max_loras  # by slot, as requests name them
        self.computed: list[LoraAdapter | None] = [None] * max_loras  # by slot, this process's (hold's)
        self._users: list[set[str]] = [set() for _ in range(max_loras)]
        self._placed_at = [0] * max_loras
        self._clock = itertools.count(1)
        self._hold = hold

    def place(self, adapter: LoraAdapter, request_id: str, unfinished: Callable[[str], bool]) -> int | None:
        """The slot the request runs in, its adapter placed there if need be; None when every slot
        holds an adapter that unfinished requests use (`unfinished(request_id)` tells)."""
        slot = self.slot_of(adapter)
        if slot is None:
            slot = self._free_slot(unfinished)
            if slot is None:
                return None
            self.computed[slot] = self._hold(slot, adapter)
            self.adapters[slot] = adapter
            self._users[slot] = set()
        self._users[slot].add(request_id)
        self._placed_at[slot] = next(self._clock)
        return slot

    def slot_of(self, adapter: LoraAdapter) -> int | None:
        for slot, held in enumerate(self.adapters):
            if held is adapter:
                return slot
        return None

    def _free_slot(self, unfinished: Callable[[str], bool]) -> int | None:
        if None in self.adapters:
            return self.adapters.index(None)
        idle = []
        for slot, users in enumerate(self._users):
            self._users[slot] = {r for r in users if unfinished(r)}
            if not self._users[slot]:
                idle.append(slot)
        return min(idle, key=lambda s: self._placed_at[s]) if idle else None
