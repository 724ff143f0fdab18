"""LoraBatch: a step's tokens' LoRA adapters as the per-op model layers apply them — each token's
slot (-1: none) and the adapter each slot holds (worker/lora_slots.py). The native decoder stack
takes the same slots and holds the adapters itself (DecoderStack.set_lora)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corellm import ops
from corellm.lora.lora_adapter import LoraAdapter


@dataclass
class LoraBatch:
    slots: torch.Tensor  # int32 [num_tokens]
    adapters: list[LoraAdapter | None]  # by slot

    def add(self, y: torch.Tensor, x: torch.Tensor, projection: str, *, layer: int) -> torch.Tensor:
        """y [num_tokens, out] (in place) += each token's adapter's update of layer `layer`'s
        `projection` ("qkv", "o", "gate_up", "down") on its input x. Returns y."""
        by_slot = [None if a is None else a.linear(layer, projection) for a in self.adapters]
        if any(linear is not None for linear in by_slot):
            ops.lora_add(y, x, self.slots, by_slot)
        return y
