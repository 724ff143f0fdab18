"""Models and their loading: HF directories (safetensors) and GGUF files, Llama family."""

from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.llama import LlamaForCausalLM
from corellm.model.loader import DEFAULT_MODEL, LoadedModel, load_model, resolve_model_path
from corellm.model.model_config import ModelConfig, UnsupportedModelError

__all__ = ["DEFAULT_MODEL", "AttentionMetadata", "LlamaForCausalLM", "LoadedModel", "ModelConfig",
           "UnsupportedModelError", "load_model", "resolve_model_path"]
