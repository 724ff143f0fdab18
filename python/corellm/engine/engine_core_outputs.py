"""EngineCoreOutputs: the fourth boundary structure (EngineCore -> OutputProcessor). Per request with
news this step: the scheduler's decision (new token, finish reason, stop token, prefix-cache hit:
its SchedulerUpdate) joined with the model runner's logprobs, or an error."""

from __future__ import annotations

from dataclasses import dataclass, field

from corellm.native import _core
from corellm.worker.model_runner_output import PromptLogprobs, SampledTokenLogprobs


@dataclass
class EngineCoreOutput:
    req_id: str  # the engine-core request (one sample of a user's request)
    # Appended this step: one token, several (speculative decoding: accepted drafts and the token
    # after them), or none (a prompt chunk, an error).
    new_token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error" | "repetition"; None while running
    stop_reason: int | str | None = None  # the stop token id that finished it, or "repetition_detected" (vLLM's)
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (usage's cached_tokens)
    new_logprobs: list[SampledTokenLogprobs] | None = None  # the new tokens', if the request asked
    new_prompt_logprobs: PromptLogprobs | None = None  # prompt positions computed this step, if asked
    pooled: list[float] | None = None  # an embedding request's vector (when its prompt is computed)
    error: str | None = None  # why the request failed (finish_reason "error")
    # The SamplingParams field whose content made the request fail ("structured_outputs": the
    # output cannot follow its grammar with this model), None when the engine is at fault.
    error_field: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)  # one per request with news this step
    # The scheduler's own statistics type (corellm._core.SchedulerStats), after the step.
    scheduler_stats: _core.SchedulerStats = field(default_factory=_core.SchedulerStats)
    num_scheduled_tokens: int = 0  # tokens the step computed (0: no forward ran)
    # Speculative decoding's drafts verified and accepted this step (None when it is off).
    spec_decoding_stats: _core.SpecDecodingStats | None = None
