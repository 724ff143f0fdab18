"""The CPU vendor the kernels decide by (cpu_isa.cpp: the non-temporal hint of next_panel.h is taken
on AMD CPUs only) is the one Linux reports in /proc/cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest

from corellm import _core

CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(name: str) -> str:
    for line in CPUINFO.read_text().splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    pytest.skip(f"/proc/cpuinfo has no '{name}' line")


@pytest.mark.skipif(not CPUINFO.exists(), reason="no /proc/cpuinfo")
def test_the_vendor_is_the_one_linux_reports():
    assert _core.kernels.cpu_is_amd() == (_cpuinfo_field("vendor_id") == "AuthenticAMD")

