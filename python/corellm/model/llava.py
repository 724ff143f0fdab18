"""LLaVA-style models (HF model_type "llava"): a vision tower (CLIP or SigLIP), a two-layer
projector into the decoder's hidden size, and a Llama / Mistral / Qwen2 decoder.

An image becomes `tokens_per_image` placeholder tokens in the prompt (the image token repeated);
the model runner encodes the image (encode_images: tower, then projector), and the decoder reads
the projected rows in place of the placeholders' embeddings (embed_with_image_rows, then forward's
inputs_embeds) — HF's masked_scatter of the image features into the text embeddings.

Under tensor parallelism the decoder is sharded as a plain Llama's; the tower and the projector
are whole on rank 0 and absent elsewhere: rank 0 encodes the images and sends each step's image
rows to the other ranks with the step (worker/step_message.py), and every rank merges them into
its (vocabulary-parallel, all-reduced) embedding rows."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from corellm.distributed.parallel_state import TensorParallel
from corellm.model.layers import Linear
from corellm.model.llama import LlamaForCausalLM
from corellm.model.model_config import ModelConfig, UnsupportedModelError
from corellm.model.vision_tower import VisionConfig, VisionTower

# The decoders a LLaVA may carry: text_config's model_type -> the HF architecture corellm runs.
_TEXT_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}
_PROJECTOR_ACTIVATIONS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh")}


def is_llava_config(cfg: dict[str, Any]) -> bool:
    return cfg.get("model_type") == "llava" or "LlavaForConditionalGeneration" in (cfg.get("architectures") or [])


@dataclass(frozen=True)
class LlavaSpec:
    """What config.json says about the image path (the decoder's own config is `text`)."""

    text: ModelConfig
    vision: VisionConfig
    image_token_id: int
    feature_layer: int  # HF's vision_feature_layer
    drop_class_token: bool  # vision_feature_select_strategy "default": the first position is dropped
    projector_activation: str
    projector_bias: bool

    @property
    def tokens_per_image(self) -> int:
        return self.vision.num_positions - (1 if self.drop_class_token else 0)

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str) -> LlavaSpec:
        text_cfg = dict(cfg.get("text_config") or {})
        text_type = text_cfg.get("model_type", "llama")
        if text_type not in _TEXT_ARCHITECTURES:
            raise UnsupportedModelError(f"{source}: a LLaVA decoder of type {text_type!r} is not supported "
                                        f"({', '.join(_TEXT_ARCHITECTURES)})")
        text_cfg.setdefault("architectures", [_TEXT_ARCHITECTURES[text_type]])
        if "tie_word_embeddings" in cfg:
            text_cfg["tie_word_embeddings"] = cfg["tie_word_embeddings"] or text_cfg.get("tie_word_embeddings", False)
        layer = cfg.get("vision_feature_layer", -2)
        if not isinstance(layer, int):
            raise UnsupportedModelError(f"{source}: vision_feature_layer {layer!r}: several feature layers are "
                                        f"not supported (one layer index)")
        strategy = cfg.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise UnsupportedModelError(f"{source}: vision_feature_select_strategy {strategy!r} is not supported "
                                        f"(default or full)")
        activation = cfg.get("projector_hidden_act", "gelu")
        if activation not in _PROJECTOR_ACTIVATIONS:
            raise UnsupportedModelError(f"{source}: projector_hidden_act {activation!r} is not supported "
                                        f"({', '.join(_PROJECTOR_ACTIVATIONS)})")
        image_token = cfg.get("image_token_index", cfg.get("image_token_id"))
        if not isinstance(image_token, int):
            raise ValueError(f"{source}: no image_token_index (the placeholder token's id)")
        return cls(text=ModelConfig.from_hf_config(text_cfg, source),
                   vision=VisionConfig.from_hf(cfg.get("vision_config") or {}, source), image_token_id=image_token,
                   feature_layer=layer, drop_class_token=strategy == "default", projector_activation=activation,
                   projector_bias=bool(cfg.get("multimodal_projector_bias", True)))


def split_llava_name(name: str) -> tuple[str, str]:
    """A checkpoint tensor's part ("text", "vision" or "projector") and its name within the part
    (the text part's names as a plain causal LM's: model.layers..., lm_head.weight). Both layouts
    transformers has written: language_model.model.* / vision_tower.vision_model.* (before v5) and
    model.language_model.* / model.vision_tower.* (v5)."""
    if name.startswith("model.") and name.split(".")[1] in ("language_model", "vision_tower", "multi_modal_projector"):
        name = name[len("model."):]
    if name.startswith("language_model."):
        rest = name[len("language_model."):]
        if rest.startswith(("model.", "lm_head.")):
            return "text", rest
        return "text", "model." + rest
    if name.startswith("vision_tower."):
        rest = name[len("vision_tower."):]
        return "vision", rest[len("vision_model."):] if rest.startswith("vision_model.") else rest
    if name.startswith("multi_modal_projector."):
        return "projector", name[len("multi_modal_projector."):]
    return "text", name  # lm_head.weight at the top level (v5)


