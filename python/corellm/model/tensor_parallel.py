"""Tensor parallelism (Megatron's split, as vLLM does it) for the Llama family: what each rank of
a group of `size` holds of a model and of its weights.

    qkv, gate_up   column-parallel: rank r holds its heads' rows of q, k and v (KV heads
                   replicated when there are fewer than ranks: rank r holds KV head r // (size / kv))
                   and its slice of the intermediate rows
    o, down        row-parallel: the matching columns; each rank's partial output is summed over
                   the group (an all-reduce) before the residual add; their biases (gpt-oss's) in
                   rank 0's partial sum alone (zeros on the others)
    sinks          (gpt-oss) one per query head: the rank's heads' 
    experts        a mixture of experts: every expert's (and a shared expert's) gate and up
                   column-parallel (gpt-oss's gate and up biases cut as their rows) and its down
                   row-parallel, as a dense MLP's; the router (with gpt-oss's bias; and
                   the shared expert's gate) replicated, so that every rank routes each token to
                   the same experts; the weighted sum of a token's experts is then a sum of the
                   ranks' partial sums, all-reduced once per layer
    embedding,     vocabulary-parallel: rank r holds rows [r * V', (r + 1) * V') of the vocabulary
    LM head        padded to size * V'; a lookup zeroes the ids outside its rows and sums over
                   the group; the logits are gathered on rank 0 and the padding cut
    norms          replicated; OLMoE's q and k norms, over each token's whole q and k, see the
                   whole rows: every rank writes its columns into rows of zeros, the rows are
                   all-reduced (adding zeros is exact) and normed whole, and each rank takes its
                   columns back (WholeRowColumns)
    LoRA updates   cut as the projection they update (shard_lora_adapter): a column-parallel
                   projection's update keeps its A and the columns of B that are the rank's output
                   columns; a row-parallel one's keeps the rows of A^T that are the rank's input
                   columns and the whole B. Its partial update is added to the projection's partial
                   output before the layer's all-reduce: the sum over the ranks of x_r A_r^T B^T is
                   x A^T B^T, so no collective of its own

Everything that does not divide is a ValueError naming the heads (or the sizes) and the group size."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from corellm.model.model_config import ModelConfig
from corellm.model.quantized_tensor import QuantizedTensor, column_slice, row_slice

if TYPE_CHECKING:  # lora_adapter imports corellm.model, which imports this module
    from corellm.lora.lora_adapter import LoraAdapter, LoraPart


def check_divisible(config: ModelConfig, size: int) -> None:
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    h, kv = config.num_attention_heads, config.num_key_value_heads
    if h % size:
        raise ValueError(f"tensor_parallel_size {size} does not divide the model's {h} attention heads")
    if kv % size and size % kv:
        raise ValueError(f"tensor_parallel_size {size} and the model's {kv} KV heads: one must divide the other "
                         f"(KV heads are split, or replicated when there are fewer than ranks)")
    for what, inter in _intermediate_sizes(config).items():
        if inter % size:
            raise ValueError(f"tensor_parallel_size {size} does not divide the model's {what} {inter}")


def _intermediate_sizes(config: ModelConfig) -> dict[str, int]:
    """The MLPs' intermediate sizes the model uses, by name: a dense MLP's (when some layer is
    dense), the experts' and a shared expert's."""
    sizes = {}
    if any(not config.layer_is_sparse(i) for i in range(config.num_hidden_layers)):
        sizes["intermediate size"] = config.intermediate_size
    if config.num_experts:
        sizes["experts' intermediate size (moe_intermediate_size)"] = config.moe_intermediate_size
    if config.shared_expert_intermediate_size:
        sizes["shared expert's intermediate size"] = config.shared_expert_intermediate_size
    return sizes


def vocab_rows(vocab_size: int, size: int) -> int:
    """Vocabulary rows per rank (the vocabulary padded to a multiple of size)."""
    return -(-vocab_size // size)


def shard_config(config: ModelConfig, size: int) -> ModelConfig:
    """One rank's share of the model: its heads, KV heads, intermediate size and vocabulary rows."""
    check_divisible(config, size)
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // size,
                               num_key_value_heads=max(1, config.num_key_value_heads // size),
                               intermediate_size=config.intermediate_size // size,
                               moe_intermediate_size=config.moe_intermediate_size // size,
                               shared_expert_intermediate_size=config.shared_expert_intermediate_size // size,
                               vocab_size=vocab_rows(config.vocab_size, size))


