"""Rotary embedding tables: inverse frequencies (with llama3, linear or LongRoPE scaling) and the
cos/sin cache the rotary kernel reads, computed as HF transformers computes them (float32).

LongRoPE (Phi-3) divides each frequency by a factor of its own: the short factors for contexts up
to the pretrained length (original_max_position_embeddings), the long ones beyond, and scales cos
and sin by an attention factor. transformers switches between the two by the length of each
forward; corellm, as vLLM and llama.cpp do, picks once for the model by the longest sequence it
will run (max_model_len), so that a sequence's cached keys never mix the two."""

from __future__ import annotations

import math

import torch

from corellm.model.model_config import ModelConfig


def rotary_exponents(rotary_dim: int) -> torch.Tensor:
    """[rotary_dim / 2] float32: 2i / rotary_dim, each frequency's power of the base."""
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64).float() / rotary_dim


def default_inverse_frequencies(rotary_dim: int, theta: float) -> torch.Tensor:
    """[rotary_dim / 2] float32: theta^(-2i / rotary_dim), unscaled rotary embeddings' frequencies."""
    return 1.0 / (theta ** rotary_exponents(rotary_dim))


def inverse_frequencies(config: ModelConfig, theta: float | None = None, scaled: bool = True,
                        max_model_len: int | None = None) -> torch.Tensor:
    """[rotary_dim / 2] float32. theta: the rope base (default the config's); scaled: apply the
    config's rope scaling (Gemma 3 scales its global layers only); max_model_len: the longest
    sequence the model will run (default max_position_embeddings), which picks LongRoPE's factors."""
    dim = config.rotary_dim
    base = config.rope_theta if theta is None else theta
    exponents = rotary_exponents(dim)
    scaling = config.rope_scaling if scaled else None
    kind = config.rope_type if scaled else None
    if kind == "longrope":
        long = longrope_is_long(config, max_model_len)
        factors = torch.tensor(scaling["long_factor" if long else "short_factor"], dtype=torch.float32)
        return 1.0 / (factors * base**exponents)
    inv = default_inverse_frequencies(dim, base)
    if not scaling:
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    old_len = float(scaling.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def longrope_is_long(config: ModelConfig, max_model_len: int | None) -> bool:
    """Whether a LongRoPE model runs its long factors: max_model_len (default max_position_embeddings)
    past the pretrained length."""
    original = config.rope_scaling["original_max_position_embeddings"]
    return (max_model_len or config.max_position_embeddings) > original


def attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by: LongRoPE's attention_factor (by default
    sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original, when s > 1); else 1."""
    scaling = config.rope_scaling
    if config.rope_type != "longrope":
        return 1.0
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    original = scaling["original_max_position_embeddings"]
    factor = scaling.get("factor") or config.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def cos_sin_cache(config: ModelConfig | None, max_position: int, inv_freq: torch.Tensor | None = None,
                  scale: float = 1.0) -> torch.Tensor:
    """[max_position, rotary_dim] float32: cos of the angles in the first half, sin in the second,
    each times scale (attention_factor). The frequencies: inv_freq, else the config's."""
    inv = inverse_frequencies(config) if inv_freq is None else inv_freq.float()
    positions = torch.arange(max_position, dtype=torch.int64).float()
    angles = positions[:, None] * inv[None, :]
    if scale == 1.0:
        return torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous()
    return torch.cat([angles.cos() * scale, angles.sin() * scale], dim=-1).contiguous()
