"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path,
as vLLM and llama.cpp's server serve it, so that Anthropic's SDKs and the tools built on them can use
a model served by corellm. The request becomes a chat request (anthropic_protocol.py), prepared as
any chat (prepare_chat: template, tools, checks); the model's reply is read as chat reads it
(AssistantMessage) and written as the API's content blocks — thinking (with --reasoning-parser; its
signature empty: corellm signs nothing), text, tool_use — whole, or streamed as its events
(message_start, content_block_start, content_block_delta, content_block_stop, message_delta,
message_stop). stop_reason: end_turn, max_tokens, stop_sequence (stop_sequence then names it) or
tool_use. Errors have the API's shape, {"type": "error", "error": {"type", "message"}}."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from corellm.engine.async_llm import EngineDeadError
from corellm.outputs import CompletionOutput
from corellm.server.anthropic_protocol import FIELD_NAMES, CountTokensRequest, MessagesRequest
from corellm.server.chat import ChatTurn, prepare_chat, render_prompt
from corellm.server.chat_tools import resolve_chat_tools
from corellm.server.errors import APIError, bad_request, renamed, validation_error
from corellm.server.protocol import ChatCompletionRequest
from corellm.server.serving import Serving

# The API's error type for each status.
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
                429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error(err: BaseException) -> APIError:
    """The error as the APIError it answers with (an engine that stopped: 503; any other failure: 500)."""
    if isinstance(err, EngineDeadError):
        return APIError(503, str(err), "service_unavailable")
    if isinstance(err, ValueError) and not isinstance(err, APIError):
        return bad_request(str(err))
    return err if isinstance(err, APIError) else APIError(500, f"{type(err).__name__}: {err}", "internal_error")


def error_body(api: APIError) -> dict[str, Any]:
    return {"type": "error", "error": {"type": _ERROR_TYPES.get(api.status, "api_error"), "message": api.message}}


def error_response(api: APIError) -> web.Response:
    return web.json_response(error_body(api), status=api.status, headers=api.headers)


async def _chat(serving: Serving, req: MessagesRequest) -> ChatCompletionRequest:
    """The chat request of the message; a 400 names the Messages API's field."""
    try:
        return ChatCompletionRequest.model_validate(req.chat_body(serving.engine.config.reasoning_parser is not None))
    except ValidationError as e:
        raise _renamed(validation_error(e)) from None


def _renamed(error: APIError) -> APIError:
    return renamed(error, FIELD_NAMES)


async def create_message(serving: Serving, request: web.Request, req: MessagesRequest) -> web.StreamResponse:
    try:
        turn = await prepare_chat(serving, request, await _chat(serving, req), id_prefix="msg_")
    except APIError as e:
        raise _renamed(e) from None
    if not req.stream:
        (out,) = await serving.run_all([turn.processed], turn.structured_field)
        c = out.outputs[0]
        reply = turn.reply()
        reply.feed(c.text)
        reply.finish()
        body = _message(turn, _blocks(reply.message()), None)
        body.update(_stop(c, reply.has_tool_calls, req))
        body["usage"] = _usage(len(out.prompt_token_ids), len(c.token_ids), out.num_cached_tokens)
        return web.json_response(body)

    resp, outputs = await serving.start_stream(request, [turn.processed], turn.structured_field)
    events = _MessageEvents(resp)
    try:
        await events.send("message_start", message=_message(turn, [], _usage(len(turn.prompt_ids), 0, 0)))
        reply, output_tokens, cached, last = turn.reply(), 0, 0, None
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for _, out in outputs:
                cached = out.num_cached_tokens
                for c in out.outputs:
                    output_tokens += len(c.token_ids)
                    for delta in reply.feed(c.text) if c.text else []:
                        await events.delta(delta)
                    if c.finish_reason is not None:
                        last = c
                        for delta in reply.finish():
                            await events.delta(delta)
        await events.finish()
        stop = (_stop(last, reply.has_tool_calls, req) if last is not None
                else {"stop_reason": None, "stop_sequence": None})
        await events.send("message_delta", delta=stop, usage=_usage(len(turn.prompt_ids), output_tokens, cached))
        await events.send("message_stop")
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - one request's failure ends its stream, not the server
        await events.send("error", error=error_body(anthropic_error(e))["error"])
    finally:
        serving.abort([turn.processed])
    return resp


