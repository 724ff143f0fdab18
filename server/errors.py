"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}, one status each."""

from __future__ import annotations

import hmac
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


# The health probes: open without the API key, and answered while the server drains (with its state).
PROBE_PATHS = ("/health", "/ping")


def api_key_refusal(request: web.Request, key: str | None) -> APIError | None:
    """The 401 for a request that does not bring `Authorization: Bearer KEY` or `x-api-key: KEY`
    (Anthropic's SDKs' header; compared in constant time), or None: it does, no key is set, or the
    route is a health probe (PROBE_PATHS)."""
    if not key or request.path in PROBE_PATHS:
        return None
    header = request.headers.get("Authorization", "")
    given = header[7:] if header.startswith("Bearer ") else request.headers.get("x-api-key", "")
    if hmac.compare_digest(given.encode(), key.encode()):
        return None
    return APIError(401, "Incorrect API key provided.", "authentication_error", None, "invalid_api_key")


def renamed(error: APIError, names: dict[str, str], whole: tuple[str, ...] = ()) -> APIError:
    """The error of a chat request made from another API's request, its param (and the message's
    first mention of it) under that API's name for the field (`names`: chat's name -> the other's);
    a field in `whole` is named without the rest of its path (its parts do not map one to one)."""
    if error.param is not None:
        head, _, rest = error.param.partition(".")
        if head in names:
            error.param = names[head] + (f".{rest}" if rest and head not in whole else "")
            error.message = error.message.replace(head, names[head], 1)
    return error


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def error_chunk(err: APIError) -> bytes:
    """The SSE event that ends a stream with an error."""
    return f"data: {json.dumps(err.body())}\n\n".encode()


def validation_error(e: ValidationError) -> APIError:
    """A pydantic validation failure as a 400 naming the field (its dotted location).

    A field that takes one of several forms (`prompt`: a string, strings, token ids, lists of
    them) fails once per form, each error's location holding the form's type tag
    (`constrained-str`, `list[constrained-int]`): the tags are dropped, and of the first field's
    errors the one that got furthest into the value and is not a mere type mismatch is told (an
    empty string, the empty second string of a list); where every form is the wrong type, the
    sentences of those that got furthest are joined."""
    errors = [(_plain_loc(err.get("loc", ())), err) for err in e.errors()]
    field = errors[0][0][:1]
    mine = [(loc, err) for loc, err in errors if loc[:1] == field]
    told = [(loc, err) for loc, err in mine if not err.get("type", "").endswith("_type")]
    candidates = told or mine
    depth = max(len(loc) for loc, _ in candidates)
    deepest = [(loc, err) for loc, err in candidates if len(loc) == depth]
    loc = ".".join(map(str, deepest[0][0]))
    msg = _message(deepest[0][1]) if told else "; ".join(dict.fromkeys(_message(err) for _, err in deepest))
    return bad_request(f"{loc}: {msg}" if loc else msg, param=loc or None)


def _plain_loc(loc: tuple) -> tuple:
    """A location without pydantic's union tags (type names such as `constrained-str`, `list[int]`
    or `function-after[...]`, where field names are snake_case words and list positions ints)."""
    return tuple(x for x in loc if isinstance(x, int) or not ("[" in x or "-" in x or x in _TYPE_TAGS))


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "tuple"}


def _message(err: dict) -> str:
    if err.get("type") == "value_error" and "error" in err.get("ctx", {}):
        return str(err["ctx"]["error"])  # our validators' own sentence, without pydantic's "Value error, "
    return err.get("msg", "invalid value")
