"""LoRA adapters with tensor parallelism: each rank holds its share of an adapter, cut as the
projections it updates (tensor_parallel.shard_lora_adapter). The shares' updates, put together
(a column-parallel projection's columns side by side, a row-parallel one's partial updates
summed), equal the whole adapter's; and through the engine, three ranks give the greedy tokens
and logprobs of one process for requests with different adapters and none in one batch (fp32),
and follow it in bf16 (the native decoder stacks)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from corellm import LLM, LoRARequest, SamplingParams  # noqa: E402
from corellm.lora import load_lora_adapter  # noqa: E402
from corellm.model.model_config import ModelConfig  # noqa: E402
from corellm.model.tensor_parallel import shard_lora_adapter  # noqa: E402
from tests.distributed.test_tensor_parallel_engine import assert_follows, assert_same_greedy  # noqa: E402
from tests.lora_adapters import ATTENTION, MLP, PHI3_MODULES, make_lora_adapter  # noqa: E402
from tests.model.tiny_models import make_tiny_model  # noqa: E402

# 9 heads and 3 KV heads, as SmolLM2's; Phi-3's heads of 16 dimensions (its LongRoPE factors' count)
NINE_HEADS = {"llama3": dict(hidden_size=72, num_attention_heads=9, num_key_value_heads=3, intermediate_size=144),
              "phi3": dict(hidden_size=144, num_attention_heads=9, num_key_value_heads=3, intermediate_size=192)}


def _update(adapter, layer: int, projection: str, x: torch.Tensor, width: int) -> torch.Tensor:
    """The adapter's update of a layer's projection on rows x: [rows, width] (zero where no part writes)."""
    y = torch.zeros(x.shape[0], width, dtype=torch.float64)
    for p in adapter.layers[layer].get(projection, []):
        y[:, p.col_offset:p.col_offset + p.b_t.shape[1]] += p.scale * (x @ p.a_t.double() @ p.b_t.double())
    return y


@pytest.mark.parametrize("arch, modules, size", [("llama3", ATTENTION + MLP, 3), ("llama3", ("q_proj", "v_proj"), 3),
                                                 ("phi3", PHI3_MODULES, 3), ("llama3", ATTENTION + MLP, 9)])
def test_the_shares_updates_put_together_equal_the_whole_adapters(tmp_path, tokenizer_json, arch, modules, size):
    """size 9: nine ranks for three KV heads, each KV head replicated on three ranks."""
    make_tiny_model(arch, tmp_path / "model", tokenizer_json, **NINE_HEADS[arch])
    hf = json.loads((tmp_path / "model" / "config.json").read_text())
    make_lora_adapter(tmp_path / "lora", hf, rank=4, modules=modules)
    config = ModelConfig.from_hf_config(hf)
    whole = load_lora_adapter("a", str(tmp_path / "lora"), config, max_lora_rank=8)
    shares = [shard_lora_adapter(whole, config, r, size) for r in range(size)]
    q, kv, hd, inter = config.q_size, config.kv_size, config.head_dim, config.intermediate_size
    kv_local = max(1, config.num_key_value_heads // size)
    g = torch.Generator().manual_seed(0)
    for layer in range(config.num_hidden_layers):
        x = torch.randn(5, config.hidden_size, generator=g, dtype=torch.float64)
        want = _update(whole, layer, "qkv", x, q + 2 * kv)
        for r, share in enumerate(shares):  # each rank's columns: its q heads, then its KV heads' k and v
            kv_first = r * kv_local if config.num_key_value_heads >= size else r // (size // config.num_key_value_heads)
            qs, ks = slice(r * q // size, (r + 1) * q // size), slice(kv_first * hd, (kv_first + kv_local) * hd)
            local = torch.cat([want[:, qs], want[:, q:][:, ks], want[:, q + kv:][:, ks]], dim=1)
            torch.testing.assert_close(_update(share, layer, "qkv", x, local.shape[1]), local)
        want = _update(whole, layer, "gate_up", x, 2 * inter)
        for r, share in enumerate(shares):
            cols = slice(r * inter // size, (r + 1) * inter // size)
            local = torch.cat([want[:, :inter][:, cols], want[:, inter:][:, cols]], dim=1)
            torch.testing.assert_close(_update(share, layer, "gate_up", x, local.shape[1]), local)
        for projection, width_in in (("o", q), ("down", inter)):  # row-parallel: the ranks' partial updates sum
            x_in = torch.randn(5, width_in, generator=g, dtype=torch.float64)
            want = _update(whole, layer, projection, x_in, config.hidden_size)
            step = width_in // size
            got = sum(_update(s, layer, projection, x_in[:, r * step:(r + 1) * step], config.hidden_size)
                      for r, s in enumerate(shares))
            torch.testing.assert_close(got, want)


def _generate(llm: LLM, prompts, loras):
    try:
        return llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2),
                            use_tqdm=False, lora_request=loras)
    finally:
        llm.shutdown()


@pytest.mark.parametrize("arch", ["llama3", "phi3"])
def test_three_ranks_with_adapters_equal_one_process(tmp_path, tokenizer_json, arch):
    """Two adapters (every module, rank 8; q and v only, rank 4 — Phi-3's fused modules for phi3)
    and the base model in one batch, max_loras 1 so that the second adapter waits for the first's
    slot and is then placed there on every rank; chunked prefill (32 tokens a step)."""
    make_tiny_model(arch, tmp_path / "model", tokenizer_json, seed=5, **NINE_HEADS[arch])
    hf = json.loads((tmp_path / "model" / "config.json").read_text())
    both = PHI3_MODULES if arch == "phi3" else ATTENTION + MLP
    make_lora_adapter(tmp_path / "a", hf, rank=8, modules=both, seed=1, std=0.2)
    make_lora_adapter(tmp_path / "b", hf, rank=4, modules=("qkv_proj",) if arch == "phi3" else ("q_proj", "v_proj"),
                      seed=2, std=0.2)
    loras = {"a": LoRARequest("a", 1, str(tmp_path / "a")), "b": LoRARequest("b", 2, str(tmp_path / "b"))}
    g = torch.Generator().manual_seed(0)
    prompts = [{"prompt_token_ids": torch.randint(0, 384, (n,), generator=g).tolist()} for n in (5, 23, 40, 2, 17)]
    names = ["a", None, "b", "a", "b"]
    per_prompt = [None if n is None else loras[n] for n in names]
    common = dict(max_model_len=128, kv_cache_memory=16 * 1024**2, max_num_batched_tokens=32, enable_lora=True,
                  max_loras=1)
    one = _generate(LLM(str(tmp_path / "model"), dtype="float32", **common), prompts, per_prompt)
    three = _generate(LLM(str(tmp_path / "model"), dtype="float32", tensor_parallel_size=3, **common), prompts,
                      per_prompt)
    assert_same_greedy(one, three)
    base = _generate(LLM(str(tmp_path / "model"), dtype="float32", **common), prompts, None)
    for name, with_lora, without in zip(names, one, base):  # the adapters change what the model says
        if name is not None:
            assert with_lora.outputs[0].token_ids != without.outputs[0].token_ids
    one = _generate(LLM(str(tmp_path / "model"), dtype="bfloat16", **common), prompts, per_prompt)
    split = LLM(str(tmp_path / "model"), dtype="bfloat16", tensor_parallel_size=3, **common)
    assert split.engine_core.model_runner.native_stack is not None
    assert assert_follows(one, _generate(split, prompts, per_prompt)) >= 30
