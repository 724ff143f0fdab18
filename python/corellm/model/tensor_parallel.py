"""Tensor parallelism (Megatron's split, as vLLM does it) for the Llama family: what each rank of
a group of `size` holds of a model and of its weights.

    qkv, gate_up   column-parallel: rank r holds its heads' rows of q, k and v (KV heads
                   replicated when there are fewer than ranks: rank r holds KV head r // (size / kv))
                   and its slice of the intermediate rows
    o, down        row-parallel: the matching columns; each rank's partial output is summed over
                   the group (an all-reduce) before the residual add
    embedding,     vocabulary-parallel: rank r holds rows [r * V', (r + 1) * V') of the vocabulary
    LM head        padded to size * V'; a lookup zeroes the ids outside its rows and sums over
                   the group; the logits are gathered on rank 0 and the padding cut
    norms          replicated

Everything that does not divide is a ValueError naming the heads (or the sizes) and the group size."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

import torch

from corellm.model.model_config import ModelConfig


def check_divisible(config: ModelConfig, size: int) -> None:
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    h, kv, inter = config.num_attention_heads, config.num_key_value_heads, config.intermediate_size
    if h % size:
        raise ValueError(f"tensor_parallel_size {size} does not divide the model's {h} attention heads")
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel_size {size} and the model's {kv} KV heads: one must divide the other "
                         f"(KV heads are split, or replicated when there are fewer than ranks)")
    if inter % size:
        raise ValueError(f"tensor_parallel_size {size} does not divide the model's intermediate size {inter}")


def vocab_rows(vocab_size: int, size: int) -> int:
    """Vocabulary rows per rank (the vocabulary padded to a multiple of size)."""
    return -(-vocab_size // size)


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """One rank's share of the model: its heads, KV heads, intermediate size and vocabulary rows."""
    check_divisible(config, size)
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // size,
                               num_key_value_heads=max(1, config.num_key_value_heads // size),
                               intermediate_size=config.intermediate_size // size,
                               vocab_size=vocab_rows(config.vocab_size, size))


def shard_weights(weights: Iterable[tuple[str, torch.Tensor]], config: ModelConfig, rank: int,
                  size: int) -> Iterator[tuple[str, torch.Tensor]]:
    """The full checkpoint's tensors (HF names) -> rank `rank`'s shards, in the local shapes."""
    c = config
    hd = c.head_dim
    heads = c.num_attention_heads // size
    kv_local = max(1, c.num_key_value_heads // size)
    kv_first = (rank * kv_local) if c.num_key_value_heads >= size else rank // (size // c.num_key_value_heads)
    inter = c.intermediate_size // size
    vocab = vocab_rows(c.vocab_size, size)
    for name, t in weights:
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: tensor parallelism needs dense weights (load a GGUF file with "
                             f"quantization='none')")
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            t = t[rank * heads * hd : (rank + 1) * heads * hd]
        elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            t = t[kv_first * hd : (kv_first + kv_local) * hd]
        elif name.endswith("o_proj.weight"):
            t = t[:, rank * heads * hd : (rank + 1) * heads * hd]
        elif name.endswith(("gate_proj.weight", "up_proj.weight")):
            t = t[rank * inter : (rank + 1) * inter]
        elif name.endswith("down_proj.weight"):
            t = t[:, rank * inter : (rank + 1) * inter]
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            rows = t[rank * vocab : (rank + 1) * vocab]
            if rows.shape[0] < vocab:  # the last rank's padding rows: never looked up, logits cut
                rows = torch.cat([rows, rows.new_zeros(vocab - rows.shape[0], t.shape[1])])
            t = rows
        yield name, t.contiguous()
