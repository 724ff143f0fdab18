"""corellm: a vLLM-v1-style LLM inference engine with a compiled core."""

from corellm import _core
from corellm.config import SchedulerConfig

__version__ = "0.1.0"

__all__ = ["SchedulerConfig", "_core", "__version__"]