class LlavaForConditionalGeneration(LlamaForCausalLM):
    def __init__(self, llava: LlavaSpec, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                 max_position: int | None = None, tp: TensorParallel = TensorParallel(),
                 max_model_len: int | None = None):
        super().__init__(llava.text, dtype, device, max_position=max_position, tp=tp, max_model_len=max_model_len)
        self.llava = llava
        # The image path runs on rank 0 only (see the module's docstring).
        self.vision_tower = VisionTower(llava.vision, llava.feature_layer, dtype, self.device) if tp.rank == 0 else None
        self.projector: dict[str, torch.Tensor] = {}

    def _projector_shapes(self) -> dict[str, tuple[int, ...]]:
        v, t = self.llava.vision.hidden_size, self.config.hidden_size
        shapes: dict[str, tuple[int, ...]] = {"linear_1.weight": (t, v), "linear_2.weight": (t, t)}
        if self.llava.projector_bias:
            shapes["linear_1.bias"] = shapes["linear_2.bias"] = (t,)
        return shapes

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], source: str,
                     scaled_type: str | None = None) -> None:
        """The decoder's tensors go to LlamaForCausalLM.load_weights; the tower's and the
        projector's are checked against their shapes here (ValueError naming the tensor), and
        skipped on a tensor-parallel rank other than 0."""
        tower = self.vision_tower
        expected = ({"vision": tower.expected_shapes(), "projector": self._projector_shapes()}
                    if tower is not None else {})
        loaded: dict[str, set[str]] = {part: set() for part in expected}

        def text_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                part, local = split_llava_name(name)
                if part == "text":
                    yield local, tensor
                    continue
                if tower is None or (part == "vision" and tower.is_unused(local)):
                    continue
                shape = expected[part].get(local)
                if shape is None:
                    raise ValueError(f"{source}: unexpected tensor {name!r} for a LLaVA {part}")
                if tuple(tensor.shape) != shape:
                    raise ValueError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, but the config "
                                     f"implies {shape}")
                if part == "vision":
                    tower.load(local, tensor)
                else:
                    self.projector[local] = tensor.to(device=self.device, dtype=self.dtype)
                loaded[part].add(local)

        super().load_weights(text_weights(), source, scaled_type=scaled_type)
        if tower is not None:
            tower.finalize()
        for part, names in expected.items():
            missing = sorted(set(names) - loaded[part])
            if missing:
                raise ValueError(f"{source}: missing {part} tensors {missing[:3]}"
                                 f"{f' and {len(missing) - 3} more' if len(missing) > 3 else ''}")

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [images, 3, H, W] (preprocessed) -> [images, tokens_per_image, hidden] in
        the model's dtype: the tower's feature layer (without the class token under the "default"
        strategy) through the projector. Rank 0's work under tensor parallelism."""
        if self.vision_tower is None:
            raise RuntimeError(f"tensor-parallel rank {self.tp.rank} holds no vision tower: rank 0 encodes the images")
        features = self.vision_tower.forward(pixel_values)
        if self.llava.drop_class_token:
            features = features[:, 1:]
        p = self.projector
        h = F.linear(features, p["linear_1.weight"], p.get("linear_1.bias"))
        h = _PROJECTOR_ACTIVATIONS[self.llava.projector_activation](h)
        return F.linear(h, p["linear_2.weight"], p.get("linear_2.bias"))

    def embed_with_image_rows(self, input_ids: torch.Tensor, rows: torch.Tensor,
                              image_rows: torch.Tensor) -> torch.Tensor:
        """The decoder's input rows for int32 input_ids [num_tokens] with image_rows [k, hidden]
        (encode_images' rows) in place of rows (int64 [k], the placeholders' flat positions). Every
        rank's call under tensor parallelism (the embedding is all-reduced)."""
        embeds = self.embed_input_ids(input_ids)
        embeds[rows] = image_rows
        return embeds

    def all_linears(self) -> list[Linear]:
        tower = self.vision_tower.linears if self.vision_tower is not None else []
        return super().all_linears() + [linear for layer in tower for linear in layer.values()]

    def other_weights(self) -> list[torch.Tensor]:
        tower = list(self.vision_tower.weights.values()) if self.vision_tower is not None else []
        return super().other_weights() + tower + list(self.projector.values())
