"""The one module that imports corellm's compiled extensions: corellm._core (scheduler, KV block
pool, prefix hashing, batch builder, CPU kernels) and, where this installation built it,
corellm._cuda (the CUDA kernels). The rest of the package imports them from here, so that a
missing build fails in one place, with one message that says how to build it."""

from __future__ import annotations

import os

import torch  # noqa: F401 - first: its libgomp is the OpenMP runtime the native kernels share

try:
    from corellm import _core
except ImportError as e:  # an installation whose extension was never built, or was built for another Python
    raise ImportError(f"corellm's native core (corellm._core) cannot be imported: {e}. Build it with `make build` "
                      f"(or `pip install -e .`) in this environment") from e

try:
    from corellm import _cuda
except ImportError:  # built without nvcc, or a CPU-only installation
    _cuda = None

__all__ = ["_core", "_cuda", "cpu_kernel_path"]


def cpu_kernel_path() -> str:
    """The CPU kernels' instruction-set path and the CPU, for start-up logs and benchmark tables:
    "amx on Intel(R) Xeon(R) Processor (runs avx512bf16, amx)". ValueError when CORELLM_ISA asks
    for a path this CPU cannot run."""
    k = _core.kernels
    runs = k.supported_cpu_isas()
    forced = os.environ.get("CORELLM_ISA")
    path = k.cpu_isa() if runs or forced else "none (no AVX-512-BF16: oneDNN's GEMM, generic kernels)"
    return f"{path} on {k.cpu_model_name()} (runs {', '.join(runs) or 'no corellm path'})"
