"""Test-run hooks. CORELLM_REPORT_AT_ONCE=1 (bench/gpu_check.sh sets it) prints a failure's
traceback the moment its test fails instead of at the end of the run: where a crash can end the
process (the GPU machine), the messages of the failures before it are kept."""

from __future__ import annotations

import os


def pytest_runtest_logreport(report) -> None:
    if report.failed and os.environ.get("CORELLM_REPORT_AT_ONCE") == "1":
        print(f"\n==== FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n", flush=True)