def shard_weights(weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]], config: ModelConfig, rank: int,
                  size: int) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """The full checkpoint's tensors (HF names) -> rank `rank`'s shards, in the local shapes. A
    quantized tensor (a GGUF type, or --quantization int8's) is cut in its packed form, the same
    bits, where the cut falls on its panels (16 rows) and blocks (32 or 256 columns); elsewhere it
    is dequantized first, and that layer runs in the dtype."""
    c = config
    hd = c.head_dim
    heads = c.num_attention_heads // size
    kv_local, kv_first = _kv_heads_of(c, rank, size)
    vocab = vocab_rows(c.vocab_size, size)
    for name, t in weights:
        if name.endswith(("q_proj.weight", "q_proj.bias")):
            t = row_slice(t, rank * heads * hd, (rank + 1) * heads * hd, name)
        elif name.endswith(("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias")):
            t = row_slice(t, kv_first * hd, (kv_first + kv_local) * hd, name)
        elif name.endswith("o_proj.weight"):
            t = column_slice(t, rank * heads * hd, (rank + 1) * heads * hd, name)
        elif name.endswith("self_attn.sinks"):  # (gpt-oss) a sink per query head: the rank's heads'
            t = t[rank * heads:(rank + 1) * heads]
        elif name.endswith(_GATE_AND_UP):
            inter = _intermediate_of(name, c) // size
            t = row_slice(t, rank * inter, (rank + 1) * inter, name)
        elif name.endswith(_DOWN):
            inter = _intermediate_of(name, c) // size
            t = column_slice(t, rank * inter, (rank + 1) * inter, name)
        elif name.endswith(_ROW_PARALLEL_BIASES) and rank > 0:
            # gpt-oss's o and down biases: a row-parallel output is a partial sum, all-reduced once,
            # so the bias goes into rank 0's alone (the others add zeros)
            t = torch.zeros_like(t)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            # the last rank's padding rows: never looked up, their logits cut
            t = _padded(row_slice(t, rank * vocab, min((rank + 1) * vocab, t.shape[0]), name), vocab)
        yield name, (t if isinstance(t, QuantizedTensor) else t.contiguous())


