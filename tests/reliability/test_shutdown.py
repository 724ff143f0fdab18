"""SIGTERM: requests in flight finish, new ones get 503 (the server keeps listening while it
drains), /health says draining, then the process exits 0."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
import urllib.request

from tests.reliability.conftest import assert_error, call
from tests.server.conftest import Server


def wait_until_running(url: str, timeout: float = 30.0) -> None:
    """Returns once the server's /metrics shows a request running (a fixed sleep is not enough
    on a loaded machine: the request may not have arrived yet)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("corellm:num_requests_running{") and float(line.rsplit(" ", 1)[1]) >= 1:
                    return
        time.sleep(0.05)
    raise AssertionError("no request started running")


def test_sigterm_drains_in_flight_requests_and_refuses_new_ones():
    s = Server("--shutdown-timeout", "30")
    result = {}

    def long_request():
        # ~3 s at this machine's single-stream speed: still running when SIGTERM comes at 0.5 s.
        body = {"prompt": "Count: 1, 2,", "max_tokens": 400, "ignore_eos": True, "temperature": 0}
        result["status"], result["body"], _ = call(s.url + "/v1/completions", body)

    t = threading.Thread(target=long_request)
    t.start()
    wait_until_running(s.url)
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    code, out, _ = call(s.url + "/v1/completions", {"prompt": "late", "max_tokens": 2})
    assert_error(code, out, 503, "service_unavailable", contains="shutting down")
    try:
        urllib.request.urlopen(s.url + "/health", timeout=5)
        raise AssertionError("/health answered 200 while draining")
    except urllib.error.HTTPError as e:
        assert e.code == 503 and json.loads(e.read())["status"] == "draining"
    t.join(timeout=60)
    assert result.get("status") == 200, result
    assert result["body"]["choices"][0]["finish_reason"] == "length"
    assert s.proc.wait(timeout=60) == 0


def test_shutdown_timeout_bounds_the_drain():
    # 4000 tokens take 20 s or more on a CPU: far past the 1 s drain (+ aiohttp's 1 s cleanup).
    s = Server("--shutdown-timeout", "1", "--max-model-len", "4096")
    result = {}

    def endless():
        body = {"prompt": "Count: 1, 2,", "max_tokens": 4000, "ignore_eos": True}
        try:
            result["status"], result["body"], _ = call(s.url + "/v1/completions", body, timeout=120)
        except (OSError, http.client.HTTPException) as e:  # cut off by the shutdown: expected
            result["error"] = e

    t = threading.Thread(target=endless)
    t.start()
    wait_until_running(s.url)
    started = time.monotonic()
    s.proc.send_signal(signal.SIGTERM)
    assert s.proc.wait(timeout=30) == 0
    assert time.monotonic() - started < 10
    t.join(timeout=30)
    assert result.get("status") != 200 or result["body"]["choices"][0]["finish_reason"] != "length"
