"""How well two texts match, as vLLM scores them with an embedding model (a bi-encoder): the cosine
similarity of their pooled, L2-normalized vectors, so a dot product (in float64). Shared by
`LLM.score` and the server's /score and /rerank.

Pairing: one first text against each of many second texts, or as many first texts as second ones,
scored pairwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")


def pair_up(first: Sequence[T], second: Sequence[T], first_name: str = "data_1",
            second_name: str = "data_2") -> tuple[list[T], list[T]]:
    """(first, second) of one length; ValueError naming both counts when they cannot be paired."""
    first, second = list(first), list(second)
    if not first or not second:
        raise ValueError(f"nothing to score: {len(first)} {first_name} and {len(second)} {second_name}")
    if len(first) == 1:
        first = first * len(second)
    if len(first) != len(second):
        raise ValueError(f"{len(first)} {first_name} for {len(second)} {second_name}: give one of {first_name}, "
                         f"or as many as {second_name} (scored pairwise)")
    return first, second


def cosine_scores(first: Sequence[Sequence[float]], second: Sequence[Sequence[float]]) -> list[float]:
    """The dot product of each (first[i], second[i]) pair of L2-normalized vectors, in float64."""
    return [float(np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)) for a, b in zip(first, second)]
