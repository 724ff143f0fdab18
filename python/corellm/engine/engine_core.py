"""EngineCore: the scheduler (C++) and the model runner, advanced one step at a time:
schedule -> execute_model (with the grammar bitmask filled meanwhile) -> sample_tokens -> process
aborts -> update_from_output (then the grammars advance with the sampled tokens; with speculative
decoding by a draft model, it proposes the next step's drafts).

Not thread-safe, except abort_requests: every other call comes from the one thread that steps
the engine. Aborts take one path whoever sends them: a thread-safe queue, drained on that
thread at the top of each step and again before the step's results are applied."""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from corellm.native import _core
from corellm.config import EngineConfig, SchedulerConfig
from corellm.engine.engine_core_outputs import EngineCoreOutput, EngineCoreOutputs
from corellm.engine.step_cost_model import StepCostModel
from corellm.engine_core_request import EngineCoreRequest
from corellm.model.loader import LoadedModel
from corellm.pooling_params import pooling_type_of
from corellm.sampling_params import RepetitionDetectionParams
from corellm.structured_output import GrammarCompiler, StructuredOutputManager
from corellm.worker.kv_cache import bytes_per_block, kv_cache_budget, kv_cache_torch_dtype
from corellm.worker.draft_model_proposer import DraftModelProposer, load_draft_model
from corellm.worker.model_runner import ModelRunner
from corellm.worker.tp_workers import TensorParallelWorkers

logger = logging.getLogger("corellm")


def plan_scheduler_config(loaded: LoadedModel, config: EngineConfig, kv_cache_dtype: torch.dtype,
                          draft: LoadedModel | None = None) -> SchedulerConfig:
    """Sizes the KV cache, of kv_cache_dtype elements, from the memory budget (shared with a draft
    model's KV cache, which has as many blocks of the same elements) and derives max_model_len when
    not given."""
    if loaded.config.encoder_only:
        return plan_encoder_scheduler_config(loaded, config)
    model_len = loaded.config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise ValueError(f"max_model_len ({config.max_model_len}) exceeds the model's context length "
                         f"({model_len} positions)")
    budget = kv_cache_budget(config.kv_cache_memory, loaded.model.device)
    per_block = bytes_per_block(loaded.model.config, config.block_size, kv_cache_dtype)  # a rank's share
    if draft is not None:
        per_block += bytes_per_block(draft.config, config.block_size, kv_cache_dtype)
    num_blocks = budget // per_block
    if num_blocks < 1:
        raise ValueError(f"the KV cache budget of {budget} bytes holds no block ({per_block} bytes each)")
    capacity = num_blocks * config.block_size
    max_model_len = config.max_model_len or min(model_len, capacity)
    logger.info("KV cache: %d blocks x %d tokens = %d tokens (%.2f GiB, %s)", num_blocks, config.block_size,
                capacity, num_blocks * per_block / 1024**3, kv_cache_dtype)
    spec = config.speculative_config
    if spec is not None and spec.num_speculative_tokens >= config.max_num_batched_tokens:
        raise ValueError(f"speculative_config: num_speculative_tokens ({spec.num_speculative_tokens}) must be below "
                         f"max_num_batched_tokens ({config.max_num_batched_tokens})")
    ngram = spec is not None and spec.method == "ngram"
    # Images (a LLaVA model): as vLLM sizes them, the encoder may take a step's token budget's worth
    # of placeholder tokens per step (at least one image), and hold as much.
    llava = getattr(loaded.model, "llava", None)
    encoder_tokens = max(config.max_num_batched_tokens, llava.tokens_per_image) if llava is not None else 0
    return SchedulerConfig(num_blocks=int(num_blocks), max_num_seqs=config.max_num_seqs,
                           max_num_batched_tokens=max(config.max_num_batched_tokens, 1),
                           max_model_len=max_model_len, block_size=config.block_size,
                           long_prefill_token_threshold=config.long_prefill_token_threshold,
                           enable_prefix_caching=config.enable_prefix_caching,
                           scheduling_policy=config.scheduling_policy,
                           num_speculative_tokens=spec.num_speculative_tokens if spec else 0,
                           prompt_lookup_min=spec.prompt_lookup_min if ngram else 0,
                           prompt_lookup_max=spec.prompt_lookup_max if ngram else 0,
                           num_lookahead_tokens=spec.num_speculative_tokens if draft is not None else 0,
                           max_num_encoder_input_tokens=encoder_tokens, encoder_cache_size=encoder_tokens)


