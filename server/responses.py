"""POST /v1/responses: OpenAI's Responses API over the chat path. The request becomes a chat
request (responses_protocol.py), prepared as any chat (prepare_chat: template, tools, structured
output, checks); the model's reply is read as chat reads it (AssistantMessage) and written as the
Responses API's output items — a reasoning item (with --reasoning-parser), the message's
output_text, function_call items — whole, or streamed as its events (response.created,
response.output_item.added, response.output_text.delta, ..., response.completed), each with its
sequence_number. A reply cut by max_output_tokens is status "incomplete".

Unless `store` is false, the finished response is kept (response_store.py): GET /v1/responses/{id}
reads it back, .../input_items lists the conversation that led to it, DELETE forgets it, and a
request naming it in `previous_response_id` continues its conversation. With `background` the
POST answers at once with the response "queued", made while the client polls GET (or cancels it:
POST .../cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from corellm.engine.async_llm import EngineDeadError
from corellm.server.chat import ChatTurn, prepare_chat
from corellm.outputs import PositionLogprobs, RequestOutput
from corellm.reasoning_parser import make_reasoning_parser
from corellm.server.errors import APIError, bad_request, renamed, validation_error
from corellm.server.logprobs import TokenLabels, token_logprob
from corellm.server.protocol import ChatCompletionRequest
from corellm.server.response_store import StoredResponse
from corellm.server.responses_protocol import FIELD_NAMES, ResponsesRequest, reasoning_content
from corellm.server.serving import Serving, now


async def create_response(serving: Serving, request: web.Request, req: ResponsesRequest) -> web.StreamResponse:
    keep = _kept(serving, req)
    previous = None
    if req.previous_response_id is not None:
        previous = serving.responses.get(req.previous_response_id, param="previous_response_id")
        if previous.in_progress:
            raise bad_request(f"previous_response_id: response {req.previous_response_id!r} is still "
                              f"{previous.body['status']}; continue it once it is done", "previous_response_id")
    turn = await _prepared(serving, request, req if previous is None else req.continuing(previous.conversation()))
    created = now()
    stored = StoredResponse({}, req.own_input_items() if keep else [], previous, background=bool(req.background))
    if req.background:
        return _start_in_background(serving, turn, req, created, stored)
    if not req.stream:
        (out,) = await serving.run_all([turn.processed], turn.structured_field)
        stored.body = _whole(serving, turn, req, created, out, stored=keep)
        if keep:
            serving.responses.put(stored)
        return web.json_response(stored.body)

    resp, outputs = await serving.start_stream(request, [turn.processed], turn.structured_field)
    events = _ResponseEvents(resp, _ReplyTokens(serving, turn, req), encrypted_reasoning=req.encrypted_reasoning)
    in_progress = _response(turn, req, created, [], None, stored=keep)
    try:
        await events.send("response.created", response=in_progress)
        await events.send("response.in_progress", response=in_progress)
        message = turn.reply()
        token_ids: list[int] = []
        prompt_ids, cached, finish = turn.prompt_ids, 0, None
        async with contextlib.aclosing(outputs):  # closed at once on a disconnect
            async for _, out in outputs:
                prompt_ids, cached = out.prompt_token_ids, out.num_cached_tokens
                for c in out.outputs:
                    token_ids += c.token_ids
                    events.tokens.feed(c.token_ids, c.logprobs)
                    for delta in message.feed(c.text) if c.text else []:
                        await events.delta(delta)
                    if c.finish_reason is not None:
                        finish = c.finish_reason
                        events.tokens.finish()
                        for delta in message.finish():
                            await events.delta(delta)
        await events.close_answer()
        body = _response(turn, req, created, events.items, finish, stored=keep)
        body["usage"] = _usage(prompt_ids, token_ids, cached, events.tokens)
        if keep:
            stored.body = body
            serving.responses.put(stored)
        await events.send("response.completed" if body["status"] == "completed" else "response.incomplete",
                          response=body)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as e:  # noqa: BLE001 - one request's failure ends its stream, not the server
        await events.error(e)
    finally:
        serving.abort([turn.processed])
    return resp


async def get_response(serving: Serving, request: web.Request) -> web.Response:
    """GET /v1/responses/{id}: the stored response as it stands (a background one: queued, in
    progress, or done)."""
    _check_query(request, {"stream": ("false",)})
    return web.json_response(serving.responses.get(request.match_info["response_id"]).body)


async def delete_response(serving: Serving, request: web.Request) -> web.Response:
    """DELETE /v1/responses/{id}: forgets the response (cancelling it if it is being made); the
    responses that continued it keep their conversation."""
    _check_query(request, {})
    response_id = request.match_info["response_id"]
    stored = serving.responses.delete(response_id)
    if stored.task is not None:
        stored.task.cancel()
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def cancel_response(serving: Serving, request: web.Request) -> web.Response:
    """POST /v1/responses/{id}/cancel: a background response being made ends "cancelled" (one
    already done is answered as it is)."""
    _check_query(request, {})
    stored = serving.responses.get(request.match_info["response_id"])
    if not stored.background:
        raise bad_request("only a response made with background true can be cancelled", "response_id")
    if stored.task is not None and not stored.task.done():
        stored.task.cancel()
        await asyncio.wait([stored.task])  # its settling callback runs first: the body says "cancelled"
    return web.json_response(stored.body)


async def list_input_items(serving: Serving, request: web.Request) -> web.Response:
    """GET /v1/responses/{id}/input_items: the conversation that led to the response (the items of
    the responses it continued, then its own input), a page at a time: `limit` (1-100, 20), `order`
    ("desc", newest first, or "asc"), `after` / `before` an item id."""
    _check_query(request, {"limit": None, "order": ("asc", "desc"), "after": None, "before": None})
    stored = serving.responses.get(request.match_info["response_id"])
    query = request.query
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request(f"limit must be an integer from 1 to 100, got {query['limit']!r}", "limit")
    items = stored.input_items()
    if query.get("order", "desc") == "desc":
        items = items[::-1]
    ids = [item.get("id") for item in items]
    start, end = 0, len(items)
    for name in ("after", "before"):
        if name in query:
            if query[name] not in ids:
                raise bad_request(f"{name}: no input item {query[name]!r} in response "
                                  f"{request.match_info['response_id']!r}", name)
            if name == "after":
                start = ids.index(query[name]) + 1
            else:
                end = ids.index(query[name])
    page = items[start:min(end, start + limit)]
    return web.json_response({"object": "list", "data": page, "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None, "has_more": start + limit < end})


def _check_query(request: web.Request, allowed: dict[str, tuple[str, ...] | None]) -> None:
    """A 400 naming the first query parameter not in `allowed` (or with a value not among its own)."""
    for name, value in request.query.items():
        if name not in allowed:
            raise bad_request(f"the query parameter {name!r} is not supported here", name, "unsupported_field")
        if allowed[name] is not None and value not in allowed[name]:
            raise bad_request(f"{name}={value!r} is not supported here (only {', '.join(allowed[name])})", name,
                              "unsupported_field")


def _kept(serving: Serving, req: ResponsesRequest) -> bool:
    """Whether the response is to be kept: unless store is false, when the server keeps any."""
    if serving.responses.capacity == 0:
        for field, given in (("store", bool(req.store)), ("background", bool(req.background))):
            if given:
                raise bad_request(f"{field} is not supported: this server keeps no responses "
                                  f"(--max-stored-responses 0); send the conversation in input", field,
                                  "unsupported_field")
    return req.store is not False and serving.responses.capacity > 0


def _start_in_background(serving: Serving, turn: ChatTurn, req: ResponsesRequest, created: int,
                         stored: StoredResponse) -> web.Response:
    """Admits the request (a 429 is this POST's answer), keeps its response "queued" and makes it
    on a task of its own, which the client's going does not end (cancel and DELETE do). The drain
    on shutdown waits for it as for a request in flight."""
    streams = serving.submit([turn.processed])
    stored.body = {**_response(turn, req, created, [], None, stored=True), "status": "queued"}
    serving.responses.put(stored)
    serving.active += 1
    serving.model_requests += 1
    stored.task = asyncio.create_task(_make_in_background(serving, turn, req, created, stored, streams))

    def settled(_: asyncio.Task) -> None:  # also when cancelled before it ever ran
        serving.active -= 1
        serving.model_requests -= 1
        serving.abort([turn.processed])
        if stored.in_progress:
            stored.body["status"] = "cancelled"

    stored.task.add_done_callback(settled)
    return web.json_response(stored.body)


async def _make_in_background(serving: Serving, turn: ChatTurn, req: ResponsesRequest, created: int,
                              stored: StoredResponse, streams: list) -> None:
    stored.body["status"] = "in_progress"
    try:
        (out,) = await serving.finish_all(streams, [turn.processed], turn.structured_field)
        stored.body.update(_whole(serving, turn, req, created, out, stored=True))
    except (asyncio.CancelledError, KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # noqa: BLE001 - the response fails; the server serves on
        api = _api_error(e)
        stored.body.update(status="failed", error={"code": api.code or api.type, "message": api.message})


def _api_error(err: BaseException) -> APIError:
    if isinstance(err, EngineDeadError):
        return APIError(503, str(err), "service_unavailable")
    return err if isinstance(err, APIError) else APIError(500, f"{type(err).__name__}: {err}", "internal_error")


def _whole(serving: Serving, turn: ChatTurn, req: ResponsesRequest, created: int, out: RequestOutput,
           stored: bool) -> dict[str, Any]:
    """The finished response of a whole (not streamed) output."""
    c = out.outputs[0]
    message = turn.reply()
    message.feed(c.text)
    message.finish()
    tokens = _ReplyTokens(serving, turn, req)
    tokens.feed(c.token_ids, c.logprobs)
    tokens.finish()
    items = _items(message.message(), encrypted_reasoning=req.encrypted_reasoning, logprobs=tokens.answer_logprobs)
    body = _response(turn, req, created, items, c.finish_reason, stored=stored)
    body["usage"] = _usage(out.prompt_token_ids, c.token_ids, out.num_cached_tokens, tokens)
    return body


class _ReplyTokens:
    """A reply's tokens told apart as they come, as its reasoning parser splits its text: the
    reasoning's (up to the token that ends the block) and the answer's, whose text is the message's
    (all of them without a parser, or when the reply opened no block). With logprobs asked for, the
    answer tokens' entries (chat's format), all of them and those not yet handed out to a delta."""

    def __init__(self, serving: Serving, turn: ChatTurn, req: ResponsesRequest):
        self.tokenizer = serving.tokenizer
        self.parser = make_reasoning_parser(turn.reasoning_parser) if turn.reasoning_parser else None
        self.labels = TokenLabels(serving.tokenizer) if req.output_logprobs else None
        self.top_n = req.top_logprobs or 0
        self.reasoning = 0  # tokens of the reasoning
        self.answer_logprobs: list[dict[str, Any]] = []
        self._handed_out = 0
        self._undecided: list[dict[str, Any] | None] = []  # before a leading <think> could be told

    def feed(self, token_ids: list[int], logprobs: list[PositionLogprobs] | None) -> None:
        for i, token_id in enumerate(token_ids):
            entry = None if self.labels is None or logprobs is None else \
                token_logprob(token_id, logprobs[i], self.labels, self.top_n)
            if self.parser is None or self.parser.part == "answer":
                self._answer([entry])
                continue
            self.parser.feed(self.tokenizer.decode([token_id], skip_special_tokens=False))
            if self.parser.part == "start":
                self._undecided.append(entry)
            elif self.parser.opened:  # in the block, or the token that ends it
                self.reasoning += len(self._undecided) + 1
                self._undecided = []
            else:  # the reply opened no block: all of it is the answer
                self._answer(self._undecided + [entry])
                self._undecided = []

    def finish(self) -> None:
        """The end of the reply: tokens still undecided are the answer's (their text is)."""
        self._answer(self._undecided)
        self._undecided = []

    def _answer(self, entries: list[dict[str, Any] | None]) -> None:
        self.answer_logprobs += [e for e in entries if e is not None]

    def hand_out(self) -> list[dict[str, Any]]:
        """The answer's entries not handed out yet (for the next text delta)."""
        new = self.answer_logprobs[self._handed_out:]
        self._handed_out = len(self.answer_logprobs)
        return new


