"""A GGUF model file: its hyper-parameters, its tokenizer and its tensors under HF tensor names,
Q/K un-permuted back to the HF layout: dequantized with the `gguf` package, or, where corellm
has a kernel for the type, kept quantized (QuantizedTensor: the file's blocks, packed). An
encoder's (BERT, XLM-R, Nomic BERT): model/gguf_encoder.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from corellm.model import gguf_encoder, quantized_tensor
from corellm.model.gguf_reader import GGUFContents
from corellm.model.encoder_config import GGUF_ENCODER_ARCHITECTURES, EncoderConfig
from corellm.model.model_config import (GEMMA3_SLIDING_PATTERN, GGUF_ARCHITECTURES, SMOLLM3_NOPE_INTERVAL, ModelConfig,
                                        UnsupportedModelError)
from corellm.model.quantized_tensor import QuantizedTensor
from corellm.model.yarn_fields import context_length
from corellm.tokenizer import Tokenizer, byte_level_bpe, sentencepiece_bpe, unigram_from_gguf, wordpiece_from_phantom


_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
# Gemma 3 names its norms after where they sit: after attention, before and after the MLP.
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight",
                       "ffn_norm.weight": "pre_feedforward_layernorm.weight",
                       "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# Phi-3 keeps q/k/v fused (attn_qkv) and gate/up fused (ffn_up, gate rows first), as its checkpoints do.
_PHI3_LAYER_NAMES = {**_LAYER_NAMES, "attn_qkv.weight": "self_attn.qkv_proj.weight",
                     "ffn_up.weight": "mlp.gate_up_proj.weight"}
# OLMo 2 norms only its outputs: after the attention and after the MLP.
_OLMO2_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight",
                      "post_ffw_norm.weight": "post_feedforward_layernorm.weight"}
# GLM-4 norms the attention's and the MLP's outputs besides their inputs (its sandwich norms), and
# keeps gate and up fused (ffn_up, gate rows first), as its checkpoints do.
_GLM4_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm.weight": "post_self_attn_layernorm.weight",
                     "post_ffw_norm.weight": "post_mlp_layernorm.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"}
# gpt-oss: its norm before the MLP named post_attention_norm, o's bias and the attention sinks.
_GPT_OSS_LAYER_NAMES = {**_LAYER_NAMES, "post_attention_norm.weight": "post_attention_layernorm.weight",
                        "attn_output.bias": "self_attn.o_proj.bias", "attn_sinks.weight": "self_attn.sinks"}
_LAYER_NAMES_OF = {"olmo2": _OLMO2_LAYER_NAMES, "gemma2": _GEMMA3_LAYER_NAMES, "gemma3": _GEMMA3_LAYER_NAMES,
                   "phi3": _PHI3_LAYER_NAMES, "glm4": _GLM4_LAYER_NAMES, "gpt-oss": _GPT_OSS_LAYER_NAMES}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")
# A mixture of experts' tensors: the router; every expert's gate, up or down in one 3-D tensor
# [experts, rows, columns] (llama.cpp's converters), or one per expert (early Mixtral files).
_ROUTER = re.compile(r"^blk\.(\d+)\.ffn_gate_inp\.weight$")
_EXPERTS = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)_exps\.weight$")
_ONE_EXPERT = re.compile(r"^blk\.(\d+)\.ffn_(gate|up|down)\.(\d+)\.weight$")
# Qwen2-MoE's shared expert: its gate's row (1-D in llama.cpp's files) and its gate, up and down.
_SHARED = re.compile(r"^blk\.(\d+)\.ffn_(gate_inp|gate|up|down)_shexp\.weight$")
# ERNIE 4.5's choice bias per expert (its e_score_correction_bias)
_PROBS_BIAS = re.compile(r"^blk\.(\d+)\.exp_probs_b\.bias$")
# gpt-oss's biases on the router's logits ([experts]) and on every expert's gate, up and down ([experts, rows])
_EXPERT_BIASES = re.compile(r"^blk\.(\d+)\.ffn_(gate_inp|gate_exps|up_exps|down_exps)\.bias$")
_EXPERT_PARTS = ("gate", "up", "down")
# Gemma's chat format, for GGUF files that carry no tokenizer.chat_template (a system message
# opens the first user turn, as Gemma's own template does).
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for message in messages %}{% if message['role'] == 'system' %}"
    "{% set ns.system = message['content'] + '\n\n' %}{% else %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "<start_of_turn>{{ role }}\n{{ (ns.system if role == 'user' else '') + message['content'] | trim }}"
    "<end_of_turn>\n{% if role == 'user' %}{% set ns.system = '' %}{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")
ROPE_FACTORS = "rope_freqs.weight"  # llama3-style scaling precomputed by the converter
# The architectures whose q and k llama.cpp's converter permutes (its LlamaModel and subclasses).
PERMUTED_ARCHITECTURES = ("llama", "smollm3", "mistral", "granite", "granitemoe")
# LongRoPE's (Phi-3's) per-frequency factors, for contexts within the pretrained length and beyond.
LONGROPE_FACTORS = {"short_factor": "rope_factors_short.weight", "long_factor": "rope_factors_long.weight"}


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _LAYER_NAMES_OF.get(arch, _LAYER_NAMES)
    m = _BLOCK.match(gguf_name)
    if m and m.group(2) in names:
        return f"model.layers.{m.group(1)}.{names[m.group(2)]}"
    return None


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's converter interleaves the two rotary halves of each head; undo it."""
    d = w.shape[0]
    return w.reshape(n_heads, d // n_heads // 2, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


class GGUFModelFile:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        try:
            self.reader = GGUFContents(self.path)
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways
            raise ValueError(f"{self.path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
        self.arch = self.field("general.architecture")
        if self.arch not in GGUF_ARCHITECTURES and self.arch not in GGUF_ENCODER_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{self.path}: GGUF architecture {self.arch!r} is not supported; corellm runs "
                f"{sorted(GGUF_ARCHITECTURES)} and the encoder {sorted(GGUF_ENCODER_ARCHITECTURES)}")

    def field(self, key: str, default: Any = None) -> Any:
        return self.reader.fields.get(key, default)

    def arch_field(self, key: str, default: Any = None) -> Any:
        return self.field(f"{self.arch}.{key}", default)

    @property
    def tensor_names(self) -> list[str]:
        return [t.name for t in self.reader.tensors]

    def config(self) -> ModelConfig | EncoderConfig:
        if self.arch in GGUF_ENCODER_ARCHITECTURES:
            return gguf_encoder.encoder_config(self)
        names = set(self.tensor_names)
        heads = int(self.arch_field("attention.head_count"))
        hidden = int(self.arch_field("embedding_length"))
        vocab = self.arch_field("vocab_size")
        if vocab is None:
            vocab = len(self.field("tokenizer.ggml.tokens"))
        scaling = None
        kind = self.arch_field("rope.scaling.type")
        if kind == "linear":
            scaling = {"rope_type": "linear", "factor": float(self.arch_field("rope.scaling.factor"))}
        elif kind == "yarn":
            scaling = self._yarn_scaling()
        elif kind not in (None, "none"):
            raise UnsupportedModelError(f"{self.path}: rope scaling type {kind!r} is not supported")
        if LONGROPE_FACTORS["long_factor"] in names:
            scaling = self._longrope_scaling()
        head_dim = int(self.arch_field("attention.key_length", hidden // heads))
        eos = self.field("tokenizer.ggml.eos_token_id")
        gemma = self._gemma_fields(hidden, heads) if self.arch in ("gemma2", "gemma3") else {}
        granite = self._granite_fields() if self.arch in ("granite", "granitemoe") else {}
        experts = self._expert_fields(names)
        gpt_oss = self._gpt_oss_fields(scaling) if self.arch == "gpt-oss" else {}
        architecture = GGUF_ARCHITECTURES[self.arch]
        if experts and self.arch == "llama":
            architecture = "MixtralForCausalLM"
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=int(self.arch_field("feed_forward_length", 0) or
                                  self.arch_field("expert_feed_forward_length")),
            num_hidden_layers=int(self.arch_field("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=int(self.arch_field("attention.head_count_kv", heads)),
            head_dim=head_dim,
            rms_norm_eps=float(self.arch_field("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_theta=float(self.arch_field("rope.freq_base", 10000.0)),
            # context_length, or under YaRN the pretrained length times the factor where longer
            max_position_embeddings=context_length(
                {"max_position_embeddings": int(self.arch_field("context_length", 2048))}, scaling, 2048),
            tie_word_embeddings="output.weight" not in names,
            attention_bias="blk.0.attn_q.bias" in names,
            qk_norm="blk.0.attn_q_norm.weight" in names,
            qk_norm_whole=self.arch in ("olmoe", "olmo2"),
            rope_scaling=gpt_oss.pop("rope_scaling", scaling),
            partial_rotary_factor=int(self.arch_field("rope.dimension_count", head_dim)) / head_dim,
            sliding_window=int(self.arch_field("attention.sliding_window", 0) or 0),
            # SmolLM3: every fourth layer NoPE (llama.cpp's n_no_rope_layer_step, not in the file)
            nope_layers=tuple(range(SMOLLM3_NOPE_INTERVAL - 1, int(self.arch_field("block_count")),
                                    SMOLLM3_NOPE_INTERVAL))
            if self.arch == "smollm3" else (),
            # llama.cpp's rope type NORM, the checkpoint's q/k unpermuted
            rope_interleaved=self.arch in ("ernie4_5", "ernie4_5-moe", "glm4"),
            **self._olmo2_fields(),
            **({"sandwich_norms": True} if self.arch == "glm4" else {}),
            bos_token_id=self.field("tokenizer.ggml.bos_token_id"),
            eos_token_id=([] if eos is None else [int(eos)]) + gemma.pop("extra_eos", []) + self._glm4_eot()
            + gpt_oss.pop("extra_eos", []),
            source=str(self.path),
            **gemma,
            **experts,
            **granite,
            **gpt_oss,
        )

    def _gpt_oss_fields(self, scaling: dict[str, Any] | None) -> dict[str, Any]:
        """A gpt-oss file as llama.cpp reads it: sliding-window and global layers alternating (the
        first sliding; attention.sliding_window_pattern where the file has it), biases on q/k/v and
        o, the sinks, the experts' clamped SwiGLU with llama.cpp's fixed alpha 1.702 and limit 7, the
        router's and experts' biases; YaRN without rounding its blend's bounds (`truncate` false, the
        model's own; llama.cpp rounds them); <|return|> and <|call|> end a generation too."""
        layers = int(self.arch_field("block_count"))
        pattern = self.arch_field("attention.sliding_window_pattern", 2)
        if isinstance(pattern, (list, tuple)):
            sliding = [bool(s) for s in pattern]
        else:
            sliding = [int(pattern) == 0 or i % int(pattern) < int(pattern) - 1 for i in range(layers)]
        tokens = self.field("tokenizer.ggml.tokens") or []
        ends = [i for i, t in enumerate(tokens) if t in ("<|return|>", "<|call|>")]
        fields: dict[str, Any] = dict(
            layer_types=tuple("sliding_attention" if s else "full_attention" for s in sliding),
            hidden_activation="swigluoai", swiglu_alpha=1.702, swiglu_limit=7.0, attention_output_bias=True,
            attention_sinks=True, moe_router_bias=True, expert_bias=True, extra_eos=ends)
        if scaling is not None and scaling.get("rope_type") == "yarn":
            fields["rope_scaling"] = {**scaling, "truncate": False}
        return fields

    def _olmo2_fields(self) -> dict[str, Any]:
        """An OLMo 2 file's layers norm only their outputs; an Olmo 3's (llama.cpp stores both as
        "olmo2") name their sliding-window layers in attention.sliding_window_pattern."""
        if self.arch != "olmo2":
            return {}
        pattern = self.arch_field("attention.sliding_window_pattern")
        fields: dict[str, Any] = dict(sandwich_norms=True, pre_norms=False)
        if pattern is not None and self.arch_field("attention.sliding_window", 0):
            fields["layer_types"] = tuple("sliding_attention" if s else "full_attention" for s in pattern)
        return fields

    def _glm4_eot(self) -> list[int]:
        """GLM-4's turn end (<|user|>, llama.cpp's eot), which its generation config lists as an end of
        generation beside <|endoftext|>; [] for another architecture or a file without one."""
        eot = self.field("tokenizer.ggml.eot_token_id") if self.arch == "glm4" else None
        return [] if eot is None else [int(eot)]

    def _granite_fields(self) -> dict[str, float]:
        """Granite's multipliers under llama.cpp's names (each optional there: absent, none)."""
        fields = dict(embedding_multiplier=self.arch_field("embedding_scale"),
                      residual_multiplier=self.arch_field("residual_scale"),
                      attention_multiplier=self.arch_field("attention.scale"),
                      logits_scaling=self.arch_field("logit_scale"))
        return {key: float(value) for key, value in fields.items() if value is not None}

    def _yarn_scaling(self) -> dict[str, Any]:
        """YaRN under llama.cpp's keys: the factor, the pretrained context length (default the
        context_length), the betas where given (llama.cpp's defaults are transformers': 32 and 1)."""
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(self.arch_field("rope.scaling.factor"))}
        original = self.arch_field("rope.scaling.original_context_length") or self.arch_field("context_length")
        scaling["original_max_position_embeddings"] = int(original)
        for key, name in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            value = self.arch_field(name)
            if value is not None:
                scaling[key] = float(value)
        if self.arch_field("rope.scaling.yarn_log_multiplier"):
            raise UnsupportedModelError(f"{self.path}: YaRN's yarn_log_multiplier (DeepSeek's mscale_all_dim) "
                                        f"is not supported in a GGUF file")
        for key, default in (("rope.scaling.attn_factor", 1.0), ("rope.scaling.yarn_attn_factor", 1.0),
                             ("rope.scaling.yarn_ext_factor", 1.0)):
            value = self.arch_field(key)
            if value is not None and float(value) != default:
                raise UnsupportedModelError(f"{self.path}: YaRN with {key} {float(value)} (llama.cpp's multiplier "
                                            f"on its attention factor, or a partial extrapolation) is not supported")
        return scaling

    def _longrope_scaling(self) -> dict[str, Any]:
        """LongRoPE as llama.cpp's converter stores it: the two factor tensors, the pretrained
        context length and the attention factor it computed."""
        tensors = {t.name: t for t in self.reader.tensors}
        scaling: dict[str, Any] = {"rope_type": "longrope"}
        for key, name in LONGROPE_FACTORS.items():
            if name not in tensors:
                raise ValueError(f"{self.path}: LongRoPE factors {name!r} without their pair")
            scaling[key] = np.array(tensors[name].data, dtype=np.float32).reshape(-1).tolist()
        original = self.arch_field("rope.scaling.original_context_length")
        if original is None:
            raise ValueError(f"{self.path}: LongRoPE factors without {self.arch}.rope.scaling.original_context_length")
        scaling["original_max_position_embeddings"] = int(original)
        factor = self.arch_field("rope.scaling.attn_factor")
        if factor is not None:
            scaling["attention_factor"] = float(factor)
        return scaling

    def _expert_fields(self, names: set[str]) -> dict[str, Any]:
        """A mixture of experts' fields as llama.cpp reads them ({} for a dense model): every layer
        with a router (ffn_gate_inp) sparse, the chosen experts' weights renormalized as llama.cpp's
        graphs do (Mixtral's and Qwen3-MoE's: yes, Qwen2-MoE's and OLMoE's: no), experts of
        expert_feed_forward_length (Mixtral's files: feed_forward_length), Qwen2-MoE's shared
        expert of expert_shared_feed_forward_length."""
        experts = int(self.arch_field("expert_count", 0) or 0)
        if not experts:
            return {}
        layers = int(self.arch_field("block_count"))
        sparse = [i for i in range(layers) if f"blk.{i}.ffn_gate_inp.weight" in names]
        shared = int(self.arch_field("expert_shared_feed_forward_length", 0) or 0)
        ernie = self.arch == "ernie4_5-moe"  # (its choice bias, and shared experts without a gate)
        # (gpt-oss: its router's and experts' biases, _gpt_oss_fields)
        return dict(num_experts=experts, num_experts_per_tok=int(self.arch_field("expert_used_count", 0) or 0),
                    moe_intermediate_size=int(self.arch_field("expert_feed_forward_length", 0) or
                                              self.arch_field("feed_forward_length")),
                    norm_topk_prob=self.arch not in ("qwen2moe", "olmoe"),
                    dense_layers=tuple(i for i in range(layers) if i not in sparse),
                    shared_expert_intermediate_size=shared,
                    shared_expert_gated=not shared or any(f"blk.{i}.ffn_gate_inp_shexp.weight" in names
                                                          for i in sparse),
                    moe_selection_bias=any(f"blk.{i}.exp_probs_b.bias" in names for i in sparse),
                    moe_renormalize_min=1e-12 if ernie else 0.0)

    def _gemma_fields(self, hidden: int, heads: int) -> dict[str, Any]:
        """What a Gemma 3 file implies as llama.cpp reads it: every sixth layer global (the rest
        sliding, rope base 10000 there), attention scaled by the head size (27B: hidden / heads),
        GeGLU, sandwich norms stored as 1 + w, embeddings times sqrt(hidden); <end_of_turn> ends a
        turn as EOS does. A Gemma 2 file: every second layer global (the first sliding), one rope base,
        27B's 46 layers scaled by hidden / heads, and its soft caps."""
        layers = int(self.arch_field("block_count"))
        gemma2 = self.arch == "gemma2"
        pattern = 2 if gemma2 else int(self.arch_field("attention.sliding_window_pattern", GEMMA3_SLIDING_PATTERN) or
                                        GEMMA3_SLIDING_PATTERN)
        head_dim = int(self.arch_field("attention.key_length", hidden // heads))
        tokens = self.field("tokenizer.ggml.tokens") or []
        end_of_turn = [i for i, t in enumerate(tokens[:1024]) if t == "<end_of_turn>"]
        return dict(
            hidden_activation="gelu_pytorch_tanh", embedding_multiplier=hidden**0.5, sandwich_norms=True,
            layer_types=tuple("full_attention" if i % pattern == pattern - 1 else "sliding_attention"
                              for i in range(layers)),
            rope_local_theta=float(self.arch_field("rope.freq_base", 10000.0)) if gemma2 else 10000.0,
            query_pre_attn_scalar=float(hidden // heads if layers == (46 if gemma2 else 62) else head_dim),
            norm_weight_offset=1.0, extra_eos=end_of_turn,
            **(dict(attn_logit_softcapping=float(self.arch_field("attn_logit_softcapping", 0.0) or 0.0),
                    final_logit_softcapping=float(self.arch_field("final_logit_softcapping", 0.0) or 0.0))
               if gemma2 else {}))

    def rope_factors(self) -> torch.Tensor | None:
        for t in self.reader.tensors:
            if t.name == ROPE_FACTORS:
                return torch.from_numpy(np.array(t.data, dtype=np.float32).reshape(-1))
        return None

    def tokenizer(self) -> Tokenizer:
        kind = self.field("tokenizer.ggml.model")
        tokens = self.field("tokenizer.ggml.tokens")
        if tokens is None:
            raise ValueError(f"{self.path}: the GGUF file holds no tokenizer (tokenizer.ggml.tokens)")
        types = self.field("tokenizer.ggml.token_type")
        bos = self.field("tokenizer.ggml.bos_token_id")
        eos = self.field("tokenizer.ggml.eos_token_id")
        if kind == "gpt2":
            add_bos = bool(self.field("tokenizer.ggml.add_bos_token", False))
            backend = byte_level_bpe(tokens, self.field("tokenizer.ggml.merges") or [], types,
                                     self.field("tokenizer.ggml.pre"), bos, add_bos)
        elif kind == "bert":
            backend = wordpiece_from_phantom(tokens, types, int(self.field("tokenizer.ggml.unknown_token_id")),
                                             int(bos), int(self.field("tokenizer.ggml.seperator_token_id", eos)),
                                             bool(self.field("tokenizer.ggml.normalizer.lowercase", True)))
            eos = None  # ([SEP] ends an input; an encoder generates nothing)
        elif kind == "t5" and self.arch in GGUF_ENCODER_ARCHITECTURES:  # an XLM-RoBERTa (bge-m3, ...)
            charsmap = self.field("tokenizer.ggml.precompiled_charsmap")
            backend = unigram_from_gguf(
                tokens, self.field("tokenizer.ggml.scores"), types,
                int(self.field("tokenizer.ggml.unknown_token_id", 3)), int(bos), int(eos),
                bool(self.field("tokenizer.ggml.add_space_prefix", True)),
                bool(self.field("tokenizer.ggml.remove_extra_whitespaces", True)),
                None if charsmap is None else bytes(np.asarray(charsmap, dtype=np.uint8)))
            eos = None  # (</s> ends an input; an encoder generates nothing)
        elif kind == "llama":
            add_bos = bool(self.field("tokenizer.ggml.add_bos_token", True))
            backend = sentencepiece_bpe(tokens, self.field("tokenizer.ggml.scores"), types, bos, add_bos,
                                        bool(self.field("tokenizer.ggml.add_space_prefix", True)))
        else:
            raise UnsupportedModelError(f"{self.path}: tokenizer model {kind!r} is not supported (gpt2, llama, bert; "
                                        f"t5 for an XLM-RoBERTa encoder)")
        return Tokenizer(backend, bos_token_id=bos, eos_token_ids=[] if eos is None else [int(eos)],
                         pad_token_id=self.field("tokenizer.ggml.padding_token_id"),
                         chat_template=self.field("tokenizer.chat_template") or
                         (GEMMA_CHAT_TEMPLATE if self.arch in ("gemma2", "gemma3") else None), source=str(self.path))

    def weights(self, dtype: torch.dtype, progress: bool = True,
                quantized: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """(HF name, tensor) for every model tensor: dequantized to `dtype`, or with `quantized`,
        a QuantizedTensor for each 2-D tensor (and each expert's slice of a 3-D one) in a type
        quant_gemm computes on."""
        from tqdm import tqdm

        config = self.config()
        if config.encoder_only:
            yield from gguf_encoder.encoder_weights(self, dtype, progress, quantized)
            return
        permute = self.arch in PERMUTED_ARCHITECTURES
        rope_tables = {ROPE_FACTORS, *LONGROPE_FACTORS.values()}  # read into the config or rope_factors()
        tensors = [t for t in self.reader.tensors if t.name not in rope_tables]
        for t in tqdm(tensors, desc=f"Loading {self.path.name}", unit="tensor", disable=not progress, leave=False):
            if config.num_experts and any(p.match(t.name) for p in (_ROUTER, _EXPERTS, _ONE_EXPERT, _SHARED,
                                                                    _PROBS_BIAS, _EXPERT_BIASES)):
                yield from self._expert_tensors(t, config, dtype, quantized)
                continue
            name = hf_name(t.name, self.arch)
            if name is None:
                raise UnsupportedModelError(f"{self.path}: unexpected tensor {t.name!r}")
            heads = None
            if permute and name.endswith(("q_proj.weight", "q_proj.bias")):
                heads = config.num_attention_heads
            elif permute and name.endswith(("k_proj.weight", "k_proj.bias")):
                heads = config.num_key_value_heads
            ggml_type = int(t.tensor_type)
            if quantized and len(t.shape) == 2 and quantized_tensor.supported(ggml_type):
                n, k = int(t.shape[1]), int(t.shape[0])
                order = None if heads is None else unpermute_qk(np.arange(n), heads)
                yield name, QuantizedTensor.pack(ggml_type, t.data, (n, k), order)
                continue
            array = self.dequantized(t)
            if heads is not None:
                array = unpermute_qk(array, heads)
            if self.arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):  # stored as 1 + w: back to HF's w
                array = array - np.float32(1.0)
            yield name, torch.from_numpy(np.ascontiguousarray(array)).to(dtype)

    def dequantized(self, t) -> np.ndarray:
        """Tensor t's values, float32, writable (GGUF's dims reversed: [.., rows, columns])."""
        from gguf.quants import dequantize

        try:
            array = dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"{self.path}: tensor {t.name!r} has type {t.tensor_type.name}, which the gguf package "
                f"cannot dequantize") from None
        array = np.asarray(array, dtype=np.float32)
        return array if array.flags.writeable else array.copy()  # a memory-mapped F32 tensor: copied

    def _expert_tensors(self, t, config: ModelConfig, dtype: torch.dtype,
                        quantized: bool) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
        """A sparse layer's router, its experts' gate, up or down weights one expert at a time, or
        its shared expert's, under the HF checkpoint's names (llama.expert_tensor_names). Quantized as for a 2-D tensor:
        an expert's rows are one slice of the 3-D tensor's blocks."""
        from corellm.model.llama import expert_tensor_names

        router, stacked, one, shared, bias, biases = (p.match(t.name) for p in (_ROUTER, _EXPERTS, _ONE_EXPERT,
                                                                                 _SHARED, _PROBS_BIAS, _EXPERT_BIASES))
        layer = int((router or stacked or one or shared or bias or biases).group(1))
        prefix, names = expert_tensor_names(config.family, layer)
        ggml_type = int(t.tensor_type)
        if biases:  # gpt-oss: the router's [experts], or the experts' [experts, rows], one row an expert
            array = self.dequantized(t)
            if biases.group(2) == "gate_inp":
                yield prefix + "gate.bias", torch.from_numpy(array.reshape(-1)).to(dtype)
                return
            name = names[_EXPERT_PARTS.index(biases.group(2)[: -len("_exps")])]
            for e in range(config.num_experts):
                yield f"{prefix}experts.{e}.{name}.bias", torch.from_numpy(np.ascontiguousarray(array[e])).to(dtype)
            return
        if bias:  # fp32, as the model keeps it
            yield prefix + "selection_bias", torch.from_numpy(self.dequantized(t).reshape(-1))
            return
        if shared and shared.group(2) == "gate_inp":  # [hidden] or [1, hidden]: one row
            yield prefix + "shared_expert_gate.weight", torch.from_numpy(self.dequantized(t).reshape(1, -1)).to(dtype)
            return
        if router:
            slices = [(prefix + "gate.weight", None)]
        elif shared:
            slices = [(f"{prefix}shared_expert.{names[_EXPERT_PARTS.index(shared.group(2))]}.weight", None)]
        elif stacked:
            name = names[_EXPERT_PARTS.index(stacked.group(2))]
            if len(t.shape) != 3 or int(t.shape[2]) != config.num_experts:
                raise ValueError(f"{self.path}: tensor {t.name!r} of shape {list(t.shape)} does not hold "
                                 f"{config.num_experts} experts")
            slices = [(f"{prefix}experts.{e}.{name}.weight", e) for e in range(config.num_experts)]
        else:
            name = names[_EXPERT_PARTS.index(one.group(2))]
            slices = [(f"{prefix}experts.{int(one.group(3))}.{name}.weight", None)]
        n, k = int(t.shape[1]), int(t.shape[0])
        if quantized and quantized_tensor.supported(ggml_type):
            for hf, e in slices:
                yield hf, QuantizedTensor.pack(ggml_type, t.data if e is None else t.data[e], (n, k))
            return
        array = self.dequantized(t)
        for hf, e in slices:
            yield hf, torch.from_numpy(np.ascontiguousarray(array if e is None else array[e])).to(dtype)
