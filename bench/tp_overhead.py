"""The tensor-parallel executor's cost per step: rank 0 sending a step's inputs (StepMessage: a
header broadcast, then one int32 buffer) to the other ranks, for a decode step of R requests
whose block tables cover C tokens each, over gloo on loopback (the CPU's backend). Also the
all-reduce of one layer's output at that batch (two per layer in a tensor-parallel model).

    .venv/bin/python bench/tp_overhead.py [--ranks 2] [--requests 1 64 256] [--context 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.multiprocessing as mp

BLOCK = 16


def step_arrays(requests: int, context: int) -> dict:
    cols = context // BLOCK
    return dict(input_ids=np.arange(requests, dtype=np.int32), positions=np.full(requests, context - 1, np.int32),
                slot_mapping=np.arange(requests, dtype=np.int32), seq_lens=np.full(requests, context, np.int32),
                query_start_loc=np.arange(requests + 1, dtype=np.int32),
                block_table=np.arange(requests * cols, dtype=np.int32).reshape(requests, cols),
                logits_indices=np.arange(requests, dtype=np.int64), max_query_len=1, max_seq_len=context)


def rank_main(rank: int, size: int, init: str, cases: list[tuple[int, int]], hidden: int, repeats: int, results) -> None:
    from corellm.distributed.parallel_state import init_tensor_parallel
    from corellm.worker.step_message import STEP, StepMessage

    torch.set_num_threads(1)
    tp = init_tensor_parallel(rank, size, init, torch.device("cpu"))
    rows = []
    for requests, context in cases:
        arrays = step_arrays(requests, context)
        x = torch.randn(requests, hidden, dtype=torch.bfloat16)
        send_times, reduce_times, barrier_times = [], [], []
        for _ in range(repeats):
            torch.distributed.barrier(group=tp.group)
            start = time.perf_counter()
            torch.distributed.barrier(group=tp.group)
            barrier_times.append(time.perf_counter() - start)
            torch.distributed.barrier(group=tp.group)
            start = time.perf_counter()
            if rank == 0:
                StepMessage.send(tp, **arrays)
            else:
                command, _, step = StepMessage.receive(tp)
                assert command == STEP and step.input_ids.shape[0] == requests
            torch.distributed.barrier(group=tp.group)  # every rank has it
            send_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            tp.all_reduce(x)
            reduce_times.append(time.perf_counter() - start)
        barrier = statistics.median(barrier_times)
        rows.append((requests, context, statistics.median(send_times) - barrier, statistics.median(reduce_times)))
    if rank == 0:
        results.put(rows)
    torch.distributed.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--requests", type=int, nargs="+", default=[1, 64, 256])
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=576, help="the all-reduced rows' width (SmolLM2: 576)")
    p.add_argument("--repeats", type=int, default=200)
    args = p.parse_args()
    from corellm.worker.tp_workers import free_local_port

    context = mp.get_context("spawn")
    results = context.Queue()
    init = f"tcp://127.0.0.1:{free_local_port()}"
    cases = [(r, args.context) for r in args.requests]
    procs = [context.Process(target=rank_main, args=(r, args.ranks, init, cases, args.hidden, args.repeats, results))
             for r in range(args.ranks)]
    for proc in procs:
        proc.start()
    rows = results.get(timeout=600)
    for proc in procs:
        proc.join()
    print(f"gloo on loopback, {args.ranks} ranks, medians of {args.repeats} (the send until every rank has it, "
          f"a barrier's own time taken out)")
    print(f"{'requests':>8} {'context':>8} {'step inputs bytes':>18} {'send, us':>9} {'all-reduce, us':>15}")
    for requests, ctx, send, reduce in rows:
        nbytes = 4 * (4 * requests + 1 + requests * ctx // BLOCK + requests) + 64
        print(f"{requests:>8} {ctx:>8} {nbytes:>18} {send * 1e6:>9.0f} {reduce * 1e6:>15.0f}")


if __name__ == "__main__":
    main()
