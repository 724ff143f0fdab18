"""DraftModelProposer: speculative decoding's draft model. After each step it proposes, for every
request that got tokens and runs on, the next num_speculative_tokens tokens by greedy decoding
with a smaller model that shares the target's tokenizer; the scheduler verifies them next step.

The draft has its own paged KV cache with the target's block layout: as many blocks, addressed by
the target's block tables, so a request's draft KV sits in the same block ids and slots as its
target KV (the scheduler reserves num_speculative_tokens lookahead slots past each scheduled
request for the draft's proposals). Per request the proposer keeps its tokens and how many of them
have draft KV (draft_computed). One proposal, for T known tokens:

  pass 0        the tokens [draft_computed, T) of every request, one varlen batch -> argmax of
                the last position = draft 1 (a new or resumed request computes its whole prompt)
  pass j < k    each request's draft j at position T + j - 1, one token per request -> draft j + 1

after which draft_computed = T: KV past T - 1 belongs to drafts, rewritten by the next pass 0 with
the tokens the target accepted. Blocks shared through the prefix cache get the same draft KV
again (same tokens, same positions, batch-invariant kernels), so sharing them is harmless."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from corellm.config import SpeculativeConfig
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.loader import LoadedModel, load_model
from corellm.model.native_stack import NativeDecoderStack, supports as native_stack_supports
from corellm.native import _core
from corellm.worker.kv_cache import allocate_kv_caches

logger = logging.getLogger("corellm")


def load_draft_model(spec: SpeculativeConfig, target: LoadedModel) -> LoadedModel:
    """Loads the draft model on the target's device and dtype, its rotary table as long as the
    target's (drafts sit at the target's positions); ValueError when its tokenizer is not the
    target's (its drafts would be other tokens)."""
    draft = load_model(spec.model, dtype=target.model.dtype, device=str(target.model.device),
                       max_position=target.model.cos_sin_cache.shape[0])
    mine, theirs = target.tokenizer.backend.get_vocab(), draft.tokenizer.backend.get_vocab()
    if mine != theirs:
        differing = len(set(mine.items()) ^ set(theirs.items()))
        raise ValueError(f"speculative_config: the draft model {spec.model!r} has another tokenizer than the target "
                         f"({len(theirs)} vs {len(mine)} tokens, {differing} differing entries): a draft model must "
                         f"share the target's tokenizer")
    logger.info("speculative decoding: draft model %s (%d layers), %d tokens per step", draft.name,
                draft.config.num_hidden_layers, spec.num_speculative_tokens)
    return draft


@dataclass
class DraftState:
    token_ids: list[int]  # the request's known tokens (prompt and outputs)
    draft_computed: int = 0  # leading tokens whose draft KV is written


