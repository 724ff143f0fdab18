"""BroadcastChannel (distributed/broadcast_channel.py) between processes joined over gloo on
loopback, through each transport: every other rank gets rank 0's messages in order, header and
payload, including an empty one and one larger than a shared-memory slot (which travels on the
group); a StepMessage arrives as sent, its block table cut to the columns its longest sequence
reaches, and a worker's view of one is intact until its next receive. And the engine's workers on it: an idle longer than the collectives' timeout does not end
them; they stop when the engine's process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from corellm.distributed.broadcast_channel import HEADER_VALUES, RING_SLOT_BYTES


def messages() -> list[tuple[list[int], np.ndarray]]:
    g = np.random.default_rng(7)
    # int32 values that fill a slot after its size field and the wire header (two int64 + the header's)
    fill = (RING_SLOT_BYTES - 8 - 8 * (2 + HEADER_VALUES)) // 4
    sizes = [0, 1, 5, 1000, fill + 100, 3, fill, fill + 1]  # the 5th and the last travel on the group
    return [([i, size, -i, 2**40 + i], g.integers(-2**31, 2**31, size, dtype=np.int32)) for i, size in enumerate(sizes)]


BLOCK = 16


def steps() -> list[dict]:
    """Two steps as the batch builder holds them (a block table as wide as 64 blocks), the second
    with prompt rows and image rows."""
    g, tg = np.random.default_rng(11), torch.Generator().manual_seed(11)
    out = []
    for seqs, max_seq_len, images in [(3, 40, 0), (5, 300, 2)]:
        n = seqs + 4
        out.append(dict(input_ids=g.integers(0, 1000, n, dtype=np.int32), positions=np.arange(n, dtype=np.int32),
                        slot_mapping=g.integers(0, 10**6, n, dtype=np.int32),
                        seq_lens=g.integers(1, max_seq_len + 1, seqs, dtype=np.int32),
                        query_start_loc=np.arange(seqs + 1, dtype=np.int32),
                        block_table=g.integers(0, 10**5, (seqs, 64), dtype=np.int32), block_size=BLOCK,
                        logits_indices=np.arange(seqs, dtype=np.int32), max_query_len=5, max_seq_len=max_seq_len,
                        prompt_rows=[(0, 3), (4, 6)] if images else [],
                        image_row_index=torch.arange(images), image_rows=torch.randn(images, 8, generator=tg).to(torch.bfloat16)
                        if images else None))
    return out


def step_problems(sent: dict, got) -> list[str]:
    cols = -(-sent["max_seq_len"] // BLOCK)
    expected = dict(input_ids=sent["input_ids"], positions=sent["positions"], logits_indices=sent["logits_indices"],
                    slot_mapping=sent["slot_mapping"], seq_lens=sent["seq_lens"],
                    query_start_loc=sent["query_start_loc"], block_table=sent["block_table"][:, :cols])
    actual = dict(input_ids=got.input_ids, positions=got.positions, logits_indices=got.logits_indices,
                  slot_mapping=got.attn.slot_mapping, seq_lens=got.attn.seq_lens,
                  query_start_loc=got.attn.query_start_loc, block_table=got.attn.block_table)
    problems = [name for name in expected if not np.array_equal(actual[name].numpy(), expected[name])]
    if (got.attn.max_query_len, got.attn.max_seq_len) != (sent["max_query_len"], sent["max_seq_len"]):
        problems.append("max lengths")
    if got.prompt_rows != sent["prompt_rows"]:
        problems.append(f"prompt rows {got.prompt_rows}")
    if sent["image_rows"] is not None and not (
            torch.equal(got.image_row_index, sent["image_row_index"])
            and torch.equal(got.image_row_bits.view(torch.bfloat16), sent["image_rows"])):
        problems.append("image rows")
    return problems


def rank_main(rank: int, size: int, init: str, transport: str, results) -> None:
    from corellm.distributed.broadcast_channel import BroadcastChannel
    from corellm.distributed.parallel_state import init_tensor_parallel
    from corellm.worker.step_message import STEP, STOP, StepMessage

    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, init, torch.device("cpu"))
    channel = BroadcastChannel(tp, shared_memory=transport == "shared memory")
    assert channel.transport == transport
    problems = []
    for i, (header, payload) in enumerate(messages()):
        if rank == 0:
            channel.send(header, [payload[:3], payload[3:]])  # parts sent as one payload
            continue
        got_header, got_payload = channel.receive()
        if got_header != header + [0] * (HEADER_VALUES - len(header)):
            problems.append(f"message {i}: header {got_header}")
        if not np.array_equal(got_payload, payload):
            problems.append(f"message {i}: payload of {got_payload.size} values differs")
    first = None
    for i, step in enumerate(steps()):
        if rank == 0:
            StepMessage.send(channel, **step)
            continue
        command, _, got = StepMessage.receive(channel)
        if command != STEP:
            problems.append(f"step {i}: command {command}")
            continue
        problems += [f"step {i}: {p}" for p in step_problems(step, got)]
        if first is None:
            first = got
        else:  # the first step's views hold until the next receive
            problems += [f"step 0 after step 1: {p}" for p in step_problems(steps()[0], first)]
    if rank == 0:
        StepMessage.send_command(channel, STOP)
    elif StepMessage.receive(channel)[0] != STOP:
        problems.append("no STOP")
    if rank != 0:
        results.put((rank, problems))
    torch.distributed.barrier(group=tp.group)
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("transport", ["shared memory", "gloo"])
def test_every_rank_gets_every_message_in_order(transport):
    from corellm.worker.tp_workers import free_local_port

    context = mp.get_context("spawn")
    results = context.Queue()
    init = f"tcp://127.0.0.1:{free_local_port()}"
    size = 3
    processes = [context.Process(target=rank_main, args=(r, size, init, transport, results)) for r in range(size)]
    for p in processes:
        p.start()
    reports = dict(results.get(timeout=120) for _ in range(size - 1))
    for p in processes:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert reports == {1: [], 2: []}


def test_a_ring_leaves_nothing_in_dev_shm_once_its_readers_joined():
    from corellm.distributed.broadcast_channel import new_ring

    ring = new_ring(2)
    path = "/dev/shm" + ring.name
    assert os.path.exists(path)
    ring.unlink_name()  # what the channel does once every rank joined its group
    assert not os.path.exists(path)
    assert ring.publish(b"still mapped", 1.0)


TINY = dict(dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2, tensor_parallel_size=3)


def tiny_model(tmp_path, tokenizer_json):
    from tests.model.tiny_models import make_tiny_model

    make_tiny_model("llama3", tmp_path, tokenizer_json, seed=5, hidden_size=72, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=192)
    return str(tmp_path)


def test_workers_outlive_an_idle_longer_than_the_collective_timeout(tmp_path, tokenizer_json, monkeypatch):
    from corellm import LLM, SamplingParams

    timeout = 10.0  # the workers' start (spawn, import torch) must fit in it: it bounds the rendezvous too
    monkeypatch.setenv("CORELLM_COLLECTIVE_TIMEOUT_S", str(timeout))  # spawned workers inherit it
    llm = LLM(tiny_model(tmp_path, tokenizer_json), **TINY)
    try:
        params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
        prompt = {"prompt_token_ids": [5, 17, 40, 41]}
        before = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
        time.sleep(timeout + 2)  # the workers wait for the next step all this time
        after = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0].token_ids
        assert list(after) == list(before)
    finally:
        llm.shutdown()


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")  # a zombie has exited: only its exit status is left


ENGINE = """
import sys, time
from corellm import LLM
llm = LLM(sys.argv[1], dtype="float32", max_model_len=128, kv_cache_memory=16 * 1024**2, tensor_parallel_size=3)
print(" ".join(str(p.pid) for p in llm.engine_core.model_runner.tp_workers._processes), flush=True)
time.sleep(600)
"""


def test_workers_stop_when_the_engine_process_is_killed(tmp_path, tokenizer_json):
    model = tiny_model(tmp_path, tokenizer_json)
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, model], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    try:
        workers = [int(p) for p in engine.stdout.readline().split()]
        assert len(workers) == 2 and all(running(p) for p in workers)
    finally:
        engine.send_signal(signal.SIGKILL)  # no clean-up of any kind in the engine
        engine.wait()
    deadline = time.monotonic() + 10
    while any(running(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(running(p) for p in workers), "a worker outlived its engine"


def test_a_ring_carries_header_and_values_and_refuses_other_items():
    from corellm.distributed.broadcast_channel import new_ring
    from corellm.native import _core

    ring = new_ring(1)
    reader = _core.ShmBroadcast.attach(ring.name, reader=0)
    ring.unlink_name()
    table = np.arange(24, dtype=np.int32).reshape(4, 6)
    assert ring.publish_values([7, -1, 2**40], [np.array([5, 6], np.int32), table[:, :2]], 1.0) is True
    header, values, count = reader.receive_values_in_place(1.0)
    assert header == [7, -1, 2**40] and count == 10
    assert values.tolist() == [5, 6, 0, 1, 6, 7, 12, 13, 18, 19]
    too_many = np.zeros(ring.slot_capacity // 4, np.int32)
    assert ring.publish_values([8], too_many, 1.0) is False  # the header alone, the values to go another way
    assert reader.receive_values_in_place(1.0) == ([8], None, too_many.size)
    with pytest.raises(ValueError, match="not int32"):
        ring.publish_values([9], [np.zeros(3, np.int64)], 1.0)
    assert reader.receive_values_in_place(0.01) is None  # nothing was published
