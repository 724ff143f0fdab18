"""LoraAdapter: a LoRA adapter loaded for a base model — a PEFT directory, or a llama.cpp LoRA GGUF
(gguf_lora.py) — its low-rank updates of the decoder layers' projections, checked against the
model's shapes and laid out for the LoRA kernel (ops.lora_add, and the native decoder stack's
LoraLayer).

A PEFT adapter directory holds adapter_config.json (r, lora_alpha, target_modules, use_rslora,
...) and adapter_model.safetensors, whose tensors are named
    base_model.model.model.layers.{i}.{self_attn|mlp}.{q|k|v|o|gate|up|down}_proj.lora_{A|B}.weight
(an image model's (LLaVA) language model's: base_model.model.model.language_model.layers.{i}...,
or language_model.model.layers.{i}... as transformers before v5 named them) with A [r, in] and B
[out, r]. Each module's update of its output is scale * B A x, scale =
lora_alpha / r (lora_alpha / sqrt(r) with use_rslora). Stored here per layer and fused projection
(qkv: q, k, v parts; gate_up: gate, up parts) as A^T [in, r] and B^T [r, out] in the model's
dtype (bf16: half the bytes a step reads; a bf16 checkpoint's values exactly) with the scale
beside them, as the kernel reads them (cpp/include/corellm/kernels/lora.h), which computes in fp32.

What corellm does not apply is refused by name, never skipped: DoRA, trained biases, modules to
save, updates of the embedding or the LM head or of an image model's vision tower and projector,
alpha_pattern, fan_in_fan_out weights."""

from __future__ import annotations

import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from corellm.model.hf_hub_cache import cached_snapshot, hub_cache_root, looks_like_repo_id
from corellm.model.llava import split_llava_name
from corellm.native import _core

if TYPE_CHECKING:
    from corellm.model.model_config import ModelConfig

# PEFT module name -> (the fused projection, which of its parts); Phi-3's modules are fused in the
# checkpoint already (qkv_proj, gate_up_proj): their update covers the whole projection.
_MODULES = {"q_proj": ("qkv", 0), "k_proj": ("qkv", 1), "v_proj": ("qkv", 2), "o_proj": ("o", 0),
            "gate_proj": ("gate_up", 0), "up_proj": ("gate_up", 1), "down_proj": ("down", 0),
            "qkv_proj": ("qkv", 3), "gate_up_proj": ("gate_up", 2)}
PROJECTIONS = ("qkv", "o", "gate_up", "down")
_TENSOR_NAME = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\."
                          r"lora_([AB])(?:\.default)?\.weight$")
# Config keys whose non-default values change what the adapter computes, and corellm does not do.
_REFUSED_CONFIG = {"use_dora": False, "fan_in_fan_out": False, "modules_to_save": None, "alpha_pattern": {},
                   "bias": "none", "layer_replication": None}
_serials = itertools.count(1)


_WEIGHT_TAGS = {torch.float32: _core.kernels.DTYPE_F32, torch.bfloat16: _core.kernels.DTYPE_BF16}


@dataclass
class LoraPart:
    """One module's update, scale * B A x: output columns [col_offset, col_offset + cols) of its
    fused projection."""

    col_offset: int
    a_t: torch.Tensor  # [in, r]: A transposed (float32 or bfloat16)
    b_t: torch.Tensor  # [r, cols]: B transposed (a_t's dtype)
    scale: float = 1.0

    @property
    def rank(self) -> int:
        return self.a_t.shape[1]


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int  # the largest of its modules' ranks
    # Unique per load: keys its requests' prefix-cache entries (an adapter loaded again under the
    # same name, from other weights, shares no cached block with the old one).
    serial: int
    layers: list[dict[str, list[LoraPart]]]  # per layer: projection -> its parts (absent: no update)
    _native: list | None = field(default=None, repr=False)

    def __getstate__(self) -> dict:
        """Pickled (sent to the other tensor-parallel ranks) without the kernel's view, whose
        addresses are this process's."""
        return {**self.__dict__, "_native": None}

    def linear(self, layer: int, projection: str) -> _core.model.LoraLinear | None:
        """The kernel's view of this adapter's update of a layer's projection (None: it has none)."""
        native = self.native_layers()[layer]
        linear = getattr(native, projection)
        return linear if linear.parts else None

    def native_layers(self) -> list:
        """One _core.model.LoraLayer per layer, made once (its addresses point into this adapter's
        tensors, which it keeps)."""
        if self._native is None:
            layers = []
            for parts_by_projection in self.layers:
                layer = _core.model.LoraLayer()
                for projection in PROJECTIONS:
                    linear = _core.model.LoraLinear()
                    parts = parts_by_projection.get(projection, [])
                    natives = []
                    for p in parts:
                        n = _core.model.LoraPart()
                        n.a_t, n.b_t, n.rank = p.a_t.data_ptr(), p.b_t.data_ptr(), p.rank
                        n.weight_dtype, n.scale = _WEIGHT_TAGS[p.a_t.dtype], p.scale
                        n.col_offset, n.cols = p.col_offset, p.b_t.shape[1]
                        natives.append(n)
                        linear.k = p.a_t.shape[0]
                    linear.parts = natives
                    setattr(layer, projection, linear)
                layers.append(layer)
            self._native = layers
        return self._native


