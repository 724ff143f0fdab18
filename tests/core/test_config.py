"""Invalid configurations are refused with a ValueError that names the field and the value."""

from __future__ import annotations

import pytest

from corellm import _core
from corellm.config import SchedulerConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"block_size": 0}, "block_size must be > 0, got 0"),
        ({"max_num_seqs": 0}, "max_num_seqs must be > 0, got 0"),
        ({"max_num_batched_tokens": -5}, "max_num_batched_tokens must be > 0, got -5"),
        ({"num_blocks": -1}, "num_blocks must be > 0"),
        ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold must be >= 0"),
        ({"block_size": 1.5}, "block_size must be an integer, got 1.5"),
        ({"max_num_seqs": "8"}, "max_num_seqs must be an integer, got '8'"),
        ({"max_model_len": True}, "max_model_len must be an integer"),
        ({"max_model_len": 2**40}, "max_model_len must be a 32-bit integer"),
        ({"enable_prefix_caching": 1}, "enable_prefix_caching must be True or False"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy must be one of"),
        ({"num_blocks": 4, "block_size": 16, "max_model_len": 100},
         "max_model_len (100) exceeds the KV cache capacity of 64 tokens"),
        ({"enable_chunked_prefill": False, "max_num_batched_tokens": 64, "max_model_len": 128},
         "without chunked prefill"),
    ],
)
def test_invalid_config_raises_value_error(kwargs: dict, message: str) -> None:
    base = {"num_blocks": 1024, "max_model_len": 512}
    with pytest.raises(ValueError) as err:
        SchedulerConfig(**{**base, **kwargs})
    assert message in str(err.value)


def test_native_config_validates_too() -> None:
    with pytest.raises(ValueError, match="block_size must be > 0, got 0"):
        _core.SchedulerConfig(num_blocks=8, block_size=0)
    with pytest.raises(ValueError, match=r"max_model_len \(2048\) exceeds the KV cache capacity"):
        _core.SchedulerConfig(num_blocks=8, block_size=16)
    with pytest.raises(TypeError):
        _core.SchedulerConfig(num_blocks=8.5)


def test_valid_config_round_trips_to_native() -> None:
    cfg = SchedulerConfig(num_blocks=100, block_size=8, max_model_len=512, scheduling_policy="priority",
                          long_prefill_token_threshold=64)
    native = cfg.to_native()
    assert native.num_blocks == 100 and native.block_size == 8 and native.max_model_len == 512
    assert native.scheduling_policy == _core.SchedulingPolicy.PRIORITY
    assert native.long_prefill_token_threshold == 64


def engine_config_of(*flags: str):
    """The EngineConfig `corellm serve` / `corellm generate` make of these flags."""
    import argparse

    from corellm.engine_args import add_engine_args, engine_config_from_args

    p = argparse.ArgumentParser()
    p.add_argument("--model", default=None)
    add_engine_args(p)
    return engine_config_from_args(p.parse_args(list(flags)))


def test_prefix_caching_and_the_long_prefill_cap_from_the_command_line() -> None:
    """vLLM's flags: prefix caching on unless --no-enable-prefix-caching; --long-prefill-token-threshold
    caps one request's prompt tokens per step (engine_core.py hands both to the scheduler)."""
    default = engine_config_of()
    assert default.enable_prefix_caching and default.long_prefill_token_threshold == 0
    off = engine_config_of("--no-enable-prefix-caching", "--long-prefill-token-threshold", "64")
    assert not off.enable_prefix_caching and off.long_prefill_token_threshold == 64
    assert engine_config_of("--enable-prefix-caching").enable_prefix_caching
    with pytest.raises(ValueError, match="long_prefill_token_threshold must be >= 0"):
        engine_config_of("--long-prefill-token-threshold", "-1")


def test_every_engine_setting_is_an_llm_parameter() -> None:
    """`corellm generate` builds its LLM from every EngineConfig field (none dropped on the way), so
    each must be a parameter of LLM under the same name."""
    import dataclasses
    import inspect

    from corellm import LLM
    from corellm.config import EngineConfig

    settings = {f.name for f in dataclasses.fields(EngineConfig)} - {"model", "torchrun"}
    assert settings <= set(inspect.signature(LLM).parameters), settings - set(inspect.signature(LLM).parameters)
