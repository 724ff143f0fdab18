"""kv_cache_dtype (vLLM's --kv-cache-dtype): "fp8" / "fp8_e4m3" and "fp8_e5m2" keep the KV cache in
8-bit floats, so the same kv_cache_memory holds twice the blocks and the start-up log names the
element type; "auto" and "bfloat16" keep bf16's; what cannot be honoured is refused by name — an
unknown name, an 8-bit cache on CUDA or for a float32 model, bfloat16 for a float32 model. (The
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
