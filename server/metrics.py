"""Prometheus metrics with vLLM-like names (corellm:...), fed by the engine's step outputs and by
finished requests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from corellm.engine.async_llm import RequestStats
from corellm.outputs import RequestOutput

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                      2.5, 5.0)


def _token_count_buckets(max_model_len: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to the context length (vLLM's buckets for token counts)."""
    buckets, scale = [], 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_model_len:
                return tuple(buckets)
            buckets.append(mantissa * scale)
        scale *= 10


class ServerMetrics:
    def __init__(self, model_name: str, max_model_len: int):
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_resident_memory_bytes, open fds, CPU seconds
        labels = ["model_name"]
        r = self.registry
        self.running = Gauge("corellm:num_requests_running", "Requests in the running batch", labels, registry=r)
        self.waiting = Gauge("corellm:num_requests_waiting", "Requests waiting to be scheduled", labels, registry=r)
        self.kv_usage = Gauge("corellm:kv_cache_usage_perc", "KV cache usage (1 = full)", labels, registry=r)
        self.prefix_queries = Counter("corellm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                                      labels, registry=r)
        self.prefix_hits = Counter("corellm:prefix_cache_hits", "Prompt tokens found in the prefix cache", labels,
                                   registry=r)
        self.preemptions = Counter("corellm:num_preemptions", "Requests preempted (recomputed later)", labels,
                                   registry=r)
        self.prompt_tokens = Counter("corellm:prompt_tokens", "Prompt tokens of finished requests", labels, registry=r)
        self.generation_tokens = Counter("corellm:generation_tokens", "Generated tokens", labels, registry=r)
        self.requests = Counter("corellm:request_success", "Finished requests by finish reason",
                                labels + ["finished_reason"], registry=r)
        self.ttft = Histogram("corellm:time_to_first_token_seconds", "Time to first token", labels,
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("corellm:e2e_request_latency_seconds", "End-to-end request latency", labels,
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.inter_token = Histogram("corellm:inter_token_latency_seconds",
                                     "Time between consecutive steps that gave a request tokens", labels,
                                     buckets=_TOKEN_GAP_BUCKETS, registry=r)
        self.time_per_output_token = Histogram("corellm:request_time_per_output_token_seconds",
                                               "A finished request's decode time over its tokens after the first "
                                               "(per sample)", labels, buckets=_TOKEN_GAP_BUCKETS, registry=r)
        self.decode_time = Histogram("corellm:request_decode_time_seconds",
                                     "A finished request's time from its first token to its last", labels,
                                     buckets=_LATENCY_BUCKETS, registry=r)
        counts = _token_count_buckets(max_model_len)
        self.request_prompt_tokens = Histogram("corellm:request_prompt_tokens", "A finished request's prompt tokens",
                                               labels, buckets=counts, registry=r)
        self.request_generation_tokens = Histogram("corellm:request_generation_tokens",
                                                   "A finished request's generated tokens (its samples' together)",
                                                   labels, buckets=counts, registry=r)
        self.free_blocks = Gauge("corellm:kv_cache_free_blocks", "Free KV blocks (cached-but-unused ones included)",
                                 labels, registry=r)
        self.queued = Gauge("corellm:num_requests_queued", "Admitted requests without a first token yet", labels,
                            registry=r)
        self.queued_tokens = Gauge("corellm:num_tokens_queued", "Prompt tokens of the queued requests", labels,
                                   registry=r)
        self.rejected = Gauge("corellm:num_requests_rejected", "Requests refused with 429 since the start", labels,
                              registry=r)
        self.open_states = Gauge("corellm:open_request_states", "Requests each layer holds state for",
                                 labels + ["layer"], registry=r)
        # Speculative decoding (vLLM's spec_decode counters): drafts verified, and accepted, in all
        # and per draft position (acceptance at position j = accepted_per_pos{position=j} / drafts).
        self.spec_drafts = Counter("corellm:spec_decode_num_drafts", "Requests that verified draft tokens in a step",
                                   labels, registry=r)
        self.spec_draft_tokens = Counter("corellm:spec_decode_num_draft_tokens", "Draft tokens verified", labels,
                                         registry=r)
        self.spec_accepted_tokens = Counter("corellm:spec_decode_num_accepted_tokens", "Draft tokens accepted",
                                            labels, registry=r)
        self.spec_accepted_per_pos = Counter("corellm:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position in the draft", labels + ["position"],
                                             registry=r)
        self.model = model_name
        for metric in (self.running, self.waiting, self.kv_usage, self.prefix_queries, self.prefix_hits,
                       self.preemptions, self.prompt_tokens, self.generation_tokens, self.ttft, self.e2e,
                       self.inter_token, self.time_per_output_token, self.decode_time, self.request_prompt_tokens,
                       self.request_generation_tokens, self.free_blocks, self.queued, self.queued_tokens,
                       self.rejected):
            metric.labels(model_name)  # every series exists (at 0) from the start
        self._last = {"queries": 0, "hits": 0, "preemptions": 0}

    def on_step(self, request_outputs, core_outputs) -> None:
        s = core_outputs.scheduler_stats
        m = self.model
        self.running.labels(m).set(s.num_running)
        self.waiting.labels(m).set(s.num_waiting)
        self.kv_usage.labels(m).set(s.kv_cache_usage)
        self.free_blocks.labels(m).set(s.num_free_blocks)
        for key, counter, value in (("queries", self.prefix_queries, s.prefix_cache_queries),
                                    ("hits", self.prefix_hits, s.prefix_cache_hits),
                                    ("preemptions", self.preemptions, s.num_preemptions)):
            if value > self._last[key]:
                counter.labels(m).inc(value - self._last[key])
                self._last[key] = value
        self.generation_tokens.labels(m).inc(sum(len(o.new_token_ids) for o in core_outputs.outputs))
        spec = core_outputs.spec_decoding_stats
        if spec is not None:
            self.spec_drafts.labels(m).inc(spec.num_drafts)
            self.spec_draft_tokens.labels(m).inc(spec.num_draft_tokens)
            self.spec_accepted_tokens.labels(m).inc(spec.num_accepted_tokens)
            for position, n in enumerate(spec.num_accepted_tokens_per_pos):
                self.spec_accepted_per_pos.labels(m, str(position)).inc(n)

    def on_request_done(self, output: RequestOutput, stats: RequestStats, finished_at: float) -> None:
        """A finished request: its counts, and the latencies its timeline (AsyncLLM's) gives."""
        m = self.model
        prompt_tokens = len(output.prompt_token_ids)
        self.prompt_tokens.labels(m).inc(prompt_tokens)
        self.request_prompt_tokens.labels(m).observe(prompt_tokens)
        self.request_generation_tokens.labels(m).observe(stats.generation_tokens)
        for c in output.outputs:
            self.requests.labels(m, c.finish_reason or "unknown").inc()
        self.e2e.labels(m).observe(finished_at - stats.arrival)
        if stats.first_token is None:
            return
        self.ttft.labels(m).observe(stats.first_token - stats.arrival)
        for gap in stats.token_gaps:
            self.inter_token.labels(m).observe(gap)
        decode = stats.last_token - stats.first_token
        self.decode_time.labels(m).observe(decode)
        per_sample = stats.generation_tokens / max(1, len(output.outputs))
        if per_sample > 1:
            self.time_per_output_token.labels(m).observe(decode / (per_sample - 1))

    def observe_server(self, queued: int, queued_tokens: int, rejected: int, open_states: dict[str, int]) -> None:
        """What the server side holds, read when /metrics is scraped."""
        m = self.model
        self.queued.labels(m).set(queued)
        self.queued_tokens.labels(m).set(queued_tokens)
        self.rejected.labels(m).set(rejected)
        for layer, count in open_states.items():
            self.open_states.labels(m, layer).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)
