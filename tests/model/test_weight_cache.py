"""The GGUF weight cache: a second load comes from the cache and equals the first; a changed file
is read afresh; a damaged cache is ignored; the entries of files gone or changed are removed."""

from __future__ import annotations

import json
import os
import shutil

import torch

from corellm.model import load_model
from corellm.model.loader import default_model_path


def _embedding(loaded) -> torch.Tensor:
    embed = loaded.model.embed
    return embed.quantized.packed if embed.quantized is not None else embed.weight


def test_cache_round_trip_and_invalidation(tmp_path, monkeypatch):
    monkeypatch.setenv("CORELLM_CACHE_DIR", str(tmp_path / "cache"))
    gguf = tmp_path / "model.gguf"
    shutil.copy(default_model_path(), gguf)
    first = load_model(str(gguf), progress=False)
    entries = list((tmp_path / "cache").iterdir())
    assert len(entries) == 1 and (entries[0] / "weights.safetensors").exists()
    second = load_model(str(gguf), progress=False)
    assert second.config == first.config
    assert torch.equal(_embedding(second), _embedding(first))
    first_qkv, second_qkv = first.model.layers[3].attn.qkv_proj, second.model.layers[3].attn.qkv_proj
    assert [(o, q.ggml_type, q.shape) for o, q in second_qkv.quantized] == \
        [(o, q.ggml_type, q.shape) for o, q in first_qkv.quantized]
    assert all(torch.equal(a.packed, b.packed) for (_, a), (_, b) in zip(first_qkv.quantized, second_qkv.quantized))
    assert torch.equal(second.model.norm, first.model.norm)
    text = "Hello 🎉 world, 12345!"
    assert second.tokenizer.encode(text) == first.tokenizer.encode(text)
    assert second.tokenizer.chat_template == first.tokenizer.chat_template
    assert second.tokenizer.eos_token_ids == first.tokenizer.eos_token_ids
    # A touched file gets a new cache entry, which replaces the stale one.
    os.utime(gguf, ns=(0, 0))
    load_model(str(gguf), progress=False)
    assert [e.name for e in (tmp_path / "cache").iterdir()] != [e.name for e in entries]
    assert len(list((tmp_path / "cache").iterdir())) == 1
    # A damaged entry is ignored, not fatal.
    for entry in (tmp_path / "cache").iterdir():
        (entry / "weights.safetensors").write_bytes(b"garbage")
    third = load_model(str(gguf), progress=False)
    assert torch.equal(_embedding(third), _embedding(first))


def test_dense_and_quantized_loads_have_their_own_entries(tmp_path, monkeypatch):
    monkeypatch.setenv("CORELLM_CACHE_DIR", str(tmp_path / "cache"))
    quantized = load_model(progress=False)
    dense = load_model(progress=False, quantization="none")
    assert quantized.quantization == "gguf" and dense.quantization == "none"
    assert len(list((tmp_path / "cache").iterdir())) == 2
    again = load_model(progress=False, quantization="none")
    assert again.model.embed.quantized is None and torch.equal(_embedding(again), _embedding(dense))
    # The dense weights are the quantized ones dequantized.
    assert torch.equal(quantized.model.embed.quantized.dequantize(torch.bfloat16), dense.model.embed.weight)


def test_a_start_from_the_cache_does_not_import_the_gguf_package(tmp_path):
    """The `gguf` package's import (~30 ms of start-up) is paid only where a GGUF file is parsed."""
    import subprocess
    import sys

    env = dict(os.environ, CORELLM_CACHE_DIR=str(tmp_path / "cache"))
    script = ("import sys; from corellm.model import load_model; load_model(progress=False); "
              "print('gguf' in sys.modules)")
    first = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    again = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.split()[-1] == "True"  # the file parsed, the cache written
    assert again.stdout.split()[-1] == "False"


def test_writing_an_entry_removes_those_of_files_gone_or_changed(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("CORELLM_CACHE_DIR", str(cache))
    kept, gone, changed = (tmp_path / f"{name}.gguf" for name in ("kept", "gone", "changed"))
    for path in (kept, gone, changed):
        shutil.copy(default_model_path(), path)
        load_model(str(path), progress=False)
    assert len(list(cache.iterdir())) == 3
    # An entry from before the source was recorded: judged by its tokenizer's source (the file).
    old = cache / "old-entry"
    old.mkdir()
    (old / "meta.json").write_text(json.dumps({"tokenizer": {"source": str(tmp_path / "deleted.gguf")}}))
    unreadable, writing = cache / "no-meta", cache / ".tmp-writing"
    unreadable.mkdir()
    writing.mkdir()
    gone.unlink()
    os.utime(changed, ns=(0, 0))
    load_model(str(changed), progress=False)  # a new entry for the changed file
    names = sorted(e.name for e in cache.iterdir())
    assert len(names) == 4 and "no-meta" in names and ".tmp-writing" in names and "old-entry" not in names
    assert sum(name.startswith(("kept-", "changed-")) for name in names) == 2
    assert load_model(str(kept), progress=False).config is not None  # still served from its entry
    assert len(list(cache.iterdir())) == 4
