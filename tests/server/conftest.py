"""A corellm server started on a free loopback port for the tests, and its OpenAI client."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from pathlib import Path

import pytest

# A ChatML template that shows tools to the model (for a server with --tool-call-parser hermes).
TOOLS_TEMPLATE = Path(__file__).parent / "templates" / "chatml_tools.jinja"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None):
        """args: corellm serve's; env: variables set for the server's process."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "corellm.cli", "serve", "--port", str(self.port), "--max-model-len", "512",
               "--kv-cache-memory", str(256 * 1024**2), *args]
        # The log goes to a file: a pipe nobody reads would fill and block the server's logging.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="corellm-server-", suffix=".log")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "TQDM_DISABLE": "1", **(env or {})})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.output()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("server did not become healthy")

    def output(self) -> str:
        """What the server has logged so far."""
        with open(self.log.name) as f:
            return f.read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def server():
    s = Server()
    yield s
    s.stop()


@pytest.fixture(scope="session")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def model_name(client):
    return client.models.list().data[0].id


def _client_of(server: Server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tools_client():
    """A server that calls tools: SmolLM2 with TOOLS_TEMPLATE, auto tool choice, Hermes' format."""
    server = Server("--chat-template", str(TOOLS_TEMPLATE), "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    try:
        yield _client_of(server)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def reasoning_client():
    """A server that reads reasoning (SmolLM2 standing in, --reasoning-parser deepseek_r1: its
    output is reasoning until it writes </think>)."""
    server = Server("--reasoning-parser", "deepseek_r1")
    try:
        yield _client_of(server)
    finally:
        server.stop()
