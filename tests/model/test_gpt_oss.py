"""gpt-oss (GptOssForCausalLM) against transformers in fp32, beyond the tiny model's runs in
test_hf_oracle.py, test_native_stack.py and the engine's test_tiny_oracle.py: its attention sinks and
clamped SwiGLU each change the result (so the comparisons test them), a checkpoint whose experts are
in MXFP4 as the official ones are (dequantized at load, exactly), the config's defaults as
transformers reads them, and what corellm refuses, by name."""

from __future__ import annotations

import json

import pytest
import torch

from corellm.model import load_model
from corellm.model.model_config import ModelConfig
from corellm.model.mxfp4 import dequantize_mxfp4, gguf_rows
from corellm.model.tensor_parallel import check_divisible, shard_weights
from tests.model.runner import assert_last_logits_match, greedy_decode
from tests.model.tiny_models import TINY, make_tiny_model

transformers = pytest.importorskip("transformers")

PROMPT = [(13 * i + 7) % 384 for i in range(50)]  # past the sliding layers' 16-token window


def test_logits_match_and_the_sinks_and_the_clamp_matter(tmp_path, tokenizer_json):
    hf = make_tiny_model("gpt_oss", tmp_path, tokenizer_json, seed=4)
    ours = load_model(str(tmp_path), dtype="float32", progress=False)
    c = ours.config
    assert (c.attention_sinks, c.attention_output_bias, c.expert_bias, c.moe_router_bias) == (True,) * 4
    assert c.layer_types == ("sliding_attention", "full_attention", "sliding_attention") and c.sliding_window == 16
    assert c.rope_type == "yarn" and c.swiglu_limit == 0.25 and c.swiglu_alpha == pytest.approx(1.702)
    assert_last_logits_match(ours.model, hf, PROMPT, atol=1e-4, rtol=1e-4)
    for layer in ours.model.layers:  # without the sinks the logits move
        layer.attn.sinks.fill_(-1e4)
    with pytest.raises(AssertionError):
        assert_last_logits_match(ours.model, hf, PROMPT, atol=1e-3, rtol=1e-3)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["swiglu_limit"] = 100.0  # a clamp nothing reaches: the logits move too
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    unclamped = load_model(str(tmp_path), dtype="float32", progress=False)
    with pytest.raises(AssertionError):
        assert_last_logits_match(unclamped.model, hf, PROMPT, atol=1e-3, rtol=1e-3)


