"""EngineCoreRequest: a request as the engine core takes it (token ids, validated parameters)."""

from __future__ import annotations

from dataclasses import dataclass

from corellm.sampling_params import SamplingParams


@dataclass
class EngineCoreRequest:
    request_id: str  # internal id: unique within the engine
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    seed: int  # key of this request's random stream (from params.seed, or drawn by the engine)
    priority: int = 0
    cache_salt: str = ""
