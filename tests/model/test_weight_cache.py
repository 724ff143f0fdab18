"""The GGUF weight cache: a second load comes from the cache and equals the first; a changed file
is read afresh; a damaged cache is ignored."""

from __future__ import annotations

import os
import shutil

import torch

from corellm.model import load_model
from corellm.model.loader import default_model_path


def test_cache_round_trip_and_invalidation(tmp_path, monkeypatch):
    monkeypatch.setenv("CORELLM_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    shutil.copy(default_model_path(), gguf)
    first = load_model(str(gguf), progress=False)
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "weights.safetensors").exists()
    second = load_model(str(gguf), progress=False)
    assert second.config == first.config
    assert torch.equal(second.model.embed, first.model.embed)
    assert torch.equal(second.model.norm, first.model.norm)
    text = "Hello 🎉 world, 12345!"
    assert second.tokenizer.encode(text) == first.tokenizer.encode(text)
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    assert second.tokenizer.eos_token_ids == first.tokenizer.eos_token_ids
    # A touched file gets a new cache entry.
    os.utime(gguf, ns=(0, 0))
    load_model(str(gguf), progress=False)
    assert len(list((tmp_path / "cache").iterdir())) == 2
    # A damaged entry is ignored, not fatal.
    for entry in (tmp_path / "cache").iterdir():
        (entry / "weights.safetensors").write_bytes(b"garbage")
    third = load_model(str(gguf), progress=False)
    assert torch.equal(third.model.embed, first.model.embed)
