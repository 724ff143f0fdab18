"""LoraSlots' placement: an adapter already held is reused, an empty slot taken next, then the
least recently placed slot whose requests have all finished; with every slot's adapter in use the
request waits (None)."""

from __future__ import annotations

import pytest

from corellm.worker.lora_slots import LoraSlots


class Adapter:  # placement looks at identity alone (no native stack here)
    def __init__(self, name):
        self.name = name


def test_placement_reuses_fills_then_evicts_the_least_recently_placed_idle_slot():
    a, b, c, d = (Adapter(n) for n in "abcd")
    slots = LoraSlots(2)
    running = {"r1", "r2", "r3"}
    unfinished = running.__contains__
    assert slots.place(a, "r1", unfinished) == 0
    assert slots.place(b, "r2", unfinished) == 1
    assert slots.place(a, "r3", unfinished) == 0  # held already: the same slot
    assert slots.place(c, "r4", unfinished) is None  # a and b both in use: c waits
    running -= {"r2"}
    assert slots.place(c, "r4", unfinished) == 1  # b's requests finished: its slot goes to c
    assert slots.slot_of(b) is None and slots.adapters == [a, c]
    running |= {"r4"}
    running -= {"r1", "r3", "r4"}
    slots.place(c, "r5", unfinished)  # c placed again after a: a is now the least recently placed
    running |= {"r5"}
    assert slots.place(d, "r6", unfinished) == 0


def test_max_loras_must_be_positive():
    with pytest.raises(ValueError, match="max_loras must be >= 1"):
        LoraSlots(0)
