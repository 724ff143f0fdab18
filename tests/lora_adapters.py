"""PEFT LoRA adapter directories for tests, written as PEFT saves them (adapter_config.json and
adapter_model.safetensors), and the oracle: the HF model with each update merged into its weight
(W + scale * B A), which PEFT's merge_and_unload computes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
PHI3_MODULES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # Phi-3's checkpoints fuse q/k/v and gate/up


def hf_shape(config) -> dict:
    """make_lora_adapter's view (an HF config's sizes) of a corellm ModelConfig."""
    return dict(hidden_size=config.hidden_size, intermediate_size=config.intermediate_size,
                num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                head_dim=config.head_dim, num_hidden_layers=config.num_hidden_layers)


def _module_shapes(config: dict) -> dict[str, tuple[int, int]]:
    """PEFT module -> (out, in) of an HF Llama-family config (a dict)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    q, kv = heads * head_dim, kv_heads * head_dim
    return {"q_proj": (q, hidden), "k_proj": (kv, hidden), "v_proj": (kv, hidden), "o_proj": (hidden, q),
            "gate_proj": (inter, hidden), "up_proj": (inter, hidden), "down_proj": (hidden, inter),
            "qkv_proj": (q + 2 * kv, hidden), "gate_up_proj": (2 * inter, hidden)}


def make_lora_adapter(directory: Path, config: dict, rank: int = 4, alpha: float = 8.0,
                      modules: tuple[str, ...] = ATTENTION + MLP, layers: list[int] | None = None, seed: int = 0,
                      std: float = 0.1, use_rslora: bool = False, extra_config: dict | None = None,
                      decoder: str = "base_model.model.model") -> dict:
    """Writes a random adapter for a model of HF `config` into `directory`; returns its updates
    {(layer, module): (A [rank, in], B [out, rank], scale)} in float32. decoder: where PEFT names
    the decoder layers (an image model's language model: base_model.model.model.language_model)."""
    directory.mkdir(parents=True, exist_ok=True)
    shapes = _module_shapes(config)
    g = torch.Generator().manual_seed(seed)
    layers = list(range(config["num_hidden_layers"])) if layers is None else layers
    tensors, updates = {}, {}
    scale = alpha / rank ** 0.5 if use_rslora else alpha / rank
    for layer in layers:
        for module in modules:
            out, inp = shapes[module]
            a = torch.randn(rank, inp, generator=g) * std
            b = torch.randn(out, rank, generator=g) * std  # PEFT starts B at zero; a trained one is not
            part = "self_attn" if module in ATTENTION + ("qkv_proj",) else "mlp"
            prefix = f"{decoder}.layers.{layer}.{part}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = a.to(torch.bfloat16)
            tensors[f"{prefix}.lora_B.weight"] = b.to(torch.bfloat16)
            updates[(layer, module)] = (a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float(), scale)
    adapter_config = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(modules),
                      "use_rslora": use_rslora, "bias": "none", "use_dora": False, "fan_in_fan_out": False,
                      "modules_to_save": None, "task_type": "CAUSAL_LM", **(extra_config or {})}
    (directory / "adapter_config.json").write_text(json.dumps(adapter_config))
    save_file(tensors, str(directory / "adapter_model.safetensors"))
    return updates


def merged(hf_model, updates: dict):
    """A copy of the HF model (a causal LM, or an image model's language model) with every update
    merged into its weight (float32)."""
    model = copy.deepcopy(hf_model).float()
    decoder = getattr(model.model, "language_model", model.model)
    layers = decoder.layers
    with torch.no_grad():
        for (layer, module), (a, b, scale) in updates.items():
            part = layers[layer].self_attn if module in ATTENTION + ("qkv_proj",) else layers[layer].mlp
            getattr(part, module).weight += scale * (b.double() @ a.double()).float()
    return model
