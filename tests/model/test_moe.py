"""Mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE): the routing and combining kernels against torch and
float64 references; int8-quantized experts in the native decoder stack bit-identical to the
per-op forward, alone or batched, and near transformers; what is refused, by name. (The bf16 and
fp32 models against transformers and each other: test_hf_oracle.py and test_native_stack.py, whose
tiny models include both families; under tensor parallelism: tests/distributed/.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from corellm import _core, ops
from corellm.lora.lora_adapter import load_lora_adapter
from corellm.model import load_model
from corellm.model.native_stack import supports
from tests.lora_adapters import hf_shape, make_lora_adapter
from tests.model.runner import PagedRunner, greedy_decode
from tests.model.tiny_models import make_tiny_model

pytest.importorskip("transformers")


@pytest.mark.parametrize("top_k, renormalize", [(1, False), (2, True), (3, False), (8, True)])
def test_route_is_softmax_then_top_k(top_k, renormalize):
    logits = torch.randn(50, 8, generator=torch.Generator().manual_seed(top_k)) * 3
    ids, weights = ops.moe_route(logits, top_k, renormalize)
    p = torch.softmax(logits.double(), dim=-1)
    want_p, want_ids = torch.topk(p, top_k, dim=-1)
    if renormalize:
        want_p = want_p / want_p.sum(-1, keepdim=True)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights.double(), want_p, atol=1e-6, rtol=1e-5)


def test_route_ties_go_to_the_lower_expert():
    logits = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]])
    ids, weights = ops.moe_route(logits, 2, True)
    assert ids.tolist() == [[1, 2]] and weights.tolist() == [[0.5, 0.5]]


def test_a_nan_logit_keeps_the_ids_in_range():
    ids, weights = ops.moe_route(torch.tensor([[0.5, float("nan"), 1.0, 0.0]]), 2, True)
    assert ids.tolist() == [[0, 1]] and torch.isnan(weights).all()


def test_route_refuses_a_top_k_beyond_the_experts():
    with pytest.raises(ValueError, match=r"top_k \(5\) must be in \[1, 4\]"):
        ops.moe_route(torch.zeros(2, 4), 5, True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_combine_sums_each_token_s_experts_by_weight(dtype):
    g = torch.Generator().manual_seed(0)
    m, top_k, hidden = 7, 3, 40
    rows = torch.randn(m * top_k, hidden, generator=g).to(dtype)
    weights = torch.rand(m, top_k, generator=g)
    out = ops.moe_combine(rows, weights)
    want = (rows.double().view(m, top_k, hidden) * weights.double()[:, :, None]).sum(1)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=8e-3)  # one bf16 rounding
    torch.testing.assert_close(out.double(), want, **tol)
    # A token's sum does not depend on the other tokens.
    assert torch.equal(ops.moe_combine(rows[3 * top_k : 4 * top_k], weights[3:4]), out[3:4])


def test_combine_adds_the_shared_expert_by_its_gate():
    g = torch.Generator().manual_seed(1)
    m, top_k, hidden = 5, 2, 24
    rows, shared = torch.randn(m * top_k, hidden, generator=g), torch.randn(m, hidden, generator=g)
    weights, gate = torch.rand(m, top_k, generator=g), torch.randn(m, generator=g) * 3
    out = ops.moe_combine(rows, weights, shared=shared, shared_gate=gate)
    want = (rows.double().view(m, top_k, hidden) * weights.double()[:, :, None]).sum(1) + \
        torch.sigmoid(gate.double())[:, None] * shared.double()
    torch.testing.assert_close(out.double(), want, atol=1e-5, rtol=1e-5)
    # ungated (ERNIE 4.5's shared experts): the shared output added whole
    ungated = ops.moe_combine(rows, weights, shared=shared)
    torch.testing.assert_close(ungated.double(), want - torch.sigmoid(gate.double())[:, None] * shared.double()
                               + shared.double(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="a shared expert's gate without its rows"):
        ops.moe_combine(rows, weights, shared_gate=gate)


def test_route_with_a_selection_bias_chooses_by_p_plus_bias_and_weighs_by_p():
    """ERNIE 4.5's router (transformers' Ernie4_5_MoeTopKRouter): softmax, the top_k of p + the bias,
    their p renormalized by their sum (at least moe_norm_min)."""
    g = torch.Generator().manual_seed(5)
    logits, bias = torch.randn(60, 8, generator=g) * 2, torch.randn(8, generator=g) * 0.3
    ids, weights = ops.moe_route(logits, 2, True, bias, 1e-12)
    p = torch.softmax(logits, dim=-1)
    _, want_ids = torch.topk(p + bias, 2, dim=-1)
    want = torch.gather(p, 1, want_ids)
    want = want / want.sum(-1, keepdim=True).clamp(min=1e-12)
    assert torch.equal(ids.long(), want_ids)
    torch.testing.assert_close(weights, want, atol=1e-6, rtol=1e-5)
    assert not torch.equal(ids, ops.moe_route(logits, 2, True)[0])  # the bias changed some choices
    # a sum below renormalize_min is divided by it instead
    _, tiny = ops.moe_route(torch.tensor([[0.0, 0.0, 0.0, 0.0]]), 1, True, renormalize_min=2.0)
    assert tiny.tolist() == [[0.125]]
    with pytest.raises(ValueError, match="selection_bias"):
        ops.moe_route(logits, 2, True, torch.zeros(7))


@pytest.fixture(scope="module", params=["mixtral", "qwen3_moe", "qwen2_moe", "ernie4_5_moe", "olmoe"])
def tiny_moe(request, tmp_path_factory, tokenizer_json):
    directory = tmp_path_factory.mktemp(request.param)
    hf = make_tiny_model(request.param, directory, tokenizer_json, seed=11)
    return request.param, directory, hf


@pytest.mark.skipif(not _core.kernels.bf16_gemm_available(), reason="needs AVX2 and FMA")
def test_int8_experts_native_equal_per_op_alone_or_batched_and_near_transformers(tiny_moe):
    arch, directory, hf = tiny_moe
    model = load_model(str(directory), dtype="bfloat16", quantization="int8", progress=False).model
    experts = [linear for layer in model.layers if hasattr(layer.mlp, "experts")
               for e in layer.mlp.experts for linear in (e.gate_up_proj, e.down_proj)]
    assert experts and all(linear.quantized for linear in experts)
    assert supports(model)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 384, (n,), generator=g).tolist() for n in (12, 11, 13, 12)]
    native = greedy_decode(model, prompts, 6, native=True)
    assert torch.equal(native, greedy_decode(model, prompts, 6, native=False))
    assert torch.equal(native, greedy_decode(model, prompts, 6, native=True, together=False))
    split = PagedRunner(model, 64, len(prompts), block_size=8, seed=2, native=True)
    prefill = split.step(prompts)
    # the prefill's sequences cut into groups, one thread each (decoder_stack.h: a team of 2, not on the amx path)
    if torch.get_num_threads() == 2 and _core.kernels.cpu_isa() != "amx":
        assert split.native_stack.last_groups > 1
    assert torch.equal(prefill, PagedRunner(model, 64, len(prompts), block_size=8, seed=2).step(prompts))
    with torch.no_grad():
        want = torch.stack([hf(torch.tensor([p])).logits[0, -1] for p in prompts])
    torch.testing.assert_close(prefill, want, atol=0.1, rtol=0.05)


def test_a_lora_update_of_a_sparse_mlp_is_refused(tiny_moe, tmp_path):
    _, directory, _ = tiny_moe
    config = load_model(str(directory), dtype="float32", progress=False).config
    shape = dict(hf_shape(config), intermediate_size=config.moe_intermediate_size)
    sparse = next(i for i in range(config.num_hidden_layers) if config.layer_is_sparse(i))  # (ERNIE 4.5's first: 1)
    make_lora_adapter(tmp_path / "mlp", shape, modules=("gate_proj",), layers=[sparse])
    with pytest.raises(ValueError, match=f"layer {sparse}'s gate_proj: that layer's MLP is a mixture of experts"):
        load_lora_adapter("mlp", str(tmp_path / "mlp"), config, max_lora_rank=16, dtype=torch.bfloat16)
    make_lora_adapter(tmp_path / "attn", shape, modules=("q_proj", "v_proj"))
    assert load_lora_adapter("attn", str(tmp_path / "attn"), config, max_lora_rank=16, dtype=torch.bfloat16).rank == 4


def test_a_bad_expert_count_is_refused():
    from corellm.model.model_config import ModelConfig

    cfg = dict(architectures=["MixtralForCausalLM"], vocab_size=10, hidden_size=8, intermediate_size=8,
               num_hidden_layers=1, num_attention_heads=2, num_local_experts=2, num_experts_per_tok=3)
    with pytest.raises(ValueError, match=r"num_experts_per_tok \(3\) <= num_experts \(2\)"):
        ModelConfig.from_hf_config(cfg)
    assert dataclasses.replace(ModelConfig.from_hf_config({**cfg, "num_experts_per_tok": 2})).layer_is_sparse(0)
