"""PoolingParams: an embedding request (vLLM's PoolingParams for its "embed" task), given where a
SamplingParams would be: the engine computes the prompt (no token is kept) and pools its final
hidden states — the final norm's output, as transformers' `last_hidden_state` — into one vector:

    LAST   the prompt's last token's row (decoder embedding models: Qwen3-Embedding, e5-mistral)
    MEAN   the mean of every prompt row, in fp32
    CLS    the prompt's first token's row

The pooling type is the model's (pooling_type_of: its sentence-transformers 1_Pooling/config.json,
else LAST, CLS for an encoder such as BERT), or the engine's `pooling_type`; the vector is
L2-normalized unless `normalize` is False; with `dimensions` (a Matryoshka model's), only its first
`dimensions` values are kept, before the normalization.

With task "classify" (vLLM's classify task; a sequence classifier only: ModelConfig's
classifier_labels) the request is a classification instead: the prompt's last token's row (LAST,
as transformers' decoder *ForSequenceClassification pool, whatever the engine's pooling type; an
encoder's first, CLS) through the model's head (a score matrix; BERT's pooler and classifier), in
fp32, gives one logit per label; with `use_activation` (the default) they
become probabilities: a softmax over the labels, or the sigmoid of the one logit of a one-label model
(a cross-encoder's relevance)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

POOLING_TYPES = ("LAST", "MEAN", "CLS")
POOLING_TASKS = ("embed", "classify")

# sentence-transformers' pooling modes (1_Pooling/config.json) -> corellm's
_SENTENCE_TRANSFORMERS_MODES = {"pooling_mode_lasttoken": "LAST", "pooling_mode_mean_tokens": "MEAN",
                                "pooling_mode_cls_token": "CLS"}


@dataclass
class PoolingParams:
    normalize: bool = True  # embed: the vector L2-normalized
    task: str = "embed"  # or "classify"
    use_activation: bool = True  # classify: probabilities, not logits
    # embed: the vector's first `dimensions` values (then normalized), for a Matryoshka model
    # (model/matryoshka.py; the input processor checks the model); None: the whole vector
    dimensions: int | None = None

    def __post_init__(self) -> None:
        for name in ("normalize", "use_activation"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}.")
        if self.task not in POOLING_TASKS:
            raise ValueError(f"task must be one of {', '.join(POOLING_TASKS)}, got {self.task!r}.")
        if self.dimensions is not None:
            if not isinstance(self.dimensions, int) or isinstance(self.dimensions, bool) or self.dimensions < 1:
                raise ValueError(f"dimensions must be a positive integer, got {self.dimensions!r}.")
            if self.task != "embed":
                raise ValueError(f"dimensions shortens an embedding; task {self.task!r} takes none.")


def pooling_type_of(model_path: str | Path, configured: str | None, default: str = "LAST") -> str:
    """The engine's pooling type: `configured` when given (one of POOLING_TYPES), else what the
    model directory's sentence-transformers pooling config names (one mode set), else `default`
    (LAST for a decoder; CLS for an encoder, as BERT-style models are trained)."""
    if configured is not None:
        if configured.upper() not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {configured!r}")
        return configured.upper()
    config = Path(model_path) / "1_Pooling" / "config.json"
    if config.is_file():
        asked = [key for key, on in json.loads(config.read_text()).items() if key.startswith("pooling_mode_") and on]
        if len(asked) != 1 or asked[0] not in _SENTENCE_TRANSFORMERS_MODES:
            raise ValueError(f"{config}: corellm pools by one of {', '.join(_SENTENCE_TRANSFORMERS_MODES)}, the "
                             f"model asks for {asked}; give pooling_type to choose")
        return _SENTENCE_TRANSFORMERS_MODES[asked[0]]
    return default
