"""Test-run hooks. CORELLM_REPORT_AT_ONCE=1 (bench/gpu_check.sh sets it) prints a failure's
traceback the moment its test fails instead of at the end of the run: where a crash can end the
process (the GPU machine), the messages of the failures before it are kept.

The tests' GGUF weight cache is the checkout's build/test-weight-cache (removed by `make clean`),
not the user's ~/.cache/corellm, unless CORELLM_CACHE_DIR says otherwise: the tests load files
written to temporary folders, each an entry of its own."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("CORELLM_CACHE_DIR", str(Path(__file__).resolve().parents[1] / "build" / "test-weight-cache"))


def pytest_runtest_logreport(report) -> None:
    if report.failed and os.environ.get("CORELLM_REPORT_AT_ONCE") == "1":
        print(f"\n==== FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n", flush=True)
