"""A mixture of experts' fields of a ModelConfig, read from an HF config.json: how many experts, how
many a token runs, their width, which layers stay dense, the shared expert, and how the router
chooses and weighs (model/layers.py's SparseMoe and the native stack compute them)."""

from __future__ import annotations

from typing import Any

from corellm.model.config_checks import UnsupportedModelError


def _ernie_experts(cfg: dict[str, Any], layers: int, source: str) -> dict[str, Any]:
    """ERNIE 4.5's mixture of experts (Ernie4_5_MoeForCausalLM): moe_num_experts experts of
    moe_intermediate_size, moe_k a token; the layers from moe_layer_start_index to
    moe_layer_end_index (-1: the last), every moe_layer_interval-th, sparse, the others dense MLPs
    of intermediate_size; moe_num_shared_experts shared experts run as one ungated MLP of their summed
    width; the choice by p + each expert's correction bias, the weights renormalized (by at least
    moe_norm_min)."""
    experts, top_k = cfg.get("moe_num_experts", 64), cfg.get("moe_k", 6)
    start, end = cfg.get("moe_layer_start_index", 1), cfg.get("moe_layer_end_index", -1)
    interval = cfg.get("moe_layer_interval", 1)
    if isinstance(start, list) or isinstance(end, list) or isinstance(experts, list):  # (the VL models' pairs)
        raise UnsupportedModelError(f"{source}: per-modality experts (lists in moe_num_experts or the layer "
                                    f"indices: ERNIE 4.5's vision-language models) are not supported")
    end = layers - 1 if end == -1 else end
    for name, value in (("moe_num_experts", experts), ("moe_k", top_k), ("moe_layer_interval", interval)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{source}: {name} must be a positive integer, got {value!r}")
    dense = tuple(i for i in range(layers) if not ((i + 1) % interval == 0 and start <= i <= end))
    shared = int(cfg.get("moe_num_shared_experts", 0) or 0) * cfg["moe_intermediate_size"]
    return dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=cfg["moe_intermediate_size"],
                norm_topk_prob=True, dense_layers=dense, shared_expert_intermediate_size=shared,
                shared_expert_gated=False, moe_selection_bias=True,
                moe_renormalize_min=float(cfg.get("moe_norm_min", 1e-12)))


def expert_fields(cfg: dict[str, Any], family: str, source: str) -> dict[str, Any]:
    """The mixture-of-experts fields of an HF config (none for a dense family). Mixtral and
    Granite-MoE: every layer sparse, experts of intermediate_size, weights always renormalized. Qwen3-MoE, Qwen2-MoE
    and OLMoE: experts of moe_intermediate_size (OLMoE's: intermediate_size); a layer is dense
    when listed in mlp_only_layers or off the decoder_sparse_step; norm_topk_prob as the config
    says (transformers' default: False); Qwen2-MoE's shared expert of
    shared_expert_intermediate_size. gpt-oss: every layer sparse, experts of intermediate_size, biases
    on the router and the experts."""
    if family not in ("mixtral", "qwen3_moe", "qwen2_moe", "olmoe", "granitemoe", "ernie4_5_moe", "gpt_oss"):
        return {}
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
    layers = cfg["num_hidden_layers"]
    if family == "ernie4_5_moe":
        return _ernie_experts(cfg, layers, source)
    if family in ("mixtral", "granitemoe"):  # (Granite's MoE: softmax over the top k, the same weights)
        return dict(num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok", 2),
                    moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=True)
    if family == "gpt_oss":  # a softmax over the top k's logits (the renormalized weights), biases everywhere
        return dict(num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok", 4),
                    moe_intermediate_size=cfg["intermediate_size"], norm_topk_prob=True, moe_router_bias=True,
                    expert_bias=True)
    step = cfg.get("decoder_sparse_step", 1) or 1
    only_mlp = set(cfg.get("mlp_only_layers") or [])
    dense = tuple(i for i in range(layers) if i in only_mlp or not (experts > 0 and (i + 1) % step == 0))
    return dict(num_experts=experts, num_experts_per_tok=cfg.get("num_experts_per_tok", 2),
                moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg["intermediate_size"],
                norm_topk_prob=bool(cfg.get("norm_topk_prob", False)), dense_layers=dense,
                shared_expert_intermediate_size=int(cfg.get("shared_expert_intermediate_size") or 0)
                if family == "qwen2_moe" else 0)
