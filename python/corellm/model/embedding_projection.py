"""EmbeddingProjection: the Dense layers a sentence-transformers model applies to its pooled vector
(LaBSE's 768 -> 768 tanh, the stella / jasper models' 1024- or 8192-wide projections), read from the
model directory's modules.json, computed in fp32 on each pooled vector before a request's
`dimensions` cut and the normalization — where sentence-transformers (and vLLM) apply them.

modules.json lists the model's modules in order; by the last part of each module's type:

    Transformer  the model itself (sentence-transformers' or a model's own, custom_st.Transformer)
    Pooling      1_Pooling/config.json, which pooling_params.pooling_type_of reads
    Dense        {path}/config.json (in_features, out_features, bias, activation_function) and the
                 layer's weights, {path}/model.safetensors (or the older pytorch_model.bin, read
                 with torch.load's weights_only): linear.weight [out, in], linear.bias [out]
    Normalize    the L2 normalization, which corellm does unless a request's `normalize` is false

Any other module transforms the vectors in a way corellm does not compute: a ValueError names it, so
that a model is never served with a step of its pipeline silently skipped."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

# sentence-transformers' Dense activation_function (a torch.nn module's path) -> its function
_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "torch.nn.modules.linear.Identity": lambda v: v,
    "torch.nn.modules.activation.Tanh": torch.tanh,
    "torch.nn.modules.activation.Sigmoid": torch.sigmoid,
    "torch.nn.modules.activation.ReLU": torch.relu,
    "torch.nn.modules.activation.GELU": torch.nn.functional.gelu,
    "torch.nn.modules.activation.SiLU": torch.nn.functional.silu,
}
_PASSING_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class DenseLayer:
    weight: torch.Tensor  # fp32 [out_features, in_features]
    bias: torch.Tensor | None  # fp32 [out_features]
    activation: str  # a key of _ACTIVATIONS


@dataclass(frozen=True)
class EmbeddingProjection:
    layers: tuple[DenseLayer, ...]

    @property
    def in_features(self) -> int:
        return self.layers[0].weight.shape[1]

    @property
    def out_features(self) -> int:
        """The length of the vectors the model gives (before a request's `dimensions`)."""
        return self.layers[-1].weight.shape[0]

    def __call__(self, vector: torch.Tensor) -> torch.Tensor:
        """A pooled vector, fp32 [in_features] (on any device) -> fp32 [out_features] on the CPU."""
        vector = vector.float().cpu()
        for layer in self.layers:
            vector = _ACTIVATIONS[layer.activation](torch.nn.functional.linear(vector, layer.weight, layer.bias))
        return vector

    @classmethod
    def from_model_dir(cls, directory: str | Path, hidden_size: int) -> EmbeddingProjection | None:
        """The directory's Dense layers in modules.json's order, checked to chain from hidden_size;
        None where it lists none (or has no modules.json)."""
        directory = Path(directory)
        listing = directory / "modules.json"
        if not listing.is_file():
            return None
        try:
            modules = json.loads(listing.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{listing}: not valid JSON ({e})") from None
        if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
            raise ValueError(f"{listing}: must list the modules as objects")
        layers: list[DenseLayer] = []
        width = hidden_size
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            if kind in _PASSING_MODULES:
                continue
            if kind != "Dense":
                raise ValueError(f"{listing}: the sentence-transformers module {module.get('type')!r} is not "
                                 f"supported (corellm computes Transformer, Pooling, Dense and Normalize modules)")
            layer = _read_dense(directory / str(module.get("path", "")), width)
            layers.append(layer)
            width = layer.weight.shape[0]
        return cls(tuple(layers)) if layers else None


def _read_dense(folder: Path, in_features: int) -> DenseLayer:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{folder}: a Dense module without its config.json")
    config = json.loads(config_file.read_text())
    if config.get("in_features") != in_features or not isinstance(config.get("out_features"), int):
        raise ValueError(f"{config_file}: a Dense layer here takes in_features {in_features} (the vector before it) "
                         f"and a positive integer out_features; got {config.get('in_features')!r} and "
                         f"{config.get('out_features')!r}")
    activation = config.get("activation_function", "torch.nn.modules.linear.Identity")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{config_file}: activation_function {activation!r} is not supported "
                         f"({', '.join(_ACTIVATIONS)})")
    state = _read_weights(folder)
    out_features, bias = config["out_features"], config.get("bias", True)
    weight = state.get("linear.weight")
    if weight is None or tuple(weight.shape) != (out_features, in_features):
        raise ValueError(f"{folder}: linear.weight must be [{out_features}, {in_features}], got "
                         f"{None if weight is None else tuple(weight.shape)}")
    b = state.get("linear.bias")
    if bias and (b is None or tuple(b.shape) != (out_features,)):
        raise ValueError(f"{folder}: the layer has a bias (config.json); linear.bias must be [{out_features}], got "
                         f"{None if b is None else tuple(b.shape)}")
    return DenseLayer(weight.float().contiguous(), b.float().contiguous() if bias else None, activation)


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        return load_file(str(folder / "model.safetensors"))
    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ValueError(f"{folder}: a Dense module without its weights (model.safetensors or pytorch_model.bin)")
