"""Matryoshka embeddings: a model trained so that the first n values of its vector are themselves an
embedding (nomic-embed-text-v1.5, jina-embeddings-v3, Qwen3-Embedding, mxbai-embed-large). A
request's `dimensions` (OpenAI's embeddings field, vLLM's PoolingParams.dimensions) then asks for the
vector's first n values, L2-normalized again.

As vLLM reads it, a model is one when its config.json says so — `"is_matryoshka": true` (any length
from 1 to the hidden size) or `"matryoshka_dimensions": [..]` (those lengths only) — or when the
user sets either through hf_overrides. The config keeps it as `matryoshka_dimensions`:

    None    not a Matryoshka model: a request's dimensions is refused
    ()      any length from 1 to the hidden size
    (n, ..) those lengths only"""

from __future__ import annotations

from typing import Any


def read_matryoshka_dimensions(cfg: dict[str, Any], source: str, hidden_size: int) -> tuple[int, ...] | None:
    """config.json's Matryoshka fields (with hf_overrides set over it), checked against the hidden size."""
    allowed = cfg.get("matryoshka_dimensions")
    flag = cfg.get("is_matryoshka", False)
    if not isinstance(flag, bool):
        raise ValueError(f"{source}: is_matryoshka must be true or false, got {flag!r}")
    if allowed is None or allowed == []:
        return () if flag else None
    if (not isinstance(allowed, list)
            or any(not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= hidden_size for n in allowed)):
        raise ValueError(f"{source}: matryoshka_dimensions must be a list of lengths from 1 to the hidden size "
                         f"({hidden_size}), got {allowed!r}")
    return tuple(sorted(set(allowed)))


def check_dimensions(dimensions: int, hidden_size: int, matryoshka_dimensions: tuple[int, ...] | None,
                     model_name: str = "the model") -> None:
    """ValueError unless a request may ask for `dimensions` values of this model's vectors."""
    if matryoshka_dimensions is None:
        raise ValueError(f"dimensions: {model_name} is not a Matryoshka embedding model (its config.json sets "
                         f"neither is_matryoshka nor matryoshka_dimensions; hf_overrides can), so its vectors "
                         f"cannot be shortened; leave dimensions unset (got {dimensions})")
    if not 1 <= dimensions <= hidden_size:
        raise ValueError(f"dimensions: {model_name} gives vectors of 1 to {hidden_size} values, got {dimensions}")
    if matryoshka_dimensions and dimensions not in matryoshka_dimensions:
        raise ValueError(f"dimensions: {model_name} supports the Matryoshka lengths "
                         f"{list(matryoshka_dimensions)}, got {dimensions}")
