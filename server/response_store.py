"""ResponseStore: the responses the server keeps — those of POST /v1/responses with `store` true
(OpenAI's default) — for GET /v1/responses/{id} and its input_items, DELETE, POST .../cancel,
a later request's `previous_response_id`, and background responses while they are made.

In memory, in this process: the `capacity` (--max-stored-responses) most recently stored or
read, the least recently used first out; a response still being made (background) is never the
one put out. A response refers to the one it continued (`previous`), so that a conversation
outlives its earlier responses being put out or deleted: its input items are then still whole.
What one kept response holds is bounded by the context: every response of its chain was made
from a prompt that held the whole conversation before it. Nothing survives a restart, as vLLM's
own store."""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from corellm.server.errors import APIError

IN_PROGRESS = ("queued", "in_progress")


@dataclass
class StoredResponse:
    body: dict[str, Any]  # the response object as GET returns it
    own_input: list[dict[str, Any]]  # this request's input items, each with its id
    previous: StoredResponse | None = None  # the response it continued (previous_response_id)
    task: asyncio.Task | None = field(default=None, repr=False)  # a background response being made
    background: bool = False

    @property
    def in_progress(self) -> bool:
        return self.body["status"] in IN_PROGRESS

    def input_items(self) -> list[dict[str, Any]]:
        """The conversation that led to this response, oldest first: each earlier response's
        input and output items, then this request's input."""
        chain, at = [], self
        while at is not None:
            chain.append(at)
            at = at.previous
        items: list[dict[str, Any]] = []
        for earlier in reversed(chain[1:]):
            items += earlier.own_input + earlier.body["output"]
        return items + self.own_input

    def conversation(self) -> list[dict[str, Any]]:
        """What a request continuing this response starts from: its input items, then its output."""
        return self.input_items() + self.body["output"]


class ResponseStore:
    def __init__(self, capacity: int):
        if capacity < 0:
            raise ValueError(f"--max-stored-responses must be >= 0, got {capacity}")
        self.capacity = capacity
        self._responses: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._responses)

    def put(self, stored: StoredResponse) -> None:
        """Keeps `stored` under its body's id (replacing a response of the same id: a client that
        names two requests alike, through request_id, keeps the later); then puts out the least
        recently used finished responses beyond the capacity."""
        response_id = stored.body["id"]
        self._responses.pop(response_id, None)
        self._responses[response_id] = stored
        excess = len(self._responses) - self.capacity
        if excess > 0:
            finished = (i for i, r in self._responses.items() if not r.in_progress)
            for old_id in list(itertools.islice(finished, excess)):
                del self._responses[old_id]

    def get(self, response_id: str, param: str | None = None) -> StoredResponse:
        """The stored response (now the most recently used); a 404 naming it when there is none —
        or a 400 naming `param` when the id came in a request's field."""
        stored = self._responses.get(response_id)
        if stored is None:
            message = f"Response with id {response_id!r} not found."
            if param is not None:
                raise APIError(400, f"Previous response with id {response_id!r} not found.", "invalid_request_error",
                               param, "previous_response_not_found")
            raise APIError(404, message, "invalid_request_error", None, "response_not_found")
        self._responses.move_to_end(response_id)
        return stored

    def delete(self, response_id: str) -> StoredResponse:
        stored = self.get(response_id)
        del self._responses[response_id]
        return stored
