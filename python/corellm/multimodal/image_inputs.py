"""ImageInputs: a prompt's images made into what the engine carries — each image token in the
prompt expanded to the model's placeholder count, and one MultiModalFeature per image (pixels,
placeholder range, content hash). The InputProcessor calls it for prompts with
multi_modal_data; every error is a ValueError naming the image."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from corellm.multimodal.features import MultiModalFeature, image_hash
from corellm.multimodal.image_loader import ImageLimits, load_image
from corellm.multimodal.image_processor import ImageProcessor


class ImageInputs:
    def __init__(self, processor: ImageProcessor, image_token_id: int, tokens_per_image: int,
                 limit_per_prompt: int = 1, limits: ImageLimits | None = None):
        self.processor = processor
        self.image_token_id = image_token_id
        self.tokens_per_image = tokens_per_image
        self.limit_per_prompt = limit_per_prompt  # --limit-mm-per-prompt image=N
        self.limits = limits or ImageLimits()

    def apply(self, ids: list[int], images: Sequence[object],
              names: Sequence[str] | None = None) -> tuple[list[int], list[MultiModalFeature]]:
        """ids hold one image token per image, in order: each becomes tokens_per_image of them.
        names: how errors call each image (default "image i")."""
        names = list(names) if names is not None else [f"image {i}" for i in range(len(images))]
        if len(images) > self.limit_per_prompt:
            raise ValueError(f"a prompt may carry at most {self.limit_per_prompt} image"
                             f"{'s' if self.limit_per_prompt != 1 else ''} (--limit-mm-per-prompt); got {len(images)}")
        slots = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if len(slots) != len(images):
            raise ValueError(f"the prompt has {len(slots)} image placeholder token"
                             f"{'s' if len(slots) != 1 else ''} (id {self.image_token_id}) for {len(images)} "
                             f"image{'s' if len(images) != 1 else ''}: put one where each image goes")
        pixels = []
        hashes = []
        for item, name in zip(images, names):
            image = load_image(item, name, self.limits)
            hashes.append(image_hash(image))
            pixels.append(torch.from_numpy(self.processor(image)))
        expanded: list[int] = []
        features = []
        previous = 0
        for slot, p, h in zip(slots, pixels, hashes):
            expanded += ids[previous:slot]
            features.append(MultiModalFeature(p, len(expanded), self.tokens_per_image, h))
            expanded += [self.image_token_id] * self.tokens_per_image
            previous = slot + 1
        expanded += ids[previous:]
        return expanded, features
