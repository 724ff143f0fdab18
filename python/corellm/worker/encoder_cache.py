"""EncoderCache: the vision encoder's outputs by image hash, kept while a request still has
placeholders of that image to compute (seed 000's EncoderCacheManager). A request takes a
reference when a step reaches its image and drops it once its computed tokens pass the image, or
when it finishes or is preempted; an image nobody references is freed. Requests carrying the same
image (the same hash) share one entry: the second finds it and skips the encoder (a hit)."""

from __future__ import annotations

import torch


class EncoderCache:
    def __init__(self):
        self._outputs: dict[str, torch.Tensor] = {}  # hash -> [placeholder tokens, hidden]
        self._users: dict[str, set[str]] = {}  # hash -> ids of the requests holding it
        self._pending: set[str] = set()  # acquired, to be encoded by the step that acquired them
        self.images_encoded = 0  # the encoder's work since start (a hit adds nothing)
        self.hits = 0  # images found here when a step needed them

    def __contains__(self, image_hash: str) -> bool:
        return image_hash in self._outputs

    def __len__(self) -> int:
        return len(self._outputs)

    def get(self, image_hash: str) -> torch.Tensor:
        return self._outputs[image_hash]

    def put(self, image_hash: str, output: torch.Tensor) -> None:
        """An image just encoded; its users are those that acquired it this step."""
        self._outputs[image_hash] = output
        self._pending.discard(image_hash)
        self.images_encoded += 1

    def acquire(self, request_id: str, image_hash: str) -> bool:
        """The request needs this image's rows: True when the caller must encode the image (put),
        False when they are cached or another request of the step is having them encoded (a hit)."""
        self._users.setdefault(image_hash, set()).add(request_id)
        if image_hash in self._outputs or image_hash in self._pending:
            self.hits += 1
            return False
        self._pending.add(image_hash)
        return True

    def release(self, request_id: str, image_hash: str) -> None:
        users = self._users.get(image_hash)
        if users is None:
            return
        users.discard(request_id)
        if not users:
            del self._users[image_hash]
            self._outputs.pop(image_hash, None)
