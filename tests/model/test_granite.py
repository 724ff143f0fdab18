"""Granite (GraniteForCausalLM: IBM's Granite 3.x dense models; GraniteMoeForCausalLM, its mixtures
of experts): a Llama with four multipliers —
the embedding rows, each layer's attention and MLP outputs (residual_multiplier, before they join
the residual stream), the attention scale itself, and the logits (divided by logits_scaling).
GGUF files written as llama.cpp's converter writes them (a "granite" file: the Llama layout, q/k
permuted, the multipliers as embedding_scale, residual_scale, attention.scale and logit_scale)
give transformers' logits in F32 and, kept quantized, in Q8_0 — Granite-MoE's too (its 3-D expert
tensors split into ffn_{gate,up,down}_exps); the native decoder stack scales as the per-op layers
do; --quantization int8 quantizes Granite-MoE's experts. (The tiny Granite and Granite-MoE also
run in test_hf_oracle.py, test_native_stack.py, the engine's test_tiny_oracle.py and the
tensor-parallel tests.)"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm.model import load_model
from tests.model.runner import PagedRunner, assert_last_logits_match
from tests import quant_blocks
from tests.model.test_gguf import LLAMA_LAYER_TENSORS, add_model_fields, write_tensors_and_close
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

PROMPT = [(11 * i + 5) % 384 for i in range(40)]


class _WithoutExperts:
    """An HF model's config and its tensors less a Granite-MoE's experts and routers."""

    def __init__(self, hf_model):
        self.config = hf_model.config
        self._state = {k: v for k, v in hf_model.state_dict().items() if ".block_sparse_moe." not in k}

    def state_dict(self) -> dict:
        return self._state


def write_granite_gguf(hf_model, hf_dir, path, tensor_type: str = "F32") -> None:
    """hf_model, saved in hf_dir, as llama.cpp's converter writes a Granite ("granite") or a
    Granite-MoE ("granitemoe": each layer's input_linear split into ffn_gate_exps and ffn_up_exps,
    output_linear as ffn_down_exps, the router as ffn_gate_inp in F32; read from the checkpoint,
    whose names transformers' modules no longer have)."""
    c = hf_model.config
    moe = c.model_type == "granitemoe"
    w = gguf.GGUFWriter(str(path), c.model_type)
    add_model_fields(w, c)
    w.add_attention_scale(c.attention_multiplier)
    w.add_embedding_scale(c.embedding_multiplier)
    w.add_residual_scale(c.residual_multiplier)
    w.add_logit_scale(c.logits_scaling)
    if not moe:
        write_tensors_and_close(w, hf_model, LLAMA_LAYER_TENSORS, tensor_type)
        return
    w.add_expert_count(c.num_local_experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    from safetensors.torch import load_file

    state = load_file(str(hf_dir / "model.safetensors"))
    inter = c.intermediate_size
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}.block_sparse_moe."
        w.add_tensor(f"blk.{i}.ffn_gate_inp.weight", state[p + "router.layer.weight"].float().numpy())
        stacked = state[p + "input_linear.weight"].float().numpy()
        for name, a in (("gate", stacked[:, :inter]), ("up", stacked[:, inter:]),
                        ("down", state[p + "output_linear.weight"].float().numpy())):
            a = np.ascontiguousarray(a)
            if tensor_type == "F32":
                w.add_tensor(f"blk.{i}.ffn_{name}_exps.weight", a)
            else:
                blocks = quant_blocks.quantize(a.reshape(-1, a.shape[-1]), tensor_type)
                w.add_tensor(f"blk.{i}.ffn_{name}_exps.weight", blocks.reshape(*a.shape[:-1], blocks.shape[-1]),
                             raw_dtype=getattr(gguf.GGMLQuantizationType, tensor_type))
    write_tensors_and_close(w, _WithoutExperts(hf_model), LLAMA_LAYER_TENSORS, tensor_type)


@pytest.mark.parametrize("arch", ["granite", "granitemoe"])
@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_a_gguf_file_gives_transformers_logits(tmp_path, arch, tensor_type):
    hf = make_tiny_model(arch, tmp_path / "hf", seed=3)
    write_granite_gguf(hf, tmp_path / "hf", tmp_path / "granite.gguf", tensor_type)
    ours = load_model(str(tmp_path / "granite.gguf"), dtype="float32", progress=False)
    c = ours.config
    assert (c.family, c.embedding_multiplier, c.residual_multiplier, c.attention_multiplier,
            c.logits_scaling, c.num_experts) == (arch, 3.0, 0.375, 0.1875, 2.5, 4 if arch == "granitemoe" else 0)
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


@pytest.mark.parametrize("arch", ["granite", "granitemoe"])
def test_the_native_stack_scales_as_the_per_op_layers(tmp_path, arch):
    hf = make_tiny_model(arch, tmp_path / "hf", seed=5)
    write_granite_gguf(hf, tmp_path / "hf", tmp_path / "granite.gguf", "Q8_0")
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


def test_int8_quantizes_granite_moe_experts(tmp_path, tokenizer_json):
    """The stacked experts are split before --quantization int8 sees them: every expert's w1 / w3 /
    w2 in Q8_0 blocks, the routers in the dtype."""
    hf = make_tiny_model("granitemoe", tmp_path, tokenizer_json, seed=6)
    ours = load_model(str(tmp_path), dtype="float32", progress=False, quantization="int8")
    moe = ours.model.layers[0].mlp
    assert all(e.gate_up_proj.quantized and e.down_proj.quantized for e in moe.experts)
    assert not moe.router.quantized
    assert_last_logits_match(ours.model, hf, PROMPT[:24], atol=0.05, rtol=0.05)
