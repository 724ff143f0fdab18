"""POST /v1/chat/completions: chat through the model's template (jinja2 sandbox), with tools and
a reasoning model's reasoning_content, streamed (SSE) or whole."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from corellm.beam_search import BeamSearchParams
from corellm.chat_template import template_variables
from corellm.engine.input_processor import ProcessedRequest
from corellm.lora.lora_request import LoRARequest
from corellm.reasoning_parser import HARMONY, make_reasoning_parser
from corellm.server.assistant_message import AssistantMessage
from corellm.sampling_params import SamplingParams
from corellm.server.chat_tools import ChatTools, resolve_chat_tools
from corellm.server.errors import bad_request
from corellm.server.logprobs import TokenLabels, chat_logprobs, prompt_logprobs
from corellm.server.chat_messages import ImagePart
from corellm.server.protocol import ChatCompletionRequest
from corellm.server.serving import Serving, now, prediction_details, send_event, usage
from corellm.tokenizer import CHAT_TEMPLATE_PARAMETERS, ChatTemplateError

# Template rendering runs in a worker thread, bounded in time and output by the sandbox itself
# (corellm.chat_template), so a pathological template neither stalls the event loop nor keeps a
# worker busy after its request was refused.
_RENDER_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="chat-template")
_IMAGE_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="images")


# Request fields that are chat template variables: passed to a template that reads them, a 400 for
# one that does not (never dropped while the reply pretends). Each with the templates that read it.
TEMPLATE_FIELDS = {"documents": "a RAG template, such as Granite's or Command R's",
                   "reasoning_effort": "a reasoning model's, such as gpt-oss's"}


async def render_prompt(serving: Serving, req: ChatCompletionRequest,
                        tools: list[dict[str, Any]] | None = None) -> str:
    """The conversation as the prompt text: the model's chat template (or --chat-template, or the
    request's where allowed) with the messages, the tools and chat_template_kwargs; with
    continue_final_message the last message is left open for the model to continue."""
    if req.chat_template is not None and not serving.config.allow_request_chat_template:
        raise bad_request("chat_template in a request is not allowed on this server (start it with "
                          "--allow-request-chat-template)", "chat_template")
    messages = [m.as_template_message(content_parts=serving.takes_images) for m in req.messages]
    kwargs = dict(req.chat_template_kwargs or {})
    for reserved in sorted(kwargs.keys() & (CHAT_TEMPLATE_PARAMETERS | {"tools"})):
        raise bad_request(f"chat_template_kwargs may not set {reserved!r}", "chat_template_kwargs")
    if tools is not None:
        kwargs["tools"] = tools
    # The request's (where allowed), the server's (--chat-template) or the model's.
    template = req.chat_template or serving.config.chat_template or serving.tokenizer.chat_template
    for name, which in TEMPLATE_FIELDS.items():
        if getattr(req, name) is None:
            continue
        if name in kwargs:
            raise bad_request(f"give {name} or chat_template_kwargs.{name}, not both", name)
        try:
            read = not template or name in template_variables(template)  # no template: the render's 400
        except ChatTemplateError as e:
            raise bad_request(str(e), "messages") from None
        if not read:
            raise bad_request(f"{name}: this chat template does not read it ({which} does)", name)
        kwargs[name] = getattr(req, name)
    loop = asyncio.get_running_loop()
    limit = serving.config.chat_template_timeout_s
    render = lambda: serving.tokenizer.apply_chat_template(  # noqa: E731
        messages, add_generation_prompt=req.add_generation_prompt,
        chat_template=template, max_render_seconds=limit,
        continue_final_message=req.continue_final_message, **kwargs)
    try:
        return await asyncio.wait_for(loop.run_in_executor(_RENDER_POOL, render), limit + 1.0)
    except asyncio.TimeoutError:  # the pool was busy: the sandbox bounds the render itself
        raise bad_request("the chat template took too long to render", "messages") from None
    except ChatTemplateError as e:
        param = "continue_final_message" if str(e).startswith("continue_final_message") else "messages"
        raise bad_request(str(e), param) from None


@dataclass
class ChatTurn:
    """A chat request made ready to run: its prompt, its engine request (or beam search) and how
    each choice's reply is read from the model's text."""

    model: str
    response_id: str  # the reply's id (Serving.new_ids)
    request_id: str  # the engine's
    text: str | None  # the prompt's text (None when it was cut)
    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int | None
    structured_field: str | None  # the request field its output constraint came from
    tools: ChatTools
    reasoning_parser: str | None
    include_reasoning: bool  # (vLLM) false: the reasoning is taken out of the reply and not sent
    processed: ProcessedRequest | None  # None with beam search
    beam: BeamSearchParams | None
    lora: LoRARequest | None = None  # the LoRA adapter its `model` named (beam search runs with it)

    def reply(self) -> AssistantMessage:
        """A new reader of one choice's text: its reasoning, content and tool calls."""
        parser = make_reasoning_parser(self.reasoning_parser, tool_calls=self.tools.mode != "none") \
            if self.reasoning_parser else None
        return AssistantMessage(parser, self.tools.parser(), include_reasoning=self.include_reasoning)


