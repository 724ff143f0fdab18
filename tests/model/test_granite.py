"""Granite (GraniteForCausalLM: IBM's Granite 3.x dense models): a Llama with four multipliers —
the embedding rows, each layer's attention and MLP outputs (residual_multiplier, before they join
the residual stream), the attention scale itself, and the logits (divided by logits_scaling).
GGUF files written as llama.cpp's converter writes them (a "granite" file: the Llama layout, q/k
permuted, the multipliers as embedding_scale, residual_scale, attention.scale and logit_scale)
give transformers' logits in F32 and, kept quantized, in Q8_0; the native decoder stack scales
as the per-op layers do. (The tiny Granite also runs in test_hf_oracle.py, test_native_stack.py
and the engine's test_tiny_oracle.py.)"""

from __future__ import annotations

import pytest
import torch

from corellm.model import load_model
from tests.model.runner import PagedRunner, assert_last_logits_match
from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

PROMPT = [(11 * i + 5) % 384 for i in range(40)]


def write_granite_gguf(hf_model, path, tensor_type: str = "F32") -> None:
    c = hf_model.config
    w = gguf.GGUFWriter(str(path), "granite")
    add_model_fields(w, c)
    w.add_attention_scale(c.attention_multiplier)
    w.add_embedding_scale(c.embedding_multiplier)
    w.add_residual_scale(c.residual_multiplier)
    w.add_logit_scale(c.logits_scaling)
    write_tensors_and_close(w, hf_model, LLAMA_LAYER_TENSORS, tensor_type)


@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_gguf_file_gives_transformers_logits(tmp_path, tensor_type):
    hf = make_tiny_model("granite", tmp_path / "hf", seed=3)
    write_granite_gguf(hf, tmp_path / "granite.gguf", tensor_type)
    ours = load_model(str(tmp_path / "granite.gguf"), dtype="float32", progress=False)
    c = ours.config
    assert (c.architecture, c.embedding_multiplier, c.residual_multiplier, c.attention_multiplier,
            c.logits_scaling) == ("GraniteForCausalLM", 3.0, 0.375, 0.1875, 2.5)
    tol = dict(atol=1e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.05, rtol=0.05)
    assert_last_logits_match(ours.model, hf, PROMPT, **tol)


def test_the_multipliers_matter(tmp_path, tokenizer_json):
    """Each multiplier left out moves the logits away from transformers' (the oracle tests would
    catch a missing one)."""
    import json

    hf = make_tiny_model("granite", tmp_path / "hf", tokenizer_json, seed=4)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert_last_logits_match(load_model(str(tmp_path / "hf"), dtype="float32", progress=False).model, hf, PROMPT,
                             atol=1e-4, rtol=1e-4)
    for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        changed = tmp_path / key
        changed.mkdir()
        for f in (tmp_path / "hf").iterdir():
            (changed / f.name).write_bytes(f.read_bytes())
        (changed / "config.json").write_text(json.dumps({**config, key: 1.0}))
        model = load_model(str(changed), dtype="float32", progress=False).model
        with pytest.raises(AssertionError):
            assert_last_logits_match(model, hf, PROMPT, atol=1e-4, rtol=1e-4)


def test_the_native_stack_scales_as_the_per_op_layers(tmp_path):
    hf = make_tiny_model("granite", tmp_path / "hf", seed=5)
    write_granite_gguf(hf, tmp_path / "granite.gguf", "Q8_0")
    model = load_model(str(tmp_path / "granite.gguf"), dtype="bfloat16", progress=False).model
    prompts = [PROMPT[:25], PROMPT[7:16]]
    assert torch.equal(PagedRunner(model, 64, 2).step(prompts), PagedRunner(model, 64, 2, native=True).step(prompts))


def test_bad_multipliers_are_refused_by_name(tmp_path, tokenizer_json):
    import json

    from corellm.model.model_config import ModelConfig

    make_tiny_model("granite", tmp_path, tokenizer_json)
    config = json.loads((tmp_path / "config.json").read_text())
    with pytest.raises(ValueError, match=r"logits_scaling \(0.0\) must be positive"):
        ModelConfig.from_hf_config({**config, "logits_scaling": 0.0})
