"""Gemma 2 (Gemma2ForCausalLM: gemma-2-2b / 9b / 27b): Gemma 3's layers (GeGLU, sandwich norms,
scaled embeddings) without q/k norms, sliding-window and global layers alternating (the first
sliding) on one rope base, and soft caps: the attention's scaled scores s become
cap * tanh(s / cap) before the softmax (attn_logit_softcapping), and the logits likewise
(final_logit_softcapping). Read from an HF directory and from a GGUF file written as llama.cpp's
converter writes one ("gemma2": norms stored as 1 + w, the caps and the window as metadata), both
against transformers' eager attention (its only one that applies the cap). The tiny Gemma 2 also
runs in test_hf_oracle.py, test_native_stack.py (the native stack bit-identical to the per-op
forward) and the engine's test_tiny_oracle.py (greedy tokens and logprobs against transformers)."""

from __future__ import annotations

import pytest
import torch

from corellm.model import load_model
from corellm.model.loader import check_head_size_on_device
from tests.model.runner import assert_last_logits_match
from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

# llama.cpp's names for a "gemma2" file's norms: after the attention, before and after the MLP
GEMMA2_LAYER_TENSORS = {**LLAMA_LAYER_TENSORS, "post_attention_layernorm": "post_attention_norm",
                        "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tokenizer_json):
    directory = tmp_path_factory.mktemp("gemma2")
    return make_tiny_model("gemma2", directory, tokenizer_json, seed=5), directory


def test_the_config_alternates_its_layers_and_keeps_the_caps(tiny):
    hf, directory = tiny
    c = load_model(str(directory), dtype="float32", progress=False).config
    assert c.architecture == "Gemma2ForCausalLM" and not c.qk_norm and c.sandwich_norms
    assert c.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert [c.layer_window(i) for i in range(3)] == [16, 0, 16]
    assert c.layer_rope_theta(0) == c.layer_rope_theta(1) == hf.config.rope_parameters["rope_theta"]
    assert (c.attn_logit_softcapping, c.final_logit_softcapping) == (0.5, 1.0)
    assert c.attention_scale == 4**-0.5


def _variant(hf, **fields):
    """hf's weights in a Gemma 2 whose config has `fields` changed."""
    model = transformers.Gemma2ForCausalLM(transformers.Gemma2Config(**{**hf.config.to_dict(), **fields})).eval()
    model.load_state_dict(hf.state_dict())
    return model


def test_the_logits_match_and_each_cap_matters(tiny):
    """corellm's logits equal transformers'; without either cap transformers' own differ by far more
    than the tolerance (so the comparisons here and in the oracle tests see both caps)."""
    hf, directory = tiny
    ours = load_model(str(directory), dtype="float32", progress=False)
    ids = list(range(7, 47))
    assert_last_logits_match(ours.model, hf, ids, atol=2e-4, rtol=1e-4)
    with torch.no_grad():
        want = hf(torch.tensor([ids])).logits[0, -1]
        for cap in ("attn_logit_softcapping", "final_logit_softcapping"):
            other = _variant(hf, **{cap: None})(torch.tensor([ids])).logits[0, -1]
            assert (want - other).abs().max() > 0.02, cap


class _AsLlamaCppWrites:
    """A Gemma 2's config and its tensors as llama.cpp's converter takes them: every norm weight as
    1 + w, and no lm_head (the embedding is tied)."""

    def __init__(self, hf_model):
        self.config = hf_model.config
        self._state = {k: v + 1.0 if k.endswith("norm.weight") else v
                       for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}

    def state_dict(self) -> dict:
        return self._state


def write_gemma2_gguf(hf_model, path, tensor_type: str = "F32") -> None:
    """hf_model as llama.cpp's converter writes a Gemma 2 ("gemma2"): norms stored as 1 + w, q/k not
    permuted, the window and the caps as metadata, no output.weight."""
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), "gemma2")
    add_model_fields(w, c)
    w.add_sliding_window(c.sliding_window)
    w.add_attn_logit_softcapping(c.attn_logit_softcapping)
    w.add_final_logit_softcapping(c.final_logit_softcapping)
    write_tensors_and_close(w, _AsLlamaCppWrites(hf_model), GEMMA2_LAYER_TENSORS, tensor_type, permute=False)


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_gemma2_gguf_file_gives_transformers_logits(tiny, tmp_path, tensor_type):
    hf, _ = tiny
    path = tmp_path / "tiny-gemma2.gguf"
    write_gemma2_gguf(hf, path, tensor_type)
    ours = load_model(str(path), dtype="float32", progress=False)
    c = ours.config
    assert c.architecture == "Gemma2ForCausalLM" and c.layer_types[:2] == ("sliding_attention", "full_attention")
    assert (c.attn_logit_softcapping, c.final_logit_softcapping, c.sliding_window) == (0.5, 1.0, 16)
    # The file's attention scale is the head size's (llama.cpp's reading), the tiny model's own
    # query_pre_attn_scalar (4) is not in it: compare with transformers at the same scale.
    assert c.attention_scale == hf.config.head_dim**-0.5
    same_scale = _variant(hf, query_pre_attn_scalar=hf.config.head_dim)
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, same_scale, list(range(5, 69)), **tol)


def test_gemma2_on_cuda_is_refused_by_name(tiny):
    _, directory = tiny
    config = load_model(str(directory), dtype="float32", progress=False).config
    with pytest.raises(ValueError, match="soft-capping"):
        check_head_size_on_device(config, torch.device("cuda"))