async def _prepared(serving: Serving, request: web.Request, req: ResponsesRequest) -> ChatTurn:
    """The chat turn of the request; a 400 names the Responses field (input, not messages)."""
    try:
        chat = ChatCompletionRequest.model_validate(req.chat_body())
        return await prepare_chat(serving, request, chat, id_prefix="resp_")
    except ValidationError as e:
        raise _renamed(validation_error(e)) from None
    except APIError as e:
        raise _renamed(e) from None


def _renamed(error: APIError) -> APIError:
    return renamed(error, FIELD_NAMES, whole=("messages",))  # input's items are not the messages one to one


def _response(turn: ChatTurn, req: ResponsesRequest, created: int, output: list[dict[str, Any]],
              finish_reason: str | None, stored: bool) -> dict[str, Any]:
    """The response object; status "in_progress" until the finish reason is known."""
    status = "in_progress" if finish_reason is None else "incomplete" if finish_reason == "length" else "completed"
    fmt = req.text.format if req.text is not None and req.text.format is not None else None
    return {
        "id": turn.response_id, "object": "response", "created_at": created, "status": status, "model": turn.model,
        "output": output, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens,
        "temperature": turn.params.temperature, "top_p": turn.params.top_p,
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or []],
        "tool_choice": (req.tool_choice if isinstance(req.tool_choice, str) or req.tool_choice is None
                        else req.tool_choice.model_dump()) or turn.tools.mode,
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True) if fmt else {"type": "text"}},
        "reasoning": {"effort": req.reasoning.effort if req.reasoning else None, "summary": None},
        "store": stored, "previous_response_id": req.previous_response_id, "background": bool(req.background),
        "truncation": "disabled", "user": req.user,
        "metadata": req.metadata or {}, "usage": None,
    }


