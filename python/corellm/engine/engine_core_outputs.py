"""EngineCoreOutputs on the Python side: the C++ scheduler's per-request results of a step, with
the model runner's logprobs attached, as the OutputProcessor reads them."""

from __future__ import annotations

from dataclasses import dataclass, field

from corellm.worker.model_runner_output import PromptLogprobs, SampledTokenLogprobs


@dataclass
class EngineCoreOutput:
    req_id: str
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stop_reason: int | None = None  # the stop token id that finished the request
    num_cached_tokens: int = 0
    new_logprobs: list[SampledTokenLogprobs] | None = None
    new_prompt_logprobs: PromptLogprobs | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class SchedulerStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    num_free_blocks: int = 0


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    scheduler_stats: SchedulerStats = field(default_factory=SchedulerStats)
    num_scheduled_tokens: int = 0
