"""ModelRunnerOutput: what one step's forward and sampling produced, per scheduled request, as
plain arrays and lists (no tensors), in the SchedulerOutput's request order."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class SampledTokenLogprobs:
    """A sampled token's logprob, rank and the request's top-n (or its logprob_token_ids'), from the
    raw distribution."""

    token_id: int
    logprob: float
    rank: int  # 1 + the number of tokens more likely
    top_token_ids: list[int]  # the request's n (its `logprobs`) most likely, best first; or its logprob_token_ids
    top_logprobs: list[float]
    top_ranks: list[int] | None = None  # logprob_token_ids' ranks (None: the top n's, 1..n in order)


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

    def followed_by(self, later: PromptLogprobs) -> PromptLogprobs:
        """These positions and then `later`'s, which must start where these end."""
        if later.start != self.start + len(self.token_ids):
            raise ValueError(f"prompt logprobs from position {later.start} do not follow those of "
                             f"[{self.start}, {self.start + len(self.token_ids)})")
        return PromptLogprobs(self.start, self.token_ids + later.token_ids, self.logprobs + later.logprobs,
                              self.ranks + later.ranks, self.top_token_ids + later.top_token_ids,
                              self.top_logprobs + later.top_logprobs)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]  # the step's requests, in the SchedulerOutput's order
    # int32 [n, width]: row i the new tokens of request i, -1 after the last (all -1 where it
    # samples nothing this step). Width 1 without speculative decoding; with it, a request's
    # accepted draft tokens, then the token sampled after them.
    sampled_token_ids: np.ndarray
    # Per request that asked for logprobs and sampled this step: one per new token, cut to its own n.
    logprobs: dict[str, list[SampledTokenLogprobs]] = field(default_factory=dict)
    prompt_logprobs: dict[str, PromptLogprobs] = field(default_factory=dict)  # prompt chunks computed now
    errors: dict[str, str] = field(default_factory=dict)  # request id -> why it failed this step
    # Of those, the failures a request's own constraints caused: request id -> the field at fault
    # ("structured_outputs", "allowed_token_ids"); the others are the engine's.
    error_fields: dict[str, str] = field(default_factory=dict)
    pooled: dict[str, list[float]] = field(default_factory=dict)  # embedding requests whose prompt is done

    @classmethod
    def empty(cls) -> "ModelRunnerOutput":
        return cls([], np.zeros((0, 1), dtype=np.int32))
