"""Rotary embedding tables: inverse frequencies (with llama3 or linear scaling) and the
cos/sin cache the rotary kernel reads, computed as HF transformers computes them (float32)."""

from __future__ import annotations

import math

import torch

from corellm.model.model_config import ModelConfig


def inverse_frequencies(config: ModelConfig, theta: float | None = None, scaled: bool = True) -> torch.Tensor:
    """theta: the rope base (default the config's); scaled: apply the config's rope scaling (Gemma 3
    scales its global layers only)."""
    dim = config.head_dim
    base = config.rope_theta if theta is None else theta
    inv = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling if scaled else None
    if not scaling:
        return inv
    kind = scaling.get("rope_type", scaling.get("type"))
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


def cos_sin_cache(config: ModelConfig, max_position: int, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """[max_position, head_dim] float32: cos of the angles in the first half, sin in the second."""
    inv = inverse_frequencies(config) if inv_freq is None else inv_freq.float()
    positions = torch.arange(max_position, dtype=torch.int64).float()
    angles = positions[:, None] * inv[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).contiguous()
