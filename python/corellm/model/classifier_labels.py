"""A sequence classifier's labels, read from its HF config.json: its id2label, or (a causal
checkpoint read as a classifier, vLLM's hf_overrides) the tokens whose output rows make its score
matrix. Shared by the decoders' ModelConfig and the encoders' EncoderConfig."""

from __future__ import annotations

from typing import Any


def read_classifier_labels(cfg: dict[str, Any], source: str) -> tuple[str, ...]:
    """A classifier's labels in id order: its id2label (transformers writes it with every config),
    else LABEL_0 .. LABEL_{num_labels - 1} (transformers' default: two)."""
    id2label = cfg.get("id2label") or {}
    count = cfg.get("num_labels", len(id2label) or 2)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise ValueError(f"{source}: num_labels must be a positive integer, got {count!r}")
    try:
        names = {int(i): str(name) for i, name in id2label.items()}
    except (TypeError, ValueError):
        raise ValueError(f"{source}: id2label's keys must be label ids, got {sorted(id2label)}") from None
    if names and sorted(names) != list(range(count)):
        raise ValueError(f"{source}: id2label names ids {sorted(names)}, num_labels is {count}")
    return tuple(names.get(i, f"LABEL_{i}") for i in range(count))


_FROM_TOKEN_METHODS = ("from_2_way_softmax", "no_post_processing")


def read_classifier_from_tokens(cfg: dict[str, Any], source: str) -> tuple[tuple[str, ...], bool]:
    """(the tokens whose output rows make the score matrix, whether as a two-way softmax) of a
    causal checkpoint read as a classifier, as vLLM's hf_overrides say it: "classifier_from_token",
    and "method" ("from_2_way_softmax" — also what "is_original_qwen3_reranker" means — or
    "no_post_processing", the default); ((), False): the checkpoint has its own score matrix."""
    tokens = cfg.get("classifier_from_token")
    if tokens is None:
        return (), False
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) and t for t in tokens):
        raise ValueError(f"{source}: classifier_from_token must be a list of tokens, got {tokens!r}")
    method = cfg.get("method") or ("from_2_way_softmax" if cfg.get("is_original_qwen3_reranker")
                                   else "no_post_processing")
    if method not in _FROM_TOKEN_METHODS:
        raise ValueError(f"{source}: method must be one of {', '.join(_FROM_TOKEN_METHODS)}, got {method!r}")
    if method == "from_2_way_softmax" and len(tokens) != 2:
        raise ValueError(f"{source}: from_2_way_softmax takes two tokens (false, true), got {tokens}")
    return tuple(tokens), method == "from_2_way_softmax"
