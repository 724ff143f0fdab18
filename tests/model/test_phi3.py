"""Phi-3 (Phi3ForCausalLM: Phi-3-mini, Phi-3.5-mini, Phi-4-mini, Phi-4) against transformers in
fp32: its fused checkpoint tensors (qkv_proj, gate_up_proj) split on load; LongRoPE with its short
factors where the engine runs no sequence past the pretrained length and its long ones where it
may (the choice transformers makes per forward, made here once, as vLLM and llama.cpp make it),
and the attention factor on cos and sin; rotary on part of each head; a sliding window; GGUF files
written as llama.cpp's converter writes them (attn_qkv, fused ffn_up, the factor tensors), in F32
and kept in Q8_0; --quantization int8 on the split projections; what a bad config gets. (The tiny
Phi-3 also runs in test_hf_oracle.py, test_native_stack.py and the engine's test_tiny_oracle.py.)"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from corellm.model import load_model
from corellm.model.model_config import ModelConfig
from corellm.model.rope import attention_factor
from tests.model.runner import PagedRunner, assert_last_logits_match
from tests.model.test_gguf import add_model_fields, write_tensors_and_close
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")

PROMPT = [(7 * i + 3) % 384 for i in range(48)]


def test_long_factors_where_sequences_may_outgrow_the_pretrained_length(tmp_path, tokenizer_json):
    """Pretrained at 32 positions, extended to 512: run with the long factors (max_model_len
    past 32, the default) it gives transformers' logits on a 48-token prompt, which transformers
    too computes with them; run with max_model_len 32 (the short factors) it gives transformers'
    on a 20-token prompt — and a different result on that prompt than the long factors."""
    hf = make_tiny_model("phi3", tmp_path, tokenizer_json, seed=3, original_max_position_embeddings=32)
    long = load_model(str(tmp_path), dtype="float32", progress=False)
    assert long.config.rope_scaling["original_max_position_embeddings"] == 32
    assert attention_factor(long.config) == pytest.approx(math.sqrt(1 + math.log(512 / 32) / math.log(32)))
    assert_last_logits_match(long.model, hf, PROMPT, atol=1e-4, rtol=1e-4)
    short = load_model(str(tmp_path), dtype="float32", progress=False, max_model_len=32)
    assert_last_logits_match(short.model, hf, PROMPT[:20], atol=1e-4, rtol=1e-4)
    with pytest.raises(AssertionError):
        assert_last_logits_match(long.model, hf, PROMPT[:20], atol=1e-4, rtol=1e-4)


def test_a_sliding_window(tmp_path, tokenizer_json):
    """Phi-3-mini-4k's kind of config: every layer attends to its last sliding_window positions."""
    hf = make_tiny_model("phi3", tmp_path, tokenizer_json, seed=4, sliding_window=12)
    ours = load_model(str(tmp_path), dtype="float32", progress=False)
    assert ours.config.sliding_window == 12
    assert_last_logits_match(ours.model, hf, PROMPT[:40], atol=1e-4, rtol=1e-4)


def test_int8_quantizes_the_split_projections(tmp_path, tokenizer_json):
    hf = make_tiny_model("phi3", tmp_path, tokenizer_json, seed=5)
    ours = load_model(str(tmp_path), dtype="float32", progress=False, quantization="int8")
    layer = ours.model.layers[0]
    ((_, qkv),) = layer.attn.qkv_proj.quantized  # quantized per row, cut into q, k and v, joined again
    ((_, gate_up),) = layer.mlp.gate_up_proj.quantized
    assert qkv.type_name == gate_up.type_name == "Q8_0" and qkv.shape == (128, 64) and gate_up.shape == (320, 64)
    assert_last_logits_match(ours.model, hf, PROMPT[:24], atol=0.05, rtol=0.05)


def write_phi3_gguf(hf_model, path, tensor_type: str = "F32") -> None:
    """hf_model as llama.cpp's converter writes a Phi-3: q/k/v fused in attn_qkv and gate/up in
    ffn_up (neither permuted: Phi-3 rotates NeoX-style), the rotary dimensions, and LongRoPE's two
    factor tensors with the pretrained context and the attention factor it computed."""
    import gguf

    c = hf_model.config
    rope = c.rope_parameters
    w = gguf.GGUFWriter(str(path), "phi3")
    add_model_fields(w, c)
    head_dim = c.hidden_size // c.num_attention_heads
    w.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    scale = c.max_position_embeddings / rope["original_max_position_embeddings"]
    w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(rope["original_max_position_embeddings"]))
                                    if scale > 1 else 1.0)
    w.add_sliding_window(c.sliding_window or 0)
    w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
    w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
    layer_tensors = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
                     "self_attn.qkv_proj": "attn_qkv", "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up",
                     "mlp.down_proj": "ffn_down"}
    write_tensors_and_close(w, hf_model, layer_tensors, tensor_type, permute=False)


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_gguf_file_gives_transformers_logits(tmp_path, tensor_type):
    """Pretrained at 32 positions: corellm runs the file's long factors (its context is 512), as
    transformers does on the 48-token prompt."""
    pytest.importorskip("gguf")
    hf = make_tiny_model("phi3", tmp_path / "hf", seed=6, original_max_position_embeddings=32)
    path = tmp_path / "phi3.gguf"
    write_phi3_gguf(hf, path, tensor_type)
    ours = load_model(str(path), dtype="float32", progress=False)
    c = ours.config
    assert c.architecture == "Phi3ForCausalLM" and c.rotary_dim == 12 and c.partial_rotary_factor == 0.75
    assert c.rope_scaling["long_factor"] == pytest.approx(hf.config.rope_parameters["long_factor"])
    if tensor_type == "Q8_0":  # the fused tensors' parts kept in the file's blocks
        qkv = ours.model.layers[0].attn.qkv_proj.quantized
        assert [(q.type_name, q.shape) for _, q in qkv] == [("Q8_0", (128, 64))]
    tol = dict(atol=1e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, PROMPT, **tol)


