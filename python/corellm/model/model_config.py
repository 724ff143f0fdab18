"""ModelConfig: the hyper-parameters of a Llama-family model, read from an HF config.json or from
GGUF metadata, validated, with one clear error for anything unsupported."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from corellm.model.classifier_labels import read_classifier_from_tokens, read_classifier_labels
from corellm.model.config_checks import UnsupportedModelError, check_positive_integers
from corellm.model.expert_fields import expert_fields
from corellm.model.yarn_fields import check_yarn, context_length, with_yarn_defaults

# HF architecture name -> corellm's model family flags.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "SmolLM3ForCausalLM": "smollm3",
    "Ernie4_5ForCausalLM": "ernie4_5",
    "Ernie4_5_MoeForCausalLM": "ernie4_5_moe",
    "GlmForCausalLM": "glm",
    "Glm4ForCausalLM": "glm4",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "OlmoeForCausalLM": "olmoe",
    "Olmo2ForCausalLM": "olmo2",
    "Olmo3ForCausalLM": "olmo3",
    "Phi3ForCausalLM": "phi3",
    "GraniteForCausalLM": "granite",
    "GraniteMoeForCausalLM": "granitemoe",
    "GptOssForCausalLM": "gpt_oss",
}
# A sequence classifier (a cross-encoder, a reward or label model) -> the decoder it is built on: the
# same layers, its final hidden state at the prompt's last token times a `score` matrix (num_labels x
# hidden, no bias) instead of an LM head (transformers' *ForSequenceClassification).
CLASSIFIER_ARCHITECTURES = {
    **{f"{family}ForSequenceClassification": f"{family}ForCausalLM"
       for family in ("Llama", "Mistral", "Qwen2", "Qwen3", "Gemma2", "Mixtral", "Qwen3Moe", "Qwen2Moe", "Phi3")},
    "Gemma3TextForSequenceClassification": "Gemma3ForCausalLM",
}
# GGUF general.architecture -> the HF architecture it stores.
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
    "qwen3moe": "Qwen3MoeForCausalLM",  # (a "llama" file with experts is Mixtral's)
    "qwen2moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "olmo2": "Olmo2ForCausalLM",  # (an Olmo 3 file too: its sliding layers in the metadata)
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "ernie4_5-moe": "Ernie4_5_MoeForCausalLM",
    "glm4": "Glm4ForCausalLM",  # GLM-4-0414, GLM-Z1 (llama.cpp's "chatglm", the older GLMs, is not read)
    "gpt-oss": "GptOssForCausalLM",
}
# HF architecture -> the GGUF general.architecture llama.cpp stores it under (Mixtral: "llama",
# told apart from Llama by its expert_count).
GGUF_ARCHITECTURE_OF = {**{hf: arch for arch, hf in GGUF_ARCHITECTURES.items()}, "MixtralForCausalLM": "llama"}
_ACTIVATIONS = ("silu", "gelu_pytorch_tanh", "swigluoai")
_LAYER_TYPES = ("full_attention", "sliding_attention")
GEMMA3_SLIDING_PATTERN = 6  # Gemma 3: five sliding-window layers, then one global


@dataclass(frozen=True)
class ModelConfig:
    architecture: str  # HF name, e.g. "LlamaForCausalLM"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool = False  # bias on q, k, v projections (Qwen2; Llama's attention_bias)
    qk_norm: bool = False  # RMSNorm on each head of q and k before RoPE (Qwen3)
    qk_norm_whole: bool = False  # with qk_norm: over q's and k's whole rows, not each head (OLMoE)
    rope_scaling: dict[str, Any] | None = None  # {"rope_type": "llama3", ...} or None
    partial_rotary_factor: float = 1.0  # the fraction of each head that rotary embeddings turn (Phi-4-mini: 0.75)
    # Rotary on the pairs (2i, 2i + 1) of a head, each by frequency i (GPT-J's, ERNIE 4.5's); False: the
    # pairs (i, i + d / 2), NeoX's and Llama's
    rope_interleaved: bool = False
    sliding_window: int = 0  # 0: none
    nope_layers: tuple[int, ...] = ()  # layers that turn no rotary embedding (SmolLM3's NoPE layers)
    # Gemma 3's differences from Llama (the defaults are Llama's):
    # the MLP's gate activation: silu, gelu_pytorch_tanh, or swigluoai (gpt-oss's: the gate clamped
    # above and the up half on both sides at swiglu_limit, then (up + 1) * gate * sigmoid(swiglu_alpha gate))
    hidden_activation: str = "silu"
    swiglu_alpha: float = 0.0
    swiglu_limit: float = 0.0
    # The embedding rows times this, the factor rounded to the dtype as HF's Gemma rounds it (Gemma:
    # sqrt(hidden); Granite: its embedding_multiplier, 12.0 in its releases, which bf16 holds exactly)
    embedding_multiplier: float = 1.0
    sandwich_norms: bool = False  # RMSNorm on the attention's and the MLP's outputs too
    # RMSNorm on each layer's input and on the MLP's (False: OLMo 2, whose layers norm only the
    # attention's and the MLP's outputs, sandwich_norms, before each joins the stream)
    pre_norms: bool = True
    layer_types: tuple[str, ...] = ()  # per layer full_attention / sliding_attention; (): sliding_window everywhere
    rope_local_theta: float = 0.0  # rope base of the sliding_attention layers (0: rope_theta)
    query_pre_attn_scalar: float = 0.0  # attention scale = this ** -0.5 (0: head_dim)
    norm_weight_offset: float = 0.0  # RMSNorm scales by (offset + weight) (Gemma: 1)
    # Gemma 2: the attention's scaled scores s become cap * tanh(s / cap) before the softmax, and the
    # logits l cap * tanh(l / cap) (0: none)
    attn_logit_softcapping: float = 0.0
    final_logit_softcapping: float = 0.0
    # Granite's multipliers (the defaults change nothing): each layer's attention and MLP outputs
    # times residual_multiplier before they join the residual stream; attention_multiplier the
    # attention scale itself (0: query_pre_attn_scalar's or head_dim's ** -0.5); logits divided by
    # logits_scaling. (Its embedding_multiplier is the field above.)
    residual_multiplier: float = 1.0
    attention_multiplier: float = 0.0
    logits_scaling: float = 1.0
    # A mixture of experts (Mixtral, Qwen3-MoE): a sparse layer's MLP is num_experts gated MLPs of
    # moe_intermediate_size, of which each token runs the num_experts_per_tok its router rates best.
    num_experts: int = 0  # 0: every MLP dense
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True  # the chosen experts' weights renormalized to sum to 1
    dense_layers: tuple[int, ...] = ()  # of a mixture-of-experts model, the layers whose MLP is dense
    shared_expert_intermediate_size: int = 0  # Qwen2-MoE: an expert every token runs, gated (0: none)
    shared_expert_gated: bool = True  # (ERNIE 4.5's shared experts: ungated, their output added whole)
    # ERNIE 4.5: the experts chosen by p + a learned bias per expert (e_score_correction_bias), their
    # weights p divided by at least moe_renormalize_min (moe_norm_min)
    moe_selection_bias: bool = False
    moe_renormalize_min: float = 0.0
    # gpt-oss: a bias on the router's logits and on each expert's gate_up and down projections, one on
    # the attention's output projection (attention_bias covers q, k and v), and a sink per layer and
    # head, a logit with no value that joins each of the head's softmax denominators (ops.paged_attention)
    moe_router_bias: bool = False
    expert_bias: bool = False
    attention_output_bias: bool = False
    attention_sinks: bool = False
    bos_token_id: int | None = None
    eos_token_id: list[int] = field(default_factory=list)
    # A sequence classifier's labels, by id (CLASSIFIER_ARCHITECTURES; its config's id2label); (): a
    # generator. `architecture` is then the decoder's, and the tied embedding stands in for the LM
    # head that such a checkpoint lacks (only for the one token an engine request samples to end).
    classifier_labels: tuple[str, ...] = ()
    # A causal checkpoint read as a classifier (vLLM's hf_overrides "classifier_from_token"): the score
    # matrix is the output projection's rows of these tokens, made at load (model/llama.py), or with
    # classifier_two_way (from_2_way_softmax: a [false, true] pair, one label) the second's row minus
    # the first's, so that the sigmoid of its logit is the softmax of the pair's.
    classifier_from_tokens: tuple[str, ...] = ()
    classifier_two_way: bool = False
    # An embedding model's Matryoshka lengths (model/matryoshka.py): None not one, () any length
    matryoshka_dimensions: tuple[int, ...] | None = None
    source: str = ""  # file the config came from, for error messages

    encoder_only = False  # a decoder (EncoderConfig's is True)
    type_vocab_size = 0  # a decoder reads no token types (an encoder's segments: EncoderConfig)

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.source}: architecture {self.architecture!r} is not supported; "
                f"corellm runs {sorted(SUPPORTED_ARCHITECTURES)}"
            )
        check_positive_integers(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "num_key_value_heads", "head_dim",
                                       "max_position_embeddings"))
        if not self.pre_norms and not self.sandwich_norms:
            raise ValueError(f"{self.source}: a model without pre-norms needs the sandwich norms on its outputs")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"{self.source}: num_attention_heads ({self.num_attention_heads}) must be a "
                             f"multiple of num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"{self.source}: head_dim must be even for rotary embeddings, got {self.head_dim}")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        object.__setattr__(self, "nope_layers", tuple(self.nope_layers))
        if any(not 0 <= i < self.num_hidden_layers for i in self.nope_layers):
            raise ValueError(f"{self.source}: nope_layers {self.nope_layers} must be layers of the "
                             f"{self.num_hidden_layers}")
        if self.sliding_window >= self.max_position_embeddings:  # (Phi-3.5-mini's 262144 of 131072 positions)
            object.__setattr__(self, "sliding_window", 0)  # a window as long as the context is none
        if self.layer_types and (len(self.layer_types) != self.num_hidden_layers
                                 or any(t not in _LAYER_TYPES for t in self.layer_types)):
            raise UnsupportedModelError(f"{self.source}: layer_types must name {self.num_hidden_layers} layers, each "
                                        f"one of {_LAYER_TYPES}; got {list(self.layer_types)}")
        object.__setattr__(self, "dense_layers", tuple(sorted(self.dense_layers)))
        object.__setattr__(self, "classifier_labels", tuple(self.classifier_labels))  # (a list from JSON)
        object.__setattr__(self, "classifier_from_tokens", tuple(self.classifier_from_tokens))
        if self.matryoshka_dimensions is not None:
            object.__setattr__(self, "matryoshka_dimensions", tuple(self.matryoshka_dimensions))
        if self.num_experts:
            if not 1 <= self.num_experts_per_tok <= self.num_experts or self.moe_intermediate_size <= 0:
                raise ValueError(f"{self.source}: a mixture of experts needs 1 <= num_experts_per_tok "
                                 f"({self.num_experts_per_tok}) <= num_experts ({self.num_experts}) and a positive "
                                 f"moe_intermediate_size ({self.moe_intermediate_size})")
            if any(not 0 <= i < self.num_hidden_layers for i in self.dense_layers):
                raise ValueError(f"{self.source}: dense layers {list(self.dense_layers)} outside the "
                                 f"{self.num_hidden_layers} layers")
        if self.hidden_activation not in _ACTIVATIONS:
            raise UnsupportedModelError(f"{self.source}: activation {self.hidden_activation!r} is not supported "
                                        f"({', '.join(_ACTIVATIONS)})")
        if self.hidden_activation == "swigluoai" and not (self.swiglu_alpha > 0 and self.swiglu_limit > 0
                                                          and math.isfinite(self.swiglu_alpha)
                                                          and math.isfinite(self.swiglu_limit)):
            raise ValueError(f"{self.source}: swiglu_alpha ({self.swiglu_alpha}) and swiglu_limit "
                             f"({self.swiglu_limit}) must be positive and finite")
        if not self.logits_scaling > 0 or not math.isfinite(self.residual_multiplier) or self.attention_multiplier < 0:
            raise ValueError(f"{self.source}: logits_scaling ({self.logits_scaling}) must be positive, "
                             f"residual_multiplier ({self.residual_multiplier}) finite and attention_multiplier "
                             f"({self.attention_multiplier}) not negative")
        rotary = self.head_dim * self.partial_rotary_factor
        if not 0 < self.partial_rotary_factor <= 1 or rotary != int(rotary) or int(rotary) % 2:
            raise ValueError(f"{self.source}: partial_rotary_factor {self.partial_rotary_factor} of head_dim "
                             f"{self.head_dim} must give an even number of rotary dimensions")
        for name in ("attn_logit_softcapping", "final_logit_softcapping"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{self.source}: {name} must be 0 (none) or positive, got {value!r}")
        if self.rope_scaling is not None:
            kind = self.rope_type
            if kind not in ("llama3", "default", "linear", "longrope", "yarn"):
                raise UnsupportedModelError(f"{self.source}: rope scaling type {kind!r} is not supported "
                                            f"(supported: llama3, linear, longrope, yarn)")
            if kind == "longrope":
                self._check_longrope()
            if kind == "yarn":
                check_yarn(self.rope_scaling, self.source)

    @property
    def family(self) -> str:
        return SUPPORTED_ARCHITECTURES[self.architecture]

    def layer_window(self, layer: int) -> int:
        """Layer `layer`'s sliding window (0: it attends to the whole context)."""
        if self.layer_types and self.layer_types[layer] == "full_attention":
            return 0
        return self.sliding_window

    def layer_uses_rope(self, layer: int) -> bool:
        return layer not in self.nope_layers

    def layer_rope_theta(self, layer: int) -> float:
        if self.layer_types and self.layer_types[layer] == "sliding_attention" and self.rope_local_theta:
            return self.rope_local_theta
        return self.rope_theta

    def _check_longrope(self) -> None:
        """LongRoPE (Phi-3): one short and one long factor per rotary frequency, and the context
        length the model was pretrained at."""
        s = self.rope_scaling
        half = self.rotary_dim // 2
        for key in ("short_factor", "long_factor"):
            factors = s.get(key)
            if not isinstance(factors, (list, tuple)) or len(factors) != half:
                raise ValueError(f"{self.source}: longrope rope scaling needs {key} with {half} values (one per "
                                 f"rotary frequency), got {factors!r}")
        original = s.get("original_max_position_embeddings")
        if not isinstance(original, int) or original <= 0:
            raise ValueError(f"{self.source}: longrope rope scaling needs a positive "
                             f"original_max_position_embeddings, got {original!r}")

    @property
    def rope_type(self) -> str | None:
        """The rope scaling's type (None: no scaling); its older key "type" read too."""
        if self.rope_scaling is None:
            return None
        return self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head that rotary embeddings turn (the first ones)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def layer_is_sparse(self, layer: int) -> bool:
        """Whether layer `layer`'s MLP is a mixture of experts."""
        return self.num_experts > 0 and layer not in self.dense_layers

    @property
    def attention_scale(self) -> float:
        return self.attention_multiplier or (self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str = "config.json") -> "ModelConfig":
        archs = cfg.get("architectures") or []
        if not archs:
            raise UnsupportedModelError(f"{source}: no 'architectures' entry; cannot tell which model this is")
        arch = archs[0]
        if arch in CLASSIFIER_ARCHITECTURES:
            tokens, two_way = read_classifier_from_tokens(cfg, source)
            # A score matrix from the checkpoint: the tied embedding stands in for its missing LM head.
            tie = {} if tokens else {"tie_word_embeddings": True}
            decoder = cls.from_hf_config({**cfg, "architectures": [CLASSIFIER_ARCHITECTURES[arch]], **tie}, source)
            labels = (tokens[1:] if two_way else tokens) or read_classifier_labels(cfg, source)
            return dataclasses.replace(decoder, classifier_labels=labels, classifier_from_tokens=tokens,
                                       classifier_two_way=two_way)
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{source}: architecture {arch!r} is not supported; corellm runs "
                f"{sorted(SUPPORTED_ARCHITECTURES)}, the sequence classifiers {sorted(CLASSIFIER_ARCHITECTURES)} and "
                f"the encoders BertModel, XLMRobertaModel, RobertaModel and their *ForSequenceClassification"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        quantization = cfg.get("quantization_config")
        method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
        if quantization is not None and not (family == "gpt_oss" and method == "mxfp4"):
            raise UnsupportedModelError(
                f"{source}: a checkpoint quantized by {method!r} (its quantization_config) "
                f"is not supported; corellm reads bf16 / fp16 / fp32 checkpoints (quantized at load with "
                f"--quantization int8 or fp8), GGUF files, and gpt-oss's MXFP4 experts")
        if family in ("gemma2", "gemma3"):
            return cls._from_gemma_config(cfg, source, family)
        heads = cfg["num_attention_heads"]
        # transformers >= 5 nests rope settings in rope_parameters; older files use rope_theta/rope_scaling.
        rope_params = dict(cfg.get("rope_parameters") or {})
        local_rope: dict[str, Any] = {}
        if "full_attention" in rope_params:  # Olmo 3: a rope per layer type, the sliding layers' unscaled
            local_rope = dict(rope_params.get("sliding_attention") or {})
            rope_params = dict(rope_params["full_attention"] or {})
            if local_rope.get("rope_type", "default") != "default":
                raise UnsupportedModelError(f"{source}: rope scaling on the sliding-window layers "
                                            f"({local_rope.get('rope_type')!r}) is not supported")
        rope_theta = float(rope_params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = cfg.get("rope_scaling") or None
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = rope_params
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) == "default":
            scaling = None
        if scaling is not None and scaling.get("rope_type", scaling.get("type")) in ("longrope", "su"):
            # Phi-3 keeps the pretrained context length beside max_position_embeddings ("su": its first name)
            scaling = {**scaling, "rope_type": "longrope"}
            scaling.setdefault("original_max_position_embeddings", cfg.get("original_max_position_embeddings"))
        scaling = with_yarn_defaults(scaling, cfg)
        eos = cfg.get("eos_token_id")
        sliding = 0
        if cfg.get("clip_qkv") is not None:
            raise UnsupportedModelError(f"{source}: clip_qkv is not supported")
        if family in ("ernie4_5", "ernie4_5_moe") and cfg.get("use_bias"):
            raise UnsupportedModelError(f"{source}: use_bias (biases on every projection) is not supported")
        if family in ("mistral", "mixtral", "phi3", "olmo3", "gpt_oss") or cfg.get("use_sliding_window"):
            sliding = int(cfg.get("sliding_window") or 0)
        olmo = family in ("olmo2", "olmo3")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            max_position_embeddings=context_length(cfg, scaling, 2048),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=family in ("qwen2", "gpt_oss") or (family == "qwen2_moe" and cfg.get("qkv_bias", True))
            or bool(cfg.get("attention_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe", "olmoe") or olmo,
            qk_norm_whole=family == "olmoe" or olmo,
            sandwich_norms=olmo or family == "glm4",
            pre_norms=not olmo,
            **({"layer_types": tuple(cfg.get("layer_types") or ()),
                "rope_local_theta": float(local_rope.get("rope_theta", rope_theta))} if family == "olmo3" else {}),
            **(_gpt_oss_fields(cfg, source) if family == "gpt_oss" else {}),
            rope_scaling=dict(scaling) if scaling else None,
            partial_rotary_factor=float(rope_params.get("partial_rotary_factor",
                                                        cfg.get("partial_rotary_factor", 1.0))),
            sliding_window=sliding,
            **_smollm3_fields(cfg, family, source),
            rope_interleaved=family in ("ernie4_5", "ernie4_5_moe", "glm", "glm4"),
            **expert_fields(cfg, family, source),
            **_granite_multipliers(cfg, family),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            source=source,
        )

    @classmethod
    def _from_gemma_config(cls, cfg: dict[str, Any], source: str, family: str) -> "ModelConfig":
        """Gemma3ForCausalLM (model_type gemma3_text): rope per layer type, sandwich norms, GeGLU,
        q/k norms. Gemma2ForCausalLM: the same without the q/k norms, with one rope base, sliding and
        global layers alternating (the first sliding), and its scores and logits soft-capped."""
        gemma2 = family == "gemma2"
        if not gemma2:
            for key in ("final_logit_softcapping", "attn_logit_softcapping"):
                if cfg.get(key) is not None:
                    raise UnsupportedModelError(f"{source}: {key} is not supported (Gemma 3 sets none)")
        if cfg.get("use_bidirectional_attention"):
            raise UnsupportedModelError(f"{source}: use_bidirectional_attention is not supported")
        rope = dict(cfg.get("rope_parameters") or {})
        if gemma2:  # one rope for every layer
            rope = {"full_attention": rope, "sliding_attention": rope}
        full, local = dict(rope.get("full_attention") or {}), dict(rope.get("sliding_attention") or {})
        scaling = full if full.get("rope_type", "default") != "default" else (cfg.get("rope_scaling") or None)
        scaling = with_yarn_defaults(scaling, cfg)
        layers = cfg["num_hidden_layers"]
        pattern = 2 if gemma2 else cfg.get("sliding_window_pattern", GEMMA3_SLIDING_PATTERN)
        layer_types = cfg.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(layers)]
        theta = float(full.get("rope_theta", cfg.get("rope_theta", 10000.0 if gemma2 else 1e6)))
        heads, eos = cfg["num_attention_heads"], cfg.get("eos_token_id")
        hidden = cfg["hidden_size"]
        return cls(
            architecture="Gemma2ForCausalLM" if gemma2 else "Gemma3ForCausalLM",
            vocab_size=cfg["vocab_size"],
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or hidden // heads,
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            max_position_embeddings=context_length(cfg, scaling, 8192 if gemma2 else 32768),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            qk_norm=not gemma2,
            rope_scaling=dict(scaling) if scaling else None,
            sliding_window=int(cfg.get("sliding_window") or 0),
            hidden_activation=cfg.get("hidden_activation") or cfg.get("hidden_act") or "gelu_pytorch_tanh",
            embedding_multiplier=hidden**0.5,
            sandwich_norms=True,
            layer_types=tuple(layer_types),
            rope_local_theta=theta if gemma2 else float(local.get("rope_theta",
                                                                  cfg.get("rope_local_base_freq", 10000.0))),
            query_pre_attn_scalar=float(cfg.get("query_pre_attn_scalar") or 0.0),
            norm_weight_offset=1.0,
            attn_logit_softcapping=float(cfg.get("attn_logit_softcapping") or 0.0),
            final_logit_softcapping=float(cfg.get("final_logit_softcapping") or 0.0),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=[] if eos is None else ([eos] if isinstance(eos, int) else list(eos)),
            source=source,
        )


