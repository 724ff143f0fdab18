"""Slow, obviously-correct torch implementations of the ops, in float64."""

from __future__ import annotations

import math

import torch


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    # HF LlamaRMSNorm: normalize in fp32, round to the input dtype, multiply by the weight.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w * h.to(x.dtype)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    d = x.shape[1] // 2
    g, u = x[:, :d].double(), x[:, d:].double()
    return (g / (1 + torch.exp(-g)) * u).to(x.dtype)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh approximation in its textbook form, 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3)))."""
    d = x.shape[1] // 2
    g, u = x[:, :d].double(), x[:, d:].double()
    return (0.5 * g * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (g + 0.044715 * g**3))) * u).to(x.dtype)


def cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float()


def rotary(positions, x, head_size, cache, is_neox):
    n = x.shape[0]
    h = x.view(n, -1, head_size).double().clone()
    rot = cache.shape[1]
    cos = cache[positions.long(), : rot // 2].double()[:, None, :]
    sin = cache[positions.long(), rot // 2 :].double()[:, None, :]
    if is_neox:
        x1, x2 = h[..., : rot // 2].clone(), h[..., rot // 2 : rot].clone()
        h[..., : rot // 2] = x1 * cos - x2 * sin
        h[..., rot // 2 : rot] = x2 * cos + x1 * sin
    else:
        x1, x2 = h[..., 0:rot:2].clone(), h[..., 1:rot:2].clone()
        h[..., 0:rot:2] = x1 * cos - x2 * sin
        h[..., 1:rot:2] = x2 * cos + x1 * sin
    return h.to(x.dtype).view(n, -1)


def gather_kv(key_cache, value_cache, block_ids, seq_len):
    """[seq_len, num_kv_heads, head_size] K and V of one sequence, from the paged layout."""
    nb, nkv, hdx, bs, x = key_cache.shape
    k = key_cache[block_ids].permute(0, 3, 1, 2, 4).reshape(-1, nkv, hdx * x)  # [blocks * bs, kv_heads, head]
    v = value_cache[block_ids].permute(0, 2, 4, 1, 3).reshape(-1, nkv, hdx * x)
    return k[:seq_len], v[:seq_len]


def paged_attention(q, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, sliding_window=0,
                    softcap=0.0, sinks=None, causal=True):
    num_kv_heads, block_size = key_cache.shape[1], key_cache.shape[3]
    head_size = key_cache.shape[2] * key_cache.shape[4]
    num_heads = q.shape[1] // head_size
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=torch.float64)
    for s in range(block_table.shape[0]):
        L = int(seq_lens[s])
        a, b = int(query_start_loc[s]), int(query_start_loc[s + 1])
        n = b - a
        blocks = block_table[s, : math.ceil(L / block_size)].long()
        k, v = gather_kv(key_cache, value_cache, blocks, L)
        k = k.double().repeat_interleave(group, dim=1)  # [L, heads, d]
        v = v.double().repeat_interleave(group, dim=1)
        qs = q[a:b].double().view(n, num_heads, head_size)
        scores = torch.einsum("qhd,khd->hqk", qs, k) * scale
        if softcap:
            scores = torch.tanh(scores / softcap) * softcap
        qpos = torch.arange(L - n, L)[:, None]
        kpos = torch.arange(L)[None, :]
        allowed = kpos <= qpos if causal else torch.ones(n, L, dtype=torch.bool)
        if sliding_window > 0:
            allowed &= kpos > qpos - sliding_window
            if not causal:
                allowed &= kpos < qpos + sliding_window
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        if sinks is not None:  # one more logit per head, its weight dropped after the softmax (gpt-oss)
            sink = sinks.double()[:, None, None].expand(num_heads, n, 1)
            p = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            p = torch.softmax(scores, dim=-1)
        out[a:b] = torch.einsum("hqk,khd->qhd", p, v).reshape(n, -1)
    return out
