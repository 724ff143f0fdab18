"""ModelRunner: owns the KV cache and the persistent batch; each step it lays out the inputs the
scheduler asked for (through the C++ BatchBuilder), runs the forward, computes logits where
tokens are sampled, and samples.

Two phases, as in vLLM v1: execute_model(scheduler_output) runs the forward and keeps an
ExecuteModelState, returning None; sample_tokens() consumes it and returns the
ModelRunnerOutput."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from corellm import ops
from corellm.native import _core
from corellm.engine_core_request import EngineCoreRequest
from corellm.lora.lora_adapter import LoraAdapter
from corellm.lora.lora_batch import LoraBatch
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.loader import LoadedModel
from corellm.model.native_stack import NativeDecoderStack, supports as native_stack_supports
from corellm.model.tensor_parallel import shard_lora_adapter
from corellm.structured_output.grammar_output import GrammarOutput
from corellm.multimodal.features import MultiModalFeature
from corellm.worker.cuda_graphs import CUDAGraphRunner
from corellm.worker.encoder_cache import EncoderCache
from corellm.worker.kv_cache import allocate_kv_caches
from corellm.worker.logits_buffer import LogitsBuffer
from corellm.worker.lora_slots import LoraSlots
from corellm.worker.model_runner_output import ModelRunnerOutput, PromptLogprobs, SampledTokenLogprobs
from corellm.worker.pooler import Pooler
from corellm.worker.sampled_rows import sampled_rows
from corellm.worker.sampling_state import SamplingState
from corellm.worker import token_bitmasks
from corellm.worker.step_activity import StepActivity
from corellm.worker.step_message import StepMessage
from corellm.worker.tp_workers import TensorParallelWorkers

logger = logging.getLogger("corellm")


@dataclass(frozen=True)
class PromptSpan:
    """A request's prompt positions start .. end-1 scored this step (each predicts the next prompt
    token), at hidden rows hidden_start .. hidden_end-1 of the step."""

    req_id: str
    start: int
    end: int
    hidden_start: int
    hidden_end: int


@dataclass
class ExecuteModelState:
    scheduler_output: _core.SchedulerOutput
    logits: torch.Tensor | None  # float32 [num_reqs, vocab]
    prompt_logprobs: dict[str, PromptLogprobs]
    pooled: dict[str, list[float]] = field(default_factory=dict)  # embedding requests done this step


class ModelRunner:
    def __init__(self, loaded: LoadedModel, scheduler_config: _core.SchedulerConfig, kv_cache_dtype: torch.dtype,
                 enforce_eager: bool = False, tp_workers: TensorParallelWorkers | None = None,
                 pooling_type: str = "LAST", max_loras: int = 0):
        """kv_cache_dtype: the KV cache's element type (worker/kv_cache.py's kv_cache_torch_dtype;
        every rank's and a draft model's too). On CUDA, decode batches replay captured CUDA graphs
        unless enforce_eager. tp_workers:
        the model is rank 0 of a tensor-parallel group whose other ranks run in these workers;
        each step's inputs are sent to them before the forward. pooling_type: how embedding
        requests' vectors are made (worker/pooler.py). max_loras: how many LoRA adapters it holds
        at once (0: LoRA off)."""
        self.encoder_only = loaded.config.encoder_only  # no KV cache; each input whole in its step
        self.pooler = Pooler(pooling_type, classifier=loaded.model.classify if loaded.config.classifier_labels else None,
                             classify_pooling=loaded.config.classifier_pooling if self.encoder_only else "LAST",
                             projection=loaded.embedding_projection)
        self._pooling: set[str] = set()  # the embedding requests in the batch (most steps: none)
        self.model = loaded.model
        self.device = self.model.device
        self.vocab_size = loaded.config.vocab_size
        c = scheduler_config
        self.block_size = c.block_size
        self.activity = StepActivity()  # the KV cache's commit waits for pauses in the steps
        self.kv_cache_dtype = kv_cache_dtype
        self.kv_caches = [] if self.encoder_only else allocate_kv_caches(
            self.model.config, c.num_blocks, c.block_size, kv_cache_dtype, self.device, self.activity)  # this rank's KV heads
        self.tp_workers = tp_workers
        if tp_workers is not None:
            tp_workers.setup(c.num_blocks, c.block_size, kv_cache_dtype)
            for m in tp_workers.collective_rpc("memory_usage"):
                logger.info("tensor parallel rank %d (pid %d): weights %.1f MiB, KV cache %.1f MiB, resident %.0f MiB",
                            m["rank"], m["pid"], m["weight_bytes"] / 2**20, m["kv_cache_bytes"] / 2**20,
                            m["resident_bytes"] / 2**20)
        self.builder = _core.BatchBuilder(max_num_reqs=c.max_num_seqs, max_model_len=c.max_model_len,
                                          block_size=c.block_size, max_num_batched_tokens=c.max_num_batched_tokens)
        self.sampling = SamplingState(c.max_num_seqs)
        # A step's logits rows: a request's sampled row, plus one per draft token it verifies.
        self.logits_buffer = LogitsBuffer(self.vocab_size, min(c.max_num_batched_tokens,
                                                               c.max_num_seqs * (1 + c.num_speculative_tokens)),
                                          self.device)
        # Image inputs (a LLaVA model): each running request's images, and their encoder outputs.
        self.mm_features: dict[str, list[MultiModalFeature]] = {}
        self.encoder_cache = EncoderCache()
        self._state: ExecuteModelState | None = None
        # The ways a step's forward can run besides the model's per-op layers (see forward).
        self.cuda_graphs: CUDAGraphRunner | None = None
        self.native_stack: NativeDecoderStack | None = None
        if self.encoder_only:
            pass  # the per-op layers (model/bert.py)
        elif self.device.type == "cuda" and not enforce_eager and tp_workers is None:
            self.cuda_graphs = CUDAGraphRunner(self.model, self.kv_caches, c.max_num_seqs, c.max_model_len,
                                               c.block_size, self.device)
            self.cuda_graphs.capture()
        elif native_stack_supports(self.model):
            self.native_stack = NativeDecoderStack(self.model, self.kv_caches)
        self.lora_slots = LoraSlots(max_loras, self._hold_lora) if max_loras else None
        self._lora_slot_of: dict[str, int] = {}  # the running requests that have an adapter: its slot

    def _hold_lora(self, slot: int, adapter: LoraAdapter) -> LoraAdapter:
        """LoraSlots' hold: the adapter into the slot on every rank (each worker cuts its own share)
        and into the native stack; returns what this rank computes with (its share)."""
        if self.tp_workers is not None:
            self.tp_workers.collective_rpc("set_lora", slot, adapter)
            adapter = shard_lora_adapter(adapter, self.model.full_config, 0, self.tp_workers.spec.size)
        if self.native_stack is not None:
            self.native_stack.set_lora(slot, adapter)
        return adapter

    def shutdown(self) -> None:
        """Releases what the runner holds beyond the KV cache (the CUDA graphs, the workers)."""
        if self.cuda_graphs is not None:
            self.cuda_graphs.release()
            self.cuda_graphs = None
        if self.tp_workers is not None:
            self.tp_workers.stop()
            self.tp_workers = None

    # ------------------------------------------------------------------ phase 1
    def execute_model(self, so: _core.SchedulerOutput) -> None:
        if self._state is not None:
            raise RuntimeError("sample_tokens() must be called after execute_model() returns None")
        self._update_states(so)
        if so.num_reqs == 0:  # nothing scheduled: no forward
            self._state = ExecuteModelState(so, None, {})
            return None
        b = self.builder
        b.prepare_inputs(so)
        spans = self._prompt_spans(so)
        with torch.inference_mode(), self.activity.running():
            hidden = self.forward(so, spans)
            # Prompt logprobs first: their pieces and then the sampled rows take the logits buffer in
            # turn (tp_workers.py's ranks gather in the same order).
            prompt_logprobs = self._prompt_logprobs(spans, hidden)
            rows = sampled_rows(hidden, b.logits_indices)
            logits = self.model.compute_logits(rows, out=self.logits_buffer.rows(rows.shape[0]))
            pooled = self._pool(so, hidden)
        # The sampler runs where the logits are (corellm's CPU or CUDA kernel).
        self._state = ExecuteModelState(so, logits.float().contiguous(), prompt_logprobs, pooled)
        return None

    def forward(self, so: _core.SchedulerOutput, prompt_spans: list[PromptSpan] = ()) -> torch.Tensor:
        """The step's forward over the builder's inputs -> hidden states [num_tokens, hidden]. The
        one place that picks how it runs:
          1. a captured CUDA graph: on a GPU, for a uniform-decode batch no larger than the largest
             capture (padded to the next captured size);
          2. the native decoder stack: on a CPU with the weights packed in bf16 (one native call);
          3. the model's per-op layers: everything else (fp32, a GPU's prefill and mixed batches,
             an encoder-only model, with its inputs' token types).
        2 and 3 are bit-identical; 1 runs 3's kernels. prompt_spans: the rows whose logits the step
        scores after the sampled ones (tensor-parallel workers compute them alongside)."""
        b = self.builder
        image_rows = self._image_rows(so) if self.mm_features else None
        graph_size = None
        if self.cuda_graphs is not None and image_rows is None:
            graph_size = self.cuda_graphs.dispatch(so.num_reqs, so.total_num_scheduled_tokens)
        if graph_size is not None:
            return self.cuda_graphs.run(graph_size, b.input_ids, b.positions, b.slot_mapping, b.block_table,
                                        b.seq_lens)
        if self.device.type == "cpu":
            i32 = torch.from_numpy  # zero-copy views of the builder's buffers
        else:  # one host-to-device copy per array, enqueued on the current stream
            i32 = lambda a: torch.from_numpy(a).to(self.device, non_blocking=True)  # noqa: E731
        attn = AttentionMetadata(slot_mapping=i32(b.slot_mapping), block_table=i32(b.block_table),
                                 seq_lens=i32(b.seq_lens), query_start_loc=i32(b.query_start_loc),
                                 max_query_len=b.max_query_len, max_seq_len=b.max_seq_len)
        if self.encoder_only:
            types = self._token_types(so)
            return self.model.forward(i32(b.input_ids), i32(b.positions), attn,
                                      token_type_ids=None if types is None else i32(types))
        lora_slots = self._lora_slots(so) if self._lora_slot_of else None
        if self.tp_workers is not None:  # the other ranks run the same step on their shares
            index, rows = image_rows if image_rows is not None else (None, None)
            StepMessage.send(self.tp_workers.channel, input_ids=b.input_ids, positions=b.positions,
                             slot_mapping=b.slot_mapping, seq_lens=b.seq_lens, query_start_loc=b.query_start_loc,
                             block_table=b.block_table, block_size=self.block_size,
                             logits_indices=b.logits_indices, max_query_len=b.max_query_len, max_seq_len=b.max_seq_len,
                             prompt_rows=[(s.hidden_start, s.hidden_end) for s in prompt_spans],
                             image_row_index=index, image_rows=None if rows is None else rows.cpu(),
                             lora_slots=lora_slots)
        inputs_embeds = None
        if image_rows is not None:  # after the step message: under TP the embedding is a collective
            index, rows = image_rows
            inputs_embeds = self.model.embed_with_image_rows(i32(b.input_ids), index.to(self.device), rows)
        if self.native_stack is not None:
            return self.native_stack.forward(i32(b.input_ids), i32(b.positions), attn, inputs_embeds=inputs_embeds,
                                             lora_slots=None if lora_slots is None else i32(lora_slots))
        lora = None if lora_slots is None else LoraBatch(i32(lora_slots), self.lora_slots.computed)
        return self.model.forward(i32(b.input_ids), i32(b.positions), attn, self.kv_caches,
                                  inputs_embeds=inputs_embeds, lora=lora)

    def _lora_slots(self, so: _core.SchedulerOutput) -> np.ndarray | None:
        """int32 [num_tokens]: each of the step's tokens' LoRA slot (-1: the base model), or None
        when none of its requests has an adapter."""
        starts = self.builder.query_start_loc
        slots = None
        for i, req_id in enumerate(so.req_ids):
            slot = self._lora_slot_of.get(req_id)
            if slot is not None:
                if slots is None:
                    slots = np.full(len(self.builder.input_ids), -1, dtype=np.int32)
                slots[starts[i]:starts[i + 1]] = slot
        return slots

    def _token_types(self, so: _core.SchedulerOutput) -> np.ndarray | None:
        """int32 [num_tokens]: each of the step's tokens' token type (an encoder's segment: 1 over the
        second text of a cross-encoder's pair), or None when no request of the step gave any (all 0)."""
        starts = self.builder.query_start_loc
        types = None
        for i, req_id in enumerate(so.req_ids):
            given = self.sampling.requests[req_id].request.token_type_ids
            if given is not None:
                if types is None:
                    types = np.zeros(len(self.builder.input_ids), dtype=np.int32)
                start = int(so.num_computed_tokens[i])
                types[starts[i]:starts[i + 1]] = given[start:start + int(so.num_scheduled_tokens[i])]
        return types

    def _image_rows(self, so: _core.SchedulerOutput) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The step's image rows: (the flat rows of the placeholders it computes, int64 [k]; the
        image rows for them [k, hidden]), or None when it computes no placeholder (seed 003's
        _execute_mm_encoder + _gather_mm_embeddings). The images the scheduler planned for this
        step are encoded (each alone, so that its rows are the same whatever else the step holds)
        into the encoder cache; each scheduled placeholder takes its image's row from there.
            | computed | this step's tokens |        (a request's prompt positions)
                  | image placeholders |               -> rows [lo - offset, hi - offset) of its output"""
        computed, scheduled = so.num_computed_tokens, so.num_scheduled_tokens
        query_start = self.builder.query_start_loc
        wanted = []  # (first flat row, image hash, first image row, end image row)
        to_encode = set(so.encoder_hashes)
        sources: dict[str, MultiModalFeature] = {}
        done = []
        for i, req_id in enumerate(so.req_ids):
            features = self.mm_features.get(req_id)
            if not features:
                continue
            start = int(computed[i])
            end = start + int(scheduled[i])
            for f in features:
                lo, hi = max(start, f.offset), min(end, f.end)
                if lo < hi:
                    wanted.append((int(query_start[i]) + lo - start, f.hash, lo - f.offset, hi - f.offset))
                    if f.hash in to_encode:
                        sources[f.hash] = f
            if end >= features[-1].end:  # past its last image: later steps need nothing of it
                done.append(req_id)
        for req_id in done:
            del self.mm_features[req_id]
        if not wanted:
            return None
        for image_hash in so.encoder_hashes:
            pixels = sources[image_hash].pixel_values[None].to(self.device)
            self.encoder_cache.put(image_hash, self.model.encode_images(pixels)[0])
        index = torch.cat([torch.arange(row, row + last - first) for row, _, first, last in wanted])
        rows = torch.cat([self.encoder_cache.get(image_hash)[first:last] for _, image_hash, first, last in wanted])
        return index, rows

    def _update_states(self, so: _core.SchedulerOutput) -> None:
        for req_id in list(so.finished_req_ids) + list(so.preempted_req_ids):
            self.sampling.remove(req_id)
            self.mm_features.pop(req_id, None)
            self._pooling.discard(req_id)
            self._lora_slot_of.pop(req_id, None)
        for req_id in so.finished_req_ids:
            self.pooler.drop(req_id)
        for image_hash in so.freed_encoder_hashes:
            self.encoder_cache.drop(image_hash)
        for new in so.scheduled_new_reqs:
            request: EngineCoreRequest = new.payload
            outputs = list(new.token_ids[new.num_prompt_tokens:])
            self.sampling.add(request, new.batch_row, outputs)
            if request.mm_features:
                self.mm_features[request.request_id] = request.mm_features
            if request.pooling is not None:
                self._pooling.add(request.request_id)
            if request.lora is not None:  # placed by the engine when it entered the scheduler
                slot = self.lora_slots.slot_of(request.lora)
                if slot is None:  # its slot was given to another adapter while it ran: a bug, never the base model
                    raise RuntimeError(f"request {request.request_id}'s LoRA adapter {request.lora.name!r} is in no slot")
                self._lora_slot_of[request.request_id] = slot
        self.builder.update_states(so)

    def _prompt_spans(self, so: _core.SchedulerOutput) -> list[PromptSpan]:
        """The step's prompt positions to score, per request that asked for prompt logprobs (after
        prepare_inputs: the builder's query_start_loc locates each request's rows), in pieces of
        at most the logits buffer's rows (each piece's logits are written there in turn)."""
        spans = []
        if not self.sampling.with_prompt_logprobs:
            return spans
        piece = self.logits_buffer.max_rows
        computed, scheduled = so.num_computed_tokens, so.num_scheduled_tokens
        qsl = self.builder.query_start_loc
        for i, req_id in enumerate(so.req_ids):
            r = self.sampling.requests.get(req_id)
            if r is None or r.request.sampling_params.prompt_logprobs is None:
                continue
            start = int(computed[i])
            # Query position p predicts the token at p + 1; only prompt tokens are scored here.
            end = min(start + int(scheduled[i]), len(r.request.prompt_token_ids) - 1)
            for a in range(start, end, piece):
                b = min(end, a + piece)
                spans.append(PromptSpan(req_id, a, b, int(qsl[i]) + (a - start), int(qsl[i]) + (b - start)))
        return spans

    def _pool(self, so: _core.SchedulerOutput, hidden: torch.Tensor) -> dict[str, list[float]]:
        """The vectors of the embedding requests whose prompt this step completes (the pooler keeps
        what earlier chunks left)."""
        pooled = {}
        if not self._pooling:
            return pooled
        qsl = self.builder.query_start_loc
        for i, req_id in enumerate(so.req_ids):
            if req_id not in self._pooling:
                continue
            r = self.sampling.requests[req_id]
            start, n = int(so.num_computed_tokens[i]), int(so.num_scheduled_tokens[i])
            vector = self.pooler.pool(req_id, r.request.pooling, len(r.request.prompt_token_ids), start,
                                      hidden[int(qsl[i]):int(qsl[i]) + n])
            if vector is not None:
                pooled[req_id] = vector
        return pooled

    def _prompt_logprobs(self, spans: list[PromptSpan], hidden: torch.Tensor) -> dict[str, PromptLogprobs]:
        """Each span's positions scored: the logits of its rows (into the logits buffer on the
        CPU), then ops.token_logprobs — the raw distribution's logprob and rank of the next prompt
        token, and the top prompt_logprobs tokens. A request's pieces are joined."""
        out: dict[str, PromptLogprobs] = {}
        for span in spans:
            r = self.sampling.requests[span.req_id]
            n = span.end - span.start
            logits = self.model.compute_logits(hidden[span.hidden_start:span.hidden_end],
                                               out=self.logits_buffer.rows(n))
            targets = r.request.prompt_token_ids[span.start + 1 : span.end + 1]
            scored = ops.token_logprobs(logits, torch.tensor(targets, dtype=torch.int32, device=logits.device),
                                       r.request.sampling_params.prompt_logprobs)
            piece = PromptLogprobs(start=span.start + 1, token_ids=list(targets), logprobs=scored.logprobs.tolist(),
                                   ranks=scored.ranks.tolist(), top_token_ids=scored.top_token_ids.tolist(),
                                   top_logprobs=scored.top_logprobs.tolist())
            earlier = out.get(span.req_id)
            out[span.req_id] = piece if earlier is None else earlier.followed_by(piece)
        return out

    # ------------------------------------------------------------------ phase 2
    def sample_tokens(self, grammar_output: GrammarOutput | None = None) -> ModelRunnerOutput:
        """Samples the step's tokens; grammar_output (structured output): the bitmasks of the
        tokens each structured row may take, applied in the sample kernel. A request verifying
        draft tokens has one logits row per draft plus one: each row is sampled as that output
        position would be, and the rejection sampler keeps the drafts up to the first one the
        target disagrees with, plus the target's own token there (or after the last draft)."""
        state, self._state = self._state, None
        if state is None:
            raise RuntimeError("sample_tokens() called without a preceding execute_model()")
        so = state.scheduler_output
        if state.logits is None:
            return ModelRunnerOutput.empty()
        req_ids = so.req_ids
        rows = so.batch_rows
        num_drafts = so.num_draft_tokens
        speculative = bool(num_drafts.any())
        md = self.sampling.metadata(req_ids, rows, num_drafts, so.draft_token_ids)
        grammar = None if grammar_output is None else (grammar_output.bitmask, grammar_output.bitmask_rows)
        allowed = self.sampling.allowed_token_bitmask(req_ids, state.logits.shape[-1])
        masks = token_bitmasks.combine(grammar, allowed)
        if masks is not None:  # one row per request; a request verifying drafts: the same for each of its rows
            bitmask, bitmask_rows = masks
            md.allowed_token_bitmask = torch.from_numpy(bitmask)
            md.bitmask_rows = torch.from_numpy(np.repeat(bitmask_rows, num_drafts + 1) if speculative else bitmask_rows)
        if self.device.type != "cpu":
            md = md.to(self.device)
        scored = self._score_logprob_token_ids(so, state.logits)  # before sample() overwrites them
        result = ops.sample(state.logits, md)
        if speculative:
            as_tensor = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(self.device)  # noqa: E731
            new_tokens = ops.rejection_sample(result.sampled_token_ids, as_tensor(num_drafts),
                                              as_tensor(so.draft_token_ids)).cpu().numpy()
        else:
            new_tokens = result.sampled_token_ids.cpu().numpy()[:, None]
        samples = so.samples_token
        new_tokens[~samples] = -1
        out = ModelRunnerOutput(req_ids, new_tokens, prompt_logprobs=state.prompt_logprobs, pooled=state.pooled)
        for i in np.nonzero(samples & (new_tokens[:, 0] < 0))[0]:
            if masks is not None and masks[1][i] >= 0:  # the request's constraints left nothing to sample
                in_grammar = grammar is not None and grammar[1][i] >= 0
                in_allowed = allowed is not None and allowed[1][i] >= 0
                out.errors[req_ids[i]] = ("its grammar and its allowed_token_ids leave no token in common to sample "
                                          "here" if in_grammar and in_allowed else
                                          "its grammar leaves no token to sample here" if in_grammar else
                                          "none of its allowed_token_ids may be sampled here (its other settings, "
                                          "min_tokens or bad_words, rule them all out)")
                out.error_fields[req_ids[i]] = "structured_outputs" if in_grammar else "allowed_token_ids"
            else:
                out.errors[req_ids[i]] = "the model produced NaN logits"
        if result.logprobs is not None:
            out.logprobs = self._sampled_logprobs(req_ids, new_tokens, num_drafts, result, scored)
        self.sampling.record(req_ids, rows, new_tokens)
        self.builder.record_sampled(so, new_tokens)
        return out

    def _score_logprob_token_ids(self, so: _core.SchedulerOutput,
                                 logits: torch.Tensor) -> dict[str, tuple[list[int], np.ndarray, np.ndarray]]:
        """For each request sampling this step with logprob_token_ids: (its ids, logprobs [rows, ids],
        ranks [rows, ids]) over its logits rows (one, or one per draft plus one), under the raw
        distribution. ops.token_logprobs scores one token per row, with the sampler's own arithmetic (so an id
        that is also sampled gets the sampled token's logprob exactly); it runs once per id over
        the request's rows, which a few label tokens make cheap."""
        if not self.sampling.with_logprob_token_ids:
            return {}
        num_drafts = so.num_draft_tokens
        first_rows = np.cumsum(num_drafts + 1) - (num_drafts + 1)
        out = {}
        for i, req_id in enumerate(so.req_ids):
            if req_id not in self.sampling.with_logprob_token_ids or not so.samples_token[i]:
                continue
            ids = self.sampling.requests[req_id].request.sampling_params.logprob_token_ids
            rows = logits[int(first_rows[i]):int(first_rows[i] + num_drafts[i] + 1)]
            scored = [ops.token_logprobs(rows, torch.full((rows.shape[0],), t, dtype=torch.int32, device=rows.device),
                                         0) for t in ids]
            out[req_id] = (ids, torch.stack([s.logprobs for s in scored], 1).cpu().numpy(),
                           torch.stack([s.ranks for s in scored], 1).cpu().numpy())
        return out

    def _sampled_logprobs(self, req_ids: list[str], new_tokens: np.ndarray, num_drafts: np.ndarray,
                          result: ops.SamplerOutput, scored: dict[str, tuple[list[int], np.ndarray, np.ndarray]]
                          ) -> dict[str, list[SampledTokenLogprobs]]:
        """Each sampling request's logprobs, one per new token (token j from its logits row j), its
        top-n cut to the n it asked for, or its logprob_token_ids' (`scored`) in their place."""
        logprobs, ranks = result.logprobs.cpu().numpy(), result.ranks.cpu().numpy()
        top_ids, top_lps = result.top_token_ids.cpu().numpy(), result.top_logprobs.cpu().numpy()
        first_rows = np.cumsum(num_drafts + 1) - (num_drafts + 1)
        out = {}
        for i, req_id in enumerate(req_ids):
            params = self.sampling.requests[req_id].request.sampling_params
            if not params.wants_logprobs:
                continue
            entries = []
            for j, token in enumerate(new_tokens[i].tolist()):
                if token < 0:
                    break
                r = first_rows[i] + j
                if req_id in scored:
                    ids, id_logprobs, id_ranks = scored[req_id]
                    entries.append(SampledTokenLogprobs(token, float(logprobs[r]), int(ranks[r]), list(ids),
                                                        id_logprobs[j].tolist(), id_ranks[j].tolist()))
                else:
                    k = params.logprobs
                    entries.append(SampledTokenLogprobs(token, float(logprobs[r]), int(ranks[r]),
                                                        top_ids[r, :k].tolist(), top_lps[r, :k].tolist()))
            if entries:
                out[req_id] = entries
        return out

    def abandon_step(self) -> None:
        """Forgets a step whose forward or sampling failed (its requests are finished with an error)."""
        self._state = None
