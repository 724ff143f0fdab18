"""Engine configuration dataclasses, validated on construction (ValueError, never assert)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from corellm.native import _core
from corellm.pooling_params import POOLING_TYPES
from corellm.reasoning_parser import REASONING_PARSERS
from corellm.sampling_params import SamplingParams

# quantization= values: "gguf" keeps a GGUF file's quantized tensors as they are (CPU kernels,
# quant_gemm.h); "int8" quantizes an HF checkpoint's linear layers to int8 at load (one scale per
# output row, activations quantized to int8 as they come; on the CPU quant_gemm.h, on a GPU the
# CUTLASS scaled GEMM); "fp8" does the same in fp8 e4m3 on a Hopper GPU (cuda/scaled_gemm.cu);
# "mxfp4" keeps an MXFP4 checkpoint's MXFP4 tensors (gpt-oss's experts) as they are (CPU kernels);
# "none" keeps (or dequantizes to) the dtype. Unset: "gguf" for a GGUF file and "mxfp4" for an MXFP4
# checkpoint on the CPU, else "none" (model/loader.py).
QUANTIZATION_METHODS = ("gguf", "int8", "fp8", "mxfp4", "none")
# generation_config.json fields that become a request's sampling defaults (vLLM's behaviour).
GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")

_POLICIES = {"fcfs": _core.SchedulingPolicy.FCFS, "priority": _core.SchedulingPolicy.PRIORITY}


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    # bool is an int subclass; True as a block size is a mistake, not a 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if not -2**31 <= value < 2**31:
        raise ValueError(f"{name} must be a 32-bit integer (< 2**31), got {value}")


@dataclass(frozen=True)
class SchedulerConfig:
    """What the scheduler may do in one step, and the KV capacity it schedules into. Here only
    the Python types are checked; the values are validated once, by the native SchedulerConfig
    (cpp/src/scheduler.cpp: ranges, capacity, chunked prefill), built at construction."""

    num_blocks: int  # KV cache capacity, in blocks
    max_num_seqs: int = 256  # running requests at most
    max_num_batched_tokens: int = 2048  # token budget of one step
    max_model_len: int = 2048  # prompt + output tokens of one request at most
    block_size: int = 16  # tokens per KV block
    long_prefill_token_threshold: int = 0  # >0: cap on one request's prompt tokens per step
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    scheduling_policy: str = "fcfs"  # "fcfs" or "priority"
    num_speculative_tokens: int = 0  # draft tokens verified per request per step at most (0: off)
    prompt_lookup_min: int = 0  # the scheduler's n-gram proposer (prompt_lookup_max 0: none)
    prompt_lookup_max: int = 0
    num_lookahead_tokens: int = 0  # KV slots past each scheduled request's tokens (a draft model's)
    # Image inputs, in placeholder tokens: the encoder's work per step at most, and the encoder
    # outputs held at once (0, 0: a text model).
    max_num_encoder_input_tokens: int = 0
    encoder_cache_size: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                _check_int(f.name, value)
            elif f.type == "bool" and not isinstance(value, bool):
                raise ValueError(f"{f.name} must be True or False, got {value!r}")
        if self.scheduling_policy not in _POLICIES:
            raise ValueError(f"scheduling_policy must be one of {sorted(_POLICIES)}, got {self.scheduling_policy!r}")
        native = _core.SchedulerConfig(  # ValueError naming the field and value
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_model_len=self.max_model_len,
            block_size=self.block_size,
            num_blocks=self.num_blocks,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            enable_prefix_caching=self.enable_prefix_caching,
            enable_chunked_prefill=self.enable_chunked_prefill,
            scheduling_policy=_POLICIES[self.scheduling_policy],
            num_speculative_tokens=self.num_speculative_tokens,
            prompt_lookup_min=self.prompt_lookup_min,
            prompt_lookup_max=self.prompt_lookup_max,
            num_lookahead_tokens=self.num_lookahead_tokens,
            max_num_encoder_input_tokens=self.max_num_encoder_input_tokens,
            encoder_cache_size=self.encoder_cache_size,
        )
        object.__setattr__(self, "_native", native)

    def to_native(self) -> _core.SchedulerConfig:
        return self._native


_SPEC_METHODS = ("ngram", "draft_model")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding, as vLLM's speculative_config names it:
      {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": n, "prompt_lookup_min": m}
        drafts copied from earlier in the request's own tokens (prompt lookup); a missing bound
        takes the other's value, both missing: 5 (vLLM's defaults);
      {"method": "draft_model", "model": PATH, "num_speculative_tokens": k}
        drafts from a smaller model with the same tokenizer ("model" alone implies this method).
    Each step verifies up to k drafts per request; greedy outputs are the same as without."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    model: str | None = None

    @classmethod
    def from_dict(cls, spec: "dict | SpeculativeConfig") -> "SpeculativeConfig":
        """From the JSON object a user wrote (ValueError naming an unknown or missing key)."""
        if isinstance(spec, SpeculativeConfig):
            return spec
        if not isinstance(spec, dict):
            raise ValueError(f"speculative_config must be a JSON object (a dict), got {type(spec).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        spec = dict(spec)
        if "method" not in spec and spec.get("model") is not None:
            spec["method"] = "draft_model"
        for key in ("method", "num_speculative_tokens"):
            if key not in spec:
                raise ValueError(f"speculative_config needs {key!r}")
        return cls(**spec)

    def __post_init__(self) -> None:
        if self.method not in _SPEC_METHODS:
            raise ValueError(f"speculative_config: method must be one of {', '.join(_SPEC_METHODS)}, got {self.method!r}")
        _check_int("speculative_config: num_speculative_tokens", self.num_speculative_tokens, 1)
        if self.method == "ngram":
            if self.model is not None:
                raise ValueError("speculative_config: method 'ngram' takes no 'model'")
            lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
            lo, hi = (5, 5) if lo is None and hi is None else (hi if lo is None else lo, lo if hi is None else hi)
            _check_int("speculative_config: prompt_lookup_min", lo, 1)
            _check_int("speculative_config: prompt_lookup_max", hi, 1)
            if lo > hi:
                raise ValueError(f"speculative_config: prompt_lookup_min ({lo}) must be <= prompt_lookup_max ({hi})")
            object.__setattr__(self, "prompt_lookup_min", lo)
            object.__setattr__(self, "prompt_lookup_max", hi)
        else:
            if not isinstance(self.model, str) or not self.model:
                raise ValueError("speculative_config: method 'draft_model' needs 'model' (a path or the default's name)")
            if self.prompt_lookup_min is not None or self.prompt_lookup_max is not None:
                raise ValueError("speculative_config: prompt_lookup_min/max belong to method 'ngram'")


# EngineConfig.kv_cache_dtype's values, vLLM's names (worker/kv_cache.py maps them to element types).
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


@dataclass(frozen=True)
class EngineConfig:
    """What the user chose for an engine (LLM, AsyncLLM, the server). None means: derive it from
    the model and the machine when the engine starts."""

    model: str | None = None  # an HF directory, a .gguf file, or the default's short name
    # Fields set over the HF directory's config.json before it is read (vLLM's hf_overrides; a
    # nested dict updates its own), e.g. a checkpoint loaded as a sequence classifier; a GGUF file
    # takes is_matryoshka and matryoshka_dimensions only (loader.GGUF_OVERRIDES).
    hf_overrides: dict | None = None
    dtype: str = "auto"
    quantization: str | None = None  # QUANTIZATION_METHODS, or None: chosen by the model and device
    device: str = "cpu"
    enforce_eager: bool = False  # CUDA: no CUDA graphs (every step eager)
    max_model_len: int | None = None  # default: the model's context, capped by the KV cache
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    block_size: int = 16
    enable_prefix_caching: bool = True
    kv_cache_memory: int | float | None = None  # bytes, or a fraction of free memory
    # The KV cache's element type (vLLM's kv_cache_dtype): "auto" the model's dtype, "bfloat16", or
    # an 8-bit float — "fp8" (= "fp8_e4m3") or "fp8_e5m2" — half the bytes per token (CPU, bfloat16 models).
    kv_cache_dtype: str = "auto"
    seed: int = 0
    long_prefill_token_threshold: int = 0
    scheduling_policy: str = "fcfs"  # "fcfs" or "priority" (lower priority values run first)
    # A reasoning model's <think> block format ("deepseek_r1", "qwen3"): structured output applies
    # after the reasoning; the server splits reasoning_content from the answer.
    reasoning_parser: str | None = None
    # Embedding requests (PoolingParams): how the prompt's hidden states become a vector ("LAST",
    # "MEAN", "CLS"); None: the model's (its sentence-transformers pooling config), else LAST.
    pooling_type: str | None = None
    # Where a request's sampling defaults (the fields it leaves out, of GENERATION_DEFAULTS) come
    # from, as vLLM's generation_config: "auto" the model's generation_config.json, "vllm" none
    # (SamplingParams' own), or a folder whose generation_config.json replaces the model's (its
    # eos_token_id too). override_generation_config: defaults set over those, e.g. {"temperature": 0.5}.
    generation_config: str = "auto"
    override_generation_config: dict | None = None
    # Speculative decoding (None: off); a dict is read by SpeculativeConfig.from_dict.
    speculative_config: SpeculativeConfig | dict | None = None
    # Image inputs (a LLaVA model): at most this many images per prompt (vLLM's
    # limit_mm_per_prompt={"image": N}), and the hosts remote image URLs may name (none: data URLs only).
    limit_mm_per_prompt: dict | None = None
    allowed_media_domains: tuple[str, ...] = ()
    # Tensor parallelism: the model split over this many processes (ranks 1.. in worker processes,
    # gloo on the CPU / NCCL on CUDA), the CPU's cores shared between them.
    tensor_parallel_size: int = 1
    # Ranks on several machines: nnodes nodes of tensor_parallel_size / nnodes ranks each, joined
    # through master_addr:master_port (node 0's, which hosts rank 0: the engine; the others run
    # `corellm serve --headless`). One node: a free local port.
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 0
    # On one machine the CPU ranks' all-reduces go through shared memory; True: through the
    # process group's backend (gloo) instead, as vLLM's disable_custom_all_reduce.
    disable_custom_all_reduce: bool = False
    # The ranks were started by torchrun (distributed/torchrun.py): rank 0's engine spawns no
    # workers, and every rank meets the others through env:// (MASTER_ADDR / MASTER_PORT).
    torchrun: bool = False
    # A streamed request's tokens go out this many at a time (its first token and its finish at
    # once): fewer, larger chunks, less per-token work where many streams run (vLLM's stream_interval).
    stream_interval: int = 1
    # LoRA adapters (vLLM's enable_lora): requests may name a PEFT adapter to run with; the model
    # runner holds max_loras of them at once (a step mixes any of those and the base model), each
    # of rank max_lora_rank at most.
    enable_lora: bool = False
    max_loras: int = 4
    max_lora_rank: int = 16

    def __post_init__(self) -> None:
        _check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        _check_int("nnodes", self.nnodes, 1)
        _check_int("node_rank", self.node_rank, 0)
        _check_int("master_port", self.master_port, 0)
        if self.tensor_parallel_size % self.nnodes:
            raise ValueError(f"tensor_parallel_size {self.tensor_parallel_size} must be a multiple of nnodes "
                             f"{self.nnodes} (each node runs the same number of ranks)")
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank {self.node_rank} must be below nnodes {self.nnodes}")
        if self.nnodes > 1 and not (0 < self.master_port < 65536):
            raise ValueError("several nodes need master_port (--master-port): node 0's port the ranks meet at")
        limits = self.limit_mm_per_prompt
        if limits is not None:
            if not isinstance(limits, dict) or set(limits) - {"image"}:
                raise ValueError(f"limit_mm_per_prompt takes {{'image': N}}, got {limits!r}")
            _check_int("limit_mm_per_prompt['image']", limits.get("image", 1), 0)
        object.__setattr__(self, "allowed_media_domains", tuple(self.allowed_media_domains))
        if self.hf_overrides is not None and (not isinstance(self.hf_overrides, dict)
                                              or not all(isinstance(k, str) for k in self.hf_overrides)):
            raise ValueError(f"hf_overrides must be a dict of config.json fields, got {self.hf_overrides!r}")
        if not isinstance(self.generation_config, str) or not self.generation_config:
            raise ValueError(f"generation_config must be 'auto', 'vllm' or a folder, got {self.generation_config!r}")
        overrides = self.override_generation_config
        if overrides is not None:
            if not isinstance(overrides, dict):
                raise ValueError(f"override_generation_config must be a dict, got {overrides!r}")
            for key, value in overrides.items():
                if key not in GENERATION_DEFAULTS:
                    raise ValueError(f"override_generation_config: {key!r} is not a sampling default; "
                                     f"the defaults are {', '.join(GENERATION_DEFAULTS)}")
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    raise ValueError(f"override_generation_config: {key} must be a number, got {value!r}")
            try:  # a value SamplingParams refuses is refused here, not in every request
                SamplingParams(**overrides)
            except ValueError as e:
                raise ValueError(f"override_generation_config: {e}") from None
        if self.pooling_type is not None and str(self.pooling_type).upper() not in POOLING_TYPES:
            raise ValueError(f"pooling_type must be one of {', '.join(POOLING_TYPES)}, got {self.pooling_type!r}")
        if self.speculative_config is not None:
            object.__setattr__(self, "speculative_config", SpeculativeConfig.from_dict(self.speculative_config))
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 2)
        if not isinstance(self.enable_lora, bool):
            raise ValueError(f"enable_lora must be True or False, got {self.enable_lora!r}")
        if self.enable_lora and self.device != "cpu":
            raise ValueError(f"enable_lora: LoRA adapters run on the CPU only so far, not on device {self.device!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size", "stream_interval", "max_loras",
                     "max_lora_rank"):
            _check_int(name, getattr(self, name), 1)
        _check_int("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.block_size % 2:
            raise ValueError(f"block_size must be even (the bfloat16 KV layout packs pairs), got {self.block_size}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        kv = self.kv_cache_memory
        if kv is not None:
            if isinstance(kv, bool) or not isinstance(kv, (int, float)):
                raise ValueError(f"kv_cache_memory must be bytes (int) or a fraction (float), got {kv!r}")
            if isinstance(kv, float) and not 0 < kv <= 1:
                raise ValueError(f"kv_cache_memory as a fraction of free memory must be in (0, 1], got {kv}")
            if isinstance(kv, int) and kv <= 0:
                raise ValueError(f"kv_cache_memory must be > 0 bytes, got {kv}")
        if self.device not in ("cpu", "cuda") and not str(self.device).startswith("cuda:"):
            raise ValueError(f"device must be 'cpu' or 'cuda', got {self.device!r}")
        if self.quantization not in (None, "auto", *QUANTIZATION_METHODS):
            raise ValueError(f"quantization must be one of {', '.join(QUANTIZATION_METHODS)} (or unset), "
                             f"got {self.quantization!r}")
        if self.scheduling_policy not in _POLICIES:
            raise ValueError(f"scheduling_policy must be one of {sorted(_POLICIES)}, got {self.scheduling_policy!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {self.kv_cache_dtype!r}")
        if self.kv_cache_dtype.startswith("fp8") and self.device != "cpu":
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype}: 8-bit KV caches are implemented in the CPU "
                             f"kernels only, not on device {self.device!r}; use kv_cache_dtype auto")
        if self.reasoning_parser is not None and self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"reasoning_parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