def _kv_heads_of(config: ModelConfig, rank: int, size: int) -> tuple[int, int]:
    """(how many KV heads rank `rank` holds, the first of them): its own, or the one it shares with
    size / kv - 1 other ranks when there are fewer KV heads than ranks."""
    kv = config.num_key_value_heads
    local = max(1, kv // size)
    return local, (rank * local if kv >= size else rank // (size // kv))


@dataclasses.dataclass(frozen=True)
class WholeRowColumns:
    """Where a rank's q and k columns sit in a token's whole q and k rows, for OLMoE's whole-row q/k
    norms over the group: q at [q_start, q_start + its q size) of q_whole, k at [k_start, ..) of
    kv_whole; writes_k: whether it puts its k into the gathered rows (of the ranks that hold the same
    KV heads, the first: written by each, the rows would hold k times their count, which the norm
    undoes but for its epsilon)."""

    q_start: int
    q_whole: int
    k_start: int
    kv_whole: int
    writes_k: bool

    @staticmethod
    def of(config: ModelConfig, rank: int, size: int) -> WholeRowColumns:
        """config: the whole model's."""
        _, kv_first = _kv_heads_of(config, rank, size)
        shared_by = max(1, size // config.num_key_value_heads)
        return WholeRowColumns(q_start=rank * config.q_size // size, q_whole=config.q_size,
                               k_start=kv_first * config.head_dim, kv_whole=config.kv_size,
                               writes_k=rank % shared_by == 0)


# An MLP's gate and up (column-parallel) and down (row-parallel), by the checkpoint's names: a
# dense MLP's, an expert's (Mixtral's w1 / w3 / w2) and Qwen2-MoE's shared expert's. The routers
# (mlp.gate, block_sparse_moe.gate) and shared_expert_gate are none of them: replicated.
_GATE_AND_UP = ("gate_proj.weight", "up_proj.weight", ".w1.weight", ".w3.weight",
                "gate_proj.bias", "up_proj.bias")  # (gpt-oss's experts' biases: cut as their rows)
_DOWN = ("down_proj.weight", ".w2.weight")
_ROW_PARALLEL_BIASES = ("o_proj.bias", "down_proj.bias")


def _intermediate_of(name: str, config: ModelConfig) -> int:
    """The whole intermediate size of the MLP that tensor `name` belongs to."""
    if ".experts." in name:
        return config.moe_intermediate_size
    if ".shared_expert." in name:
        return config.shared_expert_intermediate_size
    return config.intermediate_size


def _padded(t, rows: int):
    if t.shape[0] == rows:
        return t
    if isinstance(t, QuantizedTensor):
        return t.padded(rows)
    return torch.cat([t, t.new_zeros(rows - t.shape[0], t.shape[1])])


def shard_lora_adapter(adapter: LoraAdapter, config: ModelConfig, rank: int, size: int) -> LoraAdapter:
    """Rank `rank`'s share of a LoRA adapter of the whole model (config: the whole model's), cut as
    shard_weights cuts the projections it updates (the module docstring's "LoRA updates"). A part
    of qkv or gate_up keeps the rank's columns of its own (a q part the rank's heads, a whole-qkv
    part, Phi-3's, the rank's q, k and v columns side by side), at their place in the rank's
    projection; it is left out on a rank that holds none of them."""
    if size == 1:
        return adapter
    local = _local_columns(config, rank, size)
    layers = []
    for parts_by_projection in adapter.layers:
        shares: dict[str, list[LoraPart]] = {}
        for projection, parts in parts_by_projection.items():
            columns = local[projection]
            if projection in ("o", "down"):  # row-parallel: the rank's input columns, the whole output
                shares[projection] = [dataclasses.replace(p, a_t=p.a_t[columns].contiguous()) for p in parts]
                continue
            shares[projection] = []
            for p in parts:
                cols = p.b_t.shape[1]
                at = torch.nonzero((columns >= p.col_offset) & (columns < p.col_offset + cols)).flatten()
                if at.numel() == 0:
                    continue
                first = int(at[0])
                if int(at[-1]) - first + 1 != at.numel():
                    raise AssertionError(f"{projection}: a LoRA part's columns are not contiguous on rank {rank}")
                b_t = p.b_t[:, columns[at] - p.col_offset].contiguous()
                shares[projection].append(dataclasses.replace(p, col_offset=first, b_t=b_t))
        layers.append(shares)
    return dataclasses.replace(adapter, layers=layers, _native=None)


def _local_columns(config: ModelConfig, rank: int, size: int) -> dict[str, torch.Tensor]:
    """projection -> which of the whole projection's columns the rank's holds, in its order: the
    output columns of qkv and gate_up, the input columns of o and down. Found by cutting index
    tensors with shard_weights itself, so that the adapter's cut is the weights' by construction."""
    q, kv, inter = config.q_size, config.kv_size, config.intermediate_size
    rows = lambda lo, hi: torch.arange(lo, hi).unsqueeze(1)  # noqa: E731 - a weight's rows: output columns
    attn, mlp = "model.layers.0.self_attn.", "model.layers.0.mlp."
    cut = dict(shard_weights([(attn + "q_proj.weight", rows(0, q)), (attn + "k_proj.weight", rows(q, q + kv)),
                              (attn + "v_proj.weight", rows(q + kv, q + 2 * kv)),
                              (attn + "o_proj.weight", torch.arange(q).unsqueeze(0)),
                              (mlp + "gate_proj.weight", rows(0, inter)), (mlp + "up_proj.weight", rows(inter, 2 * inter)),
                              (mlp + "down_proj.weight", torch.arange(inter).unsqueeze(0))], config, rank, size))
    return {"qkv": torch.cat([cut[attn + n + "_proj.weight"].flatten() for n in "qkv"]),
            "o": cut[attn + "o_proj.weight"].flatten(),
            "gate_up": torch.cat([cut[mlp + "gate_proj.weight"].flatten(), cut[mlp + "up_proj.weight"].flatten()]),
            "down": cut[mlp + "down_proj.weight"].flatten()}