SMOLLM3_NOPE_INTERVAL = 4  # SmolLM3: every fourth layer turns no rotary embedding


def _gpt_oss_fields(cfg: dict[str, Any], source: str) -> dict[str, Any]:
    """gpt-oss (GptOssForCausalLM): sliding-window and global layers alternating (layer_types; by
    default the even ones sliding), biases on q, k, v and o, a sink per head, the clamped SwiGLU,
    and biases on the router and the experts (expert_fields has the experts' counts)."""
    layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                             for i in range(layers)]
    if not cfg.get("attention_bias", True):
        raise UnsupportedModelError(f"{source}: gpt-oss without attention_bias is not supported")
    return dict(layer_types=tuple(layer_types), hidden_activation="swigluoai",
                swiglu_alpha=float(cfg.get("swiglu_alpha", 1.702)), swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                attention_output_bias=True, attention_sinks=True)


def _smollm3_fields(cfg: dict[str, Any], family: str, source: str) -> dict[str, Any]:
    """SmolLM3's NoPE layers ({} for the other families): its config's no_rope_layers (per layer, 1:
    rotary, 0: none), or every no_rope_layer_interval-th layer; and the layers its sliding window
    applies to (layer_types) where use_sliding_window is set."""
    if family != "smollm3":
        return {}
    layers = cfg["num_hidden_layers"]
    flags = cfg.get("no_rope_layers")
    if flags is None:
        interval = int(cfg.get("no_rope_layer_interval") or SMOLLM3_NOPE_INTERVAL)
        flags = [int((i + 1) % interval != 0) for i in range(layers)]
    if len(flags) != layers:
        raise UnsupportedModelError(f"{source}: no_rope_layers names {len(flags)} layers of {layers}")
    fields: dict[str, Any] = {"nope_layers": tuple(i for i, rope in enumerate(flags) if not rope)}
    if cfg.get("use_sliding_window") and cfg.get("layer_types"):
        fields["layer_types"] = tuple(cfg["layer_types"])
    return fields


def _granite_multipliers(cfg: dict[str, Any], family: str) -> dict[str, float]:
    """Granite's four multipliers as the config gives them ({} for the other families)."""
    if family not in ("granite", "granitemoe"):
        return {}
    return dict(embedding_multiplier=float(cfg.get("embedding_multiplier", 1.0)),
                residual_multiplier=float(cfg.get("residual_multiplier", 1.0)),
                attention_multiplier=float(cfg.get("attention_multiplier") or 0.0),
                logits_scaling=float(cfg.get("logits_scaling", 1.0)))
