"""ERNIE 4.5 (Ernie4_5ForCausalLM: ERNIE-4.5-0.3B): a Llama whose rotary embedding turns each head's
pairs (2i, 2i + 1) by frequency i (GPT-J's interleaved form, llama.cpp's rope type NORM), not the
pairs (i, i + d / 2) of NeoX and Llama. A GGUF file ("ernie4_5", q/k as the checkpoint holds them:
llama.cpp's converter does not permute them) and an HF directory, both against transformers in fp32.
The tiny ERNIE 4.5 also runs in test_hf_oracle.py, test_native_stack.py (the native stack
bit-identical to the per-op forward) and the engine's test_tiny_oracle.py (greedy tokens and
logprobs against transformers)."""

from __future__ import annotations

import pytest

from corellm.model import load_model
from corellm.model.model_config import ModelConfig, UnsupportedModelError
from tests.model.runner import assert_last_logits_match
from tests.model.tiny_models import TINY, make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close  # noqa: E402


def test_the_config_asks_for_interleaved_rotary_and_refuses_biases():
    fields = {**TINY, "architectures": ["Ernie4_5ForCausalLM"], "model_type": "ernie4_5"}
    assert ModelConfig.from_hf_config(fields).rope_interleaved
    with pytest.raises(UnsupportedModelError, match="use_bias"):
        ModelConfig.from_hf_config({**fields, "use_bias": True})


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_an_ernie4_5_gguf_file_gives_transformers_logits(tmp_path, tokenizer_json, tensor_type):
    hf = make_tiny_model("ernie4_5", tmp_path / "hf", tokenizer_json, seed=4)
    path = tmp_path / "tiny-ernie4_5.gguf"
    w = gguf.GGUFWriter(str(path), "ernie4_5")
    add_model_fields(w, hf.config)
    write_tensors_and_close(w, hf, LLAMA_LAYER_TENSORS, tensor_type, permute=False)
    ours = load_model(str(path), dtype="float32", progress=False)
    assert ours.config.architecture == "Ernie4_5ForCausalLM" and ours.config.rope_interleaved
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)
