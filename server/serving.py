"""What the completion and chat handlers share: the served model's name, turning prompts into
engine requests (with the context-length checks users see), SSE streaming, and merging the
outputs of several prompts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import difflib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from corellm.beam_search import BeamSearch, BeamSearchParams
from corellm.engine.async_llm import AsyncLLM, EngineDeadError
from corellm.engine.input_processor import ProcessedRequest
from corellm.lora.lora_registry import LoraRegistry
from corellm.lora.lora_request import LoRARequest
from corellm.pooling_params import PoolingParams
from corellm.reasoning_parser import HARMONY
from corellm.outputs import CompletionOutput, RequestOutput
from corellm.sampling_params import SamplingParams
from corellm.structured_output.reasoning_wait import ForcedReasoningEnd
from corellm.server.admission import Admission, AdmissionLimits
from corellm.server.errors import APIError, bad_request, error_chunk
from corellm.server.response_store import ResponseStore


# The id a completion or chat reply's X-Request-Id header carries (a typed key of the aiohttp request).
REQUEST_ID = web.RequestKey("corellm.request_id", str)

# Grammars (structured output, tools) compile here, off the event loop.
_GRAMMAR_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar-check")


@dataclass
class ServerConfig:
    served_model_name: str
    api_key: str | None = None
    allow_request_chat_template: bool = False
    chat_template: str | None = None  # --chat-template: replaces the model's
    enable_auto_tool_choice: bool = False  # tool_choice "auto" allowed (with tool_call_parser)
    tool_call_parser: str | None = None  # the model's tool call format (tool_calls.TOOL_CALL_FORMATS)
    max_body_bytes: int = 2 * 1024 * 1024
    chat_template_timeout_s: float = 2.0
    grammar_compile_timeout_s: float = 10.0
    admission: AdmissionLimits = field(default_factory=AdmissionLimits)
    max_stored_responses: int = 1024  # the Responses API's store (0: none kept)
    allow_unknown_fields: bool = False  # a request argument corellm does not know: ignored (logged), not a 400
    max_logprobs: int = 20  # logprobs / top_logprobs / prompt_logprobs at most this many (-1: the vocabulary)


class Serving:
    def __init__(self, engine: AsyncLLM, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.admission = Admission(engine, config.admission)
        self.draining = False  # set on SIGTERM: new requests get 503
        self.active = 0  # requests being handled, background responses included (the drain waits for these)
        self.model_requests = 0  # of those, requests to the model's routes (GET /load)
        self.responses = ResponseStore(config.max_stored_responses)

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    @property
    def loras(self) -> LoraRegistry | None:
        """The engine's LoRA adapters (None: it runs without LoRA)."""
        return self.engine.parts.input_processor.loras

    def check_model(self, model: str | None) -> str:
        """The name a request's `model` field gives (the served model's when it gives none): the
        served model or a LoRA adapter the server knows; anything else is a 404."""
        return self.resolve_model(model)[0]

    def resolve_model(self, model: str | None) -> tuple[str, LoRARequest | None]:
        """check_model's name, and the LoRA adapter it names (None: the base model), found at once:
        an adapter unloaded meanwhile cannot leave a request on the base model unawares."""
        name = self.config.served_model_name
        if model is None or model == name:
            return name, None
        lora = None if self.loras is None else self.loras.get(model)
        if lora is None:
            # The name is only compared, never used to find files.
            raise APIError(404, f"The model `{model}` does not exist.", "invalid_request_error", "model",
                           "model_not_found")
        return model, lora

    def defaults(self) -> dict:
        """The sampling defaults of the fields a request leaves out (EngineParts.sampling_defaults)."""
        return self.engine.parts.sampling_defaults

    @property
    def classifier_labels(self) -> tuple[str, ...]:
        """A sequence classifier's labels (ModelConfig's); (): the model generates."""
        return self.engine.parts.input_processor.classifier_labels

    @property
    def takes_images(self) -> bool:
        """Whether the model takes images (a LLaVA model): chat templates then get content parts."""
        return self.engine.parts.input_processor.image_inputs is not None

    def truncate_prompt(self, prompt_ids: list[int], keep: int | None, side: str | None = None) -> list[int]:
        """truncate_prompt_tokens (vLLM's): the prompt's last `keep` tokens (-1: as many as the context
        holds, one position being left for the token that ends the request; None: all of it); with
        truncation_side "right", its first ones. 0 keeps nothing: a 400; a side without a count
        would cut nothing: a 400 too."""
        if keep is None:
            if side is not None:
                raise bad_request("truncation_side applies with truncate_prompt_tokens (which sets how many tokens "
                                  "to keep)", "truncation_side")
            return prompt_ids
        if keep == 0:
            raise bad_request("truncate_prompt_tokens must be -1 (the model's context) or at least 1, got 0",
                              "truncate_prompt_tokens")
        keep = self.engine.max_model_len - 1 if keep == -1 else keep
        return prompt_ids[:keep] if side == "right" else prompt_ids[-keep:]

    def prepare(self, request_id: str, prompt_ids: list[int], prompt_text: str | None,
                params: SamplingParams | PoolingParams, requested_max_tokens: int | None, kind: str = "prompt",
                cache_salt: str | None = None, priority: int = 0, structured_field: str | None = None,
                images: list[tuple[str, str]] | None = None,
                lora_request: LoRARequest | None = None, token_type_ids: list[int] | None = None) -> ProcessedRequest:
        """Validates one prompt against the context; the messages name the numbers and `kind`, the
        request field the prompt came from ("prompt", "messages", "input", ...). structured_field: the request field its output constraint came from (the engine checks
        the constraint and its error then names that field). images: (the part's name, its URL)
        for each image of the messages, in order. The context check counts an image's placeholder
        tokens once they are expanded (the engine's own check). lora_request: the LoRA adapter the
        request's `model` named (resolve_model). token_type_ids: each prompt token's type (an
        encoder's cross-encoder pair)."""
        limit = self.engine.max_model_len
        if len(prompt_ids) >= limit:
            left = ("an input takes at most {} tokens (one position is kept for the token that ends the request; "
                    "truncate_prompt_tokens cuts it)".format(limit - 1) if isinstance(params, PoolingParams)
                    else "at least one token must be left for the completion")
            raise bad_request(f"This model's maximum context length is {limit} tokens. However, your {kind} has "
                              f"{len(prompt_ids)} tokens; {left}.", kind, "context_length_exceeded")
        if requested_max_tokens is not None and len(prompt_ids) + requested_max_tokens > limit:
            raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                              f"{len(prompt_ids) + requested_max_tokens} tokens ({len(prompt_ids)} in the {kind}, "
                              f"{requested_max_tokens} in the completion). Please reduce the length of the {kind} "
                              f"or the completion.", "max_tokens", "context_length_exceeded")
        prompt = {"prompt_token_ids": prompt_ids, "prompt": prompt_text}
        if token_type_ids is not None:
            prompt["token_type_ids"] = token_type_ids
        if images:
            prompt["multi_modal_data"] = {"image": [url for _, url in images]}
            prompt["multi_modal_names"] = [name for name, _ in images]
        try:
            return self.engine.process(request_id, prompt, params, priority=priority, cache_salt=cache_salt or "",
                                       lora_request=lora_request)
        except ValueError as e:
            message = str(e)
            named = _in_client_terms(message, structured_field) if structured_field is not None else None
            if named is not None:
                raise bad_request(named, structured_field) from None
            raise bad_request(message, _param_named_in(message)) from None

    async def check_constraint(self, params: SamplingParams, field: str | None) -> None:
        """Compiles a request's output constraint (and, with a thinking_token_budget on a
        reasoning model, its reasoning's forced end) on a worker thread (a large grammar takes a
        while: the event loop serves the other requests meanwhile), within
        grammar_compile_timeout_s; a bad one is a 400 naming `field`. The compiled grammars are
        cached for the engine."""
        if self.engine.config.reasoning_parser == HARMONY and (params.structured_outputs is not None
                                                                or params.thinking_token_budget is not None):
            name = field if params.structured_outputs is not None else "thinking_token_budget"
            raise bad_request(f"{name} is not supported with gpt-oss's harmony format (--reasoning-parser {HARMONY}) "
                              f"yet: its answer follows an analysis message, which a grammar or a budget would cut",
                              name)
        specs = [] if params.structured_outputs is None else [params.structured_outputs]
        if params.thinking_token_budget is not None and self.engine.config.reasoning_parser is not None:
            specs.append(ForcedReasoningEnd(params.structured_outputs))
        if not specs:
            return
        compiler = self.engine.parts.grammar_compiler
        loop = asyncio.get_running_loop()
        check = loop.run_in_executor(_GRAMMAR_POOL, lambda: [compiler.check(spec) for spec in specs])
        try:
            await asyncio.wait_for(check, self.config.grammar_compile_timeout_s)
        except asyncio.TimeoutError:
            raise bad_request(f"{field}: the grammar took more than {self.config.grammar_compile_timeout_s:g} s "
                              f"to compile", field) from None
        except ValueError as e:
            raise bad_request(_in_client_terms(str(e), field) or str(e), field) from None

    @staticmethod
    def new_ids(prefix: str, request: web.Request, given: str | None) -> tuple[str, str]:
        """(the response's id, the engine's). The response's is the prefix ("cmpl-", "chatcmpl-",
        "resp_") and the X-Request-Id header, else the body's request_id, else a new uuid (vLLM's
        order), and what follows the prefix is the reply's X-Request-Id header (REQUEST_ID); the
        engine's always holds a new uuid, so that two requests that name themselves alike stay
        apart in the engine."""
        engine_id = f"{prefix}{uuid.uuid4().hex}"
        named = request.headers.get("X-Request-Id") or given
        request[REQUEST_ID] = named or engine_id.removeprefix(prefix)
        return (f"{prefix}{named}" if named else engine_id), engine_id

    def submit(self, processed: list[ProcessedRequest]) -> list:
        """Admits (or refuses with 429) and submits all of `processed` at once; returns their
        output generators."""
        self.admission.check(processed)
        streams = []
        try:
            for p in processed:
                streams.append(self.engine.submit(p))
        except BaseException:
            self.abort(processed)
            raise
        return streams

    def abort(self, processed: list[ProcessedRequest]) -> None:
        for p in processed:
            self.engine.abort(p.request_id)  # a no-op for finished requests

    @staticmethod
    def _check(out: RequestOutput, structured_field: str | None) -> RequestOutput:
        """The output, or the error that ended it: a 400 naming the field at fault where the
        request's own constraints caused it (the output cannot follow its constraint with this
        model's vocabulary: `structured_field`, the request field the constraint came from; or its
        allowed_token_ids leave nothing to sample), else a 500."""
        error = out.metrics.get("error")
        if not error:
            return out
        at_fault = out.metrics.get("error_field")
        if at_fault == "structured_outputs":
            field = structured_field or "structured_outputs"
            raise bad_request(_in_client_terms(error, field) or f"{field}: {error}", field)
        if at_fault is not None:
            raise bad_request(f"{at_fault}: {error}", at_fault)
        raise APIError(500, f"the request failed: {error}", "internal_error")

    async def run_all(self, processed: list[ProcessedRequest],
                      structured_field: str | None = None) -> list[RequestOutput]:
        """Runs requests to completion (FINAL_ONLY); cancelling aborts every one of them.
        structured_field: as for prepare()."""
        return await self.finish_all(self.submit(processed), processed, structured_field)

    async def finish_all(self, streams: list, processed: list[ProcessedRequest],
                         structured_field: str | None = None) -> list[RequestOutput]:
        """run_all of requests already submitted (`streams`: submit()'s answer for `processed`)."""
        async def one(outputs) -> RequestOutput:
            final = None
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    final = self._check(out, structured_field)
            return final

        tasks = [asyncio.ensure_future(one(s)) for s in streams]
        try:
            return list(await asyncio.gather(*tasks))
        except EngineDeadError as e:
            raise APIError(503, str(e), "service_unavailable") from None
        finally:
            for t in tasks:
                t.cancel()
            self.abort(processed)

    async def beam_search(self, request_id: str, prompt_ids: list[int], prompt_text: str | None,
                          params: BeamSearchParams, requested_max_tokens: int | None, kind: str = "prompt",
                          cache_salt: str | None = None, priority: int = 0,
                          skip_special_tokens: bool = True, lora_request: LoRARequest | None = None) -> RequestOutput:
        """vLLM's use_beam_search: the prompt's params.beam_width best sequences (corellm.beam_search),
        as one RequestOutput whose outputs are the beams, best first. The prompt and the max_tokens
        asked for are checked against the context as for any request; each round's one-token
        requests go through prepare and run_all as any request (admission, aborted with this one)."""
        search = BeamSearch(prompt_ids, params, self.tokenizer.eos_token_id, self.engine.max_model_len)
        step, cached, done = params.step_params(), 0, 0
        while beams := (search.prompts() if done else [prompt_ids]):  # the first round: the prompt, checked
            processed = [self.prepare(f"{request_id}-{done}-{k}", tokens, None, step,
                                      None if done else requested_max_tokens, kind=kind, cache_salt=cache_salt,
                                      priority=priority, lora_request=lora_request)
                         for k, tokens in enumerate(beams)]
            outputs = await self.run_all(processed)
            if done == 0:
                cached = outputs[0].num_cached_tokens
            search.advance(outputs)
            done += 1
        choices = [CompletionOutput(index=i, text=self.tokenizer.decode(search.generated_text_tokens(beam),
                                                                        skip_special_tokens=skip_special_tokens),
                                    token_ids=beam.tokens[len(prompt_ids):], cumulative_logprob=beam.cum_logprob,
                                    logprobs=None, finish_reason=beam.finish_reason, stop_reason=beam.stop_reason)
                   for i, beam in enumerate(search.best())]
        return RequestOutput(request_id, prompt_text, prompt_ids, None, choices, finished=True, num_cached_tokens=cached)

    async def start_stream(self, request: web.Request, processed: list[ProcessedRequest],
                           structured_field: str | None = None) -> tuple[web.StreamResponse, AsyncIterator]:
        """Admits and submits `processed` (a refusal is still a plain error response), then starts
        the SSE response; returns it with the merged outputs of the requests."""
        outputs = self.merged(processed, structured_field)
        try:
            return await start_sse(request), outputs
        except BaseException:
            self.abort(processed)
            raise

    @contextlib.asynccontextmanager
    async def sse_body(self, resp: web.StreamResponse, processed: list[ProcessedRequest]) -> AsyncIterator[None]:
        """The writing of a started SSE response's events, then [DONE]. A client that leaves ends it
        (the output generators' cleanup aborts the requests); any other failure ends the stream with
        an error event rather than the server; whatever happened, nothing stays in flight (aborting
        a finished request is a no-op)."""
        try:
            yield
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:  # noqa: BLE001 - one request's failure ends its stream, not the server
            await stream_errors(resp, e)
        finally:
            self.abort(processed)

    def merged(self, processed: list[ProcessedRequest],
               structured_field: str | None = None) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Submits now; yields (prompt index, output) from the streaming requests as they come. The
        caller aborts `processed` when it is done with them (a generator never iterated cannot)."""
        return self._merge(self.submit(processed), structured_field)

    async def _merge(self, streams: list, structured_field: str | None) -> AsyncIterator[tuple[int, RequestOutput]]:
        q: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, outputs) -> None:
            try:
                async with contextlib.aclosing(outputs):
                    async for out in outputs:
                        await q.put((i, self._check(out, structured_field)))
            except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
                await q.put((i, e))
                return
            await q.put((i, None))

        tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
        remaining = len(tasks)
        try:
            while remaining:
                i, item = await q.get()
                if item is None:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()


# The engine's ValueErrors start with the field they are about; the API's name for it.
_ENGINE_FIELDS = {"prompt_token_ids": "prompt", "The prompt": "prompt", "stop_token_ids": "stop_token_ids",
                  "logit_bias": "logit_bias", "logprobs": "logprobs", "min_tokens": "min_tokens",
                  "max_tokens": "max_tokens", "seed": "seed", "stop": "stop", "priority": "priority",
                  "thinking_token_budget": "thinking_token_budget", "prediction": "prediction",
                  "logprob_token_ids": "logprob_token_ids", "allowed_token_ids": "allowed_token_ids"}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int,
          completion_details: dict | None = None) -> dict:
    """OpenAI's usage object: each prompt counted once (not once per sample, as vLLM), the part of
    it served from the prefix cache in prompt_tokens_details.cached_tokens; completion_details:
    completion_tokens_details (prediction_details)."""
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if completion_details is not None:
        body["completion_tokens_details"] = completion_details
    return body


def prediction_details(prediction_ids: list[int], outputs: list[list[int]]) -> dict | None:
    """OpenAI's completion_tokens_details for a request with a prediction (None without one): of
    the prediction's tokens, per output those that appear in it, in order (the matching blocks of
    difflib's comparison of the two token sequences), and those that do not, summed over outputs."""
    if not prediction_ids:
        return None
    accepted = sum(block.size for tokens in outputs for block in
                   difflib.SequenceMatcher(None, prediction_ids, tokens, autojunk=False).get_matching_blocks())
    return {"accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": len(prediction_ids) * len(outputs) - accepted}


def _param_named_in(message: str) -> str | None:
    return next((param for prefix, param in _ENGINE_FIELDS.items() if message.startswith(prefix)), None)


async def start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                                   "Connection": "keep-alive"})
    await resp.prepare(request)
    return resp


async def send_event(resp: web.StreamResponse, payload: dict) -> None:
    await resp.write(f"data: {json.dumps(payload, ensure_ascii=False)}\n\n".encode())


async def stream_errors(resp: web.StreamResponse, err: BaseException) -> None:
    """Ends a started stream with an error event, then [DONE]."""
    api = err if isinstance(err, APIError) else APIError(500, f"{type(err).__name__}: {err}", "internal_error")
    if isinstance(err, EngineDeadError):
        api = APIError(503, str(err), "service_unavailable")
    await resp.write(error_chunk(api))
    await resp.write(b"data: [DONE]\n\n")


def _in_client_terms(message: str, field: str) -> str | None:
    """An engine message about a request's output constraint ("structured_outputs[.part]: why")
    with the request field the client used in its place ("guided_regex: why"); None for any other
    message."""
    if not message.startswith(("structured_outputs.", "structured_outputs:")) or ":" not in message:
        return None
    return field + message[message.index(":"):]


def now() -> int:
    return int(time.time())
