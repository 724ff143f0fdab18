"""EngineParts: what LLM and AsyncLLM both run — the loaded model, the EngineCore, and the input
and output processors around it — wired from one EngineConfig, in this one place."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from corellm.config import GENERATION_DEFAULTS, EngineConfig
from corellm.engine.engine_core import EngineCore
from corellm.engine.input_processor import InputProcessor
from corellm.engine.output_processor import OutputProcessor
from corellm.heap_reuse import keep_freed_memory_for_reuse
from corellm.lora.lora_registry import LoraRegistry
from corellm.model.loader import LoadedModel, load_model, load_model_config
from corellm.model.tensor_parallel import check_divisible
from corellm.multimodal.image_inputs import ImageInputs
from corellm.multimodal.image_loader import ImageLimits
from corellm.native import cpu_kernel_path
from corellm.structured_output import GrammarCompiler
from corellm.worker.tp_workers import TensorParallelWorkers

logger = logging.getLogger("corellm")


@dataclass
class EngineParts:
    loaded: LoadedModel
    engine_core: EngineCore
    input_processor: InputProcessor
    output_processor: OutputProcessor
    grammar_compiler: GrammarCompiler
    # The sampling defaults a request's left-out fields take: the model's generation_config's
    # unless the engine was configured otherwise (sampling_defaults_of). Read, never changed.
    sampling_defaults: dict

    @classmethod
    def build(cls, config: EngineConfig, loaded: LoadedModel | None = None) -> EngineParts:
        """Loads the model (unless given) and builds the engine core and both processors. On the
        CPU the kernels' instruction-set path is settled first: a CORELLM_ISA this CPU cannot run
        fails here, before anything is loaded."""
        if torch.device(config.device).type == "cpu":
            logger.info("CPU kernels: %s, %d threads", cpu_kernel_path(), torch.get_num_threads())
        workers = None
        folder_config = None  # a --generation-config folder's, read before anything loads
        if config.generation_config not in ("auto", "vllm"):
            folder_config = read_generation_config(config.generation_config)
        if config.node_rank != 0:
            raise ValueError(f"node_rank {config.node_rank}: only node 0 runs the engine; the other nodes run their "
                             f"ranks with `corellm serve MODEL --headless --node-rank {config.node_rank} ...`")
        if config.tensor_parallel_size > 1:
            if loaded is not None:
                raise ValueError("tensor_parallel_size > 1 loads the model in every rank: pass the model's path, "
                                 "not a loaded model")
            model_config = load_model_config(config.model, config.hf_overrides)  # before any process starts
            if model_config.encoder_only:
                raise ValueError(f"{model_config.source}: tensor parallelism is not supported for an encoder-only "
                                 f"model ({model_config.architecture}); run it with tensor_parallel_size 1")
            check_divisible(model_config, config.tensor_parallel_size)
            workers = TensorParallelWorkers.start(config)
        try:
            loaded = loaded or load_model(config.model, dtype=config.dtype, device=config.device,
                                          quantization=config.quantization,
                                          tensor_parallel=workers.tp if workers else None,
                                          max_model_len=config.max_model_len, hf_overrides=config.hf_overrides)
        except BaseException:
            if workers is not None:
                workers.stop()
            raise
        if loaded.config.encoder_only and loaded.model.device.type == "cpu":
            keep_freed_memory_for_reuse()  # its per-op layers allocate step-sized tensors (heap_reuse.py)
        weights = loaded.model.weight_bytes()
        logger.info("weights: %.1f MiB (%s), quantization %s", sum(weights.values()) / 2**20,
                    ", ".join(f"{kind} {size / 2**20:.1f} MiB" for kind, size in sorted(weights.items())),
                    loaded.quantization)
        generation_config = loaded.generation_config if folder_config is None else folder_config
        eos = generation_config.get("eos_token_id")
        extra_eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        eos_ids = [t for t in [loaded.tokenizer.eos_token_id, *extra_eos] if t is not None]
        grammar_compiler = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size, list(dict.fromkeys(eos_ids)))
        loras = lora_registry_of(loaded, config)
        engine_core = EngineCore(loaded, config, grammar_compiler, tp_workers=workers)
        input_processor = InputProcessor(loaded.tokenizer, loaded.config.vocab_size, engine_core.max_model_len,
                                         extra_eos, config.seed, config.scheduling_policy, grammar_compiler,
                                         config.reasoning_parser, image_inputs=image_inputs_of(loaded, config),
                                         prediction_drafts=engine_core.scheduler.config.prompt_lookup_max > 0,
                                         loras=loras, classifier_labels=loaded.config.classifier_labels,
                                         encoder_only=loaded.config.encoder_only,
                                         type_vocab_size=loaded.config.type_vocab_size,
                                         embedding_size=loaded.embedding_size,
                                         matryoshka_dimensions=loaded.config.matryoshka_dimensions)
        return cls(loaded, engine_core, input_processor, OutputProcessor(loaded.tokenizer, config.stream_interval),
                   grammar_compiler, sampling_defaults_of(generation_config, config))


def lora_registry_of(loaded: LoadedModel, config: EngineConfig) -> LoraRegistry | None:
    """The engine's LoRA adapters' registry (None without enable_lora; EngineConfig refused it on a
    GPU). An image model's (LLaVA) adapters update its language model."""
    if not config.enable_lora:
        return None
    if loaded.config.encoder_only:
        raise ValueError(f"{loaded.config.source}: LoRA adapters are not supported for an encoder-only model "
                         f"({loaded.config.architecture}); start it without enable_lora")
    return LoraRegistry(loaded.config, config.max_lora_rank, loaded.model.dtype)


def read_generation_config(folder: str) -> dict:
    """generation_config.json of a folder given as --generation-config (ValueError naming what is wrong)."""
    path = Path(folder) / "generation_config.json"
    if not path.is_file():
        raise ValueError(f"generation_config: {folder!r} is not 'auto', 'vllm' or a folder holding a "
                         f"generation_config.json")
    try:
        gen = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"generation_config: {path} is not readable JSON: {e}") from None
    if not isinstance(gen, dict):
        raise ValueError(f"generation_config: {path} must hold a JSON object")
    return gen


def sampling_defaults_of(generation_config: dict, config: EngineConfig) -> dict:
    """The sampling defaults set by the generation config ("vllm": none), then the overrides."""
    gen = {} if config.generation_config == "vllm" else generation_config
    defaults = {k: gen[k] for k in GENERATION_DEFAULTS if gen.get(k) is not None}
    return {**defaults, **(config.override_generation_config or {})}


def image_inputs_of(loaded: LoadedModel, config: EngineConfig) -> ImageInputs | None:
    """The image path of a model that takes images (None for a text model)."""
    llava = getattr(loaded.model, "llava", None)
    if llava is None or loaded.image_processor is None:
        return None
    limit = (config.limit_mm_per_prompt or {}).get("image", 1)
    return ImageInputs(loaded.image_processor, llava.image_token_id, llava.tokens_per_image, limit_per_prompt=limit,
                       limits=ImageLimits(allowed_media_domains=config.allowed_media_domains))