def plan_encoder_scheduler_config(loaded: LoadedModel, config: EngineConfig) -> SchedulerConfig:
    """An encoder-only model (BERT, XLM-R) keeps no KV cache: its attention is bidirectional, so an
    input is computed whole in one step (no chunked prefill: the step's token budget is at least
    max_model_len) and no input starts from another's cached blocks (no prefix caching). The
    scheduler still admits by blocks: as many as every running request at full length needs,
    holding no memory."""
    c = loaded.config
    model_len = c.max_input_positions
    if config.max_model_len is not None and config.max_model_len > model_len:
        raise ValueError(f"max_model_len ({config.max_model_len}) exceeds the model's context length "
                         f"({model_len} positions)")
    if config.speculative_config is not None:
        raise ValueError(f"speculative decoding does not apply to an encoder-only model ({c.architecture}): it "
                         f"generates nothing")
    if config.kv_cache_dtype != "auto":
        raise ValueError(f"kv_cache_dtype {config.kv_cache_dtype}: an encoder-only model ({c.architecture}) keeps no "
                         f"KV cache; start it with kv_cache_dtype auto")
    max_model_len = config.max_model_len or model_len
    budget = max(config.max_num_batched_tokens, max_model_len)
    logger.info("encoder-only model (%s): no KV cache; each input computed whole in one step (up to %d tokens), "
                "%d tokens a step, prefix caching off", c.architecture, max_model_len - 1, budget)
    return SchedulerConfig(num_blocks=config.max_num_seqs * -(-max_model_len // config.block_size),
                           max_num_seqs=config.max_num_seqs, max_num_batched_tokens=budget,
                           max_model_len=max_model_len, block_size=config.block_size,
                           enable_prefix_caching=False, enable_chunked_prefill=False,
                           scheduling_policy=config.scheduling_policy)


def default_pooling_type(loaded: LoadedModel) -> str:
    """How a model pools when neither the engine nor a sentence-transformers config says: a decoder
    LAST; an encoder as its file says (a GGUF's pooling type), else CLS (as vLLM pools BERT)."""
    if not loaded.config.encoder_only:
        return "LAST"
    return loaded.config.pooling_type or "CLS"


def _repetition_rule(params: RepetitionDetectionParams | None) -> tuple[int, int, int] | None:
    """A request's repetition_detection as the scheduler takes it, None when off."""
    if params is None or not params.enabled:
        return None
    return params.max_pattern_size, params.min_pattern_size, params.min_count


@dataclass
class SpecDecodingTotals:
    """Speculative decoding's counts since the engine started (vLLM's spec_decode metrics)."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)

    def add(self, step: _core.SpecDecodingStats) -> None:
        self.num_drafts += step.num_drafts
        self.num_draft_tokens += step.num_draft_tokens
        self.num_accepted_tokens += step.num_accepted_tokens
        per_pos = step.num_accepted_tokens_per_pos
        if len(self.num_accepted_tokens_per_pos) < len(per_pos):
            self.num_accepted_tokens_per_pos += [0] * (len(per_pos) - len(self.num_accepted_tokens_per_pos))
        for j, n in enumerate(per_pos):
            self.num_accepted_tokens_per_pos[j] += n

    def as_metrics(self) -> dict[str, int | list[int]]:
        return {"corellm:spec_decode_num_drafts": self.num_drafts,
                "corellm:spec_decode_num_draft_tokens": self.num_draft_tokens,
                "corellm:spec_decode_num_accepted_tokens": self.num_accepted_tokens,
                "corellm:spec_decode_num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos)}


class TensorParallelError(RuntimeError):
    """A step of a tensor-parallel engine failed: a rank died, hung past the collectives' timeout,
    or stopped in the middle of the step's collectives. The ranks no longer run in step, so the
    engine stops (a single-process engine fails the step's requests and serves on)."""


class EngineCore:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, grammar_compiler: GrammarCompiler,
                 tp_workers: TensorParallelWorkers | None = None):
        self.loaded = loaded
        # Speculative decoding: the n-gram proposer runs inside the scheduler; a draft model here.
        spec = config.speculative_config
        self.speculative = spec is not None
        draft = load_draft_model(spec, loaded) if spec is not None and spec.method == "draft_model" else None
        kv_cache_dtype = kv_cache_torch_dtype(config.kv_cache_dtype, loaded.model.dtype, loaded.model.device)
        self.scheduler_config = plan_scheduler_config(loaded, config, kv_cache_dtype, draft)
        native = self.scheduler_config.to_native()
        self.scheduler = _core.Scheduler(native)
        self.model_runner = ModelRunner(loaded, native, kv_cache_dtype, enforce_eager=config.enforce_eager,
                                        tp_workers=tp_workers,
                                        pooling_type=pooling_type_of(loaded.path, config.pooling_type,
                                                                     default_pooling_type(loaded)),
                                        max_loras=config.max_loras if config.enable_lora else 0)
        # Requests whose LoRA adapter waits for a slot (every slot's adapter in use): in arrival order.
        self._lora_waiting: list[EngineCoreRequest] = []
        self.drafter = None if draft is None else DraftModelProposer(draft, spec.num_speculative_tokens, native,
                                                                      self.model_runner)
        self.structured_output = StructuredOutputManager(grammar_compiler)
        self.spec_totals = SpecDecodingTotals(spec.num_speculative_tokens if spec else 0)
        self.step_cost = StepCostModel() if spec is not None else None
        self._aborts: queue.SimpleQueue[list[str]] = queue.SimpleQueue()
        self._pending_errors: list[EngineCoreOutput] = []  # reported by the next step

    @property
    def max_model_len(self) -> int:
        return self.scheduler_config.max_model_len

    def health_error(self) -> str | None:
        """Why the engine cannot serve, when a part of it died between steps (a worker process)."""
        workers = self.model_runner.tp_workers
        if workers is not None and not workers.alive():
            return f"a tensor-parallel worker process died ({workers.describe_dead()})"
        return None

    def shutdown(self) -> None:
        """Releases the model runner's CUDA graphs and the grammar workers."""
        self.model_runner.shutdown()
        self.structured_output.shutdown()

    def add_request(self, request: EngineCoreRequest) -> None:
        """A request with a grammar enters the scheduler once its matcher is ready (see step)."""
        if request.uses_grammar:
            self.structured_output.add(request)
        else:
            self._schedule_request(request)

    def _schedule_request(self, request: EngineCoreRequest) -> None:
        """Into the scheduler; a request it refuses (its checks are the last word) ends with an
        error reported by the next step, never by taking the engine down."""
        try:
            self._add_to_scheduler(request)
        except ValueError as e:
            logger.warning("request %s refused by the scheduler: %s", request.request_id, e)
            self._pending_errors.append(EngineCoreOutput(request.request_id, [], "error", error=str(e)))

    def _add_to_scheduler(self, request: EngineCoreRequest) -> None:
        if request.lora is not None:
            # Into a slot: at once when its adapter holds one; otherwise only behind the requests
            # already waiting for one (arrival order), and when a slot can be had.
            slots = self.model_runner.lora_slots
            unfinished = lambda request_id: self.scheduler.get_request(request_id) is not None  # noqa: E731
            held = slots.slot_of(request.lora) is not None
            if (self._lora_waiting and not held) or slots.place(request.lora, request.request_id, unfinished) is None:
                self._lora_waiting.append(request)
                return
        p = request.sampling_params
        # A request whose prompt logprobs are wanted, or whose pooling reads every prompt row, must
        # compute every prompt position: keep it out of prefix-cache sharing with a salt of its own.
        every_position = p.prompt_logprobs is not None or (
            request.pooling is not None and self.model_runner.pooler.needs_every_position(request.pooling))
        salt = f"{request.cache_salt}\x00{request.request_id}" if every_position else request.cache_salt
        if request.lora is not None:  # its blocks hold the adapter's keys and values: shared only under it
            salt = f"{salt}\x00lora:{request.lora.serial}"
        self.scheduler.add_request(
            request.request_id, request.prompt_token_ids, max_tokens=p.max_tokens, min_tokens=p.min_tokens,
            ignore_eos=p.ignore_eos, eos_token_id=-1 if request.eos_token_id is None else request.eos_token_id,
            stop_token_ids=request.stop_token_ids, priority=request.priority,
            repetition_detection=_repetition_rule(p.repetition_detection),
            arrival_time=request.arrival_time, cache_salt=salt,
            mm_ranges=[(f.offset, f.length, f.hash) for f in request.mm_features],
            use_structured_output=request.uses_grammar, prediction_token_ids=request.prediction_token_ids,
            payload=request)

    def _admit_lora_waiting(self) -> None:
        """The requests waiting for a LoRA slot enter the scheduler, in order, while slots can be had."""
        waiting, self._lora_waiting = self._lora_waiting, []
        for request in waiting:  # one that waits again keeps its place before those after it
            self._schedule_request(request)

    def _admit_ready_grammars(self, wait: bool) -> None:
        """Requests whose grammar is now compiled enter the scheduler (or fail, if it did not
        compile). wait: nothing else to do, so wait briefly for the first one."""
        for request, error, spec_at_fault in self.structured_output.ready(timeout=0.02 if wait else 0.0):
            if error is None:
                self._schedule_request(request)
            else:
                self._pending_errors.append(EngineCoreOutput(
                    request.request_id, [], "error", error=error,
                    error_field="structured_outputs" if spec_at_fault else None))

    def abort_requests(self, request_ids: list[str]) -> None:
        """Thread-safe: the requests end (aborted) at the next point the stepping thread drains
        the queue; unknown or finished ids are ignored."""
        if request_ids:
            self._aborts.put(list(request_ids))

    def _process_aborts(self) -> None:
        while True:
            try:
                ids = self._aborts.get_nowait()
            except queue.Empty:
                return
            self.scheduler.finish_requests(ids, _core.RequestStatus.FINISHED_ABORTED)
            self.structured_output.remove(ids)
            if self._lora_waiting:
                gone = set(ids)
                self._lora_waiting = [r for r in self._lora_waiting if r.request_id not in gone]

    def has_unfinished_requests(self) -> bool:
        return (self.scheduler.has_unfinished_requests() or bool(self.structured_output.awaiting)
                or bool(self._pending_errors) or bool(self._lora_waiting))

    def stats(self) -> _core.SchedulerStats:
        return self.scheduler.stats()

    def step(self) -> EngineCoreOutputs:
        self._process_aborts()
        if self._lora_waiting:
            self._admit_lora_waiting()
        self._admit_ready_grammars(wait=not self.scheduler.has_unfinished_requests())
        errors, self._pending_errors = self._pending_errors, []
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(errors, scheduler_stats=self.stats())
        so = self.scheduler.schedule()
        self.structured_output.remove(so.finished_req_ids)
        try:
            started = time.perf_counter()
            bitmask = self.structured_output.start_bitmask(so)  # filled while the forward runs
            self.model_runner.execute_model(so)
            mro = self.model_runner.sample_tokens(bitmask.result() if bitmask is not None else None)
            if self.step_cost is not None:
                self._observe_step_cost(so, time.perf_counter() - started)
        except Exception as e:  # noqa: BLE001 - one failed step must not take the engine down
            workers = self.model_runner.tp_workers
            if workers is not None:  # ... unless the model itself is broken
                dead = workers.describe_dead()
                raise TensorParallelError(f"the tensor-parallel group failed in a step "
                                          f"({f'a worker process died: {dead}' if dead else f'{type(e).__name__}: {e}'}); "
                                          f"the engine cannot run the model any more") from e
            logger.exception("step failed; its %d requests end with an error", so.num_reqs)
            self.model_runner.abandon_step()
            ids = list(so.req_ids)
            self.scheduler.finish_requests(ids, _core.RequestStatus.FINISHED_ERROR)
            self.scheduler.update_from_output(so, np.full((so.num_reqs, 1), -1, np.int32))
            message = f"{type(e).__name__}: {e}"
            return EngineCoreOutputs(errors + [EngineCoreOutput(r, [], "error", error=message) for r in ids],
                                     self.stats())
        self._process_aborts()
        outputs: list[EngineCoreOutput] = errors
        if mro.errors:
            self.scheduler.finish_requests(list(mro.errors), _core.RequestStatus.FINISHED_ERROR)
            outputs += [EngineCoreOutput(r, [], "error", error=msg, error_field=mro.error_fields.get(r))
                        for r, msg in mro.errors.items()]
        result = self.scheduler.update_from_output(so, mro.sampled_token_ids)
        req_ids = result.req_ids
        tokens = result.new_token_ids.tolist()
        counts = result.num_new_tokens.tolist()
        finish = result.finish_reasons.tolist()
        stops = result.stop_reasons.tolist()
        cached = result.num_cached_tokens.tolist()
        start = 0
        for req_id, n, f, stop, n_cached in zip(req_ids, counts, finish, stops, cached):
            new = tokens[start:start + n]  # accepted drafts and the token after them (a stop cuts them)
            start += n
            finish_reason = _core.FINISH_REASON_NAMES[f]
            stop_reason = "repetition_detected" if finish_reason == "repetition" else stop if stop >= 0 else None
            out = EngineCoreOutput(req_id, new, finish_reason, stop_reason, n_cached)
            if req_id in mro.logprobs:
                out.new_logprobs = mro.logprobs[req_id][:n]
            out.new_prompt_logprobs = mro.prompt_logprobs.pop(req_id, None)
            out.pooled = mro.pooled.get(req_id)
            for token in new:  # structured requests get no drafts: one token
                self._advance_grammar(out, token)
            outputs.append(out)
        for req_id, plp in mro.prompt_logprobs.items():  # prompt chunks that sampled nothing yet
            outputs.append(EngineCoreOutput(req_id, [], new_prompt_logprobs=plp))
        if self.drafter is not None:
            self.drafter.propose(so, result, self.scheduler)
        if self.speculative:
            self.spec_totals.add(result.spec_decoding_stats)
        return EngineCoreOutputs(outputs, self.stats(), so.total_num_scheduled_tokens,
                                 spec_decoding_stats=result.spec_decoding_stats if self.speculative else None)

    def _observe_step_cost(self, so: _core.SchedulerOutput, seconds: float) -> None:
        """A step where every request decodes (its newest token and its drafts) teaches the cost
        model, whose fit then sets which drafts the scheduler finds worth verifying."""
        if so.total_num_scheduled_tokens != so.num_reqs + int(so.num_draft_tokens.sum()):
            return  # a prompt chunk's cost is not a decode token's
        self.step_cost.observe(so.total_num_scheduled_tokens, seconds)
        fit = self.step_cost.estimate()
        if fit is not None:
            self.scheduler.set_step_cost(*fit)

    def _advance_grammar(self, out: EngineCoreOutput, token: int) -> None:
        """The request's grammar takes its new token; a token it refuses ends the request with an
        error. (A complete grammar allows only EOS: the request then ends on it.)"""
        error = self.structured_output.accept(out.req_id, token)
        if error is not None:
            if not out.finished:
                self.scheduler.finish_requests([out.req_id], _core.RequestStatus.FINISHED_ERROR)
            out.finish_reason, out.error, out.error_field = "error", error, "structured_outputs"