def _items(message: dict[str, Any], encrypted_reasoning: bool,
           logprobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The output items of a whole chat message: reasoning, the text (with its tokens' logprobs),
    the function calls."""
    items = []
    if message.get("reasoning_content"):
        items.append(_reasoning_item(message["reasoning_content"], encrypted=encrypted_reasoning))
    if message.get("content") or not message.get("tool_calls"):
        items.append(_message_item(message.get("content") or "", logprobs=logprobs))
    for call in message.get("tool_calls") or []:
        items.append(_call_item(call["id"], call["function"]["name"], call["function"]["arguments"]))
    return items


def _reasoning_item(text: str, status: str = "completed", encrypted: bool = False) -> dict[str, Any]:
    """encrypted (include ["reasoning.encrypted_content"]): the item carries its text in base64
    as well, as a client that keeps no server state gives it back next turn."""
    item = {"type": "reasoning", "id": f"rs_{uuid.uuid4().hex}", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}] if text else [], "status": status}
    if encrypted:
        item["encrypted_content"] = reasoning_content(text)
    return item


def _message_item(text: str, status: str = "completed", logprobs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": status, "role": "assistant",
            "content": [_text_part(text, logprobs)] if status == "completed" else []}


def _text_part(text: str, logprobs: list[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": list(logprobs)}


def _call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": f"fc_{uuid.uuid4().hex}", "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


def _usage(prompt_ids: list[int], token_ids: list[int], cached: int, tokens: _ReplyTokens) -> dict[str, Any]:
    return {"input_tokens": len(prompt_ids), "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": len(token_ids), "output_tokens_details": {"reasoning_tokens": tokens.reasoning},
            "total_tokens": len(prompt_ids) + len(token_ids)}


class _ResponseEvents:
    """The stream's events, from the chat deltas of the reply: each output item opened
    (output_item.added, and its content part), written (its deltas) and closed (its .done events)
    in turn; `items` holds the closed items."""

    def __init__(self, resp: web.StreamResponse, tokens: _ReplyTokens, encrypted_reasoning: bool):
        self.resp = resp
        self.tokens = tokens  # the reply's tokens: the answer's logprobs go out with its text deltas
        self.encrypted_reasoning = encrypted_reasoning  # reasoning items carry encrypted_content too
        self.sequence = 0
        self.items: list[dict[str, Any]] = []
        self.open: dict[str, Any] | None = None  # the item being written
        self.text = ""  # its text (or a call's arguments) so far

    async def send(self, kind: str, **fields: Any) -> None:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        await self.resp.write(f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n".encode())

    async def error(self, err: BaseException) -> None:
        """Ends the stream with the Responses API's error event."""
        api = _api_error(err)
        await self.send("error", code=api.code or api.type, message=api.message, param=api.param)

    async def delta(self, delta: dict[str, Any]) -> None:
        if delta.get("reasoning_content"):
            await self._write("reasoning", delta["reasoning_content"])
        if delta.get("content"):
            await self._write("message", delta["content"])
        for call in delta.get("tool_calls") or []:
            if "id" in call:  # a call starts
                await self.close_item()
                await self._open(_call_item(call["id"], call["function"]["name"], "", "in_progress"))
            await self._write("function_call", call["function"].get("arguments") or "")

    async def _write(self, kind: str, text: str) -> None:
        if self.open is None or self.open["type"] != kind:
            await self.close_item()
            await self._open(_reasoning_item("", "in_progress") if kind == "reasoning"
                             else _message_item("", "in_progress"))
        if not text:
            return
        self.text += text
        where = {"item_id": self.open["id"], "output_index": len(self.items)}
        if kind == "function_call":
            await self.send("response.function_call_arguments.delta", **where, delta=text)
        elif kind == "reasoning":
            await self.send("response.reasoning_text.delta", **where, content_index=0, delta=text)
        else:
            await self.send("response.output_text.delta", **where, content_index=0, delta=text,
                            logprobs=self.tokens.hand_out())

    async def _open(self, item: dict[str, Any]) -> None:
        self.open, self.text = item, ""
        await self.send("response.output_item.added", output_index=len(self.items), item=item)
        if item["type"] == "message":
            await self.send("response.content_part.added", item_id=item["id"], output_index=len(self.items),
                            content_index=0, part=_text_part(""))

    async def close_answer(self) -> None:
        """Ends the stream's items; a reply that made neither text nor calls (all of it reasoning)
        still gets its message item, empty, as the whole response has it."""
        if not any(item["type"] != "reasoning" for item in self.items + [self.open or {"type": "reasoning"}]):
            await self._write("message", "")
        await self.close_item()

    async def close_item(self) -> None:
        """Ends the item being written (if any): its .done events, then output_item.done."""
        item = self.open
        if item is None:
            return
        where = {"item_id": item["id"], "output_index": len(self.items)}
        if item["type"] == "message":
            last = self.tokens.hand_out()  # tokens with no text of their own after the last delta (the EOS)
            if last:
                await self.send("response.output_text.delta", **where, content_index=0, delta="", logprobs=last)
            part = _text_part(self.text, self.tokens.answer_logprobs)
            await self.send("response.output_text.done", **where, content_index=0, text=self.text,
                            logprobs=part["logprobs"])
            await self.send("response.content_part.done", **where, content_index=0, part=part)
            item["content"] = [part]
        elif item["type"] == "reasoning":
            await self.send("response.reasoning_text.done", **where, content_index=0, text=self.text)
            item.update({**_reasoning_item(self.text, encrypted=self.encrypted_reasoning), "id": item["id"]})
        else:
            await self.send("response.function_call_arguments.done", **where, arguments=self.text)
            item["arguments"] = self.text
        item["status"] = "completed"
        await self.send("response.output_item.done", output_index=len(self.items), item=item)
        self.items.append(item)
        self.open = None
