"""StepMessage: what a tensor-parallel step needs beyond the weights, sent by rank 0 (the engine's
model runner) to the other ranks before its forward — the batch builder's flat arrays, the
rows whose logits are computed and, for a step that computes image placeholders (LLaVA), the
image rows rank 0 encoded — as one message on the group's BroadcastChannel (shared memory
on one machine): a header of sizes and one int32 payload. Every rank then runs the same forward
on its share of the model (its collectives pair up with rank 0's); a header with command RPC
carries a worker method call (collective_rpc), one with command RESULT rank 0's answer to an
LLM call that every rank made (LLM(...) under torchrun: the ranks' loops return it), STOP ends a
worker's loop."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from corellm.distributed.broadcast_channel import BroadcastChannel
from corellm.model.attention_metadata import AttentionMetadata

STEP, STOP, RPC, RESULT = 1, 0, 2, 3


@dataclass
class StepMessage:
    input_ids: torch.Tensor  # int32 [num_tokens]
    positions: torch.Tensor  # int32 [num_tokens]
    attn: AttentionMetadata
    logits_indices: torch.Tensor  # int64 [rows]: the hidden rows whose logits the step computes
    # Then, in order, the logits of hidden rows [start, end) for each pair (prompt logprobs).
    prompt_rows: list[tuple[int, int]]
    # Image rows in place of placeholders' embeddings (LlavaForConditionalGeneration.embed_with_image_rows):
    # their flat rows, int64 [k], and the rows' bits, int32 [k, words] (view them as the model's dtype).
    image_row_index: torch.Tensor | None = None
    image_row_bits: torch.Tensor | None = None

    @staticmethod
    def send(channel: BroadcastChannel, *, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
             seq_lens: np.ndarray, query_start_loc: np.ndarray, block_table: np.ndarray, logits_indices: np.ndarray,
             max_query_len: int, max_seq_len: int, prompt_rows: list[tuple[int, int]] = (),
             image_row_index: torch.Tensor | None = None, image_rows: torch.Tensor | None = None) -> None:
        """image_row_index int64 [k] and image_rows [k, hidden] (bf16 or fp32), or neither."""
        n, seqs = input_ids.shape[0], seq_lens.shape[0]
        cols = block_table.shape[1] if block_table.ndim == 2 else 0
        spans = np.asarray(prompt_rows, dtype=np.int32).reshape(-1)
        if image_rows is None:
            index, bits = np.empty(0, np.int32), np.empty((0, 0), np.int32)
        else:
            index, bits = image_row_index.numpy(), image_rows.contiguous().view(torch.int32).numpy()
        channel.send([STEP, n, seqs, cols, logits_indices.shape[0], max_query_len, max_seq_len, len(prompt_rows),
                      bits.shape[0], bits.shape[1]],
                     [input_ids, positions, slot_mapping, seq_lens, query_start_loc, block_table, logits_indices, spans,
                      index, bits])

    @staticmethod
    def send_command(channel: BroadcastChannel, command: int) -> None:
        """STOP."""
        channel.send([command])

    @staticmethod
    def send_bytes(channel: BroadcastChannel, command: int, data: bytes) -> None:
        """RPC: a pickled (method, args) for the workers (TensorParallelWorkers.collective_rpc);
        RESULT: rank 0's pickled answer to a call every rank made."""
        padded = np.frombuffer(data + b"\0" * (-len(data) % 4), np.int32)
        channel.send([command, len(data)], [padded])

    @staticmethod
    def receive(channel: BroadcastChannel) -> tuple[int, bytes | None, StepMessage | None]:
        """(command, the bytes of an RPC or a RESULT, the step for STEP)."""
        header, payload = channel.receive()
        command, n, seqs, cols, rows, max_query_len, max_seq_len, num_spans, images, words = header
        if command in (RPC, RESULT):
            return command, payload.tobytes()[:n], None
        if command != STEP:
            return command, None, None
        sizes = [n, n, n, seqs, seqs + 1, seqs * cols, rows, 2 * num_spans, images, images * words]
        if payload.size != sum(sizes):
            raise RuntimeError(f"a step message carries {payload.size} values where its header needs {sum(sizes)}")
        parts = torch.split(torch.from_numpy(payload), sizes)
        attn = AttentionMetadata(slot_mapping=parts[2], block_table=parts[5].view(seqs, cols), seq_lens=parts[3],
                                 query_start_loc=parts[4], max_query_len=max_query_len, max_seq_len=max_seq_len)
        prompt_rows = [tuple(pair) for pair in parts[7].view(num_spans, 2).tolist()]
        step = StepMessage(parts[0], parts[1], attn, parts[6].long(), prompt_rows)
        if images:
            step.image_row_index, step.image_row_bits = parts[8].long(), parts[9].view(images, words)
        return STEP, [], step
