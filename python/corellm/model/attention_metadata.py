"""AttentionMetadata: where this step's tokens sit in the paged KV cache, as the attention
layers read it (built by the model runner from the BatchBuilder's arrays)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # int32 [num_tokens]: KV slot of each query token
    block_table: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs]: tokens in each sequence's KV after this step
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]: each sequence's query tokens
    max_query_len: int = 0
    max_seq_len: int = 0

    @property
    def num_seqs(self) -> int:
        return self.block_table.shape[0]