async def prepare_chat(serving: Serving, request: web.Request, req: ChatCompletionRequest,
                       id_prefix: str = "chatcmpl-") -> ChatTurn:
    """Renders, tokenizes and checks the conversation, and prepares its engine request (not yet
    submitted): every 400 a chat request can get comes from here."""
    model, lora = serving.resolve_model(req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise bad_request("top_logprobs requires logprobs to be true", "top_logprobs")
    tools = resolve_chat_tools(req, serving.config, serving.tokenizer)
    text = await render_prompt(serving, req, tools.template_tools)
    prompt_ids = serving.tokenizer.encode(text, add_special_tokens=req.add_special_tokens)
    if req.truncate_prompt_tokens is not None and any(
            isinstance(m.content, list) and any(isinstance(p, ImagePart) for p in m.content) for m in req.messages):
        raise bad_request("truncate_prompt_tokens cannot cut a prompt with images (their tokens go together)",
                          "truncate_prompt_tokens")
    kept = serving.truncate_prompt(prompt_ids, req.truncate_prompt_tokens, req.truncation_side)
    text, prompt_ids = (text if len(kept) == len(prompt_ids) else None), kept
    max_tokens = req.max_completion_tokens or req.max_tokens
    beam = req.beam_search_params(max_tokens)
    top_n = req.top_logprobs or 0
    params = req.sampling_params(serving.defaults(), max_tokens, top_n if req.logprobs else None)
    structured_field = req.structured_output()[1]
    if tools.constraint is not None:
        params.structured_outputs, structured_field = tools.constraint, "tools"
        params.skip_special_tokens = False  # a call may open with a special token the parser must see
    if serving.engine.config.reasoning_parser == HARMONY:
        params.skip_special_tokens = False  # the harmony messages' headers and markers, which the parser reads
    await serving.check_constraint(params, structured_field)
    response_id, request_id = serving.new_ids(id_prefix, request, req.request_id)
    images = [(f"messages[{i}].content[{j}]", part.image_url) for i, m in enumerate(req.messages)
              if isinstance(m.content, list) for j, part in enumerate(m.content) if isinstance(part, ImagePart)]
    for name, image_url in images:
        if image_url.detail not in (None, "auto"):
            raise bad_request(f"{name}.image_url.detail {image_url.detail!r} is not supported: the model sees every "
                              f"image at its encoder's resolution (use 'auto' or leave it out)", "messages")
    images = [(name, image_url.url) for name, image_url in images]
    if beam is not None and images:
        raise bad_request("use_beam_search takes text conversations (no images)", "use_beam_search")
    prepare = functools.partial(serving.prepare, request_id, prompt_ids, text, params, max_tokens, kind="messages",
                                cache_salt=req.cache_salt, priority=req.priority, structured_field=structured_field,
                                images=images, lora_request=lora)
    # Images are decoded (and fetched, where allowed) on a worker thread: the event loop serves on.
    processed = None
    if beam is None:
        processed = await asyncio.get_running_loop().run_in_executor(_IMAGE_POOL, prepare) if images else prepare()
    return ChatTurn(model, response_id, request_id, text, prompt_ids, params, max_tokens, structured_field, tools,
                    serving.engine.config.reasoning_parser, req.include_reasoning, processed, beam, lora)


async def create_chat_completion(serving: Serving, request: web.Request, req: ChatCompletionRequest) -> web.StreamResponse:
    turn = await prepare_chat(serving, request, req)
    model, response_id, request_id, processed = turn.model, turn.response_id, turn.request_id, turn.processed
    params, structured_field, beam, reply = turn.params, turn.structured_field, turn.beam, turn.reply
    top_n = req.top_logprobs or 0
    labels = TokenLabels(serving.tokenizer, req.return_tokens_as_token_ids)

    n = params.n
    echoed = req.echoed_text()
    predicted = processed.samples[0].prediction_token_ids if processed is not None else []
    if not req.stream:
        if beam is not None:
            out = await serving.beam_search(request_id, turn.prompt_ids, turn.text, beam, turn.max_tokens,
                                            kind="messages", cache_salt=req.cache_salt, priority=req.priority,
                                            skip_special_tokens=req.skip_special_tokens, lora_request=turn.lora)
        else:
            (out,) = await serving.run_all([processed], structured_field)
        choices = []
        for c in out.outputs:
            message = reply()
            message.feed(c.text)
            message.finish()
            finish = "tool_calls" if message.has_tool_calls and c.finish_reason == "stop" else c.finish_reason
            whole = message.message()
            if echoed:
                whole["content"] = echoed + (whole["content"] or "")
            choices.append({"index": c.index, "message": whole,
                            "logprobs": (chat_logprobs(c, labels, top_n, req.logprob_token_ids)
                                         if req.logprobs else None),
                            "finish_reason": finish, "stop_reason": c.stop_reason})
            if req.return_token_ids:
                choices[-1]["token_ids"] = list(c.token_ids)
        completion_tokens = sum(len(c.token_ids) for c in out.outputs)
        details = prediction_details(predicted, [c.token_ids for c in out.outputs])
        body = {"id": response_id, "object": "chat.completion", "created": now(), "model": model, "choices": choices,
                "prompt_logprobs": prompt_logprobs(out.prompt_logprobs),
                "usage": usage(len(out.prompt_token_ids), completion_tokens, out.num_cached_tokens, details)}
        if req.return_token_ids:
            body["prompt_token_ids"] = out.prompt_token_ids
        return web.json_response(body)

    resp, outputs = await serving.start_stream(request, [processed], structured_field)
    created = now()
    head = {"id": response_id, "object": "chat.completion.chunk", "created": created, "model": model}
    completion_tokens = cached_tokens = 0
    messages = [reply() for _ in range(n)]
    output_ids: list[list[int]] = [[] for _ in range(n)]  # each choice's tokens (a prediction's usage)
    continuous_usage = (req.stream_options is not None and req.stream_options.include_usage
                        and req.stream_options.continuous_usage_stats)

    def chunk(index: int, delta: dict, finish_reason: str | None = None, logprobs=None, token_ids=None) -> dict:
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
        if req.return_token_ids:
            choice["token_ids"] = token_ids or []
        if continuous_usage:
            return {**head, "choices": [choice],
                    "usage": usage(len(processed.prompt_token_ids), completion_tokens, cached_tokens)}
        return {**head, "choices": [choice]}

    async with serving.sse_body(resp, [processed]):
        for i in range(n):  # the role comes first, once per choice (with return_token_ids, the prompt's ids)
            first = chunk(i, {"role": "assistant", "content": ""})
            if req.return_token_ids:
                first["prompt_token_ids"] = processed.prompt_token_ids
            await send_event(resp, first)
            if echoed:
                await send_event(resp, chunk(i, {"content": echoed}))
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for _, out in outputs:
                cached_tokens = out.num_cached_tokens
                for c in out.outputs:
                    completion_tokens += len(c.token_ids)
                    output_ids[c.index] += c.token_ids if predicted else []
                    message = messages[c.index]
                    deltas = message.feed(c.text) if c.text else []
                    logprobs = (chat_logprobs(c, labels, top_n, req.logprob_token_ids)
                                if req.logprobs and c.token_ids else None)
                    if (logprobs is not None or req.return_token_ids and c.token_ids) and not deltas:
                        deltas = [{}]  # the logprobs (token ids) of tokens whose text is held back
                    for k, delta in enumerate(deltas):
                        await send_event(resp, chunk(c.index, delta, logprobs=logprobs if k == 0 else None,
                                                     token_ids=list(c.token_ids) if k == 0 else None))
                    if c.finish_reason is not None:
                        for delta in message.finish():
                            await send_event(resp, chunk(c.index, delta))
                        finish = "tool_calls" if message.has_tool_calls and c.finish_reason == "stop" else c.finish_reason
                        await send_event(resp, chunk(c.index, {}, finish))
        if req.stream_options and req.stream_options.include_usage:
            await send_event(resp, {**head, "choices": [], "usage": usage(
                len(processed.prompt_token_ids), completion_tokens, cached_tokens,
                prediction_details(predicted, output_ids))})
    return resp