class DraftModelProposer:
    def __init__(self, draft: LoadedModel, num_speculative_tokens: int, scheduler_config: _core.SchedulerConfig,
                 runner):
        self.model = draft.model
        self.k = num_speculative_tokens
        self.block_size = scheduler_config.block_size
        self.max_model_len = scheduler_config.max_model_len
        self.vocab_size = min(draft.config.vocab_size, runner.vocab_size)
        self.runner = runner  # the target's: its batch builder holds the block tables
        self.kv_caches = allocate_kv_caches(draft.config, scheduler_config.num_blocks, self.block_size,
                                            runner.kv_cache_dtype, self.model.device, runner.activity)
        self.stack = NativeDecoderStack(self.model, self.kv_caches) if native_stack_supports(self.model) else None
        self.states: dict[str, DraftState] = {}

    def propose(self, so: _core.SchedulerOutput, result: _core.SchedulerUpdate, scheduler: _core.Scheduler) -> None:
        """Follows the step (`so` planned, `result` applied) and hands the scheduler each running
        request's next drafts."""
        for req_id in list(so.finished_req_ids) + list(so.preempted_req_ids):
            self.states.pop(req_id, None)
        for new in so.scheduled_new_reqs:  # new, or resumed after preemption: draft KV from scratch
            request = new.payload
            if not request.uses_grammar:  # structured requests get no drafts
                self.states[new.req_id] = DraftState(list(new.token_ids))
        rows = dict(zip(so.req_ids, so.batch_rows.tolist()))
        tokens, counts, finished = result.new_token_ids.tolist(), result.num_new_tokens.tolist(), result.finish_reasons
        live: list[tuple[str, DraftState, list[int]]] = []  # (request, state, its block ids)
        start = 0
        for i, (req_id, n) in enumerate(zip(result.req_ids, counts)):
            state = self.states.get(req_id)
            if state is not None:
                state.token_ids.extend(tokens[start:start + n])
                if finished[i]:
                    del self.states[req_id]
                else:
                    live.append((req_id, state, self.runner.builder.row_block_ids(rows[req_id])))
            start += n
        if live:
            with torch.inference_mode():
                drafts = self._draft(live)
            for (req_id, _, _), ids in zip(live, drafts):
                scheduler.set_draft_token_ids(req_id, ids)

    def _draft(self, live: list[tuple[str, DraftState, list[int]]]) -> list[list[int]]:
        """Greedy drafts for each live request (fewer where its slots or max_model_len run out)."""
        bs = self.block_size
        # The last position each request may write: its blocks' end, and max_model_len.
        limits = [min(len(blocks) * bs, self.max_model_len) - 1 for _, _, blocks in live]
        segments = [(s.token_ids[s.draft_computed:], s.draft_computed) for _, s, _ in live]
        tables = [blocks for _, _, blocks in live]
        next_tokens = self._forward(segments, tables)
        drafts = [[t] for t in next_tokens]
        for _, s, _ in live:
            s.draft_computed = len(s.token_ids)
        for j in range(1, self.k):
            # Draft j sits at position T + j - 1; requests with no slot there stop drafting.
            idx = [i for i, (_, s, _) in enumerate(live)
                   if len(drafts[i]) == j and len(s.token_ids) + j - 1 <= limits[i]]
            if not idx:
                break
            out = self._forward([([drafts[i][-1]], len(live[i][1].token_ids) + j - 1) for i in idx],
                                [tables[i] for i in idx])
            for i, t in zip(idx, out):
                drafts[i].append(t)
        return drafts

    def _forward(self, segments: list[tuple[list[int], int]], tables: list[list[int]]) -> list[int]:
        """Runs the draft over each (tokens, first position) segment, writing their KV into the
        request's slots; returns the argmax after each segment's last token."""
        bs = self.block_size
        lens = [len(t) for t, _ in segments]
        input_ids = np.fromiter((t for toks, _ in segments for t in toks), np.int32, sum(lens))
        positions = np.concatenate([np.arange(p, p + n, dtype=np.int32) for (_, p), n in zip(segments, lens)])
        width = max(len(t) for t in tables)
        block_table = np.zeros((len(tables), width), np.int32)
        for i, t in enumerate(tables):
            block_table[i, :len(t)] = t
        owner = np.repeat(np.arange(len(segments)), lens)
        slot_mapping = (block_table[owner, positions // bs] * bs + positions % bs).astype(np.int32)
        seq_lens = np.array([p + n for (_, p), n in zip(segments, lens)], np.int32)
        query_start_loc = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        dev = self.model.device
        as_tensor = lambda a: torch.from_numpy(a).to(dev)  # noqa: E731
        attn = AttentionMetadata(slot_mapping=as_tensor(slot_mapping), block_table=as_tensor(block_table),
                                 seq_lens=as_tensor(seq_lens), query_start_loc=as_tensor(query_start_loc),
                                 max_query_len=max(lens), max_seq_len=int(seq_lens.max()))
        ids, pos = as_tensor(input_ids), as_tensor(positions)
        if self.stack is not None:
            hidden = self.stack.forward(ids, pos, attn)
        else:
            hidden = self.model.forward(ids, pos, attn, self.kv_caches)
        last = torch.from_numpy(query_start_loc[1:] - 1).long().to(dev)
        logits = self.model.compute_logits(hidden[last])[:, :self.vocab_size]
        return logits.argmax(dim=-1).tolist()
