"""corellm: a vLLM-v1-style LLM inference engine with a compiled core."""

# torch first: its libgomp.so.1 is then the one OpenMP runtime in the process, which the native
# kernels share (see CMakeLists.txt), instead of a second thread pool fighting it for the cores.
import torch  # noqa: F401

from corellm import _core
from corellm.config import EngineConfig, SchedulerConfig
from corellm.outputs import CompletionOutput, Logprob, RequestOutput
from corellm.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in the model code; imported on first use so that `import corellm` stays light.
    if name == "LLM":
        from corellm.llm import LLM

        return LLM
    raise AttributeError(f"module 'corellm' has no attribute {name!r}")


__all__ = ["LLM", "CompletionOutput", "EngineConfig", "Logprob", "RequestOutput", "RequestOutputKind",
           "SamplingParams", "SchedulerConfig", "_core", "__version__"]
