"""EncoderConfig: the hyper-parameters of an encoder-only model — BERT and (XLM-)RoBERTa, the
models behind most sentence embedders (all-MiniLM, bge, e5, gte, bge-m3) and cross-encoder
rerankers (ms-marco-MiniLM, bge-reranker), Nomic BERT (nomic-embed-text v1 / v1.5: rotary
positions, a SwiGLU MLP, no biases in its projections) and ModernBERT (gte-modernbert,
modernbert-embed, gte-reranker-modernbert: pre-norm, GeGLU, local and global attention layers) —
read from an HF config.json, validated, with one clear error for anything unsupported.

An encoder's attention is bidirectional: every position sees the whole input, so a position's
hidden state depends on the tokens after it. Such a model serves embeddings and classifications
only, each input computed whole in one step, with no KV cache and no prefix caching (the engine
reads `encoder_only`; ModelConfig's is False)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from corellm.model.classifier_labels import read_classifier_labels
from corellm.model.config_checks import UnsupportedModelError, check_positive_integers

# HF architecture -> (its family: how positions are numbered, the classification head it has; None: none)
#   bert     positions from 0; a "pooler" (dense + tanh on the first token's row) under the classifier
#   roberta  positions from padding_idx + 1 (XLM-R, RoBERTa); the head's own dense + tanh, then out_proj
#   nomic_bert  rotary positions (no position table), SwiGLU, projections without biases
#   modernbert  pre-norm, rotary positions, GeGLU, sliding-window and global layers (model/modern_bert.py);
#               its head: dense + GELU + norm on the CLS row or the mean, then the classifier
ENCODER_ARCHITECTURES = {
    "ModernBertModel": ("modernbert", None),
    "ModernBertForSequenceClassification": ("modernbert", "modernbert_head"),
    "NomicBertModel": ("nomic_bert", None),
    "BertModel": ("bert", None),
    "BertForSequenceClassification": ("bert", "bert_pooler"),
    "RobertaModel": ("roberta", None),
    "RobertaForSequenceClassification": ("roberta", "roberta_head"),
    "XLMRobertaModel": ("roberta", None),
    "XLMRobertaForSequenceClassification": ("roberta", "roberta_head"),
}
# GGUF general.architecture -> the HF architecture it stores (llama.cpp's converter writes a BertModel as "bert")
GGUF_ENCODER_ARCHITECTURES = {"bert": "BertModel", "nomic-bert": "NomicBertModel"}
# hidden_act -> torch.nn.functional.gelu's approximate argument (a BERT's MLP, or a gated MLP's
# GeGLU: ModernBERT's gelu(gate) * up); "silu": a gated MLP's only (SwiGLU: silu(gate) * up)
ENCODER_ACTIVATIONS = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh", "silu": None}


@dataclass(frozen=True)
class EncoderConfig:
    architecture: str  # HF name, e.g. "BertModel"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int  # rows of the position table (rotary positions: the context trained)
    type_vocab_size: int  # token types (segments) the embedding tells apart; 1: none
    layer_norm_eps: float
    hidden_act: str = "gelu"  # ENCODER_ACTIVATIONS
    # Rotary positions' base (NeoX-style, over the whole head; no position table); 0: absolute positions
    rope_theta: float = 0.0
    gated_mlp: bool = False  # down(act(gate(h)) * up(h)) instead of down(act(in(h)))
    projection_bias: bool = True  # the attention's and the MLP's projections have biases
    # ModernBERT's: each layer's attention, "full_attention" or "sliding_attention" (over the positions
    # within local_window of the query, each side, with rotary base rope_local_theta); (): all full
    layer_types: tuple[str, ...] = ()
    local_window: int = 0
    rope_local_theta: float = 0.0
    norm_bias: bool = True  # the LayerNorms have biases (ModernBERT's have none)
    # The row a classification reads: "CLS" (the first token's), or "MEAN" (ModernBERT's classifier_pooling)
    classifier_pooling: str = "CLS"
    classifier_bias: bool = True  # the classification head's inner dense layer has a bias
    # The first position's row in the position table (RoBERTa: padding_idx + 1, the rows below are
    # the padding's); BERT: 0
    position_offset: int = 0
    # sentence-transformers' max_seq_length (sentence_bert_config.json): the longest input the model was
    # trained on, shorter than its position table (all-MiniLM-L6-v2: 256 of 512); 0: the table's
    max_seq_length: int = 0
    # A sequence classifier's labels by id (its id2label); (): an embedding model
    classifier_labels: tuple[str, ...] = ()
    eos_token_id: tuple[int, ...] = ()  # (an encoder generates nothing: none)
    # The pooling the file itself names (a GGUF's bert.pooling_type: MEAN, CLS or LAST); "": none
    # (an HF directory says it in its sentence-transformers 1_Pooling/config.json instead)
    pooling_type: str = ""
    # Matryoshka lengths (model/matryoshka.py): None not a Matryoshka model, () any length
    matryoshka_dimensions: tuple[int, ...] | None = None
    source: str = ""

    encoder_only = True

    def __post_init__(self) -> None:
        for name in ("classifier_labels", "eos_token_id"):  # (lists from JSON: the GGUF weight cache's)
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.matryoshka_dimensions is not None:
            object.__setattr__(self, "matryoshka_dimensions", tuple(self.matryoshka_dimensions))
        if self.pooling_type not in ("", "MEAN", "CLS", "LAST"):
            raise ValueError(f"{self.source}: pooling_type must be MEAN, CLS or LAST, got {self.pooling_type!r}")
        if self.architecture not in ENCODER_ARCHITECTURES:
            raise UnsupportedModelError(f"{self.source}: architecture {self.architecture!r} is not an encoder corellm "
                                        f"runs ({', '.join(sorted(ENCODER_ARCHITECTURES))})")
        check_positive_integers(self, ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "max_position_embeddings", "type_vocab_size"))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"{self.source}: hidden_size ({self.hidden_size}) must be a multiple of "
                             f"num_attention_heads ({self.num_attention_heads})")
        if self.hidden_act not in ENCODER_ACTIVATIONS or (self.hidden_act == "silu" and not self.gated_mlp):
            raise UnsupportedModelError(f"{self.source}: hidden_act {self.hidden_act!r} is not supported "
                                        f"({', '.join(ENCODER_ACTIVATIONS)}; silu in a gated MLP only)")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types and (len(self.layer_types) != self.num_hidden_layers or
                                 set(self.layer_types) - {"full_attention", "sliding_attention"}):
            raise UnsupportedModelError(f"{self.source}: layer_types must name {self.num_hidden_layers} layers, each "
                                        f"full_attention or sliding_attention; got {list(self.layer_types)}")
        if "sliding_attention" in self.layer_types and (self.local_window < 1 or self.rope_local_theta <= 0):
            raise ValueError(f"{self.source}: sliding-window layers need a positive window and rotary base, got "
                             f"{self.local_window} and {self.rope_local_theta}")
        if self.classifier_pooling not in ("CLS", "MEAN"):
            raise ValueError(f"{self.source}: classifier_pooling must be CLS or MEAN, got {self.classifier_pooling!r}")
        if self.rope_theta < 0 or (self.rope_theta and self.head_dim % 2):
            raise ValueError(f"{self.source}: rotary positions need a positive base and an even head size, got "
                             f"{self.rope_theta} and {self.head_dim}")
        if not 0 <= self.position_offset < self.max_position_embeddings - 1:
            raise ValueError(f"{self.source}: positions start at row {self.position_offset} of "
                             f"{self.max_position_embeddings}: no room for an input")
        if self.classifier_kind is not None and not self.classifier_labels:
            raise ValueError(f"{self.source}: a sequence classifier needs at least one label")

    @property
    def family(self) -> str:
        return ENCODER_ARCHITECTURES[self.architecture][0]

    @property
    def classifier_kind(self) -> str | None:
        """The classification head: "bert_pooler", "roberta_head", or None (an embedding model)."""
        return ENCODER_ARCHITECTURES[self.architecture][1]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def max_input_positions(self) -> int:
        """The longest input: the positions the table numbers (RoBERTa's first rows are the padding's),
        or sentence-transformers' max_seq_length where shorter."""
        positions = self.max_position_embeddings - self.position_offset
        return min(positions, self.max_seq_length) if self.max_seq_length > 0 else positions

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], source: str = "config.json",
                       sentence_config: dict[str, Any] | None = None) -> "EncoderConfig":
        """cfg: config.json's; sentence_config: sentence_bert_config.json's, where the directory has one."""
        arch = (cfg.get("architectures") or [None])[0]
        if arch not in ENCODER_ARCHITECTURES:
            raise UnsupportedModelError(f"{source}: architecture {arch!r} is not an encoder corellm runs "
                                        f"({', '.join(sorted(ENCODER_ARCHITECTURES))})")
        family, head = ENCODER_ARCHITECTURES[arch]
        if family == "nomic_bert":
            return _nomic_bert_config(cfg, source, _max_seq_length(sentence_config or {}, source))
        if family == "modernbert":
            return _modernbert_config(cfg, source, _max_seq_length(sentence_config or {}, source))
        kind = cfg.get("position_embedding_type", "absolute")
        if kind != "absolute":
            raise UnsupportedModelError(f"{source}: position_embedding_type {kind!r} is not supported (absolute)")
        if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
            raise UnsupportedModelError(f"{source}: a BERT-style decoder (is_decoder, add_cross_attention) is not "
                                        f"supported; corellm runs these models as encoders")
        if head is not None and cfg.get("problem_type") == "multi_label_classification":
            raise UnsupportedModelError(f"{source}: problem_type 'multi_label_classification' (a sigmoid per label) "
                                        f"is not supported; corellm's classify gives a softmax over the labels")
        pad = cfg.get("pad_token_id", 1)
        if family == "roberta" and (not isinstance(pad, int) or pad < 0):
            raise ValueError(f"{source}: RoBERTa numbers positions from pad_token_id + 1; pad_token_id is {pad!r}")
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_hidden_layers=cfg["num_hidden_layers"],
            num_attention_heads=cfg["num_attention_heads"],
            max_position_embeddings=cfg.get("max_position_embeddings", 512),
            type_vocab_size=cfg.get("type_vocab_size", 2),
            layer_norm_eps=float(cfg.get("layer_norm_eps", 1e-12)),
            hidden_act=cfg.get("hidden_act", "gelu"),
            position_offset=pad + 1 if family == "roberta" else 0,
            max_seq_length=_max_seq_length(sentence_config or {}, source),
            classifier_labels=read_classifier_labels(cfg, source) if head is not None else (),
            source=source,
        )