def _part_shapes(config: ModelConfig) -> dict[str, list[tuple[int, int, int]]]:
    """projection -> per part (input width, first output column, output width) of the whole model."""
    q, kv, hidden, inter = config.q_size, config.kv_size, config.hidden_size, config.intermediate_size
    return {"qkv": [(hidden, 0, q), (hidden, q, kv), (hidden, q + kv, kv), (hidden, 0, q + 2 * kv)],
            "o": [(q, 0, hidden)], "gate_up": [(hidden, 0, inter), (hidden, inter, inter), (hidden, 0, 2 * inter)],
            "down": [(inter, 0, hidden)]}


def _read_config(directory: Path, name: str) -> dict:
    path = directory / "adapter_config.json"
    if not path.is_file():
        raise ValueError(f"LoRA adapter {name!r}: {directory} has no adapter_config.json (a PEFT LoRA adapter "
                         f"directory is expected)")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"LoRA adapter {name!r}: cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ValueError(f"LoRA adapter {name!r}: {path} must hold a JSON object")
    peft_type = config.get("peft_type", "LORA")
    if peft_type != "LORA":
        raise ValueError(f"LoRA adapter {name!r}: peft_type {peft_type!r} is not supported (LORA only)")
    for key, default in _REFUSED_CONFIG.items():
        value = config.get(key, default)
        if value not in (default, None) and not (isinstance(default, dict) and not value):
            raise ValueError(f"LoRA adapter {name!r}: {key}={value!r} is not supported by corellm")
    for key in ("r", "lora_alpha"):
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"LoRA adapter {name!r}: adapter_config.json's {key} must be a positive number, "
                             f"got {value!r}")
    return config


# One module's update as read from a file: {"A": [r, in], "B": [out, r]} by (layer, PEFT module name).
Pairs = dict[tuple[int, str], dict[str, torch.Tensor]]


def load_lora_adapter(name: str, path: str, config: ModelConfig, max_lora_rank: int,
                      dtype: torch.dtype = torch.float32) -> LoraAdapter:
    """The adapter at `path` for a model of `config`: a PEFT directory, a Hub id whose snapshot is in
    the local Hugging Face cache (as a model's), or a llama.cpp LoRA GGUF file (gguf_lora.py).
    ValueError naming the adapter and what is wrong (a missing file, an unknown or misshapen tensor,
    a rank above max_lora_rank, an option corellm does not apply). dtype: the matrices' storage
    (the model's: float32 or bfloat16)."""
    if dtype not in _WEIGHT_TAGS:
        raise ValueError(f"LoRA adapter {name!r}: matrices are kept in float32 or bfloat16, not {dtype}")
    where = Path(path).expanduser()
    if where.is_file() and where.suffix.lower() == ".gguf":
        from corellm.lora.gguf_lora import read_gguf_lora

        pairs, alpha = read_gguf_lora(name, where, config)
        return _adapter(name, where, pairs, config, max_lora_rank, dtype,
                        lambda rank: alpha / rank if alpha else 1.0)  # llama.cpp: no alpha, no scaling
    directory = where
    if not directory.is_dir() and looks_like_repo_id(path):  # a Hub id: its snapshot in the local cache
        directory = cached_snapshot(path) or directory
    if not directory.is_dir():
        hub = (f", nor a Hugging Face Hub id in the local cache ({hub_cache_root()}; corellm does not download: "
               f"`hf download {path}` first)") if looks_like_repo_id(path) else ""
        raise ValueError(f"LoRA adapter {name!r}: {path} is not a directory (nor a .gguf file){hub}")
    pairs, adapter_config = _read_peft(name, directory, config)
    alpha = float(adapter_config["lora_alpha"])
    rslora = bool(adapter_config.get("use_rslora", False))
    # Each module scaled by its own rank (PEFT's rank_pattern gives modules ranks of their own).
    return _adapter(name, directory, pairs, config, max_lora_rank, dtype,
                    lambda rank: alpha / math.sqrt(rank) if rslora else alpha / rank)


