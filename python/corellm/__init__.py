"""corellm: a vLLM-v1-style LLM inference engine with a compiled core."""

import os

# oneDNN caches one compiled primitive per GEMM shape, and torch's ideep layer another cache on
# top; both default to 1024 entries of about a megabyte each. A server sees a new row count almost
# every step, so the resident size would climb by a gigabyte or more before plateauing; 128 each
# bounds it while the shapes of consecutive steps (one decode batch size) still hit (bench/soak.py
# watches the server's resident size). Read by the libraries when torch loads: set before it, and
# a user's own setting wins.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "128")
os.environ.setdefault("LRU_CACHE_CAPACITY", "128")

from corellm.startup_gc import lasting_objects as _lasting_objects

with _lasting_objects():  # torch's import makes ~200k objects that live as long as the process
    # torch first: its libgomp.so.1 is then the one OpenMP runtime in the process, which the native
    # kernels share (see CMakeLists.txt), instead of a second thread pool fighting it for the cores.
    import torch  # noqa: F401

    from corellm.native import _core
    from corellm.config import EngineConfig, SchedulerConfig
    from corellm.inputs import PromptType, TextPrompt, TokensPrompt
    from corellm.lora.lora_request import LoRARequest
    from corellm.beam_search import BeamSearchOutput, BeamSearchParams, BeamSearchSequence
    from corellm.outputs import (ClassificationOutput, ClassificationRequestOutput, CompletionOutput, EmbeddingOutput,
                                 EmbeddingRequestOutput, Logprob, RequestOutput, ScoringOutput, ScoringRequestOutput)
    from corellm.pooling_params import PoolingParams
    from corellm.sampling_params import (RepetitionDetectionParams, RequestOutputKind, SamplingParams,
                                         StructuredOutputsParams)

__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in the model code; imported on first use so that `import corellm` stays light.
    if name == "LLM":
        from corellm.llm import LLM

        return LLM
    raise AttributeError(f"module 'corellm' has no attribute {name!r}")


__all__ = ["LLM", "BeamSearchOutput", "BeamSearchParams", "BeamSearchSequence", "ClassificationOutput",
           "ClassificationRequestOutput", "CompletionOutput", "EmbeddingOutput",
           "EmbeddingRequestOutput", "EngineConfig", "LoRARequest", "Logprob", "PoolingParams", "PromptType",
           "RepetitionDetectionParams", "RequestOutput", "RequestOutputKind", "SamplingParams", "SchedulerConfig",
           "ScoringOutput", "ScoringRequestOutput", "StructuredOutputsParams", "TextPrompt", "TokensPrompt", "_core",
           "__version__"]
