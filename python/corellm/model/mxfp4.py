"""MXFP4 (the OCP microscaling 4-bit float), as gpt-oss's checkpoints store their experts: per 32
weights along a row, 16 bytes of E2M1 codes (two a byte, the low nibble first) and one E8M0 scale
byte, the weight being the code's value (0, 0.5, 1, 1.5, 2, 3, 4 or 6, the high bit its sign) times
2^(scale - 127). Dequantized here at load, exactly (every such value is a bf16 too), or rewritten
as GGUF's MXFP4 blocks for the quantized GEMM to compute on (quant_gemm.h's MXFP4: the same
values, ggml's nibble order)."""

from __future__ import annotations

import numpy as np
import torch

# The E2M1 codes' values: 0-7 positive, 8-15 their negatives.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
BLOCK = 32  # weights per scale
GGML_MXFP4 = 39  # GGUF's ggml_type number of MXFP4 (quant_gemm.h's QuantType::kMXFP4)


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor, name: str = "MXFP4 tensor") -> torch.Tensor:
    """blocks [..., G, 16] and scales [..., G] (the codes and scale bytes, in any dtype that holds
    the byte values exactly) -> float32 [..., G * 32], row by row as the checkpoint lays them out."""
    if tuple(blocks.shape[:-1]) != tuple(scales.shape) or blocks.shape[-1] != BLOCK // 2:
        raise ValueError(f"{name}: MXFP4 blocks of shape {tuple(blocks.shape)} need scales of shape "
                         f"{tuple(blocks.shape[:-1])} and 16 bytes a block; got scales {tuple(scales.shape)}")
    codes = blocks.to(torch.int32)
    exponents = scales.to(torch.int32) - 127
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) > 255 or int(exponents.min()) < -127
                          or int(exponents.max()) > 128):
        raise ValueError(f"{name}: MXFP4 blocks or scales hold values outside a byte")
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float32)
    values = torch.stack([lut[codes & 0x0F], lut[codes >> 4]], dim=-1).flatten(-2)  # [..., G, 32], low nibble first
    values = torch.ldexp(values, exponents.unsqueeze(-1).to(torch.float32))
    return values.flatten(-2)


def gguf_rows(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """blocks [rows, G, 16] and scales [rows, G] (a checkpoint's, codes in pairs: value 2j the low
    nibble of byte j, 2j + 1 the high one) -> [rows, G * 17] uint8, GGUF's MXFP4 rows: per block its
    scale byte, then 16 bytes whose low nibbles hold values 0-15 and high nibbles values 16-31."""
    b = blocks.to(torch.uint8).numpy()
    codes = np.stack([b & 0x0F, b >> 4], axis=-1).reshape(*b.shape[:-1], BLOCK)  # [rows, G, 32] in order
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    rows = np.concatenate([scales.to(torch.uint8).numpy()[..., None], qs.astype(np.uint8)], axis=-1)
    return np.ascontiguousarray(rows.reshape(rows.shape[0], -1))
