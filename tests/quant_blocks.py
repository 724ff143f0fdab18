"""GGUF quantized blocks for tests: the `gguf` package quantizes Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1;
the K types (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K) and IQ4_NL / IQ4_XS, which it only dequantizes, are made
here in ggml's block layout with a plain min/max rule and the nearest level (not llama.cpp's
search: these are test weights, and the reference for every test is the `gguf` package's
dequantization of the very same blocks)."""

from __future__ import annotations

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as T

# The types quant_gemm computes on.
ALL_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "MXFP4"]
K_TYPES = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)


_TINY = 2.0**-14  # fp16's smallest normal: a scale that survives the fp16 rounding


def _f16(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).view(np.uint8).reshape(*a.shape, 2)


def _q45_k(x: np.ndarray, bits: int) -> np.ndarray:
    """Q4_K / Q5_K blocks of x [blocks, 256]: per 32 values a 6-bit scale and min."""
    top = (1 << bits) - 1
    sub = x.reshape(-1, 8, 32)
    mins = np.maximum(0.0, -sub.min(-1))
    scales = (sub.max(-1) + mins) / top
    d = np.maximum(scales.max(-1) / 63, _TINY)
    dmin = np.maximum(mins.max(-1) / 63, _TINY)
    d, dmin = d.astype(np.float16).astype(np.float32), dmin.astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scales / d[:, None]), 0, 63).astype(np.uint8)
    mn = np.clip(np.rint(mins / dmin[:, None]), 0, 63).astype(np.uint8)
    step = d[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint((sub + (dmin[:, None] * mn)[..., None]) / step[..., None]), 0)
    q = np.clip(q, 0, top).astype(np.uint8).reshape(-1, 256)
    packed = np.zeros((x.shape[0], 12), np.uint8)
    for j in range(4):
        packed[:, j] = (sc[:, j] & 63) | ((sc[:, j + 4] >> 4) << 6)
        packed[:, j + 4] = (mn[:, j] & 63) | ((mn[:, j + 4] >> 4) << 6)
        packed[:, j + 8] = (sc[:, j + 4] & 0xF) | ((mn[:, j + 4] & 0xF) << 4)
    chunks = q.reshape(-1, 4, 2, 32)  # chunk c: values 64c .. 64c + 31 (low nibbles), then 32 more (high)
    qs = ((chunks[:, :, 0] & 0xF) | ((chunks[:, :, 1] & 0xF) << 4)).reshape(-1, 128).astype(np.uint8)
    parts = [_f16(d).reshape(-1, 2), _f16(dmin).reshape(-1, 2), packed]
    if bits == 5:
        qh = np.zeros((x.shape[0], 32), np.uint8)
        for c in range(4):
            qh |= ((chunks[:, c, 0] >> 4) << (2 * c)).astype(np.uint8)
            qh |= ((chunks[:, c, 1] >> 4) << (2 * c + 1)).astype(np.uint8)
        parts.append(qh)
    parts.append(qs)
    return np.concatenate(parts, axis=1)


def _iq4_indices(x: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The nearest level's index for each x / step (step broadcast against x; 0 where step is 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(step != 0, x / step, 0.0)
    return np.abs(scaled[..., None] - IQ4_LEVELS).argmin(-1).astype(np.uint8)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """Index groups of 32 [..., 32] -> 16 bytes each: value i in the low nibble of byte i, 16 + i high."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def _iq4_nl(x: np.ndarray) -> np.ndarray:
    """IQ4_NL blocks of x [blocks, 32]: d = max |x| / 127 and each value's nearest level."""
    d = np.maximum(np.abs(x).max(-1) / 127, _TINY).astype(np.float16).astype(np.float32)
    return np.concatenate([_f16(d).reshape(-1, 2), _nibbles(_iq4_indices(x, d[:, None]))], axis=1)


def _iq4_xs(x: np.ndarray) -> np.ndarray:
    """IQ4_XS blocks of x [blocks, 256]: per 32 values a 6-bit scale (stored + 32), levels as IQ4_NL."""
    sub = x.reshape(-1, 8, 32)
    scales = np.abs(sub).max(-1) / 127
    d = np.maximum(scales.max(-1) / 31, _TINY).astype(np.float16).astype(np.float32)
    ls = np.clip(np.rint(scales / d[:, None]), 0, 31).astype(np.int32) + 32  # stored: 0..63
    q = _iq4_indices(sub, (d[:, None] * (ls - 32))[..., None])
    low = (ls & 0xF).astype(np.uint8)
    scales_l = low[:, 0::2] | (low[:, 1::2] << 4)  # sub-block j: byte j / 2, nibble j % 2
    scales_h = np.zeros(x.shape[0], np.uint16)
    for j in range(8):
        scales_h |= ((ls[:, j] >> 4) & 3).astype(np.uint16) << (2 * j)
    return np.concatenate([_f16(d).reshape(-1, 2), scales_h.view(np.uint8).reshape(-1, 2), scales_l,
                           _nibbles(q).reshape(-1, 128)], axis=1)


def _q2_k(x: np.ndarray) -> np.ndarray:
    """Q2_K blocks of x [blocks, 256]: per 16 values a 4-bit scale and min, values 0..3."""
    sub = x.reshape(-1, 16, 16)
    mins = np.maximum(0.0, -sub.min(-1))
    scales = (sub.max(-1) + mins) / 3
    d = np.maximum(scales.max(-1) / 15, _TINY).astype(np.float16).astype(np.float32)
    dmin = np.maximum(mins.max(-1) / 15, _TINY).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scales / d[:, None]), 0, 15).astype(np.uint8)
    mn = np.clip(np.rint(mins / dmin[:, None]), 0, 15).astype(np.uint8)
    step = d[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] > 0, np.rint((sub + (dmin[:, None] * mn)[..., None]) / step[..., None]), 0)
    q = np.clip(q, 0, 3).astype(np.uint8).reshape(-1, 2, 4, 32)  # value 128 h + 32 j + l
    qs = np.zeros((x.shape[0], 2, 32), np.uint8)  # qs[h, l] bits 2j
    for j in range(4):
        qs |= q[:, :, j] << (2 * j)
    return np.concatenate([sc | (mn << 4), qs.reshape(-1, 64), _f16(d).reshape(-1, 2), _f16(dmin).reshape(-1, 2)],
                          axis=1)


