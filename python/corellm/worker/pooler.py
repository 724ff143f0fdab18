"""Pooler: the embedding requests' vectors (PoolingParams), from each step's final hidden states.
A request's prompt may be computed over several steps (chunked prefill, and again after a
preemption): step by step the pooler keeps what its pooling type needs of the positions not yet
taken in — CLS the first position's row, MEAN the running sum of the rows in position order, in
float64 (a sequential scan: the same sum whatever the chunks) — and once the prompt's last position
is computed gives the vector: LAST that row, MEAN the sum over the prompt's length, CLS the first
row; in fp32, through the model's Dense projection (a sentence-transformers model's), cut to the
request's `dimensions` (a Matryoshka model), L2-normalized if the request asks. A classification
(task "classify") pools the model's classification row whatever the engine's type (a decoder's
LAST, an encoder's CLS or, ModernBERT's classifier_pooling, MEAN), and the
model's classify (a decoder's score matrix, an encoder's head), in fp32, gives the label logits
(probabilities with use_activation: softmax, or the sigmoid of a lone logit). A row's bits do not
depend on the batch (corellm's kernels), so neither does the vector."""

from __future__ import annotations

from collections.abc import Callable

import torch

from corellm.pooling_params import POOLING_TYPES, PoolingParams


class Pooler:
    def __init__(self, pooling_type: str, classifier: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 classify_pooling: str = "LAST", projection: Callable[[torch.Tensor], torch.Tensor] | None = None):
        """classifier: a sequence classifier's classify (its pooled row, fp32 [hidden] -> label
        logits, fp32 [num_labels]); None: the model classifies nothing. classify_pooling: the row it
        reads (LAST: a decoder's; CLS: an encoder's). projection: a sentence-transformers model's
        Dense layers (model/embedding_projection.py) on each pooled vector, fp32; None: none."""
        for name, value in (("pooling_type", pooling_type), ("classify_pooling", classify_pooling)):
            if value not in POOLING_TYPES:
                raise ValueError(f"{name} must be one of {', '.join(POOLING_TYPES)}, got {value!r}")
        self.pooling_type = pooling_type
        self.classify_pooling = classify_pooling
        self._classifier = classifier
        self._projection = projection
        # request -> (the CLS row or the MEAN sum so far, the prompt positions taken in so far)
        self._partial: dict[str, tuple[torch.Tensor | None, int]] = {}

    def type_for(self, params: PoolingParams) -> str:
        """How the request's rows are pooled: the classifier's row for a classification, else the
        engine's type."""
        return self.classify_pooling if params.task == "classify" else self.pooling_type

    def needs_every_position(self, params: PoolingParams) -> bool:
        """Whether the request's vector reads rows before the prompt's last (MEAN, CLS): a prompt
        served from another request's prefix-cache blocks would leave them uncomputed."""
        return self.type_for(params) != "LAST"

    def drop(self, req_id: str) -> None:
        """A finished request. (A preempted one keeps its part: the positions it computes again
        are not taken in twice, and those its own cached blocks spare it were taken in before.)"""
        self._partial.pop(req_id, None)

    def pool(self, req_id: str, params: PoolingParams, prompt_len: int, start: int,
             rows: torch.Tensor) -> list[float] | None:
        """rows: the request's hidden rows this step, prompt positions [start, start + len(rows));
        the vector once the prompt's last position is among them, else None."""
        end = start + rows.shape[0]
        pooling_type = self.type_for(params)
        if pooling_type != "LAST":
            part, taken = self._partial.get(req_id, (None, 0))
            new_from, new_to = max(taken, start), min(end, prompt_len)
            if new_to > new_from:
                new = rows[new_from - start:new_to - start]
                if pooling_type == "MEAN":
                    scan = new.double() if part is None else torch.cat([part[None], new.double()])
                    part = scan.cumsum(dim=0)[-1]
                elif new_from == 0:
                    part = rows[0].float()
                self._partial[req_id] = (part, new_to)
        if end < prompt_len:
            return None
        if pooling_type == "LAST":
            vector = rows[prompt_len - 1 - start].float()
        else:
            part, _ = self._partial.pop(req_id)
            vector = (part / prompt_len).float() if pooling_type == "MEAN" else part
        if params.task == "classify":
            return self._classify(vector, params.use_activation)
        if self._projection is not None:
            vector = self._projection(vector)
        if params.dimensions is not None:  # a Matryoshka model's first values (the input processor checked it)
            vector = vector[:params.dimensions]
        if params.normalize:
            vector = torch.nn.functional.normalize(vector, dim=0)
        return vector.cpu().tolist()

    def _classify(self, row: torch.Tensor, use_activation: bool) -> list[float]:
        if self._classifier is None:  # the input processor refuses these first
            raise ValueError("task 'classify' needs a sequence-classification model")
        logits = self._classifier(row)
        if use_activation:
            logits = torch.sigmoid(logits) if logits.numel() == 1 else torch.softmax(logits, dim=0)
        return logits.cpu().tolist()