def test_the_native_stack_runs_the_split_q8_0_projections_bit_for_bit(tmp_path):
    pytest.importorskip("gguf")
    hf = make_tiny_model("phi3", tmp_path / "hf", seed=7)
    path = tmp_path / "phi3.gguf"
    write_phi3_gguf(hf, path, "Q8_0")
    model = load_model(str(path), dtype="bfloat16", progress=False).model
    per_op = PagedRunner(model, 64, 2).step([PROMPT[:30], PROMPT[5:17]])
    native = PagedRunner(model, 64, 2, native=True).step([PROMPT[:30], PROMPT[5:17]])
    assert torch.equal(per_op, native)


def _config(tmp_path, **overrides) -> dict:
    make_tiny_model("phi3", tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for key, value in overrides.items():
        cfg["rope_parameters"][key] = value
    return cfg


@pytest.mark.parametrize("overrides, message", [
    (dict(short_factor=[1.0, 2.0]), r"longrope rope scaling needs short_factor with 6 values"),
    (dict(long_factor=None), r"longrope rope scaling needs long_factor with 6 values"),
    (dict(partial_rotary_factor=0.3), r"partial_rotary_factor 0.3 of head_dim 16 must give an even number"),
])
def test_a_bad_rope_config_is_refused_by_name(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(_config(tmp_path, **overrides))


def test_the_older_su_name_and_top_level_fields(tmp_path):
    """Phi-3's configs before transformers 5: rope_scaling {"type": "su" or "longrope", ...} with
    original_max_position_embeddings and partial_rotary_factor at the top level."""
    cfg = _config(tmp_path)
    rope = cfg.pop("rope_parameters")
    cfg.update(rope_theta=rope["rope_theta"], original_max_position_embeddings=32, partial_rotary_factor=0.75,
               rope_scaling={"type": "su", "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]})
    c = ModelConfig.from_hf_config(cfg)
    assert c.rope_scaling["rope_type"] == "longrope" and c.rope_scaling["original_max_position_embeddings"] == 32
    assert c.rotary_dim == 12


def test_a_lora_adapter_of_the_fused_modules_runs_alike_in_the_native_stack(tmp_path, tokenizer_json):
    """A Phi-3 PEFT adapter updates qkv_proj and gate_up_proj whole (test_lora.py checks it against
    transformers with the updates merged); in bf16 the native decoder stack applies it bit for bit
    as the per-op layers do."""
    from corellm.lora.lora_adapter import load_lora_adapter
    from tests.lora_adapters import PHI3_MODULES, make_lora_adapter

    make_tiny_model("phi3", tmp_path / "model", tokenizer_json, seed=8)
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    make_lora_adapter(tmp_path / "adapter", config, rank=4, modules=PHI3_MODULES)
    model = load_model(str(tmp_path / "model"), dtype="bfloat16", progress=False).model
    adapter = load_lora_adapter("a", str(tmp_path / "adapter"), model.config, max_lora_rank=8, dtype=torch.bfloat16)
    prompts = [PROMPT[:21], PROMPT[3:12]]
    got = [PagedRunner(model, 64, 2, lora_adapters=[adapter], native=native).step(prompts, lora=[0, -1])
           for native in (False, True)]
    assert torch.equal(got[0], got[1])
    base = PagedRunner(model, 64, 2).step(prompts)
    assert torch.equal(got[0][1], base[1]) and not torch.equal(got[0][0], base[0])


def test_the_engine_picks_the_factors_by_its_max_model_len(tmp_path, tokenizer_json):
    """LLM(max_model_len=...) reaches the model's rope table: up to the pretrained length the short
    factors, past it (or unset: the model's 512 positions) the long ones."""
    from corellm import LLM
    from corellm.model.rope import cos_sin_cache, inverse_frequencies

    make_tiny_model("phi3", tmp_path, tokenizer_json, original_max_position_embeddings=32)
    for max_model_len, long in ((32, False), (64, True), (None, True)):
        llm = LLM(str(tmp_path), dtype="float32", max_model_len=max_model_len, kv_cache_memory=4 * 2**20)
        try:
            c = llm.loaded.config
            want = cos_sin_cache(c, 512, inverse_frequencies(c, max_model_len=512 if long else 32), attention_factor(c))
            assert torch.equal(llm.loaded.model.cos_sin_cache, want)
        finally:
            llm.shutdown()
