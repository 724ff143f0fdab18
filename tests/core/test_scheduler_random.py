"""Thousands of random requests through the native scheduler and batch builder with a fake
model: integrity after every step, outputs equal to a reference run without the engine, and
every block back in the pool at the end."""

from __future__ import annotations

import random

import numpy as np
import pytest

from corellm import _core
from corellm.config import SchedulerConfig
from tests.core.fake_model import FakeModelRunner, ReferenceRequest

VOCAB = 64
EOS = 0


def drive(config: SchedulerConfig, seed: int, num_requests: int, abort_rate: float) -> dict:
    rng = random.Random(seed)
    native = config.to_native()
    scheduler = _core.Scheduler(native)
    runner = FakeModelRunner(native, VOCAB)
    shared_prefixes = [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(8, 64))] for _ in range(4)]
    expected: dict[str, ReferenceRequest] = {}
    results: dict[str, tuple[list[int], str]] = {}
    aborted: set[str] = set()
    pending = list(range(num_requests))
    steps = preemptions = 0

    def submit(i: int) -> None:
        prefix = rng.choice(shared_prefixes) if rng.random() < 0.5 else []
        tail = [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 80))]
        prompt = (prefix + tail)[: config.max_model_len - 1]
        ref = ReferenceRequest(
            prompt=prompt,
            max_tokens=rng.randrange(1, 40),
            min_tokens=rng.choice([0, 0, 2]),
            ignore_eos=rng.random() < 0.2,
            eos_token_id=EOS,
            stop_token_ids=tuple(rng.sample(range(1, VOCAB), 2)) if rng.random() < 0.3 else (),
        )
        ref.min_tokens = min(ref.min_tokens, ref.max_tokens)
        req_id = f"req-{i}"
        expected[req_id] = ref.run(VOCAB, config.max_model_len)
        runner.add_truth(req_id, prompt)
        scheduler.add_request(
            req_id,
            prompt,
            max_tokens=ref.max_tokens,
            min_tokens=ref.min_tokens,
            ignore_eos=ref.ignore_eos,
            eos_token_id=EOS,
            stop_token_ids=list(ref.stop_token_ids),
            priority=rng.randrange(3),
            arrival_time=float(i),
        )
        results[req_id] = ([], "")

    while pending or scheduler.has_unfinished_requests():
        for _ in range(rng.randrange(0, 6)):
            if pending:
                submit(pending.pop(0))
        plan = scheduler.schedule()
        scheduler.check_integrity()
        preemptions += len(plan.preempted_req_ids)
        assert plan.total_num_scheduled_tokens <= config.max_num_batched_tokens
        assert plan.num_reqs <= config.max_num_seqs
        sampled = runner.execute(plan) if plan.num_reqs else np.zeros(0, np.int32)
        if plan.num_reqs and rng.random() < abort_rate:
            # Abort between the forward and update_from_output, as the engine's abort queue does.
            victim = rng.choice(list(plan.req_ids))
            scheduler.finish_requests([victim], _core.RequestStatus.FINISHED_ABORTED)
            aborted.add(victim)
        out = scheduler.update_from_output(plan, sampled)  # every plan, an empty one too, as the engine
        for req_id, token, finish in zip(out.req_ids, out.new_token_ids.tolist(), out.finish_reasons.tolist()):
            tokens, _ = results[req_id]
            tokens.append(token)
            if finish:
                results[req_id] = (tokens, _core.FINISH_REASON_NAMES[finish])
        if rng.random() < abort_rate / 2 and scheduler.num_waiting:
            # Abort a request that may still be waiting (or mid-prefill).
            victim = f"req-{rng.randrange(num_requests)}"
            if scheduler.finish_requests([victim], _core.RequestStatus.FINISHED_ABORTED):
                aborted.add(victim)
        scheduler.check_integrity()
        steps += 1
        assert steps < 200_000, "the scheduler stopped making progress"

    for req_id, ref in expected.items():
        tokens, reason = results[req_id]
        if req_id in aborted:
            assert tokens == ref.outputs[: len(tokens)], req_id
            continue
        assert tokens == ref.outputs, f"{req_id}: outputs differ from the reference run"
        assert reason == ref.finish_reason, req_id
    assert scheduler.num_free_blocks == scheduler.num_blocks
    assert not scheduler.has_unfinished_requests()
    return {"steps": steps, "preemptions": preemptions, "stats": scheduler.stats(),
            "tokens": runner.tokens_computed}


CONFIGS = {
    # roomy KV, big budget
    "roomy": SchedulerConfig(num_blocks=512, block_size=16, max_num_seqs=32,
                             max_num_batched_tokens=512, max_model_len=256),
    # tiny budget: every prompt is chunked
    "chunked": SchedulerConfig(num_blocks=512, block_size=8, max_num_seqs=16,
                               max_num_batched_tokens=24, max_model_len=192),
    # tiny KV: constant preemption
    "tight_kv": SchedulerConfig(num_blocks=40, block_size=8, max_num_seqs=16,
                                max_num_batched_tokens=128, max_model_len=160),
    "priority": SchedulerConfig(num_blocks=48, block_size=4, max_num_seqs=8,
                                max_num_batched_tokens=64, max_model_len=128, scheduling_policy="priority",
                                long_prefill_token_threshold=16),
    "no_prefix_cache": SchedulerConfig(num_blocks=64, block_size=16, max_num_seqs=8,
                                       max_num_batched_tokens=256, max_model_len=256,
                                       enable_prefix_caching=False, enable_chunked_prefill=False),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2])
def test_random_requests_match_reference(name: str, seed: int) -> None:
    summary = drive(CONFIGS[name], seed=seed, num_requests=400, abort_rate=0.05)
    stats = summary["stats"]
    if name == "tight_kv":
        assert summary["preemptions"] > 0 and stats.num_preemptions > 0
    if name in ("roomy", "chunked"):
        assert stats.prefix_cache_hits > 0
    if name == "no_prefix_cache":
        assert stats.prefix_cache_hits == 0
