"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, one status each."""

from __future__ import annotations

import json

from aiohttp import web
from pydantic import ValidationError


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> web.Response:
        return web.json_response(self.body(), status=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def error_chunk(err: APIError) -> bytes:
    """The SSE event that ends a stream with an error."""
    return f"data: {json.dumps(err.body())}\n\n".encode()


def validation_error(e: ValidationError) -> APIError:
    """A pydantic validation failure as a 400 naming the field (its dotted location)."""
    first = e.errors()[0]
    loc = ".".join(str(x) for x in first.get("loc", ()))
    msg = first.get("msg", "invalid value")
    if first.get("type") == "value_error" and "error" in first.get("ctx", {}):
        msg = str(first["ctx"]["error"])  # our validators' own sentence, without pydantic's "Value error, "
    return bad_request(f"{loc}: {msg}" if loc else msg, param=loc or None)
