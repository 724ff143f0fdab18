"""transformers for the benchmarks that run it or write HF directories with it.

transformers (5.x) depends on and imports Hugging Face's `kernels` package; a script run from
bench/ has bench/ first on sys.path, where bench/kernels.py (corellm's kernel benchmark) would be
taken for it ("cannot import name 'CUDAProperties' from 'kernels'"). import_transformers() imports
the installed `kernels` first with bench/ off sys.path, so that the module cache holds the real
one, then transformers."""

from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

_BENCH = os.path.dirname(os.path.abspath(__file__))


def import_transformers() -> ModuleType:
    if "kernels" not in sys.modules:
        saved = sys.path[:]
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _BENCH]
        try:
            importlib.import_module("kernels")
        except ImportError:  # not installed: transformers then finds no usable `kernels` either
            pass
        finally:
            sys.path[:] = saved
    return importlib.import_module("transformers")
