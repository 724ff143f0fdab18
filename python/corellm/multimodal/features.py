"""MultiModalFeature: what a request carries for each image (EngineCoreRequest.mm_features, seed
000's mm_features): the preprocessed pixels, where its placeholder tokens sit in the prompt, and
the blake3 hash of its content — the key of the encoder cache and of the prefix-cache blocks that
cover its placeholders."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class MultiModalFeature:
    pixel_values: torch.Tensor  # float32 [3, H, W], as the model's image processor makes them
    offset: int  # the first placeholder token's position in the prompt
    length: int  # placeholder tokens: the encoder's output rows for this image
    hash: str  # blake3 of the image's content (hex)

    @property
    def end(self) -> int:
        return self.offset + self.length


def image_hash(image) -> str:
    """blake3 over a PIL image's mode, size and pixels: equal images, however they were encoded
    (PNG or JPEG bytes, a data URL, a PIL object), hash alike."""
    from blake3 import blake3

    h = blake3()
    h.update(f"{image.mode}:{image.width}x{image.height}:".encode())
    h.update(image.tobytes())
    return h.hexdigest()
