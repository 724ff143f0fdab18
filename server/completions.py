"""POST /v1/completions: text completion, streamed (SSE) or whole."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from corellm.outputs import CompletionOutput, RequestOutput
from corellm.server.errors import bad_request
from corellm.server.logprobs import completion_logprobs, prompt_logprobs
from corellm.server.protocol import CompletionRequest
from corellm.server.serving import Serving, now, send_event, stream_errors, usage


def _prompts(req: CompletionRequest, serving: Serving) -> list[tuple[list[int], str | None]]:
    p = req.prompt
    encode = lambda text: serving.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)  # noqa: E731
    if isinstance(p, str):
        return [(encode(p), p)]
    if not p:
        raise bad_request("prompt must not be empty", "prompt")
    if isinstance(p[0], str):
        return [(encode(s), s) for s in p]
    if isinstance(p[0], int):
        return [(list(p), None)]
    return [(list(ids), None) for ids in p]


async def create_completion(serving: Serving, request: web.Request, req: CompletionRequest) -> web.StreamResponse:
    model = serving.check_model(req.model)
    if req.echo:
        raise bad_request("echo is not supported", "echo")
    if req.suffix:
        raise bad_request("suffix is not supported", "suffix")
    params = req.sampling_params(serving.defaults(), req.max_tokens, req.logprobs)
    request_id = serving.new_id("cmpl")
    structured_field = req.structured_output()[1]
    await serving.check_constraint(params.structured_outputs, structured_field)
    processed = [serving.prepare(f"{request_id}-{i}", ids, text, params, req.max_tokens,
                                 cache_salt=req.cache_salt, priority=req.priority, structured_field=structured_field)
                 for i, (ids, text) in enumerate(_prompts(req, serving))]
    n = params.n
    if not req.stream:
        outputs = await serving.run_all(processed, structured_field)
        return web.json_response(_response(request_id, model, outputs, n, serving))

    resp, outputs = await serving.start_stream(request, processed, structured_field)
    created = now()
    completion_tokens = [0] * (len(processed) * n)
    cached_tokens = [0] * len(processed)
    try:
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for i, out in outputs:
                cached_tokens[i] = out.num_cached_tokens
                for c in out.outputs:
                    index = i * n + c.index
                    completion_tokens[index] += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    choice = {"index": index, "text": c.text, "finish_reason": c.finish_reason,
                              "logprobs": completion_logprobs(c, serving.tokenizer) if req.logprobs is not None else None}
                    if c.finish_reason is not None:
                        choice["stop_reason"] = c.stop_reason
                    await send_event(resp, {"id": request_id, "object": "text_completion", "created": created,
                                            "model": model, "choices": [choice]})
        if req.stream_options and req.stream_options.include_usage:
            prompt_tokens = sum(len(p.prompt_token_ids) for p in processed)
            await send_event(resp, {"id": request_id, "object": "text_completion", "created": created, "model": model,
                                    "choices": [], "usage": usage(prompt_tokens, sum(completion_tokens),
                                                                  sum(cached_tokens))})
        await resp.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        raise  # the client left: the generators' cleanup aborts the requests
    except Exception as e:  # noqa: BLE001 - one request's failure ends its stream, not the server
        await stream_errors(resp, e)
    finally:
        serving.abort(processed)  # whatever happened, nothing stays in flight (a no-op once finished)
    return resp


def _response(request_id: str, model: str, outputs: list[RequestOutput], n: int, serving: Serving) -> dict:
    choices, prompt_tokens, completion_tokens, cached_tokens = [], 0, 0, 0
    for i, out in enumerate(outputs):
        prompt_tokens += len(out.prompt_token_ids)
        cached_tokens += out.num_cached_tokens
        for c in out.outputs:
            completion_tokens += len(c.token_ids)
            choice = _choice(i * n + c.index, c, serving)
            if out.prompt_logprobs is not None:
                choice["prompt_logprobs"] = prompt_logprobs(out.prompt_logprobs)
            choices.append(choice)
    return {"id": request_id, "object": "text_completion", "created": now(), "model": model, "choices": choices,
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens)}


def _choice(index: int, c: CompletionOutput, serving: Serving) -> dict:
    return {"index": index, "text": c.text, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
            "logprobs": completion_logprobs(c, serving.tokenizer) if c.logprobs is not None else None}
