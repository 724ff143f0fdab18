"""RequestPart: the base of every request model of the server (protocol.py, chat_messages.py, the
embeddings, scores and Responses routes' bodies)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class RequestPart(BaseModel):
    """A request body or a part of one: strict JSON types, unknown fields kept (model_extra) for
    request_fields.py. Subclasses add to this configuration (pydantic merges it)."""

    model_config = ConfigDict(extra="allow", strict=True)
