"""The one module that imports corellm's compiled extensions: corellm._core (scheduler, KV block
pool, prefix hashing, batch builder, CPU kernels) and, where this installation built it,
corellm._cuda (the CUDA kernels). The rest of the package imports them from here, so that a
missing build fails in one place, with one message that says how to build it."""

from __future__ import annotations

import torch  # noqa: F401 - first: its libgomp is the OpenMP runtime the native kernels share

try:
    from corellm import _core
except ImportError as e:  # an installation whose extension was never built, or was built for another Python
    raise ImportError(f"corellm's native core (corellm._core) cannot be imported: {e}. Build it with `make build` "
                      f"(or `pip install -e .`) in this environment") from e

if not _core.kernels.supported_cpu_isas():  # before any kernel runs: they are compiled for x86-64-v3
    raise ImportError(f"corellm's CPU kernels need AVX2 and FMA (x86-64-v3, 2013 and later); this CPU "
                      f"({_core.kernels.cpu_model_name()}) lacks them")

try:
    from corellm import _cuda
except ImportError:  # built without nvcc, or a CPU-only installation
    _cuda = None

__all__ = ["_core", "_cuda", "cpu_kernel_path"]


def cpu_kernel_path() -> str:
    """The CPU kernels' instruction-set path and the CPU, for start-up logs and benchmark tables:
    "amx on Intel(R) Xeon(R) Processor (runs avx2, avx512, avx512bf16, amx)". ValueError when
    CORELLM_ISA asks for a path this CPU cannot run."""
    k = _core.kernels
    return f"{k.cpu_isa()} on {k.cpu_model_name()} (runs {', '.join(k.supported_cpu_isas())})"
