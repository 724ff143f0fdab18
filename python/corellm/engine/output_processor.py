"""OutputProcessor: EngineCoreOutputs -> RequestOutputs. Per request it detokenizes, matches stop
strings (asking the engine to abort the request when one is found), gathers logprobs, groups the
n samples of a request, and emits CUMULATIVE, DELTA or FINAL_ONLY outputs. A DELTA (streamed)
sample's tokens go out stream_interval at a time (vLLM's --stream-interval), its first token and
its finish at once: fewer, larger chunks where many streams share a machine."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from corellm.engine.detokenizer import IncrementalDetokenizer
from corellm.engine.engine_core_outputs import EngineCoreOutput
from corellm.engine.input_processor import ProcessedRequest
from corellm.outputs import CompletionOutput, Logprob, PositionLogprobs, RequestOutput
from corellm.sampling_params import RequestOutputKind
from corellm.tokenizer import Tokenizer

logger = logging.getLogger("corellm")


@dataclass
class SampleState:
    """One of the n samples of a request (one engine-core request)."""

    index: int
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    sent_text: int = 0  # DELTA: characters already sent
    sent_tokens: int = 0
    sent_finish: bool = False  # DELTA: the finish was reported


@dataclass
class RequestState:
    request: ProcessedRequest
    samples: dict[str, SampleState]  # engine-core request id -> its sample
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0
    error: str | None = None
    error_field: str | None = None  # EngineCoreOutput.error_field
    embedding: list[float] | None = None  # an embedding request's vector

    @property
    def finished(self) -> bool:
        return all(s.finish_reason is not None for s in self.samples.values())


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer, stream_interval: int = 1):
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.requests: dict[str, RequestState] = {}  # engine-core request id -> its request
        self._decode_cache: dict[int, str] = {}

    def add_request(self, processed: ProcessedRequest) -> None:
        p = processed.params
        samples = {}
        for i, sample in enumerate(processed.samples):
            s = SampleState(i, IncrementalDetokenizer(self.tokenizer, sample.sampling_params, processed.prompt_token_ids))
            if p.wants_logprobs:
                s.logprobs, s.cumulative_logprob = [], 0.0
            samples[sample.request_id] = s
        state = RequestState(processed, samples)
        if p.prompt_logprobs is not None:
            state.prompt_logprobs = [None] + [None] * (len(processed.prompt_token_ids) - 1)
        for sample_id in samples:
            self.requests[sample_id] = state

    def abort(self, sample_ids: list[str]) -> None:
        """Forgets requests the caller gave up on (by engine-core id)."""
        for cid in sample_ids:
            self.requests.pop(cid, None)

    def sample_ids(self, processed: ProcessedRequest) -> list[str]:
        return [s.request_id for s in processed.samples]

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def _decode(self, token_id: int) -> str:
        text = self._decode_cache.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._decode_cache) < 200_000:
                self._decode_cache[token_id] = text
        return text

    def _position(self, token_id: int, logprob: float, rank: int, top_ids: list[int],
                  top_lps: list[float], top_ranks: list[int] | None = None) -> PositionLogprobs:
        ranks = top_ranks if top_ranks is not None else range(1, len(top_ids) + 1)
        pos = {tid: Logprob(lp, r, self._decode(tid)) for tid, lp, r in zip(top_ids, top_lps, ranks)}
        pos.setdefault(token_id, Logprob(logprob, rank, self._decode(token_id)))
        return pos

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> tuple[list[RequestOutput], list[str]]:
        """Returns the RequestOutputs to deliver and the engine-core ids to abort (stop strings, and
        the other samples of a request whose processing failed). A failure while processing one
        request (a detokenizer error, say) ends that request with an error, not the others."""
        results: list[RequestOutput] = []
        to_abort: list[str] = []
        touched: dict[int, RequestState] = {}
        for out in outputs:
            state = self.requests.get(out.req_id)
            if state is None:
                continue  # aborted or finished already
            sample = state.samples[out.req_id]
            if sample.finish_reason is not None:
                continue
            try:
                self._apply(state, sample, out, to_abort)
            except Exception as e:  # noqa: BLE001 - isolated to this request
                self._fail(state, e, to_abort)
            touched[id(state)] = state
        for state in touched.values():
            try:
                output = self._make_output(state)
            except Exception as e:  # noqa: BLE001 - isolated to this request
                self._fail(state, e, to_abort)
                output = self._make_error_output(state)
            if output is not None:
                results.append(output)
            if state.finished:
                for cid in state.samples:
                    self.requests.pop(cid, None)
        return results, to_abort

    def _apply(self, state: RequestState, sample: SampleState, out: EngineCoreOutput, to_abort: list[str]) -> None:
        """Adds one engine-core output to its sample: tokens, logprobs, text, stop strings."""
        if out.num_cached_tokens and sample.index == 0:  # the prompt's, as its first sample found it
            state.num_cached_tokens = out.num_cached_tokens
        if out.new_prompt_logprobs is not None and state.prompt_logprobs is not None:
            plp = out.new_prompt_logprobs
            for j, tid in enumerate(plp.token_ids):
                state.prompt_logprobs[plp.start + j] = self._position(
                    tid, plp.logprobs[j], plp.ranks[j], plp.top_token_ids[j], plp.top_logprobs[j])
        if out.error is not None:
            state.error, state.error_field = out.error, out.error_field
        if out.pooled is not None:
            state.embedding = out.pooled
        stop_terminated = out.finished and out.finish_reason == "stop"  # a stop token or EOS ended it
        seen = sample.detokenizer.num_tokens
        stop_str = sample.detokenizer.update(out.new_token_ids, stop_terminated) if out.new_token_ids else None
        kept = sample.detokenizer.num_tokens - seen  # a stop string drops the tokens after it
        sample.token_ids.extend(out.new_token_ids[:kept])
        if sample.logprobs is not None and out.new_logprobs:
            for lp in out.new_logprobs[:kept]:
                sample.logprobs.append(self._position(lp.token_id, lp.logprob, lp.rank, lp.top_token_ids,
                                                      lp.top_logprobs, lp.top_ranks))
                sample.cumulative_logprob += lp.logprob
        if stop_str is not None:
            sample.finish_reason, sample.stop_reason = "stop", stop_str
            if not out.finished:
                to_abort.append(out.req_id)
        elif out.finished:
            sample.finish_reason, sample.stop_reason = out.finish_reason, out.stop_reason

    def _fail(self, state: RequestState, error: Exception, to_abort: list[str]) -> None:
        """Ends every sample of the request with an error; the engine aborts those still running."""
        logger.error("processing the output of request %s failed: %s: %s", state.request.request_id,
                     type(error).__name__, error)
        state.error = f"{type(error).__name__}: {error}"
        for cid, s in state.samples.items():
            if s.finish_reason is None:
                s.finish_reason = "error"
                to_abort.append(cid)

    def _make_error_output(self, state: RequestState) -> RequestOutput:
        req = state.request
        completions = [CompletionOutput(s.index, "", [], None, None, s.finish_reason, None)
                       for s in state.samples.values()]
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, None, completions, True,
                             state.num_cached_tokens, metrics=self._error_metrics(state))

    def _make_output(self, state: RequestState) -> RequestOutput | None:
        kind = state.request.params.output_kind
        finished = state.finished
        if kind == RequestOutputKind.FINAL_ONLY and not finished:
            return None
        completions = []
        for s in state.samples.values():
            text = s.detokenizer.text(s.finish_reason is not None)
            token_ids, logprobs = s.token_ids, s.logprobs
            if kind == RequestOutputKind.DELTA:
                if s.sent_finish or (len(token_ids) == s.sent_tokens and s.finish_reason is None):
                    continue  # nothing new for this sample
                waiting = s.finish_reason is None and s.sent_tokens > 0
                if waiting and len(token_ids) - s.sent_tokens < self.stream_interval:
                    continue  # fewer than stream_interval new tokens since the last chunk
                s.sent_finish = s.finish_reason is not None
                new_text, new_tokens = text[s.sent_text:], token_ids[s.sent_tokens:]
                new_logprobs = logprobs[s.sent_tokens:] if logprobs is not None else None
                s.sent_text, s.sent_tokens = len(text), len(token_ids)
                text, token_ids, logprobs = new_text, new_tokens, new_logprobs
            completions.append(CompletionOutput(s.index, text, list(token_ids), s.cumulative_logprob,
                                                list(logprobs) if logprobs is not None else None,
                                                s.finish_reason, s.stop_reason))
        if kind == RequestOutputKind.DELTA and not completions and not finished:
            return None  # every sample waits for more tokens
        req = state.request
        return RequestOutput(req.request_id, req.prompt, req.prompt_token_ids, state.prompt_logprobs, completions,
                             finished, state.num_cached_tokens,
                             metrics=self._error_metrics(state), embedding=state.embedding)

    @staticmethod
    def _error_metrics(state: RequestState) -> dict:
        """RequestOutput.metrics of a failed request: the error, and the field at fault if any."""
        if state.error is None:
            return {}
        return {"error": state.error, "error_field": state.error_field} if state.error_field else {"error": state.error}
