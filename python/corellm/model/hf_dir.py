"""An HF model directory: config.json, *.safetensors (one file or sharded with an index),
tokenizer files, generation_config.json. Safetensors only: pickled weights are never loaded."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from corellm.model.llava import LlavaSpec, is_llava_config
from corellm.model.encoder_config import ENCODER_ARCHITECTURES, EncoderConfig
from corellm.model.matryoshka import read_matryoshka_dimensions
from corellm.model.model_config import ModelConfig
from corellm.multimodal.image_processor import ImageProcessor
from corellm.tokenizer import Tokenizer

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def with_overrides(cfg: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """cfg with overrides set over it (vLLM's hf_overrides): a dict value that meets a dict updates it
    in turn; any other value replaces the field."""
    merged = dict(cfg)
    for key, value in overrides.items():
        merged[key] = with_overrides(merged[key], value) if isinstance(value, dict) and isinstance(
            merged.get(key), dict) else value
    return merged


class HFModelDir:
    def __init__(self, path: str | Path, hf_overrides: dict[str, Any] | None = None):
        """hf_overrides: fields set over config.json as it is read (with_overrides)."""
        self.path = Path(path)
        if not (self.path / "config.json").is_file():
            raise FileNotFoundError(f"{self.path}: no config.json (not an HF model directory)")
        self.hf_overrides = hf_overrides or {}
        self.files = self._safetensors_files()

    def _config_json(self) -> dict[str, Any]:
        return with_overrides(_read_json(self.path / "config.json"), self.hf_overrides)

    def _safetensors_files(self) -> list[Path]:
        index = self.path / "model.safetensors.index.json"
        if index.exists():
            weight_map = _read_json(index).get("weight_map") or {}
            files = sorted({self.path / f for f in weight_map.values()})
            missing = [str(f) for f in files if not f.exists()]
            if missing:
                raise FileNotFoundError(f"{index}: lists shards that do not exist: {missing}")
            return files
        files = sorted(self.path.glob("*.safetensors"))
        if not files:
            pickles = [p.name for p in self.path.iterdir() if p.suffix in _PICKLE_SUFFIXES]
            hint = f" (found {pickles}: pickled weights are not loaded, convert them to safetensors)" if pickles else ""
            raise FileNotFoundError(f"{self.path}: no *.safetensors weights{hint}")
        return files

    def config(self) -> ModelConfig | EncoderConfig:
        """The decoder's configuration (a LLaVA's text_config), or an encoder-only model's."""
        llava = self.llava_spec()
        if llava is not None:
            return llava.text
        source = str(self.path / "config.json") + (" (with hf_overrides)" if self.hf_overrides else "")
        cfg = self._config_json()
        if (cfg.get("architectures") or [None])[0] in ENCODER_ARCHITECTURES:
            sentence = self.path / "sentence_bert_config.json"
            config = EncoderConfig.from_hf_config(cfg, source, _read_json(sentence) if sentence.is_file() else None)
        else:
            config = ModelConfig.from_hf_config(cfg, source)
        dimensions = read_matryoshka_dimensions(cfg, source, config.hidden_size)
        return config if dimensions is None else dataclasses.replace(config, matryoshka_dimensions=dimensions)

    def llava_spec(self) -> LlavaSpec | None:
        """The image path of a LLaVA-style model (model_type "llava"), or None."""
        cfg = self._config_json()
        return LlavaSpec.from_hf_config(cfg, str(self.path / "config.json")) if is_llava_config(cfg) else None

    def image_processor(self, image_size: int) -> ImageProcessor:
        return ImageProcessor.from_dir(self.path, image_size)

    def generation_config(self) -> dict[str, Any]:
        path = self.path / "generation_config.json"
        return _read_json(path) if path.exists() else {}

    def tokenizer(self) -> Tokenizer:
        return Tokenizer.from_hf_dir(self.path)

    def weights(self, dtype: torch.dtype, progress: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open
        from tqdm import tqdm

        with tqdm(total=None, desc=f"Loading {self.path.name}", unit="tensor", disable=not progress,
                  leave=False) as bar:
            for file in self.files:
                try:
                    handle = safe_open(str(file), framework="pt")
                except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
                    raise ValueError(f"{file}: not a readable safetensors file ({e})") from None
                with handle as f:
                    for name in f.keys():
                        bar.update(1)
                        yield name, f.get_tensor(name).to(dtype)
