"""`corellm serve` launched by torchrun (python -m torch.distributed.run --nproc-per-node 3): rank 0
serves, ranks 1 and 2 run their shares of the model; the answers equal those of the engine that
spawns its own workers; SIGTERM to torchrun stops every rank. And the refusals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

pytest.importorskip("transformers")

from corellm import LLM, SamplingParams  # noqa: E402
from tests.model.tiny_models import make_tiny_model  # noqa: E402

PROMPTS = [[5, 17, 40, 41, 3, 99, 250], [7, 8, 9]]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def completion(port: int, prompt: list[int]) -> str:
    body = json.dumps({"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())["choices"][0]["text"]


def wait_healthy(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"torchrun exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"no /health 200 within {seconds} s")


def test_serve_under_torchrun_equals_the_spawning_engine(tmp_path, tokenizer_json):
    from corellm.worker.tp_workers import free_local_port

    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    engine = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2)
    llm = LLM(str(tmp_path), tensor_parallel_size=3, **engine)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        want = [o.outputs[0].text for o in outs]
    finally:
        llm.shutdown()
    port = free_local_port()
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port",
         str(free_local_port()), "-m", "corellm.cli", "serve", str(tmp_path), "--tensor-parallel-size", "3",
         "--port", str(port), "--dtype", "float32", "--max-model-len", "128", "--kv-cache-memory",
         str(16 * 1024**2)], cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"})
    try:
        wait_healthy(port, torchrun, 180)
        assert [completion(port, p) for p in PROMPTS] == want
        torchrun.send_signal(signal.SIGTERM)
        assert torchrun.wait(timeout=60) is not None
    finally:
        if torchrun.poll() is None:
            torchrun.kill()
            torchrun.wait()


def test_what_torchrun_refuses(monkeypatch, capsys):
    from corellm.cli import main

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "test")
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "2"), ("LOCAL_WORLD_SIZE", "2")):
        monkeypatch.setenv(key, value)
    assert main(["serve", "--tensor-parallel-size", "3"]) == 2
    assert "--tensor-parallel-size (3) must equal its world size (2" in capsys.readouterr().err
    assert main(["serve", "--tensor-parallel-size", "2", "--data-parallel-size", "2"]) == 2
    assert "--data-parallel-size and --headless do not apply" in capsys.readouterr().err
    assert main(["serve", "--tensor-parallel-size", "2", "--nnodes", "2", "--node-rank", "1"]) == 2
    assert "leave them out under torchrun" in capsys.readouterr().err
    assert main(["generate", "Hi", "--tensor-parallel-size", "2"]) == 2
    assert "corellm generate does not run under torchrun" in capsys.readouterr().err
