"""BroadcastChannel (distributed/broadcast_channel.py) between processes joined over gloo on
loopback, through each transport: every other rank gets rank 0's messages in order, header and
payload, including an empty one and one larger than a shared-memory slot (which travels on the
group). And the engine's workers on it: an idle longer than the collectives' timeout does not end
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


def rank_main(rank: int, size: int, init: str, transport: str, results) -> None:
    from corellm.distributed.broadcast_channel import BroadcastChannel
    from corellm.distributed.parallel_state import init_tensor_parallel

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
