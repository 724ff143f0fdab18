"""A script that builds its LLM at top level, without `if __name__ == "__main__":`: every
spawned process (tensor-parallel worker, data-parallel replica) imports the script again. The
engine must say so within seconds, in the worker and in the parent, instead of building a second
engine in each worker and timing out in the group's rendezvous."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
import time

import pytest

from corellm import LLM
from corellm.distributed.spawned_processes import MAIN_GUARD_HINT

pytest.importorskip("transformers")

from tests.model.tiny_models import make_tiny_model  # noqa: E402


def test_an_llm_built_while_a_spawned_process_imports_the_main_script_is_refused(monkeypatch):
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(RuntimeError, match='LLM was created while a spawned corellm process was importing the main '
                                           'script: a script that creates an LLM must do it under `if __name__ == '
                                           '"__main__":`'):
        LLM(model="/no/such/model")  # refused before anything is read


@pytest.mark.parametrize("parallel", ["tensor_parallel_size=3", "data_parallel_size=2"])
def test_an_unguarded_script_fails_fast_naming_the_fix(tmp_path, tokenizer_json, parallel):
    make_tiny_model("llama3", tmp_path / "model", tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        from corellm import LLM, SamplingParams
        llm = LLM({str(tmp_path / "model")!r}, {parallel}, dtype="float32", max_model_len=64,
                  kv_cache_memory=16 * 1024**2)
        print(llm.generate("hi", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].text)
    """))
    started = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TQDM_DISABLE": "1"})
    elapsed = time.monotonic() - started
    assert done.returncode != 0
    what = "tensor-parallel worker corellm-tp1" if parallel.startswith("tensor") else "data-parallel replica 1"
    assert f"RuntimeError: {what}" in done.stderr and MAIN_GUARD_HINT in done.stderr, done.stderr[-3000:]
    # The worker's own error says it too, and came before any model was loaded there.
    assert "LLM was created while a spawned corellm process was importing the main script" in done.stderr
    assert elapsed < 45, f"took {elapsed:.1f} s (the group's rendezvous times out at 60 s)"
