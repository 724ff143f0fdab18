"""A failed argument check in either native extension reaches Python as a ValueError naming the
value, never a crash. Each case runs in a child process that has imported torch first (as the
engine has), so a toolchain whose C++ exceptions cannot cross the extension boundary fails one
test, with the C++ runtime the child had mapped, instead of killing the test run. The CUDA
case needs corellm._cuda (built wherever nvcc is), not a GPU: the check runs before any launch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from corellm.ops._backend import cuda_available

# The child names the C++ runtime it has mapped before the call, so that a crash still says it.
CHILD = textwrap.dedent("""
    import sys, torch
    {setup}
    maps = open("/proc/self/maps").read().split()
    print("C++ runtime:", sorted({{p for p in maps if "libstdc++" in p or "libgcc_s" in p}}), flush=True)
    try:
        {call}
    except ValueError as e:
        print("ValueError:", e)
        sys.exit(0)
    print("no error raised")
    sys.exit(3)
""")

CASES = {
    "_core": ("import corellm._core as native", "native.BlockPool(0)", "num_blocks must be > 0, got 0"),
    # paged_attention's first check, the head size, comes before it reads any address.
    "_cuda": ("import corellm._cuda as native",
              "native.paged_attention(0, 0, 72, 0, 0, 1, 1, 72, 16, 0, 1, 0, 0, 1, 1, 0.1, 0, native.DTYPE_BF16,"
              " 20, 20, 0, 0)",
              "head_size 72 is not supported on CUDA"),
}


@pytest.mark.parametrize("module", sorted(CASES))
def test_a_native_check_raises_value_error(module):
    if module == "_cuda" and not cuda_available():
        pytest.skip("corellm._cuda is not built (no nvcc at build time)")
    setup, call, message = CASES[module]
    child = CHILD.format(setup=setup, call=call)
    run = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, (f"corellm.{module}: the child exited {run.returncode} instead of raising "
                                 f"ValueError\nstdout: {run.stdout[-500:]}\nstderr: {run.stderr[-1500:]}")
    assert message in run.stdout
