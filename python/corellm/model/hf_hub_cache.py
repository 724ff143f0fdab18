"""A Hugging Face Hub repository id (`Qwen/Qwen2.5-0.5B-Instruct`, or `org/name-GGUF:Q4_K_M` for
one of a GGUF repository's files, as llama.cpp's `-hf` takes it) found in the local Hub cache, where
`hf download`, transformers and vLLM put what they fetch. corellm reads that cache; it does not
download.

The cache's layout (huggingface_hub's): under the cache root, `models--ORG--NAME/refs/main` holds
the commit the repository's main branch was at, and `models--ORG--NAME/snapshots/COMMIT/` its
files (links into `blobs/`). The root is $HF_HUB_CACHE, else $HF_HOME/hub, else
$XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub.

What a snapshot resolves to: its directory when it holds config.json (an HF model directory),
else its one .gguf file, or the one whose name holds the id's `:TAG` (case-insensitive)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

# An id: NAME or ORG/NAME (the Hub's characters), optionally :TAG.
_REPO_ID = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*/)?[A-Za-z0-9][A-Za-z0-9._-]*(?::[A-Za-z0-9._-]+)?$")


def hub_cache_root() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def looks_like_repo_id(model: str) -> bool:
    return bool(_REPO_ID.match(model)) and ".." not in model


@dataclass(frozen=True)
class HubModel:
    """A repository id resolved in the cache: what to load, and the name to serve it under."""

    repo_id: str  # ORG/NAME (with :TAG when given), the served model's name, as vLLM names it
    path: Path  # the snapshot directory, or one of its .gguf files


def find_in_hub_cache(model: str) -> HubModel:
    """FileNotFoundError (naming where it looked and what to run) when the id is not in the cache,
    or its snapshot holds no model corellm can load; ValueError when a GGUF repository holds several
    files and the id names none of them."""
    repo, _, tag = model.partition(":")
    root = hub_cache_root()
    folder = root / f"models--{repo.replace('/', '--')}"
    if not folder.is_dir():
        raise FileNotFoundError(f"model {model!r}: no such file or directory, and not in the Hugging Face cache "
                                f"({root}). corellm does not download models: fetch it first (`hf download {repo}`), "
                                f"or give an HF model directory, a .gguf file, or 'SmolLM2-135M-Instruct'")
    snapshot = _main_snapshot(folder)
    if snapshot is None:
        raise FileNotFoundError(f"model {model!r}: {folder} holds no snapshot of the repository's main branch "
                                f"(an interrupted download? run `hf download {repo}` again)")
    if not tag and (snapshot / "config.json").is_file():
        return HubModel(repo, snapshot)
    ggufs = sorted(p for p in snapshot.iterdir() if p.suffix.lower() == ".gguf")
    chosen = [p for p in ggufs if tag.lower() in p.name.lower()] if tag else ggufs
    if len(chosen) == 1:
        return HubModel(model, chosen[0])
    if not ggufs:
        raise FileNotFoundError(f"model {model!r}: the cached snapshot {snapshot} has neither config.json nor a "
                                f".gguf file (a partial download? `hf download {repo}` fetches the rest)")
    names = ", ".join(p.name for p in ggufs)
    if not chosen:
        raise FileNotFoundError(f"model {model!r}: no .gguf file of {repo}'s cached snapshot has {tag!r} in its "
                                f"name (it has {names})")
    matching = f" for {tag!r}" if tag else ""
    raise ValueError(f"model {model!r}: {repo}'s cached snapshot has {len(chosen)} .gguf files{matching} "
                     f"({', '.join(p.name for p in chosen)}): name one as {repo}:TAG (e.g. :Q4_K_M), or give its path")


def cached_snapshot(repo: str) -> Path | None:
    """The main branch's snapshot directory of a repository (ORG/NAME) in the cache, whatever it
    holds (a LoRA adapter's has no config.json); None when the cache has none."""
    folder = hub_cache_root() / f"models--{repo.replace('/', '--')}"
    return _main_snapshot(folder) if folder.is_dir() else None


def _main_snapshot(folder: Path) -> Path | None:
    """The snapshot refs/main names; without refs/main, the only snapshot there is."""
    ref = folder / "refs" / "main"
    if ref.is_file():
        snapshot = folder / "snapshots" / ref.read_text().strip()
        return snapshot if snapshot.is_dir() else None
    snapshots = [p for p in (folder / "snapshots").glob("*") if p.is_dir()]
    return snapshots[0] if len(snapshots) == 1 else None
