"""A linear layer's weight quantized for the GPU's scaled GEMM (--quantization fp8 / int8 on CUDA,
vLLM's W8A8): the weight [n, k] in fp8 e4m3 or int8 with one fp32 scale per output channel, made
at load from the model's bf16 weight (on the device); each call quantizes the activations per
token (ops.quantize_rows) and runs ops.scaled_gemm, whose epilogue applies both scales."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from corellm import ops
from corellm.ops.scaled_gemm import SCALED_TYPES


@dataclass
class ScaledWeight:
    qtype: str  # "fp8" or "int8" (ops.scaled_gemm.SCALED_TYPES)
    weight: torch.Tensor  # [n, k] in the type
    scales: torch.Tensor  # fp32 [n]: row i of the weight is weight[i] * scales[i]

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    @property
    def type_name(self) -> str:
        return "fp8_e4m3" if self.qtype == "fp8" else "int8"

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + self.scales.numel() * 4

    @staticmethod
    def supports(shape: tuple[int, int]) -> bool:
        """Whether the scaled GEMM takes a weight of this shape (k a multiple of 16, n of 8)."""
        n, k = shape
        return k % 16 == 0 and n % 8 == 0

    @classmethod
    def quantize(cls, w: torch.Tensor, qtype: str) -> ScaledWeight:
        """w [n, k] -> per output channel: scale = max |w_row| / R (R = 448 for fp8, 127 for int8;
        1 for a row of zeros), q = w / scale rounded to the type (to nearest; int8 to nearest even)."""
        if qtype not in SCALED_TYPES:
            raise ValueError(f"scaled weight: type {qtype!r} is not one of {', '.join(SCALED_TYPES)}")
        dtype, limit = SCALED_TYPES[qtype]
        w = w.float()
        amax = w.abs().amax(dim=1)
        scales = torch.where(amax > 0, amax / limit, torch.ones_like(amax))
        q = torch.clamp(w / scales[:, None], -limit, limit)  # a rounding of amax / scale may pass R
        q = q.to(dtype) if qtype == "fp8" else torch.round(q).to(dtype)
        return cls(qtype, q.contiguous(), scales.contiguous())

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.scales[:, None]).to(dtype)

    def matmul(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """x [m, k] (bf16 / fp16 / fp32) -> x W^T in bf16 [m, n] (into `out` when given)."""
        q, scales = ops.quantize_rows(x, self.qtype)
        return ops.scaled_gemm(q, scales, self.weight, self.scales, out=out)
