"""SmolLM3 (SmolLM3ForCausalLM: SmolLM3-3B): a Llama whose every fourth layer turns no rotary
embedding (NoPE). The config's no_rope_layers (per layer, 1: rotary, 0: none) or its
no_rope_layer_interval name them; a GGUF file ("smollm3", written as llama.cpp's converter writes a
Llama: q/k permuted) does not, and llama.cpp takes every fourth layer, as corellm does. Both against
transformers in fp32. The tiny SmolLM3 (its middle layer NoPE) also runs in test_hf_oracle.py,
test_native_stack.py (the native stack bit-identical to the per-op forward) and the engine's
test_tiny_oracle.py (greedy tokens and logprobs against transformers)."""

from __future__ import annotations

import pytest

from corellm.model import load_model
from corellm.model.model_config import ModelConfig, UnsupportedModelError
from tests.model.runner import assert_last_logits_match
from tests.model.tiny_models import TINY, make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close  # noqa: E402


def _config(**fields) -> ModelConfig:
    cfg = {**TINY, "architectures": ["SmolLM3ForCausalLM"], "model_type": "smollm3", **fields}
    return ModelConfig.from_hf_config(cfg)


def test_the_nope_layers_come_from_the_config():
    assert _config(num_hidden_layers=8, no_rope_layer_interval=4).nope_layers == (3, 7)
    assert _config(num_hidden_layers=8).nope_layers == (3, 7)  # the interval's default, 4
    c = _config(no_rope_layers=[0, 1, 1])
    assert c.nope_layers == (0,) and [c.layer_uses_rope(i) for i in range(3)] == [False, True, True]
    with pytest.raises(UnsupportedModelError, match="no_rope_layers names 2 layers of 3"):
        _config(no_rope_layers=[1, 0])


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_smollm3_gguf_file_gives_transformers_logits(tmp_path, tokenizer_json, tensor_type):
    hf = make_tiny_model("smollm3", tmp_path / "hf", tokenizer_json, seed=3, num_hidden_layers=4,
                         no_rope_layers=[1, 1, 1, 0])
    path = tmp_path / "tiny-smollm3.gguf"
    w = gguf.GGUFWriter(str(path), "smollm3")
    add_model_fields(w, hf.config)
    write_tensors_and_close(w, hf, LLAMA_LAYER_TENSORS, tensor_type)
    ours = load_model(str(path), dtype="float32", progress=False)
    assert ours.config.architecture == "SmolLM3ForCausalLM" and ours.config.nope_layers == (3,)
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)