def _max_seq_length(sentence_config: dict[str, Any], source: str) -> int:
    """sentence_bert_config.json's max_seq_length (0 where it sets none)."""
    value = sentence_config.get("max_seq_length")
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise ValueError(f"{source}: sentence_bert_config.json's max_seq_length must be an integer >= 2, got {value!r}")
    return value


# Nomic BERT's config.json, as its Hub repositories (the model's own code) write it, or as transformers'
# NomicBertConfig does: (the Hub's key, transformers' key) for each field.
_NOMIC_KEYS = {"hidden_size": ("n_embd", "hidden_size"), "num_hidden_layers": ("n_layer", "num_hidden_layers"),
               "num_attention_heads": ("n_head", "num_attention_heads"),
               "intermediate_size": ("n_inner", "intermediate_size"),
               "layer_norm_eps": ("layer_norm_epsilon", "layer_norm_eps")}
# The Hub config's options that corellm computes only in their nomic-embed-text values: (key, value).
_NOMIC_FIXED = (("causal", False), ("prenorm", False), ("parallel_block", False), ("use_rms_norm", False),
                ("rotary_emb_fraction", 1.0), ("rotary_emb_interleaved", False), ("rotary_emb_scale_base", None),
                ("rotary_scaling_factor", None))


def _nomic_bert_config(cfg: dict[str, Any], source: str, max_seq_length: int) -> EncoderConfig:
    """A NomicBertModel's config (nomic-embed-text v1 / v1.5): post-norm layers, rotary positions over
    whole heads (NeoX-style), SwiGLU; its context the positions it was trained on (max_trained_positions:
    2048, as llama.cpp takes it, though the Hub config says n_positions 8192)."""
    def field(name: str, default: Any = None) -> Any:
        hub, ours = _NOMIC_KEYS[name]
        return cfg.get(hub, cfg.get(ours, default))

    if cfg.get("moe_every_n_layers"):
        raise UnsupportedModelError(f"{source}: a Nomic BERT mixture of experts (nomic-embed-text-v2-moe) is not "
                                    f"supported")
    for key, value in _NOMIC_FIXED:
        if key in cfg and cfg[key] != value:
            raise UnsupportedModelError(f"{source}: {key} {cfg[key]!r} is not supported for a NomicBertModel "
                                        f"(only {value!r})")
    if cfg.get("head_dim") not in (None, field("hidden_size") // field("num_attention_heads")):
        raise UnsupportedModelError(f"{source}: head_dim {cfg['head_dim']} is not hidden_size / num_attention_heads")
    activation = cfg.get("activation_function", "swiglu" if cfg.get("hidden_act", "silu") == "silu" else None)
    if activation != "swiglu":
        raise UnsupportedModelError(f"{source}: a NomicBertModel's MLP must be SwiGLU, got activation "
                                    f"{activation or cfg.get('hidden_act')!r}")
    biases = {key: cfg.get(key, False) for key in ("qkv_proj_bias", "mlp_fc1_bias", "mlp_fc2_bias")}
    if len(set(biases.values())) > 1:
        raise UnsupportedModelError(f"{source}: a NomicBertModel's projections have biases all or none, got {biases}")
    rope = cfg.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default":
        raise UnsupportedModelError(f"{source}: rope_type {rope['rope_type']!r} is not supported for a NomicBertModel")
    theta = cfg.get("rotary_emb_base", rope.get("rope_theta", cfg.get("rope_theta", 1000.0)))
    positions = cfg.get("max_trained_positions", cfg.get("n_positions", cfg.get("max_position_embeddings", 2048)))
    return EncoderConfig(
        architecture=cfg["architectures"][0],
        vocab_size=cfg["vocab_size"],
        hidden_size=field("hidden_size"),
        intermediate_size=field("intermediate_size"),
        num_hidden_layers=field("num_hidden_layers"),
        num_attention_heads=field("num_attention_heads"),
        max_position_embeddings=positions,
        type_vocab_size=cfg.get("type_vocab_size", 2),
        layer_norm_eps=float(field("layer_norm_eps", 1e-12)),
        hidden_act="silu",
        rope_theta=float(theta),
        gated_mlp=True,
        projection_bias=bool(biases["qkv_proj_bias"]),
        max_seq_length=max_seq_length,
        source=source,
    )


def _modernbert_config(cfg: dict[str, Any], source: str, max_seq_length: int) -> EncoderConfig:
    """A ModernBERT's config (transformers' ModernBertConfig, as its 4.x releases wrote it —
    global_attn_every_n_layers, global_rope_theta, local_rope_theta — or as 5.x does: layer_types and
    rope_parameters per layer type). Its layers are pre-norm, its MLP GeGLU (gelu of Wi's first half
    times its second; SwiGLU with hidden_activation silu), its attention windowed to local_attention / 2
    positions each side in the sliding layers; no token types (the one type 0)."""
    arch = cfg["architectures"][0]
    layers = cfg["num_hidden_layers"]
    layer_types = cfg.get("layer_types")
    if layer_types is None:
        every = cfg.get("global_attn_every_n_layers", 3)
        layer_types = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    rope = cfg.get("rope_parameters") or {}
    thetas = {}
    for kind, legacy, default in (("full_attention", "global_rope_theta", 160_000.0),
                                  ("sliding_attention", "local_rope_theta", 10_000.0)):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default" or cfg.get("rope_scaling"):
            raise UnsupportedModelError(f"{source}: scaled rotary positions (rope_type "
                                        f"{params.get('rope_type', cfg.get('rope_scaling'))!r}) are not supported for "
                                        f"a ModernBERT")
        thetas[kind] = float(params.get("rope_theta", cfg.get(legacy, default)))
    if cfg.get("attention_bias", False) != cfg.get("mlp_bias", False):
        raise UnsupportedModelError(f"{source}: a ModernBERT's attention and MLP projections have biases both or "
                                    f"neither, got attention_bias {cfg.get('attention_bias')}, mlp_bias "
                                    f"{cfg.get('mlp_bias')}")
    activation = cfg.get("hidden_activation", "gelu")  # (IBM's granite-embedding r2: silu, a SwiGLU)
    if activation not in ENCODER_ACTIVATIONS:
        raise UnsupportedModelError(f"{source}: hidden_activation {activation!r} is not supported for a ModernBERT "
                                    f"({', '.join(ENCODER_ACTIVATIONS)})")
    head = ENCODER_ARCHITECTURES[arch][1]
    if head is not None:
        if cfg.get("classifier_activation", "gelu") != "gelu":
            raise UnsupportedModelError(f"{source}: classifier_activation {cfg['classifier_activation']!r} is not "
                                        f"supported (gelu)")
        if cfg.get("problem_type") == "multi_label_classification":
            raise UnsupportedModelError(f"{source}: problem_type 'multi_label_classification' (a sigmoid per label) "
                                        f"is not supported; corellm's classify gives a softmax over the labels")
    pooling = str(cfg.get("classifier_pooling", "cls")).upper()
    return EncoderConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=cfg["num_attention_heads"],
        max_position_embeddings=cfg.get("max_position_embeddings", 8192),
        type_vocab_size=1,
        layer_norm_eps=float(cfg.get("norm_eps", 1e-5)),
        hidden_act=activation,
        rope_theta=thetas["full_attention"],
        gated_mlp=True,
        projection_bias=bool(cfg.get("attention_bias", False)),
        layer_types=tuple(layer_types),
        local_window=int(cfg.get("local_attention", 128)) // 2,
        rope_local_theta=thetas["sliding_attention"],
        norm_bias=bool(cfg.get("norm_bias", False)),
        classifier_pooling=pooling,
        classifier_bias=bool(cfg.get("classifier_bias", False)),
        max_seq_length=max_seq_length,
        classifier_labels=read_classifier_labels(cfg, source) if head is not None else (),
        source=source,
    )
