"""EncoderCache: the vision encoder's outputs the model runner holds, by image hash. What it holds
is decided by the scheduler's EncoderCacheManager (cpp/include/corellm/encoder_cache_manager.h):
each step the SchedulerOutput names the images to encode (encoder_hashes) and those to drop
(freed_encoder_hashes); requests carrying the same image share one entry."""

from __future__ import annotations

import torch


class EncoderCache:
    def __init__(self):
        self._outputs: dict[str, torch.Tensor] = {}  # hash -> [placeholder tokens, hidden]
        self.images_encoded = 0  # the encoder's work since start (a reused entry adds nothing)

    def __len__(self) -> int:
        return len(self._outputs)

    def get(self, image_hash: str) -> torch.Tensor:
        output = self._outputs.get(image_hash)
        if output is None:
            raise RuntimeError(f"bug: image {image_hash[:16]} is needed but was neither encoded nor held")
        return output

    def put(self, image_hash: str, output: torch.Tensor) -> None:
        self._outputs[image_hash] = output
        self.images_encoded += 1

    def drop(self, image_hash: str) -> None:
        self._outputs.pop(image_hash, None)
