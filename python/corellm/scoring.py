"""How well two texts match, as vLLM scores them. With an embedding model (a bi-encoder): the
cosine similarity of their pooled, L2-normalized vectors, so a dot product (in float64). With a
one-label sequence classifier (a cross-encoder): the classifier's sigmoid on the two texts encoded
as one input (cross_encoder_inputs). Shared by `LLM.score` and the server's /score and /rerank.

Pairing: one first text against each of many second texts, or as many first texts as second ones,
scored pairwise."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from corellm.inputs import TokensPrompt

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


def cross_encoder_inputs(tokenizer, labels: Sequence[str], first: Sequence, second: Sequence,
                         token_types: bool = False) -> list[TokensPrompt]:
    """Each (first[i], second[i]) pair as a cross-encoder reads it: the tokenizer's pair encoding
    (Tokenizer.encode_pair), with its token types where `token_types` (a model whose embedding
    tells them apart: BERT's). labels: the classifier's (one: its relevance). A pair's parts are
    texts (a str, or a dict holding only its "prompt"); ValueError naming what is not."""
    if len(labels) != 1:
        raise ValueError(f"scoring with a sequence classifier needs one label (a cross-encoder's relevance); this "
                         f"model has {len(labels)} ({', '.join(labels)}): classify each input instead")

    def text(prompt, name: str) -> str:
        if isinstance(prompt, dict) and set(prompt) == {"prompt"}:
            prompt = prompt["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"a cross-encoder scores texts, encoding each pair together: {name} must be a text, "
                             f"got {type(prompt).__name__ if not isinstance(prompt, dict) else sorted(prompt)}")
        return prompt

    pairs = []
    for a, b in zip(first, second):
        ids, types = tokenizer.encode_pair(text(a, "data_1"), text(b, "data_2"))
        pairs.append(TokensPrompt(prompt_token_ids=ids, token_type_ids=types) if token_types
                     else TokensPrompt(prompt_token_ids=ids))
    return pairs
