"""The vision tower of a LLaVA-style model: a ViT encoder as CLIP's and SigLIP's vision models
build it (HF's CLIPVisionModel / SiglipVisionModel), run up to the layer whose output the model
takes (vision_feature_layer), on a batch of preprocessed images.

    pixel_values [images, 3, H, W]
      -> patch embedding (a conv with stride = patch size) [images, patches, hidden]
      -> CLIP: a class token first; + position embeddings; CLIP: pre-layernorm
      -> encoder layers: x += attn(layer_norm1(x)); x += mlp(layer_norm2(x))   (full attention)
      -> the hidden states after layer `vision_feature_layer` (HF's hidden_states[layer]).

Weights keep their HF names under the tower (embeddings.*, pre_layrnorm.*, encoder.layers.N.*);
the projections are corellm's Linear layers (q, k and v fused into one; on the CPU in bf16 the
packed, batch-invariant GEMM), the rest plain torch ops, in the model's dtype, on its device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from corellm.model.layers import Linear
from corellm.model.model_config import UnsupportedModelError

_ACTIVATIONS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
}
_TOWER_TYPES = ("clip_vision_model", "siglip_vision_model")


@dataclass(frozen=True)
class VisionConfig:
    model_type: str  # clip_vision_model or siglip_vision_model
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    hidden_act: str = "quick_gelu"
    layer_norm_eps: float = 1e-5

    @classmethod
    def from_hf(cls, cfg: dict[str, Any], source: str) -> VisionConfig:
        model_type = cfg.get("model_type", "clip_vision_model")
        if model_type not in _TOWER_TYPES:
            raise UnsupportedModelError(f"{source}: vision tower {model_type!r} is not supported ({', '.join(_TOWER_TYPES)})")
        clip = model_type == "clip_vision_model"
        act = cfg.get("hidden_act", "quick_gelu" if clip else "gelu_pytorch_tanh")
        if act not in _ACTIVATIONS:
            raise UnsupportedModelError(f"{source}: vision activation {act!r} is not supported ({', '.join(_ACTIVATIONS)})")
        config = cls(model_type=model_type, hidden_size=cfg.get("hidden_size", 1024 if clip else 768),
                     intermediate_size=cfg.get("intermediate_size", 4096 if clip else 3072),
                     num_hidden_layers=cfg.get("num_hidden_layers", 24 if clip else 12),
                     num_attention_heads=cfg.get("num_attention_heads", 16 if clip else 12),
                     image_size=cfg.get("image_size", 336 if clip else 224), patch_size=cfg.get("patch_size", 14 if clip else 16),
                     num_channels=cfg.get("num_channels", 3), hidden_act=act,
                     layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-5 if clip else 1e-6)))
        if config.hidden_size % config.num_attention_heads or config.image_size % config.patch_size:
            raise ValueError(f"{source}: vision hidden_size {config.hidden_size} must divide into "
                             f"{config.num_attention_heads} heads and image_size {config.image_size} into patches of "
                             f"{config.patch_size}")
        return config

    @property
    def has_class_token(self) -> bool:  # CLIP: a class token before the patches, and a pre-layernorm
        return self.model_type == "clip_vision_model"

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_positions(self) -> int:
        return self.num_patches + (1 if self.has_class_token else 0)


class VisionTower:
    def __init__(self, config: VisionConfig, feature_layer: int, dtype: torch.dtype, device: torch.device):
        """feature_layer: HF's vision_feature_layer (negative counts from the end: -1 the last
        layer's output, -2 the one before; 0 the embeddings). Layers past it are not loaded."""
        self.config = config
        self.dtype, self.device = dtype, device
        total = config.num_hidden_layers
        index = feature_layer if feature_layer >= 0 else total + 1 + feature_layer
        if not 0 <= index <= total:
            raise ValueError(f"vision_feature_layer {feature_layer} is outside the tower's {total} layers")
        self.num_layers_used = index
        self.weights: dict[str, torch.Tensor] = {}  # embeddings and norms, by HF name
        h, i = config.hidden_size, config.intermediate_size
        # Per layer: the projections, q / k / v fused into qkv ([3h, h]: q rows, then k, then v).
        self.linears = [{"qkv": Linear(3 * h, h, True, dtype, device), "out_proj": Linear(h, h, True, dtype, device),
                         "fc1": Linear(i, h, True, dtype, device), "fc2": Linear(h, i, True, dtype, device)}
                        for _ in range(index)]

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        """The tensors this tower loads, by their HF name under the tower, with their shapes."""
        c = self.config
        h, i = c.hidden_size, c.intermediate_size
        shapes: dict[str, tuple[int, ...]] = {
            "embeddings.patch_embedding.weight": (h, c.num_channels, c.patch_size, c.patch_size),
            "embeddings.position_embedding.weight": (c.num_positions, h),
        }
        if c.has_class_token:
            shapes["embeddings.class_embedding"] = (h,)
            shapes["pre_layrnorm.weight"] = shapes["pre_layrnorm.bias"] = (h,)
        else:
            shapes["embeddings.patch_embedding.bias"] = (h,)
        for n in range(self.num_layers_used):
            p = f"encoder.layers.{n}."
            for norm in ("layer_norm1", "layer_norm2"):
                shapes[p + norm + ".weight"] = shapes[p + norm + ".bias"] = (h,)
            for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
                shapes[p + f"self_attn.{proj}.weight"] = (h, h)
                shapes[p + f"self_attn.{proj}.bias"] = (h,)
            shapes[p + "mlp.fc1.weight"], shapes[p + "mlp.fc1.bias"] = (i, h), (i,)
            shapes[p + "mlp.fc2.weight"], shapes[p + "mlp.fc2.bias"] = (h, i), (h,)
        return shapes

    def is_unused(self, name: str) -> bool:
        """A tensor of the tower this model never runs (layers past the feature layer, the post
        layernorm, SigLIP's pooling head), or a buffer older checkpoints saved (position_ids)."""
        if name.startswith(("post_layernorm.", "head.")) or name == "embeddings.position_ids":
            return True
        if name.startswith("encoder.layers."):
            return int(name.split(".")[2]) >= self.num_layers_used
        return False

    def load(self, name: str, tensor: torch.Tensor) -> None:
        """One tensor by its HF name (its shape checked by the caller against expected_shapes)."""
        if not name.startswith("encoder.layers."):
            self.weights[name] = tensor.to(device=self.device, dtype=self.dtype)
            return
        _, _, layer, *rest = name.split(".")
        module, kind = ".".join(rest[:-1]), rest[-1]
        if module.startswith("layer_norm"):
            self.weights[name] = tensor.to(device=self.device, dtype=self.dtype)
            return
        proj = module.split(".")[-1]  # q_proj, k_proj, v_proj, out_proj, fc1, fc2
        rows = tensor.shape[0]
        linear, offset = self.linears[int(layer)].get(proj), 0
        if linear is None:  # q, k or v: a third of qkv
            linear, offset = self.linears[int(layer)]["qkv"], ("q_proj", "k_proj", "v_proj").index(proj) * rows
        if kind == "weight":
            linear.load(offset, tensor)
        else:
            linear.bias[offset : offset + rows].copy_(tensor)

    def finalize(self) -> None:
        """Lays the projections out for the kernels, once every tensor is loaded."""
        for layer in self.linears:
            for linear in layer.values():
                linear.finalize()

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [images, channels, H, W] -> [images, positions, hidden] (the feature layer's
        output: with CLIP's class token first)."""
        c, w = self.config, self.weights
        x = F.conv2d(pixel_values.to(self.device, self.dtype), w["embeddings.patch_embedding.weight"],
                     w.get("embeddings.patch_embedding.bias"), stride=c.patch_size)
        x = x.flatten(2).transpose(1, 2)  # [images, patches, hidden]
        if c.has_class_token:
            cls = w["embeddings.class_embedding"].expand(x.shape[0], 1, -1)
            x = torch.cat([cls, x], dim=1)
        x = x + w["embeddings.position_embedding.weight"]
        if c.has_class_token:
            x = F.layer_norm(x, (c.hidden_size,), w["pre_layrnorm.weight"], w["pre_layrnorm.bias"], c.layer_norm_eps)
        for n in range(self.num_layers_used):
            x = self._layer(x, n)
        return x

    def _layer(self, x: torch.Tensor, n: int) -> torch.Tensor:
        c, w, linears = self.config, self.weights, self.linears[n]
        p = f"encoder.layers.{n}."
        heads, eps = c.num_attention_heads, c.layer_norm_eps
        images, positions, hidden = x.shape
        h = F.layer_norm(x, (hidden,), w[p + "layer_norm1.weight"], w[p + "layer_norm1.bias"], eps)
        qkv = linears["qkv"](h.reshape(-1, hidden))  # [images * positions, 3 * hidden]
        q, k, v = (t.reshape(images, positions, heads, hidden // heads).transpose(1, 2)
                   for t in qkv.split(hidden, dim=1))  # each [images, heads, positions, head_dim]
        attn = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(-1, hidden)
        x = x + linears["out_proj"](attn).view(images, positions, hidden)
        h = F.layer_norm(x, (hidden,), w[p + "layer_norm2.weight"], w[p + "layer_norm2.bias"], eps)
        h = _ACTIVATIONS[c.hidden_act](linears["fc1"](h.reshape(-1, hidden)))
        return x + linears["fc2"](h).view(images, positions, hidden)
