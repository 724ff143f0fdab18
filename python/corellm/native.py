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

try:
    from corellm import _cuda
except ImportError:  # built without nvcc, or a CPU-only installation
    _cuda = None

__all__ = ["_core", "_cuda"]
