"""The JSON and SSE requests the server tests make by hand (beside the openai client), on
tests/reliability's `call`."""

from __future__ import annotations

import json
import urllib.request

from tests.reliability.conftest import call


def post(server, path: str, body: dict) -> tuple[int, dict]:
    """(status, parsed body) of a POST; an error status is returned, not raised."""
    status, parsed, _ = call(server.url + path, body)
    return status, parsed


def stream(server, path: str, body: dict) -> list[dict]:
    """The JSON events of the request streamed (`stream` set), up to [DONE]."""
    req = urllib.request.Request(server.url + path, data=json.dumps({**body, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return [json.loads(line[6:]) for line in r.read().decode().splitlines() if line.startswith("data: {")]
