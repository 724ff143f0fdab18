"""Bitmasks of the tokens a step's requests may sample, in the sampler's layout: one row of int32
words per masked request (token t allowed when bit t % 32 of word t // 32 is set), and per request
its row or -1. Two sources: a request's grammar (structured output, filled each step) and its
allowed_token_ids (vLLM's; the same row every step). A request with both gets their AND."""

from __future__ import annotations

import numpy as np

TokenBitmask = tuple[np.ndarray, np.ndarray]  # (rows [m, words] int32, per request its row or -1)


def bitmask_row(token_ids: list[int], words: int) -> np.ndarray:
    """One row allowing exactly token_ids (each < 32 * words)."""
    bits = np.zeros(words * 32, dtype=bool)
    bits[np.asarray(token_ids, dtype=np.int64)] = True
    return np.packbits(bits.reshape(words, 32), axis=1, bitorder="little").view(np.uint32).reshape(words).view(np.int32)


def combine(a: TokenBitmask | None, b: TokenBitmask | None) -> TokenBitmask | None:
    """Per request the AND of its rows in a and b; a request masked in one only keeps that row.
    Rows of different widths are compared as if padded with zero words (the sampler masks the
    tokens past a row's words)."""
    if a is None or b is None:
        return a if b is None else b
    (a_bits, a_rows), (b_bits, b_rows) = a, b
    words = max(a_bits.shape[1], b_bits.shape[1])
    masked = np.flatnonzero((a_rows >= 0) | (b_rows >= 0))
    bits = np.zeros((len(masked), words), dtype=np.int32)
    rows = np.full(len(a_rows), -1, dtype=np.int32)
    for k, i in enumerate(masked.tolist()):
        row = np.full(words, -1, dtype=np.int32)  # all allowed, then narrowed by each source
        for source_bits, source_rows in ((a_bits, a_rows), (b_bits, b_rows)):
            if source_rows[i] >= 0:
                padded = np.zeros(words, dtype=np.int32)
                padded[:source_bits.shape[1]] = source_bits[source_rows[i]]
                row &= padded
        bits[k], rows[i] = row, k
    return bits, rows
