"""GLM-4 (Glm4ForCausalLM: GLM-4-9B-0414, GLM-Z1) from a GGUF file as llama.cpp's converter writes it
("glm4"): q/k/v with biases and unpermuted (llama.cpp's rope type NORM turns interleaved pairs, as
the checkpoint does, over half of each head: rope.dimension_count), gate and up fused in ffn_up, the
sandwich norms under llama.cpp's names (post_attention_norm, post_ffw_norm); against transformers
in fp32 on the tiny GLM-4 it was written from (F32 and Q8_0). The file's turn end (eot, <|user|>)
ends generation beside its eos, as GLM-4's generation config has it. The tiny GLM-4 also runs
against transformers from its HF directory in tests/engine/test_tiny_oracle.py."""

from __future__ import annotations

import pytest

from corellm.model import load_model
from tests.model.runner import assert_last_logits_match
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tests.model.test_gguf import add_model_fields, write_tensors_and_close  # noqa: E402

GLM4_LAYER_TENSORS = {"input_layernorm": "attn_norm", "post_self_attn_layernorm": "post_attention_norm",
                      "post_attention_layernorm": "ffn_norm", "post_mlp_layernorm": "post_ffw_norm",
                      "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
                      "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_glm4_gguf_file_gives_transformers_logits(tmp_path, tokenizer_json, tensor_type):
    hf = make_tiny_model("glm4", tmp_path / "hf", tokenizer_json, seed=7)
    c = hf.config
    partial = (c.rope_parameters or {}).get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 0.5))
    assert partial < 1.0  # half of each head turned: the metadata must say so
    path = tmp_path / "tiny-glm4.gguf"
    w = gguf.GGUFWriter(str(path), "glm4")
    add_model_fields(w, c)
    w.add_rope_dimension_count(int(c.head_dim * partial))
    w.add_eot_token_id(5)
    write_tensors_and_close(w, hf, GLM4_LAYER_TENSORS, tensor_type, permute=False)
    ours = load_model(str(path), dtype="float32", progress=False)
    config = ours.config
    assert (config.architecture, config.rope_interleaved, config.sandwich_norms, config.attention_bias) == \
        ("Glm4ForCausalLM", True, True, True)
    assert config.partial_rotary_factor == partial and config.eos_token_id == [2, 5]
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)
