"""Image preprocessing as the model's HF image processor does it (CLIPImageProcessor,
SiglipImageProcessor and kin, read from preprocessor_config.json or processor_config.json), with
Pillow and NumPy: convert to RGB (over white where transparent), resize (shortest edge, or to a fixed height and width; PIL's
filter), center crop, rescale, normalize, channels first.
tests/multimodal/test_image_processor.py holds it equal to transformers' own."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class ImageProcessor:
    shortest_edge: int | None  # resize so that the shorter side is this long, or
    height: int | None  # ... to exactly height x width
    width: int | None
    resample: int  # PIL's filter number (3: bicubic, 2: bilinear)
    crop: tuple[int, int] | None  # center crop (height, width), or None
    rescale_factor: float | None  # multiply by this (1/255), or None
    mean: tuple[float, float, float] | None  # normalize: (x - mean) / std per channel, or None
    std: tuple[float, float, float] | None
    convert_rgb: bool = True

    @classmethod
    def from_dict(cls, cfg: dict[str, Any], image_size: int) -> ImageProcessor:
        """An HF image processor config; image_size (the vision tower's) when it gives no size."""
        size = cfg.get("size", {"shortest_edge": image_size}) if cfg.get("do_resize", True) else {}
        if isinstance(size, int):
            size = {"shortest_edge": size}
        crop = cfg.get("crop_size") if cfg.get("do_center_crop", False) else None
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        normalize = cfg.get("do_normalize", True)
        return cls(shortest_edge=size.get("shortest_edge"), height=size.get("height"), width=size.get("width"),
                   resample=int(cfg.get("resample", 3)),
                   crop=(int(crop["height"]), int(crop["width"])) if crop else None,
                   rescale_factor=float(cfg.get("rescale_factor", 1 / 255)) if cfg.get("do_rescale", True) else None,
                   mean=tuple(cfg.get("image_mean", _CLIP_MEAN)) if normalize else None,
                   std=tuple(cfg.get("image_std", _CLIP_STD)) if normalize else None,
                   convert_rgb=bool(cfg.get("do_convert_rgb", True)))

    @classmethod
    def from_dir(cls, path: Path, image_size: int) -> ImageProcessor:
        """The model directory's preprocessor_config.json, else processor_config.json's
        "image_processor", else CLIP's defaults at the tower's image size."""
        for name, key in (("preprocessor_config.json", None), ("processor_config.json", "image_processor")):
            file = Path(path) / name
            if file.is_file():
                try:
                    cfg = json.loads(file.read_text())
                except json.JSONDecodeError as e:
                    raise ValueError(f"{file}: not valid JSON ({e})") from None
                cfg = cfg.get(key, {}) if key else cfg
                if cfg:
                    return cls.from_dict(cfg, image_size)
        return cls.from_dict({"size": {"shortest_edge": image_size}, "do_center_crop": True,
                              "crop_size": {"height": image_size, "width": image_size}}, image_size)

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of this size is resized to (HF's rule: the short side to
        shortest_edge, the long one scaled and truncated)."""
        if self.shortest_edge is None:
            return (self.height or height, self.width or width)
        short, long = (width, height) if width <= height else (height, width)
        new_long = int(self.shortest_edge * long / short)
        return (new_long, self.shortest_edge) if width <= height else (self.shortest_edge, new_long)

    def __call__(self, image) -> np.ndarray:
        """A PIL image -> float32 [3, H, W]."""
        if self.convert_rgb and image.mode != "RGB":
            image = to_rgb(image)
        if self.shortest_edge is not None or self.height is not None:
            height, width = self.output_size(image.height, image.width)
            if (height, width) != (image.height, image.width):
                image = image.resize((width, height), resample=self.resample)
        x = np.asarray(image)
        if x.ndim == 2:
            x = x[:, :, None]
        x = x.transpose(2, 0, 1)  # [channels, H, W]
        if self.crop is not None:
            x = center_crop(x, *self.crop)
        x = x.astype(np.float64) * self.rescale_factor if self.rescale_factor is not None else x.astype(np.float64)
        x = x.astype(np.float32)
        if self.mean is not None:
            mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.std, dtype=np.float32)[:, None, None]
            x = (x - mean) / std
        return np.ascontiguousarray(x, dtype=np.float32)


def to_rgb(image):
    """An image in RGB; transparency composited over white (as HF's convert_to_rgb does)."""
    from PIL import Image

    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


def center_crop(x: np.ndarray, height: int, width: int) -> np.ndarray:
    """x [C, H, W] cropped to the center height x width, padded with zeros where it is smaller
    (HF's center_crop)."""
    _, h, w = x.shape
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return x[:, top : top + height, left : left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((x.shape[0], new_h, new_w), dtype=x.dtype)
    pad_top, pad_left = -(-(new_h - h) // 2), -(-(new_w - w) // 2)
    padded[:, pad_top : pad_top + h, pad_left : pad_left + w] = x
    top, left = top + pad_top, left + pad_left
    return padded[:, max(0, top) : min(new_h, top + height), max(0, left) : min(new_w, left + width)]
