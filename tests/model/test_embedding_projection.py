"""A sentence-transformers model's Dense layers after its pooling (modules.json;
model/embedding_projection.py), on a tiny random BERT against transformers' pooled hidden states
through the same layers in float64: a chain of two (tanh from safetensors, then identity from a
pytorch_model.bin), before the normalization and a Matryoshka `dimensions` cut, whose bound is then
the projection's width; a module corellm does not compute, or a layer that does not chain, refused
by name."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from safetensors.torch import save_file  # noqa: E402

from corellm import LLM, PoolingParams  # noqa: E402
from tests.model.test_bert import PROMPTS, encode, hf_hidden, make_encoder  # noqa: E402

MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
           {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
           {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.base.modules.dense.Dense"},
           {"idx": 4, "name": "4", "path": "4_Normalize", "type": "sentence_transformers.models.Normalize"}]


def write_dense(folder, in_features: int, out_features: int, activation: str, seed: int, pickled: bool = False):
    g = torch.Generator().manual_seed(seed)
    weight, bias = torch.randn(out_features, in_features, generator=g) / in_features**0.5, torch.randn(out_features,
                                                                                                      generator=g)
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"in_features": in_features, "out_features": out_features,
                                                    "bias": True, "activation_function": activation}))
    state = {"linear.weight": weight, "linear.bias": bias}
    if pickled:
        torch.save(state, folder / "pytorch_model.bin")
    else:
        save_file(state, str(folder / "model.safetensors"))
    return weight.double(), bias.double()


@pytest.fixture
def projected(tmp_path, tokenizer_json):
    """(transformers' model, the directory, the reference projection of a pooled float64 row)."""
    hf = make_encoder("bert", tmp_path, tokenizer_json, seed=21, pooling="mean_tokens")
    w1, b1 = write_dense(tmp_path / "2_Dense", 64, 24, "torch.nn.modules.activation.Tanh", seed=1)
    w2, b2 = write_dense(tmp_path / "3_Dense", 24, 16, "torch.nn.modules.linear.Identity", seed=2, pickled=True)
    (tmp_path / "modules.json").write_text(json.dumps(MODULES))
    return hf, tmp_path, lambda row: torch.tanh(row @ w1.T + b1) @ w2.T + b2


def test_the_dense_layers_project_the_pooled_vector(projected, tokenizer_json):
    hf, directory, project = projected
    llm = LLM(str(directory), dtype="float32", max_num_seqs=8)
    for prompt, out in zip(PROMPTS, llm.embed(PROMPTS, PoolingParams(normalize=False), use_tqdm=False)):
        want = project(hf_hidden(hf, encode(tokenizer_json, prompt)).mean(0))
        torch.testing.assert_close(torch.tensor(out.outputs.embedding, dtype=torch.float64), want, atol=2e-5,
                                   rtol=2e-5)
    unit = torch.tensor(llm.embed(PROMPTS[:1], use_tqdm=False)[0].outputs.embedding, dtype=torch.float64)
    assert unit.shape == (16,) and abs(float(unit.norm()) - 1.0) < 1e-6


def test_a_matryoshka_cut_comes_after_the_projection(projected, tokenizer_json):
    hf, directory, project = projected
    llm = LLM(str(directory), dtype="float32", max_num_seqs=8, hf_overrides={"is_matryoshka": True})
    out = llm.embed(PROMPTS[:1], PoolingParams(dimensions=8), use_tqdm=False)[0].outputs.embedding
    want = project(hf_hidden(hf, encode(tokenizer_json, PROMPTS[0])).mean(0))[:8]
    torch.testing.assert_close(torch.tensor(out, dtype=torch.float64), want / want.norm(), atol=2e-5, rtol=2e-5)
    with pytest.raises(ValueError, match="1 to 16 values, got 17"):
        llm.embed(PROMPTS[:1], PoolingParams(dimensions=17), use_tqdm=False)


@pytest.mark.parametrize("change, says", [
    (lambda d: (d / "modules.json").write_text(json.dumps(MODULES + [
        {"idx": 5, "name": "5", "path": "5_LayerNorm", "type": "sentence_transformers.models.LayerNorm"}])),
     "module 'sentence_transformers.models.LayerNorm' is not supported"),
    (lambda d: (d / "3_Dense" / "config.json").write_text(json.dumps({"in_features": 64, "out_features": 16})),
     r"takes in_features 24 \(the vector before it\)"),
    (lambda d: (d / "2_Dense" / "config.json").write_text(json.dumps(
        {"in_features": 64, "out_features": 24, "activation_function": "torch.nn.modules.activation.Softmax"})),
     "activation_function 'torch.nn.modules.activation.Softmax' is not supported"),
    (lambda d: (d / "2_Dense" / "model.safetensors").unlink(), "a Dense module without its weights"),
])
def test_what_corellm_does_not_compute_is_refused_by_name(projected, change, says):
    _, directory, _ = projected
    change(directory)
    with pytest.raises(ValueError, match=says):
        LLM(str(directory), dtype="float32")
