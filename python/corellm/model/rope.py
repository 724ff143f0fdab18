"""Rotary embedding tables: inverse frequencies (with llama3, linear, LongRoPE or YaRN scaling) and
the cos/sin cache the rotary kernel reads, computed as HF transformers computes them (float32).

LongRoPE (Phi-3) divides each frequency by a factor of its own: the short factors for contexts up
to the pretrained length (original_max_position_embeddings), the long ones beyond, and scales cos
and sin by an attention factor. transformers switches between the two by the length of each
forward; corellm, as vLLM and llama.cpp do, picks once for the model by the longest sequence it
will run (max_model_len), so that a sequence's cached keys never mix the two.

YaRN (Qwen2.5 and Qwen3 past their pretrained context, DeepSeek, gpt-oss) keeps the high
frequencies (many turns over the pretrained length), divides the low ones by `factor`, and blends
linearly over the dimensions between the two whose frequencies turn beta_fast and beta_slow times
over original_max_position_embeddings; cos and sin are scaled by 0.1 ln(factor) + 1 (or, where
mscale and mscale_all_dim are given, the ratio of that form for each)."""

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
    if kind == "yarn":
        return yarn_inverse_frequencies(scaling, dim, base)
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


def yarn_inverse_frequencies(scaling: dict, dim: int, base: float) -> torch.Tensor:
    """[dim / 2] float32, YaRN's (module docstring): frequency i is kept (extrapolated) below the
    blend's first dimension, divided by factor (interpolated) past its last, linearly mixed
    between. The blend's bounds: where a frequency turns beta_fast (default 32) and beta_slow
    (default 1) times over the pretrained length, rounded outwards unless `truncate` is false
    (gpt-oss), kept within [0, dim - 1]."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def dimension_turning(turns: float) -> float:
        return dim * math.log(original / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_turning(beta_fast), dimension_turning(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # (transformers' guard against a zero-width blend)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    powers = base ** rotary_exponents(dim)
    extrapolated, interpolated = 1.0 / powers, 1.0 / (factor * powers)
    keep = 1 - ramp  # 1: the frequency as trained
    return interpolated * (1 - keep) + extrapolated * keep


def yarn_attention_factor(scaling: dict) -> float:
    """What YaRN multiplies cos and sin by: attention_factor where given, else 0.1 mscale ln(factor)
    + 1 over the same with mscale_all_dim where both are given (DeepSeek), else 0.1 ln(factor) + 1."""
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = float(scaling["factor"])

    def mscale(weight: float = 1.0) -> float:
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if scaling.get("mscale") and scaling.get("mscale_all_dim"):
        return mscale(float(scaling["mscale"])) / mscale(float(scaling["mscale_all_dim"]))
    return mscale()


def longrope_is_long(config: ModelConfig, max_model_len: int | None) -> bool:
    """Whether a LongRoPE model runs its long factors: max_model_len (default max_position_embeddings)
    past the pretrained length."""
    original = config.rope_scaling["original_max_position_embeddings"]
    return (max_model_len or config.max_position_embeddings) > original


def attention_factor(config: ModelConfig) -> float:
    """What cos and sin are multiplied by: LongRoPE's attention_factor (by default
    sqrt(1 + ln(s) / ln(original)), s = max_position_embeddings / original, when s > 1), YaRN's
    (yarn_attention_factor); else 1."""
    scaling = config.rope_scaling
    if config.rope_type == "yarn":
        return yarn_attention_factor(scaling)
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
