"""Exact re-encodings of GGUF block types that corellm's quantized GEMM has no kernel for into a
wider type it has: the same weights, value for value, in more bytes (kept far smaller than the
bf16 a dequantization would give, and computed by the integer kernels).

Q3_K -> Q6_K. Both types scale 16-value sub-blocks of a 256-value super-block: Q3_K stores
w = d * s * q with q in [-4, 3] (2 low bits in qs, the high bit in hmask, set for q >= 0) and s a
6-bit scale minus 32; Q6_K stores w = d * sc * (u - 32) with u a 6-bit value (4 low bits in ql,
2 high in qh) and sc an int8. So u = q + 32, sc = s, and d (fp16) carries over: 210 bytes per
super-block instead of 110, every dequantized value the same float.

Bit positions, as ggml lays the blocks out (value v = 128 h + r of a super-block, r < 128):
  Q3_K: low 2 bits in qs[32 h + r % 32] >> 2 (r / 32); high bit in hmask[r % 32] bit (4 h + r / 32);
        scale i's low nibble in scales[i % 8] >> 4 (i / 8), its 2 high bits in scales[8 + i % 4] >> 2 (i / 4).
  Q6_K: low 4 bits in ql[64 h + r % 64] >> 4 (r / 64); high 2 bits in qh[32 h + r % 32] >> 2 (r / 32);
        scale i in scales[i]."""

from __future__ import annotations

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

_Q3_K_BYTES = GGML_QUANT_SIZES[GGMLQuantizationType.Q3_K][1]  # per super-block of 256 values: 110


def _q3_k_values(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[b, 110] Q3_K super-blocks -> (q int8 [b, 256] in [-4, 3], s int8 [b, 16], d's 2 bytes [b, 2])."""
    hmask, qs, packed, d = blocks[:, :32], blocks[:, 32:96], blocks[:, 96:108], blocks[:, 108:110]
    low2 = (qs.reshape(-1, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # [b, h, r / 32, r % 32]
    high = (hmask.reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]) & 1  # [b, 4 h + r / 32, r % 32]
    q = low2.reshape(-1, 256).astype(np.int8) - 4 * (1 - high.reshape(-1, 256).astype(np.int8))
    low4 = (packed[:, :8].reshape(-1, 1, 8) >> np.array([0, 4], dtype=np.uint8)[:, None]) & 0xF  # scale 8 j + i
    high2 = (packed[:, 8:].reshape(-1, 1, 4) >> (2 * np.arange(4, dtype=np.uint8))[:, None]) & 3  # scale 4 j + i
    s = (low4.reshape(-1, 16) | (high2.reshape(-1, 16) << 4)).astype(np.int8) - 32
    return q, s, d


def _q6_k_blocks(u: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """u uint8 [b, 256] in [0, 63], sc int8 [b, 16], d's 2 bytes [b, 2] -> [b, 210] Q6_K super-blocks."""
    halves = u.reshape(-1, 2, 128)
    low = (halves & 0xF).reshape(-1, 2, 2, 64)
    ql = low[:, :, 0] | (low[:, :, 1] << 4)
    high = (halves >> 4).reshape(-1, 2, 4, 32)
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), d], axis=1)


def widen_q3_k(rows: np.ndarray) -> np.ndarray:
    """A Q3_K tensor's rows [n, k / 256 * 110] uint8 -> the same weights as Q6_K rows [n, k / 256 * 210]."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    if rows.ndim != 2 or rows.shape[1] % _Q3_K_BYTES:
        raise ValueError(f"Q3_K rows must be [n, a multiple of {_Q3_K_BYTES} bytes], got {rows.shape}")
    q, s, d = _q3_k_values(rows.reshape(-1, _Q3_K_BYTES))
    u = (q + 32).astype(np.uint8)
    return _q6_k_blocks(u, s, d).reshape(rows.shape[0], -1)


# ggml_type -> (the type it is widened to, the re-encoding of its rows)
WIDENINGS = {int(GGMLQuantizationType.Q3_K): (int(GGMLQuantizationType.Q6_K), widen_q3_k)}
