"""A Hugging Face Hub id resolves to its snapshot in the local Hub cache (huggingface_hub's layout,
laid out here by hand: blobs, links in snapshots/COMMIT, refs/main), loads, and is served under the
id; what is not there is an error that says where corellm looked and what to run."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from corellm import LLM, SamplingParams
from corellm.model.hf_hub_cache import find_in_hub_cache, hub_cache_root, looks_like_repo_id
from corellm.model.loader import default_model_path, resolve_model
from tests.model.tiny_models import make_tiny_model


def cache_repo(root: Path, repo_id: str, files: dict[str, Path], commit: str = "0123abcd", ref: bool = True) -> Path:
    """Lays `files` (name in the repository -> a file to copy) out as `hf download` does; returns
    the snapshot directory."""
    folder = root / f"models--{repo_id.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for i, (name, source) in enumerate(sorted(files.items())):
        blob = folder / "blobs" / f"blob{i}"
        if source.stat().st_size > 1 << 20:  # the big GGUF: a link to it rather than a copy
            blob.symlink_to(source.resolve())
        else:
            shutil.copyfile(source, blob)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    if ref:
        (folder / "refs").mkdir()
        (folder / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch):
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    return root


def test_an_hf_repository_loads_from_the_cache_and_is_served_under_its_id(hub, tmp_path, tokenizer_json):
    model_dir = tmp_path / "made"
    make_tiny_model("llama3", model_dir, tokenizer_json=tokenizer_json)
    snapshot = cache_repo(hub, "acme/tiny-llama", {p.name: p for p in model_dir.iterdir()})
    assert resolve_model("acme/tiny-llama") == (snapshot, "acme/tiny-llama")
    greedy = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine = dict(dtype="float32", max_model_len=64, kv_cache_memory=8 * 1024**2)
    by_id = LLM("acme/tiny-llama", **engine)
    assert by_id.loaded.name == "acme/tiny-llama"  # the server's default --served-model-name
    by_path = LLM(str(model_dir), **engine)
    prompt = {"prompt_token_ids": [5, 17, 42, 9]}
    assert (by_id.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids
            == by_path.generate(prompt, greedy, use_tqdm=False)[0].outputs[0].token_ids)


def test_a_gguf_repository_takes_its_file_by_tag(hub):
    gguf = default_model_path()
    snapshot = cache_repo(hub, "acme/SmolLM2-GGUF", {"smol.Q4_1.gguf": gguf, "smol.Q8_0.gguf": gguf,
                                                    "README.md": Path(__file__)})
    assert find_in_hub_cache("acme/SmolLM2-GGUF:q8_0").path == snapshot / "smol.Q8_0.gguf"
    assert resolve_model("acme/SmolLM2-GGUF:Q4_1") == (snapshot / "smol.Q4_1.gguf", "acme/SmolLM2-GGUF:Q4_1")
    with pytest.raises(ValueError, match=r"2 \.gguf files \(smol\.Q4_1\.gguf, smol\.Q8_0\.gguf\): name one as "
                                         r"acme/SmolLM2-GGUF:TAG"):
        resolve_model("acme/SmolLM2-GGUF")
    with pytest.raises(FileNotFoundError, match="no .gguf file of acme/SmolLM2-GGUF's cached snapshot has 'Q5_K'"):
        resolve_model("acme/SmolLM2-GGUF:Q5_K")
    only = cache_repo(hub, "acme/one-GGUF", {"one.Q4_1.gguf": gguf}, ref=False)  # no refs/main: the one snapshot
    assert resolve_model("acme/one-GGUF") == (only / "one.Q4_1.gguf", "acme/one-GGUF")


def test_what_is_not_in_the_cache_says_where_it_looked(hub):
    with pytest.raises(FileNotFoundError, match=rf"not in the Hugging Face cache \({hub}\).*`hf download acme/absent`"):
        resolve_model("acme/absent")
    cache_repo(hub, "acme/partial", {"README.md": Path(__file__)})
    with pytest.raises(FileNotFoundError, match="neither config.json nor a .gguf file"):
        resolve_model("acme/partial")
    assert not looks_like_repo_id("../acme/x") and not looks_like_repo_id("/abs/path") and looks_like_repo_id("gpt2")


def test_the_cache_root_follows_the_hub_variables(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub_cache_root() == tmp_path / "home" / "hub"
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_root() == tmp_path / "xdg" / "huggingface" / "hub"
