"""The Llama-family building blocks over corellm's ops: attention with a paged KV cache, the
SwiGLU MLP, and the decoder layer that chains them with RMSNorm and the residual stream.

Weights are fused at load time: q, k, v projections -> one qkv matrix; gate and up -> gate_up."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corellm import ops
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.model_config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]  # (key_cache, value_cache) of one layer


class Attention:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device):
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = self.head_dim**-0.5
        self.eps = config.rms_norm_eps
        self.sliding_window = config.sliding_window
        empty = lambda *shape: torch.empty(shape, dtype=dtype, device=device)  # noqa: E731
        self.qkv_weight = empty(self.q_size + 2 * self.kv_size, config.hidden_size)  # [q+2kv, hidden]
        self.qkv_bias = empty(self.q_size + 2 * self.kv_size) if config.attention_bias else None
        self.o_weight = empty(config.hidden_size, self.q_size)  # [hidden, q]
        self.q_norm = empty(self.head_dim) if config.qk_norm else None
        self.k_norm = empty(self.head_dim) if config.qk_norm else None

    def forward(self, positions: torch.Tensor, h: torch.Tensor, attn: AttentionMetadata, kv_cache: KVCache,
                cos_sin_cache: torch.Tensor) -> torch.Tensor:
        num_tokens = h.shape[0]
        qkv = F.linear(h, self.qkv_weight, self.qkv_bias)  # [num_tokens, q + 2kv]
        q = qkv[:, : self.q_size]
        k = qkv[:, self.q_size : self.q_size + self.kv_size]
        v = qkv[:, self.q_size + self.kv_size :]
        if self.q_norm is not None:  # Qwen3: RMSNorm over each head's dims
            q = ops.rms_norm(q.reshape(-1, self.head_dim), self.q_norm, self.eps).view(num_tokens, -1)
            k = ops.rms_norm(k.reshape(-1, self.head_dim), self.k_norm, self.eps).view(num_tokens, -1)
        ops.rotary_embedding(positions, q, k, self.head_dim, cos_sin_cache, is_neox=True)
        key_cache, value_cache = kv_cache
        ops.reshape_and_cache(k, v, key_cache, value_cache, attn.slot_mapping)
        out = ops.paged_attention(q, key_cache, value_cache, attn.block_table, attn.seq_lens,
                                  attn.query_start_loc, self.scale, self.sliding_window)
        return F.linear(out, self.o_weight)


class MLP:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device):
        self.gate_up_weight = torch.empty(2 * config.intermediate_size, config.hidden_size, dtype=dtype, device=device)
        self.down_weight = torch.empty(config.hidden_size, config.intermediate_size, dtype=dtype, device=device)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(ops.silu_and_mul(F.linear(h, self.gate_up_weight)), self.down_weight)


class DecoderLayer:
    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device):
        self.eps = config.rms_norm_eps
        self.input_norm = torch.empty(config.hidden_size, dtype=dtype, device=device)
        self.post_attention_norm = torch.empty(config.hidden_size, dtype=dtype, device=device)
        self.attn = Attention(config, dtype, device)
        self.mlp = MLP(config, dtype, device)

    def forward(self, positions: torch.Tensor, h: torch.Tensor, residual: torch.Tensor | None,
                attn: AttentionMetadata, kv_cache: KVCache, cos_sin_cache: torch.Tensor):
        """The residual stream is carried un-normalized: the layer's output is (h, residual) and
        the stream after it is h + residual (added by the next norm, fused)."""
        if residual is None:
            residual = h
            h = ops.rms_norm(h, self.input_norm, self.eps)
        else:
            h, residual = ops.fused_add_rms_norm(h, residual, self.input_norm, self.eps)
        h = self.attn.forward(positions, h, attn, kv_cache, cos_sin_cache)
        h, residual = ops.fused_add_rms_norm(h, residual, self.post_attention_norm, self.eps)
        return self.mlp.forward(h), residual