def _q6_k(x: np.ndarray) -> np.ndarray:
    """Q6_K blocks of x [blocks, 256]: per 16 values an int8 scale, values 0..63 around 32."""
    sub = x.reshape(-1, 16, 16)
    scales = np.abs(sub).max(-1) / 31
    d = np.maximum(scales.max(-1) / 127, _TINY).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scales / d[:, None]), -128, 127).astype(np.int8)
    step = d[:, None] * sc
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] != 0, np.rint(sub / step[..., None]), 0) + 32
    u = np.clip(q, 0, 63).astype(np.uint8).reshape(-1, 2, 4, 32)  # halves of 128, quarters of 32
    ql = np.zeros((x.shape[0], 2, 64), np.uint8)
    qh = np.zeros((x.shape[0], 2, 32), np.uint8)
    ql[:, :, :32] = (u[:, :, 0] & 0xF) | ((u[:, :, 2] & 0xF) << 4)
    ql[:, :, 32:] = (u[:, :, 1] & 0xF) | ((u[:, :, 3] & 0xF) << 4)
    for quarter in range(4):
        qh |= ((u[:, :, quarter] >> 4) << (2 * quarter)).astype(np.uint8)
    return np.concatenate([ql.reshape(-1, 128), qh.reshape(-1, 64), sc.view(np.uint8), _f16(d).reshape(-1, 2)], axis=1)


def _q3_k(x: np.ndarray) -> np.ndarray:
    """Q3_K blocks of x [blocks, 256]: per 16 values a 6-bit scale (stored + 32), values -4..3."""
    sub = x.reshape(-1, 16, 16)
    scales = np.abs(sub).max(-1) / 4
    d = np.maximum(scales.max(-1) / 31, _TINY).astype(np.float16).astype(np.float32)
    s = np.clip(np.rint(scales / d[:, None]), 0, 31).astype(np.int8)
    step = d[:, None] * s
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(step[..., None] != 0, np.rint(sub / step[..., None]), 0)
    q = np.clip(q, -4, 3).astype(np.int8).reshape(-1, 256)
    low2, high = (q & 3).astype(np.uint8), (q >= 0).astype(np.uint8)
    qs = np.zeros((x.shape[0], 2, 32), np.uint8)  # value 128 h + 32 j + l: qs[h, l] bits 2j
    for j in range(4):
        qs |= low2.reshape(-1, 2, 4, 32)[:, :, j] << (2 * j)
    hmask = np.zeros((x.shape[0], 32), np.uint8)  # value 32 b + l: hmask[l] bit b
    for b in range(8):
        hmask |= high.reshape(-1, 8, 32)[:, b] << b
    stored = (s + 32).astype(np.uint8)
    packed = np.zeros((x.shape[0], 12), np.uint8)
    packed[:, :8] = (stored[:, :8] & 0xF) | ((stored[:, 8:] & 0xF) << 4)  # scale 8 j + i: byte i, nibble j
    for t in range(4):  # scale 4 t + i: its high bits in byte 8 + i, bits 2t
        packed[:, 8:] |= (stored[:, 4 * t : 4 * t + 4] >> 4) << (2 * t)
    return np.concatenate([hmask, qs.reshape(-1, 64), packed, _f16(d).reshape(-1, 2)], axis=1)


def quantize(x: np.ndarray, type_name: str) -> np.ndarray:
    """x [n, k] float -> the file's blocks [n, row bytes] uint8."""
    t = getattr(T, type_name)
    x = np.ascontiguousarray(x, dtype=np.float32)
    if type_name not in K_TYPES | {"IQ4_NL", "IQ4_XS"}:
        return quants.quantize(x, t)
    n, k = x.shape
    flat = x.reshape(-1, 256)
    if type_name == "IQ4_NL":
        blocks = _iq4_nl(x.reshape(-1, 32))
    elif type_name == "IQ4_XS":
        blocks = _iq4_xs(flat)
    elif type_name == "Q3_K":
        blocks = _q3_k(flat)
    elif type_name == "Q2_K":
        blocks = _q2_k(flat)
    else:
        blocks = _q6_k(flat) if type_name == "Q6_K" else _q45_k(flat, 4 if type_name == "Q4_K" else 5)
    assert blocks.shape[1] == GGML_QUANT_SIZES[t][1]
    return blocks.reshape(n, -1)


def dequantize(blocks: np.ndarray, type_name: str) -> np.ndarray:
    return quants.dequantize(blocks, getattr(T, type_name)).astype(np.float32)
