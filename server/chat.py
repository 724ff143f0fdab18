"""POST /v1/chat/completions: chat through the model's template (jinja2 sandbox), streamed (SSE)
or whole."""

from __future__ import annotations

import asyncio
import contextlib
import concurrent.futures

from aiohttp import web

from corellm.tokenizer import ChatTemplateError
from corellm.server.errors import bad_request
from corellm.server.logprobs import chat_logprobs, prompt_logprobs
from corellm.server.protocol import ChatCompletionRequest
from corellm.server.serving import Serving, now, send_event, stream_errors, usage

# Template rendering runs in a worker thread, bounded in time and output by the sandbox itself
# (corellm.chat_template), so a pathological template neither stalls the event loop nor keeps a
# worker busy after its request was refused.
_RENDER_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="chat-template")


async def render_prompt(serving: Serving, req: ChatCompletionRequest) -> str:
    if req.chat_template is not None and not serving.config.allow_request_chat_template:
        raise bad_request("chat_template in a request is not allowed on this server (start it with "
                          "--allow-request-chat-template)", "chat_template")
    messages = [m.as_template_message() for m in req.messages]
    loop = asyncio.get_running_loop()
    limit = serving.config.chat_template_timeout_s
    render = lambda: serving.tokenizer.apply_chat_template(  # noqa: E731
        messages, add_generation_prompt=req.add_generation_prompt, chat_template=req.chat_template,
        max_render_seconds=limit)
    try:
        return await asyncio.wait_for(loop.run_in_executor(_RENDER_POOL, render), limit + 1.0)
    except asyncio.TimeoutError:  # the pool was busy: the sandbox bounds the render itself
        raise bad_request("the chat template took too long to render", "messages") from None
    except ChatTemplateError as e:
        raise bad_request(str(e), "messages") from None


async def create_chat_completion(serving: Serving, request: web.Request, req: ChatCompletionRequest) -> web.StreamResponse:
    model = serving.check_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    text = await render_prompt(serving, req)
    prompt_ids = serving.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
    max_tokens = req.max_completion_tokens or req.max_tokens
    top_n = req.top_logprobs or 0
    params = req.sampling_params(serving.defaults(), max_tokens, top_n if req.logprobs else None)
    request_id = serving.new_id("chatcmpl")
    processed = serving.prepare(request_id, prompt_ids, text, params, max_tokens, kind="messages",
                                cache_salt=req.cache_salt, priority=req.priority,
                                structured_field=req.structured_output()[1])
    n = params.n
    if not req.stream:
        (out,) = await serving.run_all([processed])
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": chat_logprobs(c, serving.tokenizer, top_n) if req.logprobs else None,
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason} for c in out.outputs]
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
        return web.json_response({
            "id": request_id, "object": "chat.completion", "created": now(), "model": model, "choices": choices,
            "prompt_logprobs": prompt_logprobs(out.prompt_logprobs),
            "usage": usage(len(prompt_ids), completion_tokens, out.num_cached_tokens)})

    resp, outputs = await serving.start_stream(request, [processed])
    created = now()
    head = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
    completion_tokens = cached_tokens = 0
    try:
        for i in range(n):  # the role comes first, once per choice
            await send_event(resp, {**head, "choices": [{"index": i, "delta": {"role": "assistant", "content": ""},
                                                         "logprobs": None, "finish_reason": None}]})
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for _, out in outputs:
                cached_tokens = out.num_cached_tokens
                for c in out.outputs:
                    completion_tokens += len(c.token_ids)
                    if not c.text and not c.token_ids and c.finish_reason is None:
                        continue
                    delta = {"content": c.text} if c.text or c.finish_reason is None else {}
                    await send_event(resp, {**head, "choices": [{
                        "index": c.index, "delta": delta,
                        "logprobs": chat_logprobs(c, serving.tokenizer, top_n) if req.logprobs else None,
                        "finish_reason": c.finish_reason}]})
        if req.stream_options and req.stream_options.include_usage:
            await send_event(resp, {**head, "choices": [],
                                    "usage": usage(len(prompt_ids), completion_tokens, cached_tokens)})
        await resp.write(b"data: [DONE]\n\n")
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - one request's failure ends its stream, not the server
        await stream_errors(resp, e)
    finally:
        serving.abort([processed])  # whatever happened, nothing stays in flight (a no-op once finished)
    return resp
