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
    logits_indices: torch.Tensor  # int32 [rows]: the hidden rows whose logits the step computes
    # Then, in order, the logits of hidden rows [start, end) for each pair (prompt logprobs).
    prompt_rows: list[tuple[int, int]]
    # Image rows in place of placeholders' embeddings (LlavaForConditionalGeneration.embed_with_image_rows):
    # their flat rows, int64 [k], and the rows' bits, int32 [k, words] (view them as the model's dtype).
    image_row_index: torch.Tensor | None = None
    image_row_bits: torch.Tensor | None = None
    lora_slots: torch.Tensor | None = None  # int32 [num_tokens]: each token's LoRA slot (-1: none), or None

    @staticmethod
    def send(channel: BroadcastChannel, *, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
             seq_lens: np.ndarray, query_start_loc: np.ndarray, block_table: np.ndarray, block_size: int,
             logits_indices: np.ndarray, max_query_len: int, max_seq_len: int,
             prompt_rows: list[tuple[int, int]] = (), image_row_index: torch.Tensor | None = None,
             image_rows: torch.Tensor | None = None, lora_slots: np.ndarray | None = None) -> None:
        """The batch builder's int32 arrays. block_table [seqs, max blocks a request]: only the
        columns the step's longest sequence (max_seq_len tokens of block_size) reaches travel.
        image_row_index int64 [k] and image_rows [k, hidden] (bf16 or fp32), or neither.
        lora_slots: int32 [n], when a token of the step has a LoRA adapter."""
        n, seqs = input_ids.shape[0], seq_lens.shape[0]
        if block_table.ndim == 2:
            block_table = block_table[:, :-(-max_seq_len // block_size)]
        cols = block_table.shape[1] if block_table.ndim == 2 else 0
        parts = [input_ids, positions, slot_mapping, seq_lens, query_start_loc, block_table, logits_indices]
        header = [STEP, n, seqs, cols, logits_indices.shape[0], max_query_len, max_seq_len, len(prompt_rows), 0, 0,
                  int(lora_slots is not None)]
        if prompt_rows:
            parts.append(np.asarray(prompt_rows, dtype=np.int32).reshape(-1))
        if image_rows is not None:
            bits = image_rows.contiguous().view(torch.int32).numpy()
            parts += [image_row_index.numpy().astype(np.int32), bits]
            header[8:10] = bits.shape
        if lora_slots is not None:
            parts.append(lora_slots)
        channel.send(header, parts)

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
        """(command, the bytes of an RPC or a RESULT, the step for STEP). A step's tensors view the
        channel's message: they are valid until the next receive."""
        header, payload = channel.receive()
        command, n, seqs, cols, rows, max_query_len, max_seq_len, num_spans, images, words, lora = header
        if command in (RPC, RESULT):
            return command, payload.tobytes()[:n], None
        if command != STEP:
            return command, None, None
        # The parts' ends in the payload: input_ids, positions, slot_mapping [n]; seq_lens [seqs];
        # query_start_loc [seqs + 1]; block_table [seqs, cols]; logits_indices [rows]; the prompt
        # rows' pairs; the image rows' index [images] and bits [images, words]; the tokens' LoRA slots
        # [n] (lora: 1) or nothing. Each part becomes a tensor through a NumPy slice (far cheaper per
        # step than torch.split).
        e_ids, e_pos, e_slots = n, 2 * n, 3 * n
        e_lens = e_slots + seqs
        e_starts = e_lens + seqs + 1
        e_table = e_starts + seqs * cols
        e_logits = e_table + rows
        e_spans = e_logits + 2 * num_spans
        e_images = e_spans + images * (1 + words)
        end = e_images + n * lora
        if payload.size != end:
            raise RuntimeError(f"a step message carries {payload.size} values where its header needs {end}")
        i32 = torch.from_numpy
        attn = AttentionMetadata(slot_mapping=i32(payload[e_pos:e_slots]),
                                 block_table=i32(payload[e_starts:e_table].reshape(seqs, cols)),
                                 seq_lens=i32(payload[e_slots:e_lens]), query_start_loc=i32(payload[e_lens:e_starts]),
                                 max_query_len=max_query_len, max_seq_len=max_seq_len)
        prompt_rows = []
        if num_spans:
            prompt_rows = [tuple(pair) for pair in payload[e_logits:e_spans].reshape(num_spans, 2).tolist()]
        step = StepMessage(i32(payload[:e_ids]), i32(payload[e_ids:e_pos]), attn, i32(payload[e_table:e_logits]),
                           prompt_rows)
        if images:
            step.image_row_index = i32(payload[e_spans:e_spans + images]).long()
            step.image_row_bits = i32(payload[e_spans + images:e_images].reshape(images, words))
        if lora:
            step.lora_slots = i32(payload[e_images:end])
        return STEP, None, step
