"""EncoderAttention: an encoder step's bidirectional attention (BERT, RoBERTa, Nomic BERT,
ModernBERT), each input alone, every position seeing every other — or, in a sliding layer, those
at most `window` positions away on either side.

    context[t] = concat over heads of softmax(q_t k^T / sqrt(head_dim)) v   (over t's input's keys)

On the CPU, one call of corellm's attention kernel per layer for the whole step (ops.paged_attention
with causal=False: a row's arithmetic depends on its own input only, so an input gets the same
bits alone or beside others, as in the decoders). The kernel reads keys and values from a paged
cache: the step's are written into a scratch one (reshape_and_cache), laid out once per step —
each input's blocks one after the other, block_size tokens each — and reused by every layer. On
other devices, torch's scaled_dot_product_attention, one input at a time.

Against that per-input loop on the CPU (torch's flash attention widens bf16 to fp32 for MKL, and
each input and layer is a dispatch from Python): bench/embeddings.py in the README's encoder
section."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from corellm import ops

BLOCK_SIZE = 16


class EncoderAttention:
    def __init__(self, query_start_loc: list[int], heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device):
        """query_start_loc: the step's input bounds (each input whole, positions 0 .. n - 1)."""
        self.query_start_loc = query_start_loc
        self.heads, self.head_dim = heads, head_dim
        self.native = device.type == "cpu"
        if not self.native:
            return
        lengths = [end - start for start, end in zip(query_start_loc[:-1], query_start_loc[1:])]
        blocks = [-(-n // BLOCK_SIZE) for n in lengths]
        first = [0]
        for b in blocks:
            first.append(first[-1] + b)
        self.block_table = torch.zeros((len(lengths), max(blocks, default=0)), dtype=torch.int32)
        slots = []
        for i, (n, b) in enumerate(zip(lengths, blocks)):
            self.block_table[i, :b] = torch.arange(first[i], first[i] + b, dtype=torch.int32)
            slots.append(torch.arange(n, dtype=torch.int32) + first[i] * BLOCK_SIZE)
        self.slot_mapping = torch.cat(slots) if slots else torch.zeros(0, dtype=torch.int32)
        self.seq_lens = torch.tensor(lengths, dtype=torch.int32)
        self.bounds = torch.tensor(query_start_loc, dtype=torch.int32)
        key_shape, value_shape = ops.kv_cache_shapes(first[-1], heads, head_dim, BLOCK_SIZE, dtype)
        self.key_cache = torch.empty(key_shape, dtype=dtype)
        self.value_cache = torch.empty(value_shape, dtype=dtype)

    def __call__(self, qkv: torch.Tensor, window: int = 0) -> torch.Tensor:
        """qkv [tokens, 3 * heads * head_dim] (q, k, v) -> the context [tokens, heads * head_dim];
        window > 0: a position sees those at most `window` away (ModernBERT's sliding layers)."""
        d = self.heads * self.head_dim
        if not self.native:
            return self._by_torch(qkv, window)
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        ops.reshape_and_cache(k, v, self.key_cache, self.value_cache, self.slot_mapping)
        # the kernel's window counts the keys less than sliding_window away: |i - j| <= window
        return ops.paged_attention(q, self.key_cache, self.value_cache, self.block_table, self.seq_lens, self.bounds,
                                   self.head_dim**-0.5, sliding_window=window + 1 if window > 0 else 0,
                                   causal=False)

    def _by_torch(self, qkv: torch.Tensor, window: int) -> torch.Tensor:
        heads, head_dim = self.heads, self.head_dim
        context = torch.empty((qkv.shape[0], heads * head_dim), dtype=qkv.dtype, device=qkv.device)
        for start, end in zip(self.query_start_loc[:-1], self.query_start_loc[1:]):
            n = end - start
            # [n, 3d] -> q, k, v [1, heads, n, head_dim]
            q, k, v = qkv[start:end].view(n, 3, heads, head_dim).permute(1, 2, 0, 3).unsqueeze(1)
            mask = None
            if window and n > window + 1:
                where = torch.arange(n, device=qkv.device)
                mask = (where[:, None] - where[None, :]).abs() <= window
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            context[start:end] = out[0].transpose(0, 1).reshape(n, heads * head_dim)
        return context
