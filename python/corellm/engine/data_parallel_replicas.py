"""DataParallelReplicas: the replicas 1 .. N-1 of LLM(data_parallel_size=N) — each a process
(torch.multiprocessing, spawn) holding an LLM built with the same arguments, its own KV cache and
its share of the machine's cores. LLM.generate sends each replica a contiguous share of the
prompts, runs share 0 itself meanwhile, then puts the replicas' outputs back in prompt order.

    LLM (replica 0)                                replica r
      start: spawn, wait for "ready" ─────────▶     LLM(**same arguments) -> "ready" (or the error)
      generate: submit(r, share r) ───────────▶     llm.generate(share r) -> its RequestOutputs
                run share 0, then result(r) ◀──     (or the error, as text)
      shutdown ───────────────────────────────▶     None: shut down, exit

A replica that dies makes result() raise at once (its pipe closes). Replicas are not daemonic
processes, so that a tensor-parallel replica can start its own worker processes; they are shut
down at exit if the LLM was not (and end by themselves when this process dies: their pipe closes)."""

from __future__ import annotations

import atexit
import logging
import os
from typing import Any

import torch
import torch.multiprocessing as mp

from corellm.distributed.spawned_processes import MAIN_GUARD_HINT
from corellm.outputs import RequestOutput

logger = logging.getLogger("corellm")


def _next_work(conn):
    """The next share to generate, or None: shut down (asked to, or the parent is gone)."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def replica_main(arguments: dict[str, Any], threads: int, conn) -> None:
    from corellm.llm import LLM

    torch.set_num_threads(threads)
    try:
        llm = LLM(**arguments)
    except Exception as e:  # noqa: BLE001 - reported to the LLM that started this replica
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    conn.send(("ready", None))
    while (work := _next_work(conn)) is not None:
        prompts, params, priorities, loras = work
        try:
            conn.send(("ok", llm.generate(prompts, params, use_tqdm=False, priority=priorities, lora_request=loras)))
        except Exception as e:  # noqa: BLE001 - the caller's error, not the replica's end
            conn.send(("error", f"{type(e).__name__}: {e}"))
    llm.shutdown()


class DataParallelReplicas:
    def __init__(self, arguments: dict[str, Any], size: int):
        """Starts replicas 1 .. size-1 with the LLM arguments and waits until each has loaded the
        model; this process keeps a share of the cores for replica 0."""
        threads = max(1, (os.cpu_count() or 1) // size)
        context = mp.get_context("spawn")
        self._replicas: list[tuple[Any, Any]] = []  # (process, connection)
        atexit.register(self.shutdown)  # before multiprocessing's own exit handler joins them
        for r in range(1, size):
            parent, child = context.Pipe()
            process = context.Process(target=replica_main, args=(arguments, threads, child), daemon=False,
                                      name=f"corellm-dp{r}")
            process.start()
            child.close()
            self._replicas.append((process, parent))
        try:
            for r in range(1, size):
                self._receive(r)
        except BaseException:
            self.shutdown()
            raise
        torch.set_num_threads(threads)
        logger.info("data parallel: %d replicas, %d CPU threads each", size, threads)

    def _receive(self, r: int):
        process, conn = self._replicas[r - 1]
        try:
            kind, value = conn.recv()
        except (EOFError, OSError):
            process.join(timeout=5)
            raise RuntimeError(f"data-parallel replica {r} exited (status {process.exitcode}); its error is printed "
                               f"above (the usual cause at start-up: {MAIN_GUARD_HINT})") from None
        if kind == "error":
            raise RuntimeError(f"data-parallel replica {r}: {value}")
        return value

    def submit(self, r: int, prompts: list, params: list, priorities: list[int], loras: list) -> None:
        """Replica r (1 ..) starts generating for its share (loras: each prompt's LoRARequest or None)."""
        self._replicas[r - 1][1].send((prompts, params, priorities, loras))

    def result(self, r: int) -> list[RequestOutput]:
        """Replica r's outputs for its share, in its order (waits for them)."""
        return self._receive(r)

    def shutdown(self) -> None:
        for process, conn in self._replicas:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process, conn in self._replicas:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
            conn.close()
        self._replicas = []
        atexit.unregister(self.shutdown)
