"""YaRN's fields in a model's config, as transformers completes and checks them: the pretrained
context length's defaults, the context a YaRN model serves (vLLM's rule), and the checks of its
settings (ModelConfig's; model/rope.py computes the frequencies and the attention factor)."""

from __future__ import annotations

import math
from typing import Any


def with_yarn_defaults(scaling: dict[str, Any] | None, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """YaRN's scaling as transformers completes it: its type under "rope_type", and the pretrained
    context length from the config's top level where it has one, else from the scaling, else
    max_position_embeddings. Any other scaling as it is."""
    if scaling is None or scaling.get("rope_type", scaling.get("type")) != "yarn":
        return scaling
    scaling = {**scaling, "rope_type": "yarn"}
    scaling.pop("type", None)
    if cfg.get("original_max_position_embeddings") is not None:
        scaling["original_max_position_embeddings"] = cfg["original_max_position_embeddings"]
    scaling.setdefault("original_max_position_embeddings", cfg.get("max_position_embeddings"))
    return scaling


def context_length(cfg: dict[str, Any], scaling: dict[str, Any] | None, default: int) -> int:
    """The positions the model serves: max_position_embeddings, or under YaRN the pretrained length
    times the factor where that is longer (vLLM's rule: Qwen2.5's 32768 x 4 = 131072)."""
    length = cfg.get("max_position_embeddings", default)
    if scaling is not None and scaling.get("rope_type") == "yarn":
        original, factor = scaling.get("original_max_position_embeddings"), scaling.get("factor")
        if (isinstance(original, int) and isinstance(factor, (int, float)) and not isinstance(factor, bool)
                and math.isfinite(factor)):
            length = max(length, int(original * factor))
    return length


def check_yarn(s: dict[str, Any], source: str) -> None:
    """YaRN: a factor of at least 1, the pretrained context length, finite betas (fast above slow)."""
    factor, original = s.get("factor"), s.get("original_max_position_embeddings")
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor >= 1:
        raise ValueError(f"{source}: yarn rope scaling needs a factor of at least 1, got {factor!r}")
    if isinstance(original, bool) or not isinstance(original, int) or original <= 0:
        raise ValueError(f"{source}: yarn rope scaling needs a positive original_max_position_embeddings, "
                         f"got {original!r}")
    fast, slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
    if not all(isinstance(b, (int, float)) and math.isfinite(b) and b > 0 for b in (fast, slow)) or fast < slow:
        raise ValueError(f"{source}: yarn rope scaling needs positive beta_fast >= beta_slow, got "
                         f"beta_fast={s.get('beta_fast')!r}, beta_slow={s.get('beta_slow')!r}")
    for key in ("attention_factor", "mscale", "mscale_all_dim"):
        value = s.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value) or value < 0):
            raise ValueError(f"{source}: yarn rope scaling's {key} must be a number >= 0, got {value!r}")

