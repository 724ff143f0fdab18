"""ModelRunnerOutput: what one step's forward and sampling produced, per scheduled request, as
plain arrays and lists (no tensors), in the SchedulerOutput's request order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SampledLogprobs:
    """Logprobs of the sampled tokens (row i: request i of the step), from the raw distribution."""

    logprobs: np.ndarray  # float32 [n]: the sampled token's
    ranks: np.ndarray  # int32 [n]
    top_token_ids: np.ndarray  # int32 [n, k]
    top_logprobs: np.ndarray  # float32 [n, k]


@dataclass
class PromptLogprobs:
    """Logprobs of prompt tokens computed this step for one request: positions [start, start + n)
    of the prompt (position p: the prompt token at p given the tokens before it)."""

    start: int
    token_ids: list[int]
    logprobs: list[float]
    ranks: list[int]
    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    sampled_token_ids: np.ndarray  # int32 [n]; -1 where the request samples nothing this step
    logprobs: SampledLogprobs | None = None
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)  # request id -> why it failed this step

    @classmethod
    def empty(cls) -> "ModelRunnerOutput":
        return cls([], np.zeros(0, dtype=np.int32))
