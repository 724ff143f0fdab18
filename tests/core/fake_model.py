"""A fake model for driving the native core without weights: it keeps a fake paged KV cache
(token id and position per slot), checks that every sequence reads back exactly its own tokens
at the right positions, and "samples" a token that depends on the whole context. Any wrong
slot, wrong prefix offset or stale KV makes the check fail or changes the outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from corellm import _core


def next_token(context: list[int] | np.ndarray, vocab_size: int) -> int:
    """The fake model: a deterministic function of the whole context."""
    ctx = np.asarray(context, dtype=np.int64)
    weights = np.arange(1, len(ctx) + 1, dtype=np.int64)
    return int((ctx * weights).sum() * 2654435761 % 1000003 % vocab_size)


@dataclass
class ReferenceRequest:
    """How a request must end, computed without the engine (independent stop rules)."""

    prompt: list[int]
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    eos_token_id: int = -1
    stop_token_ids: tuple[int, ...] = ()
    outputs: list[int] = field(default_factory=list)
    finish_reason: str = ""

    def run(self, vocab_size: int, max_model_len: int) -> "ReferenceRequest":
        tokens = list(self.prompt)
        while True:
            t = next_token(tokens, vocab_size)
            tokens.append(t)
            self.outputs.append(t)
            n = len(self.outputs)
            if n >= self.min_tokens:
                if not self.ignore_eos and t == self.eos_token_id:
                    self.finish_reason = "stop"
                    return self
                if t in self.stop_token_ids:
                    self.finish_reason = "stop"
                    return self
            if n >= self.max_tokens or len(tokens) >= max_model_len:
                self.finish_reason = "length"
                return self


class FakeModelRunner:
    """Plays the model runner's part of a step: update the persistent batch, lay out the inputs,
    write the fake KV, read it back per sequence, sample."""

    def __init__(self, config: _core.SchedulerConfig, vocab_size: int):
        self.block_size = config.block_size
        self.vocab_size = vocab_size
        self.builder = _core.BatchBuilder(
            max_num_reqs=config.max_num_seqs,
            max_model_len=config.max_model_len,
            block_size=config.block_size,
            max_num_batched_tokens=config.max_num_batched_tokens,
        )
        num_slots = config.num_blocks * config.block_size
        self.kv_token = np.full(num_slots, -1, dtype=np.int64)
        self.kv_pos = np.full(num_slots, -1, dtype=np.int64)
        self.truth: dict[str, list[int]] = {}  # request id -> its tokens so far (test's own record)
        self.tokens_computed = 0

    def add_truth(self, request_id: str, prompt: list[int]) -> None:
        self.truth[request_id] = list(prompt)

    def execute(self, plan: _core.SchedulerOutput) -> np.ndarray:
        b = self.builder
        b.update_states(plan)
        b.prepare_inputs(plan)
        n = plan.num_reqs
        assert b.num_reqs == n and b.num_tokens == plan.total_num_scheduled_tokens
        slots = b.slot_mapping.astype(np.int64)
        assert len(np.unique(slots)) == len(slots), "two tokens of one step share a KV slot"
        self.kv_token[slots] = b.input_ids
        self.kv_pos[slots] = b.positions
        self.tokens_computed += b.num_tokens
        qsl, seq_lens, table = b.query_start_loc, b.seq_lens, b.block_table
        sampled = np.full(n, -1, dtype=np.int32)
        for i, req_id in enumerate(plan.req_ids):
            truth = self.truth[req_id]
            seq_len = int(seq_lens[i])
            start, end = int(qsl[i]), int(qsl[i + 1])
            assert end - start == plan.num_scheduled_tokens[i]
            assert seq_len == plan.num_computed_tokens[i] + plan.num_scheduled_tokens[i]
            assert list(b.input_ids[start:end]) == truth[seq_len - (end - start) : seq_len]
            assert b.logits_indices[i] == end - 1
            num_blocks = -(-seq_len // self.block_size)
            req_slots = (
                table[i, :num_blocks, None].astype(np.int64) * self.block_size
                + np.arange(self.block_size)
            ).ravel()[:seq_len]
            assert (self.kv_pos[req_slots] == np.arange(seq_len)).all(), f"{req_id}: wrong KV positions"
            assert (self.kv_token[req_slots] == truth[:seq_len]).all(), f"{req_id}: stale or foreign KV"
            if plan.samples_token[i]:
                sampled[i] = next_token(self.kv_token[req_slots], self.vocab_size)
                truth.append(int(sampled[i]))
        b.record_sampled(plan, sampled)
        return sampled