async def count_tokens(serving: Serving, request: web.Request, req: CountTokensRequest) -> web.Response:
    """The input's tokens as the model reads them (the template applied, the tools shown), with no
    check against the context."""
    serving.check_model(req.model)
    message = req.as_message()
    try:
        chat = await _chat(serving, message)
        tools = resolve_chat_tools(chat, serving.config, serving.tokenizer)
        text = await render_prompt(serving, chat, tools.template_tools)
    except APIError as e:
        raise _renamed(e) from None
    tokens = serving.tokenizer.encode(text, add_special_tokens=chat.add_special_tokens)
    return web.json_response({"input_tokens": len(tokens)})


def _message(turn: ChatTurn, content: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": turn.response_id, "type": "message", "role": "assistant", "model": turn.model, "content": content,
            "stop_reason": None, "stop_sequence": None, "usage": usage}


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The content blocks of a whole chat message: thinking, text, tool_use, each where the reply
    has it (as the stream opens them); a reply of nothing is one empty text block."""
    blocks = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": _arguments(call["function"]["arguments"])})
    return blocks or [{"type": "text", "text": ""}]


def _arguments(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {}  # the calls' parser hands out arguments that parse; an empty call's are ""


def _stop(c: CompletionOutput, tool_calls: bool, req: MessagesRequest) -> dict[str, Any]:
    if c.finish_reason == "length":
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if isinstance(c.stop_reason, str) and c.stop_reason in (req.stop_sequences or ()):
        return {"stop_reason": "stop_sequence", "stop_sequence": c.stop_reason}
    return {"stop_reason": "tool_use" if tool_calls else "end_turn", "stop_sequence": None}


def _usage(input_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    """The API counts cache reads apart from the input; corellm's prefix cache writes at no charge."""
    return {"input_tokens": input_tokens - cached, "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


class _MessageEvents:
    """The stream's events, from the chat deltas of the reply: each content block opened
    (content_block_start), written (content_block_delta) and closed (content_block_stop) in turn."""

    def __init__(self, resp: web.StreamResponse):
        self.resp = resp
        self.index = -1  # the open block's
        self.open: str | None = None  # its type

    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, **fields}
        await self.resp.write(f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode())

    async def delta(self, delta: dict[str, Any]) -> None:
        if delta.get("reasoning_content"):
            await self._write("thinking", {"type": "thinking_delta", "thinking": delta["reasoning_content"]})
        if delta.get("content"):
            await self._write("text", {"type": "text_delta", "text": delta["content"]})
        for call in delta.get("tool_calls") or []:
            if "id" in call:  # a call starts
                await self._open({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": {}})
            arguments = call["function"].get("arguments")
            if arguments:
                await self.send("content_block_delta", index=self.index,
                                delta={"type": "input_json_delta", "partial_json": arguments})

    async def _write(self, kind: str, delta: dict[str, Any]) -> None:
        if self.open != kind:
            await self._open({"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking"
                             else {"type": "text", "text": ""})
        await self.send("content_block_delta", index=self.index, delta=delta)

    async def _open(self, block: dict[str, Any]) -> None:
        await self.close_block()
        self.index += 1
        self.open = block["type"]
        await self.send("content_block_start", index=self.index, content_block=block)

    async def finish(self) -> None:
        """Closes the last block; a reply of nothing is one empty text block (as the whole message)."""
        if self.index == -1:
            await self._open({"type": "text", "text": ""})
        await self.close_block()

    async def close_block(self) -> None:
        if self.open is not None:
            if self.open == "thinking":  # the API closes a thinking block with its signature
                await self.send("content_block_delta", index=self.index,
                                delta={"type": "signature_delta", "signature": ""})
            await self.send("content_block_stop", index=self.index)
            self.open = None
