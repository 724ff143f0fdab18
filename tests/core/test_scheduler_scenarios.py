"""Named scenarios through the Python binding of the scheduler: chunked prefill, prefix hits,
preemption and resume, aborts, bad input, and the binding's zero-copy arrays."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pytest

from corellm import _core
from corellm.config import SchedulerConfig
from tests.core.fake_model import FakeModelRunner

FINISHED_ABORTED = _core.RequestStatus.FINISHED_ABORTED
FINISHED_ERROR = _core.RequestStatus.FINISHED_ERROR


class Harness:
    def __init__(self, **config):
        base = dict(num_blocks=256, block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                    max_model_len=128)
        self.config = SchedulerConfig(**{**base, **config}).to_native()
        self.scheduler = _core.Scheduler(self.config)
        self.runner = FakeModelRunner(self.config, vocab_size=1000)
        self.outputs: dict[str, list[int]] = {}
        self.finish: dict[str, str] = {}

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 4, **kw) -> None:
        self.scheduler.add_request(req_id, prompt, max_tokens=max_tokens, **kw)
        self.runner.add_truth(req_id, prompt)
        self.outputs[req_id] = []

    def step(self) -> _core.SchedulerOutput:
        """One engine step: every plan, empty ones too, is closed by update_from_output."""
        plan = self.scheduler.schedule()
        self.scheduler.check_integrity()
        sampled = self.runner.execute(plan) if plan.num_reqs else np.zeros(0, dtype=np.int32)
        out = self.scheduler.update_from_output(plan, sampled)
        for i, req_id in enumerate(out.req_ids):
            self.outputs[req_id].append(int(out.new_token_ids[i]))
            if out.finish_reasons[i]:
                self.finish[req_id] = _core.FINISH_REASON_NAMES[int(out.finish_reasons[i])]
        self.scheduler.check_integrity()
        return plan

    def run(self, max_steps: int = 1000) -> None:
        for _ in range(max_steps):
            if not self.scheduler.has_unfinished_requests():
                return
            self.step()
        raise AssertionError("did not finish")

    def all_blocks_free(self) -> bool:
        return self.scheduler.num_free_blocks == self.scheduler.num_blocks


def test_chunked_prefill_spreads_a_long_prompt_over_steps() -> None:
    h = Harness(max_num_batched_tokens=16)
    h.add("long", list(range(1, 51)), max_tokens=2)
    chunks = []
    while True:
        plan = h.step()
        chunks.append((int(plan.num_computed_tokens[0]), int(plan.num_scheduled_tokens[0]),
                       bool(plan.samples_token[0])))
        if plan.samples_token[0]:
            break
    assert chunks == [(0, 16, False), (16, 16, False), (32, 16, False), (48, 2, True)]
    h.run()
    assert h.finish["long"] == "length" and h.all_blocks_free()


def test_prefix_hit_computes_only_the_tail_never_the_whole_prompt() -> None:
    h = Harness()
    system = list(range(100, 124))  # 24 tokens = 6 full blocks
    h.add("first", system + [1, 2, 3])
    h.run()
    h.add("second", system + [7, 8, 9, 10, 11])
    plan = h.step()
    new = plan.scheduled_new_reqs[0]
    assert new.num_computed_tokens == 24
    assert plan.num_scheduled_tokens[0] == 5
    # The very same prompt again: the last token is always computed (its logits are needed).
    h.run()
    h.add("third", system + [7, 8, 9, 10, 11])
    plan = h.step()
    assert plan.scheduled_new_reqs[0].num_computed_tokens == 28
    assert plan.num_scheduled_tokens[0] == 1
    h.run()
    assert h.outputs["second"] == h.outputs["third"]
    stats = h.scheduler.stats()
    assert stats.prefix_cache_hits == 24 + 28
    assert h.all_blocks_free()


def test_a_failed_step_leaves_no_findable_blocks() -> None:
    """The forward of a step fails (the engine ends the step's requests and serves on): the blocks
    it was to fill hold no KV, so a later request with the same prefix must not find them."""
    h = Harness()
    prefix = list(range(100, 164))  # 64 tokens = 16 full blocks
    h.add("doomed", prefix + [1, 2])
    plan = h.scheduler.schedule()
    h.runner.builder.update_states(plan)  # the model runner saw the plan; then its forward raised
    h.scheduler.finish_requests(["doomed"], FINISHED_ERROR)
    h.scheduler.update_from_output(plan, np.full(plan.num_reqs, -1, dtype=np.int32))
    h.scheduler.check_integrity()
    h.add("next", prefix + [7, 8])
    assert h.step().scheduled_new_reqs[0].num_computed_tokens == 0  # the fake model checks the KV it reads
    h.run()
    fresh = Harness()
    fresh.add("next", prefix + [7, 8])
    fresh.run()
    assert h.outputs["next"] == fresh.outputs["next"]
    assert h.all_blocks_free()


def test_blocks_become_findable_when_their_step_completes() -> None:
    """Two requests with one prefix in the same step do not share it (the first one's KV is not
    written yet when the step is planned); the next request does."""
    h = Harness()
    prefix = list(range(200, 232))  # 8 full blocks
    h.add("a", prefix + [1])
    h.add("b", prefix + [2])
    plan = h.step()
    assert [r.num_computed_tokens for r in plan.scheduled_new_reqs] == [0, 0]
    h.add("c", prefix + [3])
    assert h.step().scheduled_new_reqs[0].num_computed_tokens == 32


def test_cache_salt_keeps_tenants_apart() -> None:
    h = Harness()
    prompt = list(range(1, 30))
    h.add("a", prompt, cache_salt="tenant-a")
    h.run()
    h.add("b", prompt, cache_salt="tenant-b")
    assert h.step().scheduled_new_reqs[0].num_computed_tokens == 0
    h.add("c", prompt, cache_salt="tenant-a")
    h.run()
    h.add("d", prompt, cache_salt="tenant-a")
    assert h.step().scheduled_new_reqs[0].num_computed_tokens == 28


def test_preemption_and_resume_give_the_same_outputs_as_running_alone() -> None:
    prompts = {f"r{i}": list(range(10 * i + 1, 10 * i + 15)) for i in range(4)}
    alone = {}
    for req_id, prompt in prompts.items():
        h = Harness()
        h.add(req_id, prompt, max_tokens=20)
        h.run()
        alone[req_id] = h.outputs[req_id]
    # 12 blocks of 4 = 48 slots for 4 requests that each grow to 34 tokens.
    h = Harness(num_blocks=12, max_model_len=48)
    for req_id, prompt in prompts.items():
        h.add(req_id, prompt, max_tokens=20)
    preempted = []
    for _ in range(1000):
        if not h.scheduler.has_unfinished_requests():
            break
        preempted += h.step().preempted_req_ids
    assert preempted, "the tiny KV cache should have forced preemption"
    assert h.scheduler.stats().num_preemptions == len(preempted)
    assert h.outputs == alone
    assert h.all_blocks_free()


def test_a_request_preempting_itself_lets_the_others_run() -> None:
    """PRIORITY: the first running request is the lowest-priority one and the pool is full: it is
    its own preemption victim; the step goes on with the next running request (before: an empty
    plan, which the engine could not close). Every request ends as it would alone."""
    h = Harness(scheduling_policy="priority", num_blocks=4, max_model_len=16)
    h.add("low", [1, 2, 3, 4, 5, 6, 7], max_tokens=6, priority=1)
    h.step()  # low: 7 prompt tokens in 2 blocks, 8 tokens after the step
    h.add("high", [11, 12, 13, 14, 15, 16, 17], max_tokens=6, priority=0)
    h.step()  # low decodes inside its 2 blocks, high prefills into the last 2
    plan = h.step()  # low needs a third block: it preempts itself, high decodes
    assert list(plan.preempted_req_ids) == ["low"] and list(plan.req_ids) == ["high"]
    h.run()
    for req_id, prompt in (("low", [1, 2, 3, 4, 5, 6, 7]), ("high", [11, 12, 13, 14, 15, 16, 17])):
        alone = Harness(num_blocks=4, max_model_len=16)
        alone.add(req_id, prompt, max_tokens=6)
        alone.run()
        assert h.outputs[req_id] == alone.outputs[req_id]
    assert h.all_blocks_free()


def test_an_empty_plan_is_a_normal_step() -> None:
    h = Harness()
    plan = h.scheduler.schedule()  # nothing to do
    assert plan.num_reqs == 0
    out = h.scheduler.update_from_output(plan, np.zeros(0, dtype=np.int32))
    assert len(out.req_ids) == 0
    h.add("a", [1, 2, 3])
    h.run()
    assert h.finish["a"] == "length"


def test_abort_mid_prefill_and_mid_decode_frees_blocks() -> None:
    h = Harness(max_num_batched_tokens=8)
    h.add("prefilling", list(range(1, 40)), max_tokens=5)
    h.step()
    assert h.scheduler.get_request("prefilling")["num_computed_tokens"] == 8
    assert h.scheduler.finish_requests(["prefilling"], FINISHED_ABORTED) == 1
    assert h.all_blocks_free()
    h.add("decoding", [5, 6, 7], max_tokens=50)
    # The next step tells the model runner to drop the aborted request's state.
    assert list(h.step().finished_req_ids) == ["prefilling"]
    h.step()
    assert h.scheduler.get_request("decoding")["status"] == _core.RequestStatus.RUNNING
    assert h.scheduler.finish_requests(["decoding", "no-such-request"], FINISHED_ABORTED) == 1
    assert h.scheduler.get_request("decoding") is None
    assert h.all_blocks_free()
    plan = h.scheduler.schedule()
    assert list(plan.finished_req_ids) == ["decoding"]
    with pytest.raises(ValueError, match="FINISHED_"):
        h.scheduler.finish_requests(["x"], _core.RequestStatus.RUNNING)


def test_stop_token_eos_and_payload_travel() -> None:
    h = Harness()
    params = {"temperature": 0.0}
    h.add("r", [1, 2, 3], max_tokens=8, payload=params)
    plan = h.scheduler.schedule()
    assert plan.scheduled_new_reqs[0].payload is params
    sampled = h.runner.execute(plan)
    out = h.scheduler.update_from_output(plan, sampled)
    first = int(out.new_token_ids[0])
    # A second request whose eos is exactly what the fake model will produce stops at once.
    h.add("e", [1, 2, 3], max_tokens=8, eos_token_id=first)
    h.add("s", [1, 2, 3], max_tokens=8, stop_token_ids=[first])
    h.add("i", [1, 2, 3], max_tokens=3, eos_token_id=first, ignore_eos=True)
    h.run()
    assert h.finish["e"] == "stop" and h.outputs["e"] == [first]
    assert h.finish["s"] == "stop"
    assert h.finish["i"] == "length" and len(h.outputs["i"]) == 3


@pytest.mark.parametrize(
    "prompt, kwargs, message",
    [
        ([], {}, "the prompt is empty"),
        ([1, 2.5], {}, "prompt_token_ids must hold integers"),
        ([1, -2], {}, "prompt_token_ids[1] = -2 is out of range"),
        ([1, 2**40], {}, "is out of range"),
        ([[1, 2]], {}, "must be 1-D"),
        (list(range(1, 200)), {}, "the prompt has 199 tokens, but the model's context length (max_model_len) is 128"),
        ([1, 2], {"max_tokens": 0}, "max_tokens must be >= 1, got 0"),
        ([1, 2], {"min_tokens": 9, "max_tokens": 4}, "min_tokens must be in [0, max_tokens=4], got 9"),
        ([1, 2], {"stop_token_ids": ["a"]}, "stop_token_ids must hold integers"),
    ],
)
def test_bad_requests_raise_value_error(prompt, kwargs, message) -> None:
    h = Harness()
    kwargs.setdefault("max_tokens", 4)
    with pytest.raises(ValueError) as err:
        h.scheduler.add_request("bad", prompt, **kwargs)
    assert message in str(err.value)
    h.scheduler.check_integrity()


def test_step_protocol_errors_are_value_errors() -> None:
    h = Harness()
    h.add("a", [1, 2, 3])
    h.add("a2", [4, 5])
    with pytest.raises(ValueError, match="already in use"):
        h.scheduler.add_request("a", [1], max_tokens=1)
    plan = h.scheduler.schedule()
    with pytest.raises(ValueError, match="before update_from_output"):
        h.scheduler.schedule()
    with pytest.raises(ValueError, match="got sampled tokens for 1 requests, 2 were scheduled"):
        h.scheduler.update_from_output(plan, [1])
    with pytest.raises(ValueError, match="invalid sampled token id -1"):
        h.scheduler.update_from_output(plan, np.array([-1, 3], dtype=np.int32))
    h.scheduler.update_from_output(plan, [7, 8])


def test_arrays_are_zero_copy_views() -> None:
    h = Harness()
    h.add("a", list(range(1, 11)))
    plan = h.scheduler.schedule()
    b = h.runner.builder
    b.update_states(plan)
    b.prepare_inputs(plan)
    ids = b.input_ids
    assert ids.dtype == np.int32 and not ids.flags.owndata
    again = b.input_ids
    assert np.shares_memory(ids, again)  # both views of the builder's own buffer
    assert b.block_table.shape == (1, b.max_num_blocks_per_req)
    assert not plan.num_scheduled_tokens.flags.owndata


def test_schedule_releases_the_gil() -> None:
    # Two schedulers stepping in two threads must not corrupt each other or deadlock.
    def work(tag: str, errors: list) -> None:
        try:
            h = Harness()
            for i in range(30):
                h.add(f"{tag}-{i}", list(range(1, 20 + i)), max_tokens=6)
            h.run()
            assert h.all_blocks_free()
        except Exception as e:  # noqa: BLE001 - reported to the main thread
            errors.append(e)

    errors: list = []
    threads = [threading.Thread(target=work, args=(t, errors)) for t in ("x", "y")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_prefix_hasher_is_sha256_of_parent_tokens_and_salt() -> None:
    root = bytes(range(32))
    hasher = _core.PrefixHasher(root)
    tokens = np.array([1, 2, 3, 70000], dtype=np.int32)
    expected = hashlib.sha256(root + tokens.tobytes()).digest()
    assert hasher.hash_block(root, tokens) == expected
    salted = hashlib.sha256(root + tokens.tobytes() + (4).to_bytes(8, "little") + b"salt").digest()
    assert hasher.hash_block(root, tokens, "salt") == salted
    assert _core.PrefixHasher().root != _core.PrefixHasher().root  # per-process random key


def test_block_pool_binding() -> None:
    pool = _core.BlockPool(4)
    ids = pool.get_new_blocks(3)
    assert ids == [0, 1, 2] and pool.num_free_blocks == 1
    assert pool.get_new_blocks(2) is None
    pool.touch([0])
    assert pool.ref_cnt(0) == 2
    pool.free_blocks([2, 1, 0])
    pool.check_integrity()
    with pytest.raises(ValueError, match="block 3 is not in use"):
        pool.free_blocks([3])
    with pytest.raises(ValueError, match="out of range"):
        pool.touch([9])
    with pytest.raises(ValueError, match="num_blocks must be > 0"):
        _core.BlockPool(0)
