"""POST /inference/v1/generate: vLLM's tokens-in, tokens-out route, which RL trainers and
disaggregated front ends call (they render the chat themselves and read token ids back).

    request   token_ids (the prompt, as ids) and sampling_params (vLLM's SamplingParams as JSON:
              corellm.SamplingParams takes the same names; a missing max_tokens is the rest of the
              context, as vLLM's route); stream and stream_options, cache_salt, priority,
              request_id, return_token_ids (the prompt's ids in the reply), output_mode ("tokens",
              or "text": each choice's text too, its logprobs then in chat's format)
    reply     {request_id, model, created, output_mode, choices: [{index, token_ids, finish_reason,
              stop_reason, logprobs}], usage, prompt_logprobs, prompt_token_ids}; streamed, each
              event a choice's new token ids, then usage with include_usage, then [DONE]

Logprobs in "tokens" mode name tokens by id, as vLLM's: per position {token_id, logprob, rank,
top_logprobs: the sampled token first, then the most likely others, max(logprobs, 1) in all}."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import Field

from corellm.outputs import CompletionOutput, RequestOutput
from corellm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams
from corellm.server.errors import APIError, bad_request
from corellm.server.logprobs import TokenLabels, chat_logprobs, prompt_logprobs
from corellm.server.protocol import MAX_CACHE_SALT_CHARS, MAX_REQUEST_ID_CHARS, StreamOptions
from corellm.server.request_part import RequestPart
from corellm.server.serving import Serving, now, send_event, usage

# SamplingParams' fields a request may set (output_kind is the route's own business).
_SAMPLING_FIELDS = frozenset(f.name for f in dataclasses.fields(SamplingParams)) - {"output_kind"}
# vLLM logprobs' floor (a -inf logprob is not JSON).
_LOGPROB_FLOOR = -9999.0


class GenerateRequest(RequestPart):
    model: str | None = None
    request_id: str | None = Field(None, min_length=1, max_length=MAX_REQUEST_ID_CHARS, pattern=r"^[\x21-\x7e]+$")
    token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=MAX_CACHE_SALT_CHARS)
    priority: int = Field(0, ge=-2**31, lt=2**31)
    return_token_ids: bool = False
    output_mode: Literal["tokens", "text"] = "tokens"


def sampling_params_of(req: GenerateRequest, context_left: int) -> SamplingParams:
    """The request's sampling_params as corellm's SamplingParams; a 400 names
    `sampling_params.<field>` for a field corellm does not know or a value it refuses."""
    given = dict(req.sampling_params)
    detokenize = given.pop("detokenize", True)  # vLLM's: whether text is made at all
    if not isinstance(detokenize, bool):
        raise bad_request(f"sampling_params.detokenize must be a boolean, got {detokenize!r}",
                          "sampling_params.detokenize")
    if not detokenize and (req.output_mode == "text" or given.get("stop")):
        raise bad_request("sampling_params.detokenize false makes no text: output_mode \"text\" and stop strings "
                          "need it", "sampling_params.detokenize")
    unknown = sorted(set(given) - _SAMPLING_FIELDS)
    if unknown:
        raise bad_request(f"sampling_params.{unknown[0]} is not a sampling parameter corellm knows",
                          f"sampling_params.{unknown[0]}", "unknown_field")
    structured = given.get("structured_outputs")
    if isinstance(structured, dict):
        try:
            given["structured_outputs"] = StructuredOutputsParams(**structured)
        except (TypeError, ValueError) as e:
            raise bad_request(f"sampling_params.structured_outputs: {e}",
                              "sampling_params.structured_outputs") from None
    bias = given.get("logit_bias")
    if isinstance(bias, dict):  # JSON's keys are strings
        try:
            given["logit_bias"] = {int(k): v for k, v in bias.items()}
        except ValueError:
            raise bad_request("sampling_params.logit_bias's keys must be token ids",
                              "sampling_params.logit_bias") from None
    given.setdefault("max_tokens", max(context_left, 1))  # as vLLM's route: the rest of the context
    given["output_kind"] = RequestOutputKind.DELTA if req.stream else RequestOutputKind.FINAL_ONLY
    try:
        return SamplingParams(**given)
    except (TypeError, ValueError) as e:
        message = str(e)
        field = next((f for f in sorted(given, key=len, reverse=True) if message.startswith(f)), None)
        raise bad_request(f"sampling_params.{message}",
                          f"sampling_params.{field}" if field else "sampling_params") from None


def token_id_logprobs(c: CompletionOutput, top_n: int, scored_ids: list[int] | None = None) -> dict | None:
    """The choice's logprobs with tokens named by id (vLLM's tokens mode): per position the sampled
    token, then top_logprobs — the sampled token first, then the others most likely first,
    max(top_n, 1) in all (with logprob_token_ids, `scored_ids`: then those tokens)."""
    if c.logprobs is None:
        return None
    content = []
    for token_id, pos in zip(c.token_ids, c.logprobs):
        sampled = pos[token_id]
        others = sorted((kv for kv in pos.items() if kv[0] != token_id), key=lambda kv: -kv[1].logprob)
        ranked = [(token_id, sampled)] + ([kv for kv in others if kv[0] in scored_ids] if scored_ids is not None
                                          else others[:max(top_n, 1) - 1])
        content.append({"token_id": token_id, "logprob": max(sampled.logprob, _LOGPROB_FLOOR), "rank": sampled.rank,
                        "top_logprobs": [{"token_id": t, "logprob": max(lp.logprob, _LOGPROB_FLOOR), "rank": lp.rank}
                                         for t, lp in ranked]})
    return {"content": content}


def _choice(c: CompletionOutput, req: GenerateRequest, params: SamplingParams, labels: TokenLabels) -> dict:
    choice = {"index": c.index, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason,
              "stop_reason": c.stop_reason, "logprobs": None}
    if params.wants_logprobs:
        top_n, scored = params.logprobs or 0, params.logprob_token_ids
        choice["logprobs"] = (chat_logprobs(c, labels, top_n, scored) if req.output_mode == "text"
                              else token_id_logprobs(c, top_n, scored))
    if req.output_mode == "text":
        choice["text"] = c.text
    return choice


async def create_generate(serving: Serving, request: web.Request, req: GenerateRequest) -> web.StreamResponse:
    model, lora = serving.resolve_model(req.model)
    vocab = serving.engine.loaded.config.vocab_size
    outside = next((t for t in req.token_ids if t >= vocab), None)
    if outside is not None:
        raise bad_request(f"token id {outside} is outside the vocabulary [0, {vocab})", "token_ids")
    params = sampling_params_of(req, serving.engine.max_model_len - len(req.token_ids))
    structured_field = "sampling_params.structured_outputs" if params.structured_outputs is not None else None
    await serving.check_constraint(params, structured_field)
    response_id, request_id = serving.new_ids("generate-tokens-", request, req.request_id)
    try:
        processed = [serving.prepare(request_id, list(req.token_ids), None, params,
                                     req.sampling_params.get("max_tokens"), kind="token_ids",
                                     cache_salt=req.cache_salt, priority=req.priority,
                                     structured_field=structured_field, lora_request=lora)]
    except APIError as e:  # the engine names SamplingParams' fields: they sit in sampling_params here
        if e.param is not None and e.param != "token_ids" and not e.param.startswith("sampling_params"):
            e.param = f"sampling_params.{e.param}"
        raise
    labels = TokenLabels(serving.tokenizer, False)
    head = {"request_id": response_id, "output_mode": req.output_mode}
    if not req.stream:
        [out] = await serving.run_all(processed, structured_field)
        body = {**head, "model": model, "created": now(),
                "choices": [_choice(c, req, params, labels) for c in out.outputs],
                "usage": _usage(out), "prompt_logprobs": prompt_logprobs(out.prompt_logprobs),
                "kv_transfer_params": None}
        if req.return_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        return web.json_response(body)

    resp, outputs = await serving.start_stream(request, processed, structured_field)
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    continuous_usage = include_usage and req.stream_options.continuous_usage_stats
    generated, cached, sent = [0] * params.n, 0, False
    async with serving.sse_body(resp, processed):
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for _, out in outputs:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    generated[c.index] += len(c.token_ids)
                    if not c.token_ids and c.finish_reason is None:
                        continue
                    event = {**head, "choices": [_choice(c, req, params, labels)]}
                    if req.return_token_ids and not sent:  # the prompt's ids with the first event
                        event["prompt_token_ids"] = list(req.token_ids)
                    if continuous_usage:
                        event["usage"] = usage(len(req.token_ids), sum(generated), cached)
                    await send_event(resp, event)
                    sent = True
        if include_usage:
            await send_event(resp, {**head, "choices": [], "usage": usage(len(req.token_ids), sum(generated), cached)})
    return resp


def _usage(out: RequestOutput) -> dict:
    return usage(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs), out.num_cached_tokens)
