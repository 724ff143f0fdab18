"""The tensor-parallel executor's cost per step: rank 0 sending a step's inputs (StepMessage: a
header and one int32 buffer on the BroadcastChannel) to the other ranks, for a decode step of R
requests whose block tables cover C tokens each (the builder's table is --max-model-len wide; the
columns C reaches travel), --gap-us after every worker is waiting for it (the
engine's own work between two steps), through each transport: the shared-memory ring
(every rank on one machine) and gloo broadcasts over loopback (ranks on other machines). Latency
is from rank 0 starting the send to the last rank holding the step (the ranks' clocks are one
CLOCK_MONOTONIC); "rank 0" is the time the send takes the engine's thread. Also the all-reduce of
one layer's output at that batch (two per layer in a tensor-parallel model).

    .venv/bin/python bench/tp_overhead.py [--ranks 2] [--requests 1 64 256] [--context 2048] [--max-model-len 8192]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.multiprocessing as mp

BLOCK = 16


def step_arrays(requests: int, context: int, max_model_len: int) -> dict:
    """A decode step as the batch builder holds it: its block table as wide as max_model_len's blocks."""
    width = -(-max_model_len // BLOCK)
    return dict(input_ids=np.arange(requests, dtype=np.int32), positions=np.full(requests, context - 1, np.int32),
                slot_mapping=np.arange(requests, dtype=np.int32), seq_lens=np.full(requests, context, np.int32),
                query_start_loc=np.arange(requests + 1, dtype=np.int32),
                block_table=np.arange(requests * width, dtype=np.int32).reshape(requests, width), block_size=BLOCK,
                logits_indices=np.arange(requests, dtype=np.int32), max_query_len=1, max_seq_len=context)


def rank_main(rank: int, size: int, init: str, cases: list[tuple[int, int]], hidden: int, repeats: int,
              gap_s: float, transport: str, max_model_len: int, results) -> None:
    from corellm.distributed.broadcast_channel import BroadcastChannel, new_ring
    from corellm.distributed.parallel_state import init_tensor_parallel
    from corellm.native import _core
    from corellm.worker.step_message import STEP, StepMessage

    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, init, torch.device("cpu"), shm_all_reduce=transport == "shared memory")
    channel = BroadcastChannel(tp, shared_memory=transport == "shared memory")
    # Each worker tells rank 0 it waits for the step through a ring of its own (gloo's own latency
    # here is ~1 ms, and would decide when a worker starts to wait).
    ack = new_ring(1) if rank > 0 else None
    names = [None] * size
    torch.distributed.all_gather_object(names, ack.name if ack is not None else None, group=tp.group)
    acks = [_core.ShmBroadcast.attach(n, reader=0) for n in names[1:]] if rank == 0 else []
    torch.distributed.barrier(group=tp.group)
    rows = []
    for requests, context in cases:
        arrays = step_arrays(requests, context, max_model_len)
        x = torch.randn(requests, hidden, dtype=torch.bfloat16)
        stamps, reduce_times = np.zeros((repeats, 2)), []
        for i in range(repeats):
            tp.all_reduce(x)  # the ranks leave it together, so the next one times the all-reduce alone
            start = time.perf_counter()
            tp.all_reduce(x)
            reduce_times.append(time.perf_counter() - start)
            if rank == 0:
                for worker_ack in acks:  # each is waiting for the step now
                    assert worker_ack.receive(60.0) is not None
                end = time.perf_counter() + gap_s  # the engine's own work between two steps: busy, as the
                while time.perf_counter() < end:  # engine is (after a sleep a VM's vCPU comes back cold)
                    pass
                start = time.perf_counter()
                StepMessage.send(channel, **arrays)
                stamps[i] = (start, time.perf_counter())
            else:
                assert ack.publish(b"waiting", 60.0)
                command, _, step = StepMessage.receive(channel)
                assert command == STEP and step.input_ids.shape[0] == requests
                stamps[i, 1] = time.perf_counter()
        every = [torch.zeros(repeats, 2, dtype=torch.float64) for _ in range(size)]
        torch.distributed.all_gather(every, torch.from_numpy(stamps), group=tp.group)
        sent, held = every[0].numpy(), np.max([e.numpy()[:, 1] for e in every[1:]], axis=0)
        rows.append((requests, context, float(np.median(held - sent[:, 0])), float(np.median(sent[:, 1] - sent[:, 0])),
                     statistics.median(reduce_times)))
    if rank == 0:
        results.put(rows)
    torch.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--requests", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=8192, help="the builder's block table is this wide")
    p.add_argument("--hidden", type=int, default=576, help="the all-reduced rows' width (SmolLM2: 576)")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--gap-us", type=float, default=1000,
                   help="rank 0's busy time between the workers waiting and the send (its scheduling, sampling)")
    p.add_argument("--transport", choices=["shm", "gloo", "both"], default="both")
    args = p.parse_args()
    from corellm.worker.tp_workers import free_local_port

    context = mp.get_context("spawn")
    transports = {"shm": ["shared memory"], "gloo": ["gloo"], "both": ["shared memory", "gloo"]}[args.transport]
    print(f"{args.ranks} ranks on this machine, medians of {args.repeats}, the send {args.gap_us:.0f} us after "
          f"every worker waits for it")
    print(f"{'transport':>13} {'requests':>8} {'context':>8} {'step bytes':>10} {'latency, us':>11} "
          f"{'rank 0, us':>10} {'all-reduce, us':>14}")
    for transport in transports:
        results = context.Queue()
        init = f"tcp://127.0.0.1:{free_local_port()}"
        cases = [(r, args.context) for r in args.requests]
        procs = [context.Process(target=rank_main, args=(r, args.ranks, init, cases, args.hidden, args.repeats,
                                                          args.gap_us * 1e-6, transport, args.max_model_len,
                                                          results)) for r in range(args.ranks)]
        for proc in procs:
            proc.start()
        rows = results.get(timeout=600)
        for proc in procs:
            proc.join()
        for requests, ctx, latency, own, reduce in rows:
            nbytes = 4 * (4 * requests + 1 + requests * ctx // BLOCK + requests) + 8 * 13  # + size, wire
            print(f"{transport:>13} {requests:>8} {ctx:>8} {nbytes:>10} {latency * 1e6:>11.0f} {own * 1e6:>10.0f} "
                  f"{reduce * 1e6:>14.0f}")


if __name__ == "__main__":
    main()
