"""Admission control: a bounded waiting queue in front of the engine.

A request is *queued* from the moment it is admitted until it produces its first token (AsyncLLM
counts these, and their prompt tokens, on the event loop). A new request is admitted only while
the queue stays within --max-queued-requests and --max-queued-tokens once it is added; past
that it is refused at once with 429 and a Retry-After hint, so that load beyond capacity turns
into quick refusals instead of an unbounded queue and requests that time out in it. A request
too big for the token bound even with the queue empty is refused with 400 (waiting would not
help). Samples count one request each (n = 4 is four)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from corellm.engine.async_llm import AsyncLLM
from corellm.engine.input_processor import ProcessedRequest
from corellm.server.errors import APIError, bad_request


@dataclass
class AdmissionLimits:
    max_queued_requests: int = 1024
    max_queued_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("max_queued_requests", "max_queued_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


class Admission:
    def __init__(self, engine: AsyncLLM, limits: AdmissionLimits):
        self.engine = engine
        self.limits = limits
        self.num_rejected = 0

    def check(self, processed: list[ProcessedRequest]) -> None:
        """Raises APIError (429, or 400 for a request that can never fit) unless all of
        `processed` may join the queue now. Call right before submitting them."""
        requests = sum(p.num_samples for p in processed)
        tokens = sum(p.num_prompt_tokens for p in processed)
        lim = self.limits
        if tokens > lim.max_queued_tokens:
            raise bad_request(f"the request's prompts hold {tokens} tokens (counting each of the n samples), more "
                              f"than this server queues at once ({lim.max_queued_tokens}); send fewer or shorter "
                              f"prompts", "prompt")
        if requests > lim.max_queued_requests:
            raise bad_request(f"the request asks for {requests} samples (prompts x n), more than this server "
                              f"queues at once ({lim.max_queued_requests})", "n")
        queued_requests, queued_tokens = self.engine.num_queued_requests, self.engine.num_queued_tokens
        if queued_requests + requests > lim.max_queued_requests or queued_tokens + tokens > lim.max_queued_tokens:
            self.num_rejected += 1
            raise APIError(429, f"The server is overloaded: {queued_requests} requests ({queued_tokens} prompt tokens) "
                                f"are waiting for their first token (limits {lim.max_queued_requests} and "
                                f"{lim.max_queued_tokens}). Retry later.",
                           "rate_limit_exceeded", None, "server_overloaded",
                           headers={"Retry-After": str(self.retry_after_s())})

    def retry_after_s(self) -> int:
        """A whole-second hint: roughly how long the current queue takes to start (≥ 1 s)."""
        stats = self.engine.stats
        running = max(stats.num_running, 1)
        return max(1, min(60, math.ceil(self.engine.num_queued_requests / running)))
