"""kv_cache_dtype (vLLM's --kv-cache-dtype): "fp8" / "fp8_e4m3" and "fp8_e5m2" keep the KV cache in
8-bit floats, so the same kv_cache_memory holds twice the blocks and the start-up log names the
element type; "auto" and "bfloat16" keep bf16's; what cannot be honoured is refused by name — an
unknown name, an 8-bit cache on CUDA or for a float32 model, bfloat16 for a float32 model; greedy
tokens with an fp8 cache are unchanged by preemption and by speculative decoding. (The
tokens an 8-bit cache gives: tests/engine/test_smollm2_oracle.py and test_cpu_paths.py; its
kernels: tests/ops/test_attention_fp8_kv.py; over tensor-parallel ranks:
tests/distributed/test_tensor_parallel_engine.py.)"""

from __future__ import annotations

import logging

import pytest
import torch

from corellm import LLM, SamplingParams
from corellm.config import EngineConfig
from corellm.model import load_model
from tests.core.test_config import engine_config_of

ENGINE = dict(max_model_len=256, kv_cache_memory=32 * 1024**2, max_num_seqs=8)


@pytest.fixture(scope="module")
def model():
    return load_model(progress=False)


def test_an_fp8_cache_holds_twice_the_blocks(model, caplog):
    with caplog.at_level(logging.INFO, logger="corellm"):
        fp8 = LLM(loaded_model=model, kv_cache_dtype="fp8", **ENGINE)
    bf16 = LLM(loaded_model=model, **ENGINE)
    assert fp8.engine_core.scheduler_config.num_blocks == 2 * bf16.engine_core.scheduler_config.num_blocks
    assert {k.dtype for pair in fp8.engine_core.model_runner.kv_caches for k in pair} == {torch.float8_e4m3fn}
    assert "torch.float8_e4m3fn" in "".join(r.getMessage() for r in caplog.records if "KV cache:" in r.getMessage())
    e5m2 = LLM(loaded_model=model, kv_cache_dtype="fp8_e5m2", **ENGINE)
    assert e5m2.engine_core.model_runner.kv_caches[0][1].dtype == torch.float8_e5m2
    same = LLM(loaded_model=model, kv_cache_dtype="bfloat16", **ENGINE)
    assert same.engine_core.model_runner.kv_caches[0][0].dtype == torch.bfloat16
    params = SamplingParams(temperature=0, max_tokens=8)
    assert same.generate("Paris is", params, use_tqdm=False)[0].outputs[0].token_ids == \
        bf16.generate("Paris is", params, use_tqdm=False)[0].outputs[0].token_ids


def test_what_cannot_be_honoured_is_refused_by_name():
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, bfloat16, fp8, fp8_e4m3, fp8_e5m2, "
                                         "got 'int8'"):
        EngineConfig(kv_cache_dtype="int8")
    with pytest.raises(ValueError, match="8-bit KV caches are implemented in the CPU kernels only, not on device 'cuda'"):
        EngineConfig(kv_cache_dtype="fp8", device="cuda")
    with pytest.raises(ValueError, match="kv_cache_dtype fp8 needs a bfloat16 model .* runs in torch.float32"):
        LLM(dtype="float32", quantization="none", kv_cache_dtype="fp8", **ENGINE)
    with pytest.raises(ValueError, match="kv_cache_dtype bfloat16 needs a bfloat16 model"):
        LLM(dtype="float32", quantization="none", kv_cache_dtype="bfloat16", **ENGINE)


def test_the_command_line_flag():
    assert engine_config_of("--kv-cache-dtype", "fp8_e5m2").kv_cache_dtype == "fp8_e5m2"
    assert engine_config_of().kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        engine_config_of("--kv-cache-dtype", "int4")


def test_greedy_outputs_with_an_fp8_cache_survive_preemption_and_speculation(model):
    """With an fp8 cache as with bf16's: greedy tokens are the same when a tiny cache preempts and
    recomputes requests, and with n-gram or draft-model speculation (the draft's cache fp8 too)."""
    from corellm.model.loader import default_model_path

    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    want = [o.outputs[0].token_ids
            for o in LLM(loaded_model=model, kv_cache_dtype="fp8", **ENGINE).generate(prompts, params, use_tqdm=False)]
    # 6 blocks of 16 tokens (184 KiB each in fp8) for 9 requests of ~30 tokens: preemption
    tiny = LLM(loaded_model=model, kv_cache_dtype="fp8", max_model_len=64, kv_cache_memory=int(1.2 * 2**20))
    assert [o.outputs[0].token_ids for o in tiny.generate(prompts * 3, params, use_tqdm=False)] == want * 3
    assert tiny.get_metrics()["corellm:num_preemptions"] > 0
    for spec in ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3},
                 {"method": "draft_model", "model": str(default_model_path()), "num_speculative_tokens": 3}):
        llm = LLM(loaded_model=model, kv_cache_dtype="fp8", speculative_config=spec, **ENGINE)
        assert [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)] == want, spec["method"]
    assert llm.engine_core.drafter.kv_caches[0][0].dtype == torch.float8_e4m3fn
