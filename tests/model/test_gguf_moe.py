"""Mixture-of-experts GGUF files as llama.cpp writes them — Qwen3-MoE ("qwen3moe"), Qwen2-MoE
("qwen2moe", with its shared expert), OLMoE ("olmoe") and Mixtral ("llama" with experts), every
expert's gate, up and down in one 3-D tensor, or (early Mixtral files) one tensor per expert —
read by corellm: the same logits as transformers on the HF model the file was written from (F32;
Q8_0 and Q4_0 kept quantized, within their error), the native stack bit-identical to the per-op
forward on the quantized experts, and transformers' own GGUF reader agreeing on the Qwen3-MoE and
Qwen2-MoE files' layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from corellm.model import load_model
from corellm.model.native_stack import supports
from tests import quant_blocks
from tests.model.runner import PagedRunner, assert_last_logits_match
from tests.model.test_gguf import add_model_fields, permute_qk
from tests.model.tiny_models import make_tiny_model

transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

_ATTENTION = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
              "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
# (HF router, HF expert prefix, gate / up / down names) of each family
_EXPERTS = {"qwen3_moe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
            "qwen2_moe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
            "olmoe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
            "ernie4_5_moe": ("mlp.gate", "mlp.experts", ("gate_proj", "up_proj", "down_proj")),
            "mixtral": ("block_sparse_moe.gate", "block_sparse_moe.experts", ("w1", "w3", "w2"))}
_ARCHS = {"qwen3_moe": "qwen3moe", "qwen2_moe": "qwen2moe", "olmoe": "olmoe", "mixtral": "llama",
          "ernie4_5_moe": "ernie4_5-moe"}


def write_moe_gguf(hf_model, hf_dir, family: str, path, tensor_type: str = "F32", stacked: bool = True) -> None:
    """hf_model, saved in hf_dir (the checkpoint's names: one tensor per expert), as llama.cpp's
    converter writes it: q/k permuted for "llama" files, each layer's experts stacked into
    ffn_{gate,up,down}_exps [experts, rows, columns] (or, stacked=False, one ffn_{gate,up,down}.E
    tensor each), the router as ffn_gate_inp (F32, as the converter keeps it)."""
    c = hf_model.config
    arch = _ARCHS[family]
    w = gguf.GGUFWriter(str(path), arch)
    add_model_fields(w, c)
    experts = getattr(c, "num_local_experts", None) or c.num_experts
    w.add_expert_count(experts)
    w.add_expert_used_count(c.num_experts_per_tok)
    if family in ("qwen3_moe", "qwen2_moe", "ernie4_5_moe"):  # (Mixtral's and OLMoE's experts: feed_forward_length)
        w.add_expert_feed_forward_length(c.moe_intermediate_size)
    if family == "qwen2_moe":
        w.add_expert_shared_feed_forward_length(c.shared_expert_intermediate_size)
    if family == "ernie4_5_moe":  # its shared experts as one MLP of their summed width
        w.add_expert_shared_feed_forward_length(c.moe_intermediate_size * c.moe_num_shared_experts)

    def add(name: str, a: np.ndarray) -> None:
        if tensor_type != "F32" and a.ndim >= 2 and "ffn_gate_inp" not in name:
            blocks = quant_blocks.quantize(a.reshape(-1, a.shape[-1]), tensor_type)
            w.add_tensor(name, blocks.reshape(*a.shape[:-1], blocks.shape[-1]),
                         raw_dtype=getattr(gguf.GGMLQuantizationType, tensor_type))
        else:
            w.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))

    from safetensors.numpy import load_file

    state = {k: v.astype(np.float32) for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    router, prefix, parts = _EXPERTS[family]
    add("token_embd.weight", state.pop("model.embed_tokens.weight"))
    add("output_norm.weight", state.pop("model.norm.weight"))
    if "lm_head.weight" in state:  # (a tied one, ERNIE 4.5's: none, as the converter writes it)
        add("output.weight", state.pop("lm_head.weight"))
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        if p + router + ".weight" in state:
            add(f"blk.{i}.ffn_gate_inp.weight", state.pop(p + router + ".weight"))
            for hf_part, part in zip(parts, ("gate", "up", "down")):
                mats = [state.pop(f"{p}{prefix}.{e}.{hf_part}.weight") for e in range(experts)]
                if stacked:
                    add(f"blk.{i}.ffn_{part}_exps.weight", np.stack(mats))
                else:
                    for e, m in enumerate(mats):
                        add(f"blk.{i}.ffn_{part}.{e}.weight", m)
            if p + "mlp.moe_statics.e_score_correction_bias" in state:  # ERNIE 4.5: the choice's bias, ungated shared
                add(f"blk.{i}.exp_probs_b.bias", state.pop(p + "mlp.moe_statics.e_score_correction_bias").reshape(-1))
                for part in ("gate", "up", "down"):
                    add(f"blk.{i}.ffn_{part}_shexp.weight", state.pop(f"{p}mlp.shared_experts.{part}_proj.weight"))
            if p + "mlp.shared_expert_gate.weight" in state:  # Qwen2-MoE; the gate's row 1-D, as some files have it
                add(f"blk.{i}.ffn_gate_inp_shexp.weight", state.pop(p + "mlp.shared_expert_gate.weight")[0])
                for part in ("gate", "up", "down"):
                    add(f"blk.{i}.ffn_{part}_shexp.weight", state.pop(f"{p}mlp.shared_expert.{part}_proj.weight"))
        for hf, name in _ATTENTION.items():
            for kind in ("weight", "bias"):
                if p + hf + "." + kind not in state:
                    continue
                a = state.pop(p + hf + "." + kind)
                if arch == "llama" and hf == "self_attn.q_proj":
                    a = permute_qk(a, c.num_attention_heads)
                elif arch == "llama" and hf == "self_attn.k_proj":
                    a = permute_qk(a, c.num_key_value_heads)
                add(f"blk.{i}.{name}.{kind}", a)
    assert not state, f"tensors not written: {sorted(state)[:4]}"
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _hf(family, directory):
    # llama.cpp renormalizes Qwen3-MoE's chosen experts' weights (and Mixtral's), not Qwen2-MoE's.
    return make_tiny_model(family, directory, seed=13, norm_topk_prob=True) if family == "qwen3_moe" \
        else make_tiny_model(family, directory, seed=13)


@pytest.mark.parametrize("family, tensor_type, stacked", [
    ("qwen3_moe", "F32", True), ("qwen3_moe", "Q8_0", True), ("mixtral", "F32", True), ("mixtral", "Q4_0", True),
    ("mixtral", "F32", False), ("qwen2_moe", "F32", True), ("qwen2_moe", "Q8_0", True), ("olmoe", "F32", True),
    ("olmoe", "Q8_0", True), ("ernie4_5_moe", "F32", True), ("ernie4_5_moe", "Q8_0", True)])
def test_moe_gguf_logits_match_transformers(tmp_path, family, tensor_type, stacked):
    hf = _hf(family, tmp_path / "hf")
    path = tmp_path / "moe.gguf"
    write_moe_gguf(hf, tmp_path / "hf", family, path, tensor_type, stacked)
    ours = load_model(str(path), dtype="float32", progress=False, use_cache=False)
    c = ours.config
    assert (c.family, c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size) == \
        (family, 8 if family == "olmoe" else 4, 2, 64)
    assert c.dense_layers == {"qwen3_moe": (1,), "ernie4_5_moe": (0,)}.get(family, ())
    assert c.shared_expert_intermediate_size == {"qwen2_moe": 96, "ernie4_5_moe": 64}.get(family, 0)
    assert (c.shared_expert_gated, c.moe_selection_bias) == ((False, True) if family == "ernie4_5_moe" else (True, False))
    assert c.norm_topk_prob == (family not in ("qwen2_moe", "olmoe"))
    assert c.qk_norm_whole == (family == "olmoe")
    quantized = [linear for layer in ours.model.layers if c.layer_is_sparse(layer.index)
                 for e in layer.mlp.experts for linear in (e.gate_up_proj, e.down_proj)]
    assert all(bool(linear.quantized) == (tensor_type != "F32") for linear in quantized)
    tol = dict(atol=2e-4, rtol=1e-4) if tensor_type == "F32" else dict(atol=0.1, rtol=0.05)
    assert_last_logits_match(ours.model, hf, list(range(5, 69)), **tol)


def test_quantized_experts_native_equal_per_op(tmp_path):
    hf = _hf("qwen3_moe", tmp_path / "hf")
    path = tmp_path / "moe.gguf"
    write_moe_gguf(hf, tmp_path / "hf", "qwen3_moe", path, "Q8_0")
    model = load_model(str(path), dtype="bfloat16", progress=False, use_cache=False).model
    assert supports(model)
    g = torch.Generator().manual_seed(8)
    prompts = [torch.randint(0, 384, (n,), generator=g).tolist() for n in (12, 11, 13, 12)]
    outs = []
    for native in (True, False):
        runner = PagedRunner(model, 64, len(prompts), block_size=8, seed=3, native=native)
        last = runner.step(prompts)
        steps = [last]
        for _ in range(5):
            last = runner.step([[t] for t in last.argmax(-1).tolist()])
            steps.append(last)
        outs.append(torch.stack(steps))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("family, sizes", [("qwen3_moe", dict(norm_topk_prob=True, moe_intermediate_size=768)),
                                           ("qwen2_moe", dict(moe_intermediate_size=1408,
                                                              shared_expert_intermediate_size=5632))])
def test_transformers_reads_the_file_alike(tmp_path, family, sizes):
    """transformers' GGUF loader (written against llama.cpp's files) and corellm read the same
    model from it (transformers takes no expert_feed_forward_length: the HF model's experts have
    its default sizes here)."""
    hf = make_tiny_model(family, tmp_path / "hf", seed=13, mlp_only_layers=[], **sizes)
    path = tmp_path / "moe.gguf"
    write_moe_gguf(hf, tmp_path / "hf", family, path)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name,
                                                               torch_dtype=torch.float32).eval()
    ours = load_model(str(path), dtype="float32", progress=False, use_cache=False)
    ids = list(range(5, 40))
    with torch.no_grad():
        want = theirs(torch.tensor([ids])).logits[0, -1:]
    torch.testing.assert_close(PagedRunner(ours.model, 64, 1).step([ids]), want, atol=2e-4, rtol=1e-4)
