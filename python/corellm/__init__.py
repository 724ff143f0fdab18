"""corellm: a vLLM-v1-style LLM inference engine with a compiled core."""

# torch first: its libgomp.so.1 is then the one OpenMP runtime in the process, which the native
# kernels share (see CMakeLists.txt), instead of a second thread pool fighting it for the cores.
import torch  # noqa: F401

from corellm import _core
from corellm.config import SchedulerConfig

__version__ = "0.1.0"

__all__ = ["SchedulerConfig", "_core", "__version__"]
