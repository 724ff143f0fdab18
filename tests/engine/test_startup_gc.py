"""startup_gc.lasting_objects(): no collection inside the block, what is alive at its end frozen
(never scanned again), the collector's state as before afterwards, nothing frozen on an error."""

from __future__ import annotations

import gc

import pytest

from corellm.startup_gc import lasting_objects


def tracked(obj: object) -> bool:
    """Whether a collection would scan obj (frozen objects are in no generation gc.get_objects sees)."""
    return any(o is obj for o in gc.get_objects())


def test_the_block_pauses_collection_and_freezes_what_it_made() -> None:
    assert gc.isenabled()
    with lasting_objects():
        assert not gc.isenabled()
        made = [[] for _ in range(3)]
        assert tracked(made)
    assert gc.isenabled()
    assert not tracked(made) and gc.get_freeze_count() > 0


def test_an_error_freezes_nothing_and_restores_collection() -> None:
    frozen = gc.get_freeze_count()
    made = None
    with pytest.raises(RuntimeError):
        with lasting_objects():
            made = [[]]
            raise RuntimeError("build failed")
    # Frozen objects of earlier tests may be freed meanwhile (the count only falls then); a freeze
    # here would have raised it by every tracked object, made included.
    assert gc.isenabled() and gc.get_freeze_count() <= frozen and tracked(made)


def test_a_disabled_collector_stays_disabled() -> None:
    gc.disable()
    try:
        with lasting_objects():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
