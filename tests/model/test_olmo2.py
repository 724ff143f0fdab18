"""OLMo 2 (Olmo2ForCausalLM: OLMo-2-0425-1B, 7B, 13B) and Olmo 3 (Olmo3ForCausalLM): layers that norm
only their outputs — RMSNorm on the attention's output and on the MLP's before each joins the
residual stream, none on a layer's input nor before its MLP (ModelConfig.pre_norms False) — with q
and k normed over each token's whole rows, as OLMoE's. Olmo 3 adds sliding-window layers beside
global ones. GGUF files as llama.cpp's converter writes them ("olmo2" for both: post_attention_norm
and post_ffw_norm, q/k not permuted, an Olmo 3's sliding layers as attention.sliding_window_pattern)
against transformers in fp32. The tiny OLMo 2 and Olmo 3 also run in test_hf_oracle.py,
test_native_stack.py (the native stack bit-identical to the per-op forward) and the engine's
test_tiny_oracle.py (greedy tokens and logprobs against transformers)."""

from __future__ import annotations

import pytest

from corellm.model import load_model
from tests.model.runner import assert_last_logits_match
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close  # noqa: E402

# llama.cpp's names for an "olmo2" file: its output norms where Gemma's sit, whole-row q/k norms
OLMO2_LAYER_TENSORS = {**LLAMA_LAYER_TENSORS, "post_attention_layernorm": "post_attention_norm",
                       "post_feedforward_layernorm": "post_ffw_norm", "self_attn.q_norm": "attn_q_norm",
                       "self_attn.k_norm": "attn_k_norm"}


def test_its_layers_have_no_pre_norms(tmp_path, tokenizer_json):
    make_tiny_model("olmo2", tmp_path, tokenizer_json, seed=2)
    loaded = load_model(str(tmp_path), dtype="float32", progress=False)
    c = loaded.config
    assert not c.pre_norms and c.sandwich_norms and c.qk_norm_whole
    layer = loaded.model.layers[0]
    assert layer.input_norm is None and layer.post_attention_norm is None
    assert layer.attention_output_norm is not None and layer.mlp_output_norm is not None


@pytest.mark.parametrize("arch, tensor_type", [("olmo2", "F32"), ("olmo2", "Q8_0"), ("olmo3", "F32")])
def test_an_olmo2_gguf_file_gives_transformers_logits(tmp_path, tokenizer_json, arch, tensor_type):
    hf = make_tiny_model(arch, tmp_path / "hf", tokenizer_json, seed=6)
    path = tmp_path / f"tiny-{arch}.gguf"
    w = gguf.GGUFWriter(str(path), "olmo2")
    add_model_fields(w, hf.config)
    if arch == "olmo3":
        w.add_sliding_window(hf.config.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in hf.config.layer_types])
    write_tensors_and_close(w, hf, OLMO2_LAYER_TENSORS, tensor_type, permute=False)
    ours = load_model(str(path), dtype="float32", progress=False)
    c = ours.config
    assert c.architecture == "Olmo2ForCausalLM" and not c.pre_norms and c.qk_norm_whole
    if arch == "olmo3":
        assert [c.layer_window(i) for i in range(3)] == [16, 0, 16]
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)  # 64 tokens: past the window