def test_experts_in_mxfp4_load_exactly(tmp_path, tokenizer_json):
    """The official checkpoints' form: each layer's gate_up_proj and down_proj as _blocks and
    _scales (config quantization_config quant_method mxfp4). Random codes and scales, the HF model
    given the weights transformers' own converter makes of them. Dequantized at load (quantization
    "none"): the same logits. Kept in MXFP4 (the default on the CPU): every expert's weight
    dequantizes to transformers' exactly, the logits within the int8 activations' error, and in
    bf16 the native stack is bit-identical to the per-op layers."""
    from safetensors.torch import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    hf = make_tiny_model("gpt_oss", tmp_path, tokenizer_json, seed=5)
    g = torch.Generator().manual_seed(6)
    state = load_file(str(tmp_path / "model.safetensors"))
    c = hf.config
    for i, layer in enumerate(hf.model.layers):
        for proj, (rows, k) in {"gate_up_proj": (2 * c.intermediate_size, c.hidden_size),
                                "down_proj": (c.hidden_size, c.intermediate_size)}.items():
            blocks = torch.randint(0, 256, (c.num_local_experts, rows, k // 32, 16), generator=g, dtype=torch.uint8)
            scales = torch.randint(119, 124, (c.num_local_experts, rows, k // 32), generator=g, dtype=torch.uint8)
            with torch.no_grad():
                getattr(layer.mlp.experts, proj).copy_(convert_moe_packed_tensors(blocks, scales, dtype=torch.float32))
            name = f"model.layers.{i}.mlp.experts.{proj}"
            del state[name]
            state[name + "_blocks"], state[name + "_scales"] = blocks, scales
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = load_model(str(tmp_path), dtype="float32", progress=False, quantization="none")
    assert ours.quantization == "none"
    assert_last_logits_match(ours.model, hf, PROMPT, atol=1e-4, rtol=1e-4)
    kept = load_model(str(tmp_path), dtype="float32", progress=False)
    assert kept.quantization == "mxfp4"
    for i, layer in enumerate(kept.model.layers):
        experts = hf.model.layers[i].mlp.experts
        for e, expert in enumerate(layer.mlp.experts):
            ((_, gate_up),), ((_, down),) = expert.gate_up_proj.quantized, expert.down_proj.quantized
            assert gate_up.type_name == down.type_name == "MXFP4"
            want = experts.gate_up_proj[e].detach().t()  # [2 inter, hidden], gate and up rows interleaved
            assert torch.equal(gate_up.dequantize(torch.float32), torch.cat([want[0::2], want[1::2]]))
            assert torch.equal(down.dequantize(torch.float32), experts.down_proj[e].detach().t())
    assert_last_logits_match(kept.model, hf, PROMPT, atol=0.05, rtol=0.05)
    bf16 = load_model(str(tmp_path), dtype="bfloat16", progress=False).model
    prompts = [PROMPT[:n] for n in (9, 30, 50)]
    assert torch.equal(greedy_decode(bf16, prompts, 6, native=True), greedy_decode(bf16, prompts, 6, native=False))
    # a half without the other is named
    del state["model.layers.1.mlp.experts.down_proj_scales"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"model.layers.1.mlp.experts.down_proj_blocks without its _scales"):
        load_model(str(tmp_path), dtype="float32", progress=False)


def test_mxfp4_values():
    """Codes 0-15 are 0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, the low nibble first, times
    2^(scale - 127)."""
    blocks = torch.tensor([[[0x10 | 0x0, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE] + [0] * 8]], dtype=torch.uint8)
    got = dequantize_mxfp4(blocks, torch.tensor([[128]], dtype=torch.uint8))
    want = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6] + [0] * 16) * 2
    assert torch.equal(got[0], want)
    with pytest.raises(ValueError, match="need scales of shape"):
        dequantize_mxfp4(blocks, torch.zeros(2, 1, dtype=torch.uint8))


def gpt_oss_config(**overrides) -> dict:
    cfg = dict(TINY, architectures=["GptOssForCausalLM"], model_type="gpt_oss", num_local_experts=4,
               num_experts_per_tok=2, head_dim=16, sliding_window=16, rope_theta=150000.0,
               rope_scaling={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 4096})
    cfg.update(overrides)
    return cfg


def test_the_config_defaults_as_transformers_reads_them():
    """The official config.json's form (rope_scaling, no layer_types, no swiglu fields): sliding
    layers first then alternating, alpha 1.702, limit 7, YaRN x32 over 4096 positions (131072)."""
    c = ModelConfig.from_hf_config(gpt_oss_config(num_hidden_layers=4), "gpt-oss")
    assert c.layer_types == ("sliding_attention", "full_attention") * 2
    assert (c.swiglu_alpha, c.swiglu_limit, c.hidden_activation) == (1.702, 7.0, "swigluoai")
    assert c.max_position_embeddings == 131072 and c.rope_scaling["truncate"] is False
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (4, 2, TINY["intermediate_size"])


@pytest.mark.parametrize(("overrides", "message"), [
    ({"swiglu_limit": 0.0}, r"swiglu_alpha \(1.702\) and swiglu_limit \(0.0\) must be positive and finite"),
    ({"attention_bias": False}, r"gpt-oss without attention_bias is not supported"),
    ({"quantization_config": {"quant_method": "awq"}}, r"a checkpoint quantized by 'awq'"),
])
def test_a_bad_config_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf_config(gpt_oss_config(**overrides), "gpt-oss")


def test_tensor_parallel_shards_of_the_sinks_and_biases():
    """(The group's logits against the single process: tests/distributed/test_tensor_parallel_model.py.)
    Rank r holds its heads' sinks and its rows of an expert's gate and up biases; o's and down's
    biases are rank 0's alone, zeros elsewhere, so that the all-reduced partial sums hold them once."""
    config = ModelConfig.from_hf_config(gpt_oss_config(), "gpt-oss")
    check_divisible(config, 2)
    sinks, gate_bias, o_bias = torch.arange(4.0), torch.arange(160.0), torch.ones(64)  # 4 heads, experts of 160
    weights = [("model.layers.0.self_attn.sinks", sinks), ("model.layers.0.mlp.experts.1.gate_proj.bias", gate_bias),
               ("model.layers.0.self_attn.o_proj.bias", o_bias), ("model.layers.0.mlp.experts.1.down_proj.bias", o_bias),
               ("model.layers.0.mlp.gate.bias", torch.ones(4))]
    for rank in (0, 1):
        got = dict(shard_weights(weights, config, rank, 2))
        assert torch.equal(got["model.layers.0.self_attn.sinks"], sinks[2 * rank:2 * rank + 2])
        assert torch.equal(got["model.layers.0.mlp.experts.1.gate_proj.bias"], gate_bias[80 * rank:80 * rank + 80])
        for name in ("model.layers.0.self_attn.o_proj.bias", "model.layers.0.mlp.experts.1.down_proj.bias"):
            assert torch.equal(got[name], o_bias if rank == 0 else torch.zeros(64))
        assert torch.equal(got["model.layers.0.mlp.gate.bias"], torch.ones(4))  # the router's: replicated


def test_mxfp4_rows_in_ggufs_order():
    """A checkpoint's codes in pairs (2j low, 2j + 1 high) as GGUF's MXFP4 block: the scale byte,
    then values 0-15 in the low nibbles and 16-31 in the high ones; the gguf package reads back the
    values dequantize_mxfp4 gives."""
    from gguf import GGMLQuantizationType, quants

    g = torch.Generator().manual_seed(8)
    blocks = torch.randint(0, 256, (5, 3, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(110, 140, (5, 3), generator=g, dtype=torch.uint8)
    rows = gguf_rows(blocks, scales)
    assert rows.shape == (5, 51)
    read = quants.dequantize(rows, GGMLQuantizationType.MXFP4)
    assert torch.equal(torch.from_numpy(read.reshape(5, 96)), dequantize_mxfp4(blocks, scales).reshape(5, 96))


def test_quantization_mxfp4_needs_an_mxfp4_checkpoint(tmp_path, tokenizer_json):
    make_tiny_model("gpt_oss", tmp_path, tokenizer_json, seed=2)
    with pytest.raises(ValueError, match=r"quantization 'mxfp4' keeps an MXFP4 checkpoint's weights as they are"):
        load_model(str(tmp_path), dtype="float32", progress=False, quantization="mxfp4")
    assert load_model(str(tmp_path), dtype="float32", progress=False).quantization == "none"


def test_another_quantized_checkpoint_is_refused_by_name():
    cfg = dict(TINY, architectures=["LlamaForCausalLM"], quantization_config={"quant_method": "fp8"})
    with pytest.raises(ValueError, match=r"a checkpoint quantized by 'fp8' \(its quantization_config\) is not "
                                         r"supported"):
        ModelConfig.from_hf_config(cfg, "llama")


def write_gpt_oss_gguf(hf, path, tokenizer_pre: str | None = None) -> None:
    """hf as llama.cpp's converter writes a gpt-oss: its experts gate and up apart and in MXFP4 (the
    gguf package's quantizer; the HF model is given the values they dequantize to, so that it is the
    oracle of the file), every other tensor in F32, the router and the experts' biases, the sinks, the
    sliding window and YaRN."""
    import gguf
    import numpy as np

    from tests.model.test_gguf import add_model_fields

    c = hf.config
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    add_model_fields(w, c)
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    w.add_expert_feed_forward_length(c.intermediate_size)
    w.add_sliding_window(c.sliding_window)
    rope = c.rope_parameters
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rope["factor"])
    w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    if tokenizer_pre is not None:
        w.add_tokenizer_pre(tokenizer_pre)

    def f32(t):
        return t.detach().float().numpy()

    w.add_tensor("token_embd.weight", f32(hf.model.embed_tokens.weight))
    w.add_tensor("output_norm.weight", f32(hf.model.norm.weight))
    w.add_tensor("output.weight", f32(hf.lm_head.weight))
    mxfp4 = gguf.GGMLQuantizationType.MXFP4
    for i, layer in enumerate(hf.model.layers):
        a, mlp, p = layer.self_attn, layer.mlp, f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", f32(layer.input_layernorm.weight))
        w.add_tensor(p + "post_attention_norm.weight", f32(layer.post_attention_layernorm.weight))
        for proj, name in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            w.add_tensor(p + name + ".weight", f32(getattr(a, proj).weight))
            w.add_tensor(p + name + ".bias", f32(getattr(a, proj).bias))
        w.add_tensor(p + "attn_sinks.weight", f32(a.sinks))
        w.add_tensor(p + "ffn_gate_inp.weight", f32(mlp.router.weight))
        w.add_tensor(p + "ffn_gate_inp.bias", f32(mlp.router.bias))
        ex = mlp.experts
        gate_up = f32(ex.gate_up_proj).transpose(0, 2, 1)  # [experts, 2 inter, hidden], gate and up interleaved
        parts = {"gate": gate_up[:, 0::2], "up": gate_up[:, 1::2], "down": f32(ex.down_proj).transpose(0, 2, 1)}
        for name, weight in parts.items():
            blocks = np.stack([gguf.quants.quantize(np.ascontiguousarray(e), mxfp4) for e in weight])
            w.add_tensor(p + f"ffn_{name}_exps.weight", blocks, raw_dtype=mxfp4)
            parts[name] = np.stack([gguf.quants.dequantize(b, mxfp4) for b in blocks])
        with torch.no_grad():  # the HF model computes with the file's values
            interleaved = np.empty_like(gate_up)
            interleaved[:, 0::2], interleaved[:, 1::2] = parts["gate"], parts["up"]
            ex.gate_up_proj.copy_(torch.from_numpy(interleaved.transpose(0, 2, 1)))
            ex.down_proj.copy_(torch.from_numpy(parts["down"].transpose(0, 2, 1).copy()))
        bias = f32(ex.gate_up_proj_bias)
        w.add_tensor(p + "ffn_gate_exps.bias", np.ascontiguousarray(bias[:, 0::2]))
        w.add_tensor(p + "ffn_up_exps.bias", np.ascontiguousarray(bias[:, 1::2]))
        w.add_tensor(p + "ffn_down_exps.bias", f32(ex.down_proj_bias))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_a_gguf_file_as_llama_cpp_writes_it(tmp_path, tokenizer_json):
    """Its experts kept in MXFP4 (the default for a GGUF file): logits within the int8 activations'
    error of transformers' on the file's values; dequantized (quantization "none"): within 1e-4; its
    config as the HF one (YaRN unrounded, as the model defines it)."""
    pytest.importorskip("gguf")
    hf = make_tiny_model("gpt_oss", tmp_path / "hf", tokenizer_json, seed=9)
    path = tmp_path / "gpt-oss.gguf"
    write_gpt_oss_gguf(hf, path)
    kept = load_model(str(path), dtype="float32", progress=False)
    c = kept.config
    assert c.architecture == "GptOssForCausalLM" and c.layer_types == ("sliding_attention", "full_attention",
                                                                         "sliding_attention")
    assert (c.sliding_window, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == (16, 4, 2, 64)
    assert c.rope_scaling["truncate"] is False and c.rope_scaling["original_max_position_embeddings"] == 128
    assert (c.swiglu_alpha, c.swiglu_limit) == (1.702, 7.0)
    hf.config.swiglu_limit = 7.0  # llama.cpp's fixed limit (the file has no field for it)
    for layer in hf.model.layers:
        layer.mlp.experts.limit = 7.0
    ((_, gate_up),) = kept.model.layers[0].mlp.experts[0].gate_up_proj.quantized
    assert gate_up.type_name == "MXFP4"
    assert_last_logits_match(kept.model, hf, PROMPT, atol=0.05, rtol=0.05)
    exact = load_model(str(path), dtype="float32", progress=False, quantization="none")
    assert_last_logits_match(exact.model, hf, PROMPT, atol=1e-4, rtol=1e-4)


def test_the_gpt_4o_pre_tokenizer():
    """A GGUF vocabulary with pre "gpt-4o" (gpt-oss's o200k) splits as tiktoken's o200k pattern — a
    capitalised word with its contraction, digits in threes, punctuation runs with their newlines —
    in the tokenizers library's regex engine as in Python's `regex`."""
    regex = pytest.importorskip("regex")
    import tokenizers
    from tokenizers import pre_tokenizers

    from corellm.tokenizer import GPT4O_SPLIT

    text = "HELLO World's 12345 ok!!\n\n  done CamelCase über"
    assert regex.findall(GPT4O_SPLIT, text)[:9] == ["HELLO", " World's", " ", "123", "45", " ok", "!!\n\n", " ",
                                                    " done"]
    split = pre_tokenizers.Split(tokenizers.Regex(GPT4O_SPLIT), behavior="isolated")
    assert [piece for piece, _ in split.pre_tokenize_str(text)] == regex.findall(GPT4O_SPLIT, text)


def test_int8_quantizes_the_experts_and_keeps_their_biases(tmp_path, tokenizer_json):
    """--quantization int8 on a gpt-oss directory: the split experts' and the attention's projections
    quantized per row (their biases added in the kernels' epilogue), logits within the int8 error."""
    hf = make_tiny_model("gpt_oss", tmp_path, tokenizer_json, seed=1)
    ours = load_model(str(tmp_path), dtype="float32", progress=False, quantization="int8")
    layer = ours.model.layers[0]
    ((_, gate_up),) = layer.mlp.experts[0].gate_up_proj.quantized
    ((_, qkv),) = layer.attn.qkv_proj.quantized
    assert gate_up.type_name == qkv.type_name == "Q8_0" and layer.mlp.experts[0].gate_up_proj.bias is not None
    assert_last_logits_match(ours.model, hf, PROMPT, atol=0.05, rtol=0.05)
