"""What every model configuration (model_config.py's ModelConfig, encoder_config.py's EncoderConfig,
expert_fields.py) checks alike: the error that names an unsupported option, and the positive sizes."""

from __future__ import annotations


class UnsupportedModelError(ValueError):
    """The model's architecture or one of its options is not supported."""


def check_positive_integers(config, names: tuple[str, ...]) -> None:
    """ValueError naming config.source and the first of the fields `names` that is not a positive
    integer (a decoder's or an encoder's sizes)."""
    for name in names:
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{config.source}: {name} must be a positive integer, got {value!r}")
