"""`corellm serve` refuses an address it cannot listen on with a clear error (exit status 2), before
it loads the model rather than after; takes the model as an argument or as --model; it builds the grammar compiler's llguidance tokenizer only
once no request is in flight (llguidance holds the GIL while it builds)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from types import SimpleNamespace

from corellm.server.main import warm_grammar_when_idle


def serve(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "corellm.cli", "serve", *args], capture_output=True, text=True,
                          timeout=120)


def test_a_taken_port_is_a_clear_start_error_before_the_model_loads() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = serve("--port", str(port))
    assert proc.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr, proc.stderr
    assert "weights:" not in proc.stderr and "Traceback" not in proc.stderr  # refused before the model loads


def test_an_address_of_another_machine_is_a_clear_start_error() -> None:
    proc = serve("--host", "192.0.2.1", "--port", "8000")  # TEST-NET-1: never this machine's
    assert proc.returncode == 2
    assert "cannot listen on 192.0.2.1:8000" in proc.stderr, proc.stderr


def test_the_model_may_come_as_a_flag_but_not_twice(tmp_path) -> None:
    """`--model PATH` as vLLM's serve takes it (here a missing file, so that the loader names it);
    a positional model and a different --model is a start error naming both."""
    missing = tmp_path / "missing.gguf"
    proc = serve("--model", str(missing))
    assert proc.returncode == 2 and f"model '{missing}': no such file or directory" in proc.stderr, proc.stderr
    proc = serve("a.gguf", "--model", "b.gguf")
    assert proc.returncode == 2 and "two models given: 'a.gguf' and --model 'b.gguf'" in proc.stderr, proc.stderr


def test_the_grammar_tokenizer_is_built_at_the_first_check_without_requests_in_flight() -> None:
    warmed: list[float] = []
    serving = SimpleNamespace(active=2)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        engine = SimpleNamespace(parts=SimpleNamespace(grammar_compiler=SimpleNamespace(
            warm=lambda: warmed.append(loop.time()))))
        task = asyncio.create_task(warm_grammar_when_idle(engine, serving, idle_s=0.01))
        await asyncio.sleep(0.1)
        assert not warmed  # requests in flight all along
        serving.active, idle_from = 0, loop.time()
        await asyncio.wait_for(task, 1.0)
        assert len(warmed) == 1 and warmed[0] >= idle_from

    asyncio.run(scenario())
