"""Whether the engine is computing steps: the KV cache's background commit (kv_cache.py) runs
only in the pauses between them.

Why: in a VM, the first write to guest memory the host has not yet backed stalls the whole vCPU
while the host faults it in, whatever the writing thread's priority. On an AMD EPYC Zen 3 VM (2
vCPUs) committing the default 2 GiB on 2 MiB pages took 37 s of a vCPU; with it running beside
the steps, the first 16 x 128-token prefill of a fresh engine took 8.1 s (2.7 s with the commit
in the pauses: the engine faults in only the blocks it writes), and a fresh server's first
64-request load at concurrency 16 (BF16 SmolLM2) gave 1.03-1.04x less throughput and a p99 TTFT of
6.1-9.3 s instead of 4.0-5.4 s (three alternated pairs). Between steps the commit costs nothing;
a request that arrives during it waits for one chunk (one 2 MiB page) at most.

The step runner marks its steps (`with activity.running(): ...`); the committer asks
idle_seconds() before each chunk."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class StepActivity:
    def __init__(self) -> None:
        self._running = 0
        self._last_end = time.monotonic()  # idle from creation

    @contextmanager
    def running(self) -> Iterator[None]:
        self._running += 1
        try:
            yield
        finally:
            self._running -= 1
            self._last_end = time.monotonic()

    def idle_seconds(self) -> float:
        """0 while a step runs, else the seconds since the last one ended."""
        return 0.0 if self._running else time.monotonic() - self._last_end
