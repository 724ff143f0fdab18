"""`corellm serve` launched by torchrun (python -m torch.distributed.run --nproc-per-node 3): rank 0
serves, ranks 1 and 2 run their shares of the model; the answers equal those of the engine that
spawns its own workers; SIGTERM to torchrun stops every rank. A script making an LLM under
torchrun: every rank gets rank 0's outputs. And the refusals."""

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


def tiny_model_and_its_answers(directory, tokenizer_json) -> list[str]:
    """Writes the tiny model (9 heads, 3 KV heads) to `directory`; PROMPTS' greedy texts from the
    engine that spawns its own three ranks."""
    make_tiny_model("llama3", directory, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    llm = LLM(str(directory), tensor_parallel_size=3, dtype="float32", max_model_len=128,
              kv_cache_memory=16 * 1024**2)
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                            SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
        return [o.outputs[0].text for o in outs]
    finally:
        llm.shutdown()


def test_serve_under_torchrun_equals_the_spawning_engine(tmp_path, tokenizer_json):
    from corellm.worker.tp_workers import free_local_port

    want = tiny_model_and_its_answers(tmp_path, tokenizer_json)
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


LLM_SCRIPT = """
import json, os, sys
from corellm import LLM, SamplingParams

prompts = [{"prompt_token_ids": p} for p in json.loads(sys.argv[2])]
llm = LLM(sys.argv[1], tensor_parallel_size=3, dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2)
params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
out = {"first": [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]}
try:
    llm.generate([{"prompt_token_ids": [10**6]}], params, use_tqdm=False)
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
out["again"] = [o.outputs[0].text for o in llm.generate(prompts, params, use_tqdm=False)]
out["tokenizer"] = llm.get_tokenizer() is not None
llm.shutdown()
with open(os.path.join(sys.argv[3], f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump(out, f)
"""


def test_llm_in_a_script_under_torchrun_answers_on_every_rank(tmp_path, tokenizer_json):
    """torchrun --nproc-per-node 3 script.py, the script making an LLM(tensor_parallel_size=3): rank 0
    holds the engine, the others run their shares of its steps while every rank calls generate;
    each rank gets rank 0's outputs (equal to the engine that spawns its own workers), and rank
    0's error for a bad prompt, after which the next call works."""
    from corellm.worker.tp_workers import free_local_port

    model = tmp_path / "model"
    want = tiny_model_and_its_answers(model, tokenizer_json)
    script = tmp_path / "script.py"
    script.write_text(LLM_SCRIPT)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port",
                          str(free_local_port()), str(script), str(model), json.dumps(PROMPTS), str(tmp_path)],
                         cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1"}, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in range(3):
        out = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert out["first"] == want and out["again"] == want and out["tokenizer"], rank
        assert "1000000" in out["error"] and out["error"].startswith("ValueError" if rank == 0 else "RuntimeError: rank 0: ValueError")


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
    with pytest.raises(ValueError, match=r"tensor_parallel_size \(1\) must equal its world size \(2"):
        LLM()
    with pytest.raises(ValueError, match="data_parallel_size, loaded_model, nnodes and node_rank do not apply"):
        LLM(tensor_parallel_size=2, data_parallel_size=2)