def _read_peft(name: str, directory: Path, config: ModelConfig) -> tuple[Pairs, dict]:
    """A PEFT adapter directory's updates and its adapter_config.json."""
    from safetensors import safe_open

    adapter_config = _read_config(directory, name)
    weights = directory / "adapter_model.safetensors"
    if not weights.is_file():
        found = "adapter_model.bin (a pickle, which corellm does not load)" if (directory / "adapter_model.bin").is_file() \
            else "no weights"
        raise ValueError(f"LoRA adapter {name!r}: {directory} has no adapter_model.safetensors ({found})")
    pairs: Pairs = {}
    with safe_open(str(weights), framework="pt") as f:
        for tensor_name in f.keys():
            # An adapter of an image model (LLaVA): its language model's updates by a causal LM's names
            part, local = split_llava_name(tensor_name.removeprefix("base_model.model."))
            if part != "text":
                raise ValueError(f"LoRA adapter {name!r}: tensor {tensor_name!r} updates the image model's {part} "
                                 f"(vision tower or projector), which corellm does not apply (only the language "
                                 f"model's decoder layers)")
            m = _TENSOR_NAME.match(local)
            if m is None or m.group(2) not in _MODULES:
                raise ValueError(f"LoRA adapter {name!r}: tensor {tensor_name!r} is not an update corellm applies "
                                 f"(only the decoder layers' {', '.join(_MODULES)})")
            pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = f.get_tensor(tensor_name)
    if not pairs:
        raise ValueError(f"LoRA adapter {name!r}: {weights} holds no LoRA tensors")
    return pairs, adapter_config


def _adapter(name: str, source: Path, pairs: Pairs, config: ModelConfig, max_lora_rank: int, dtype: torch.dtype,
             scale_of) -> LoraAdapter:
    """The adapter of the updates `pairs`, each checked against the model's shapes and max_lora_rank;
    scale_of(rank): a module's scale."""
    shapes = _part_shapes(config)
    layers: list[dict[str, list[LoraPart]]] = [{} for _ in range(config.num_hidden_layers)]
    top_rank = 0
    for (layer, module), ab in sorted(pairs.items()):
        where = f"LoRA adapter {name!r}: layer {layer}'s {module}"
        if layer >= config.num_hidden_layers:
            raise ValueError(f"{where}: the model has {config.num_hidden_layers} layers")
        if set(ab) != {"A", "B"}:
            raise ValueError(f"{where} has lora_{''.join(ab)} without its lora_{'B' if 'A' in ab else 'A'}")
        projection, index = _MODULES[module]
        if projection in ("gate_up", "down") and config.layer_is_sparse(layer):
            raise ValueError(f"{where}: that layer's MLP is a mixture of experts, whose updates corellm does not "
                             f"apply (only the attention's q/k/v/o)")
        width_in, col_offset, width_out = shapes[projection][index]
        a, b = ab["A"], ab["B"]
        rank = a.shape[0]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != width_in or b.shape != (width_out, rank):
            raise ValueError(f"{where}: lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} do not fit the model "
                             f"(expected ({rank}, {width_in}) and ({width_out}, {rank}))")
        if rank > max_lora_rank:
            raise ValueError(f"{where} has rank {rank}, above max_lora_rank ({max_lora_rank})")
        top_rank = max(top_rank, rank)
        part = LoraPart(col_offset, a.to(dtype).t().contiguous(), b.to(dtype).t().contiguous(), scale_of(rank))
        layers[layer].setdefault(projection, []).append(part)
    for layer, layer_parts in enumerate(layers):
        for projection, parts in layer_parts.items():
            parts.sort(key=lambda p: p.col_offset)
            for before, after in zip(parts, parts[1:]):
                if before.col_offset + before.b_t.shape[1] > after.col_offset:
                    raise ValueError(f"LoRA adapter {name!r}: layer {layer}'s {projection} updates overlap (a fused "
                                     f"module and one of its parts both updated)")
    return LoraAdapter(name=name, path=str(source), rank=top_rank, serial=next(_serials), layers=layers)
