"""LlamaForCausalLM: the Llama family (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, Phi-3 and its
fused checkpoints, LongRoPE and partial rotary; Granite and its multipliers; Gemma 3's variant of
it: GeGLU, sandwich norms, scaled embeddings, sliding-window layers with their own rope base; and
the mixtures of experts built on it, Mixtral, Qwen3-MoE, Qwen2-MoE, OLMoE and Granite-MoE) as
decoder layers over corellm's ops, its weight loading (fusing q/k/v and gate/up, checking every
shape against the config) and its logits."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch

from corellm import ops
from corellm.distributed.parallel_state import TensorParallel
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.layers import MLP, DecoderLayer, Embedding, KVCache, Linear, SparseMoe
from corellm.model.model_config import ModelConfig
from corellm.model.gpt_oss_checkpoint import GptOssCheckpoint
from corellm.model.quantized_tensor import QuantizedTensor, row_slice
from corellm.model.rope import attention_factor, cos_sin_cache, inverse_frequencies, longrope_is_long
from corellm.model.tensor_parallel import WholeRowColumns, shard_config, shard_weights

if TYPE_CHECKING:
    from corellm.lora.lora_batch import LoraBatch

logger = logging.getLogger("corellm")

# Where a checkpoint tensor goes: a linear layer or the embedding (which keep quantized tensors as
# they are), or a plain tensor (norms, biases).
Destination = Linear | Embedding | torch.Tensor

# Tensors some checkpoints carry that the model recomputes.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def expert_tensor_names(family: str, layer: int) -> tuple[str, tuple[str, str, str]]:
    """Where a sparse layer's tensors are in an HF checkpoint: (the prefix of its router, PREFIX +
    "gate.weight", and of its experts, PREFIX + "experts.E." + name + ".weight"; the experts'
    gate, up and down names). Mixtral: block_sparse_moe, w1 / w3 / w2; Qwen3-MoE and Qwen2-MoE: mlp,
    *_proj (Qwen2-MoE's shared expert: PREFIX + "shared_expert." and "shared_expert_gate.weight")."""
    if family in ("mixtral", "granitemoe"):  # (Granite-MoE's fused tensors: split_fused_projections)
        return f"model.layers.{layer}.block_sparse_moe.", ("w1", "w3", "w2")
    return f"model.layers.{layer}.mlp.", ("gate_proj", "up_proj", "down_proj")


# Phi-3's checkpoints fuse q, k and v into qkv_proj and gate and up into gate_up_proj, in that
# order; the loader splits them into the names of every other model's (split_fused_projections),
# so that the fused layers below, tensor parallelism and int8 see one layout.
_FUSED_PROJECTIONS = {"self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                                    "self_attn.v_proj.weight"),
                      "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight")}


# Granite-MoE's checkpoints hold each layer's experts in two 3-D tensors (input_linear [experts,
# 2 x intermediate, hidden]: gate rows then up rows; output_linear [experts, hidden, intermediate])
# and its router under router.layer; they are split into Mixtral's names.
_GRANITE_EXPERTS = re.compile(r"^(model\.layers\.\d+\.block_sparse_moe\.)"
                              r"(input_linear|output_linear|router\.layer)\.weight$")


def _layer_norm_names(c: ModelConfig) -> dict[str, str]:
    """A layer's norms in the checkpoint -> DecoderLayer's attributes. Llama: before the attention
    and before the MLP. With sandwich norms, also on the attention's and the MLP's outputs, under
    Gemma's names (post_attention_layernorm on the attention's output) or GLM-4's; OLMo 2: only those."""
    if not c.pre_norms:
        return {"post_attention_layernorm": "attention_output_norm", "post_feedforward_layernorm": "mlp_output_norm"}
    if not c.sandwich_norms:
        return {"input_layernorm": "input_norm", "post_attention_layernorm": "post_attention_norm"}
    if c.family == "glm4":
        return {"input_layernorm": "input_norm", "post_self_attn_layernorm": "attention_output_norm",
                "post_attention_layernorm": "post_attention_norm", "post_mlp_layernorm": "mlp_output_norm"}
    return {"input_layernorm": "input_norm", "post_attention_layernorm": "attention_output_norm",
            "pre_feedforward_layernorm": "post_attention_norm", "post_feedforward_layernorm": "mlp_output_norm"}


# ERNIE 4.5's sparse layers: the shared experts (one MLP) and the experts' choice bias [1, experts].
_ERNIE_MOE_NAMES = re.compile(r"^(model\.layers\.\d+\.mlp\.)(shared_experts\..+|moe_statics\.e_score_correction_bias)$")


def split_fused_projections(weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]], config: ModelConfig,
                            keep_mxfp4: bool = False) -> Iterator[tuple[str, torch.Tensor | QuantizedTensor]]:
    """Each fused projection as its parts (row slices: views, or a quantized tensor's panels); ERNIE
    4.5's shared experts and expert bias under Qwen2-MoE's name and the layer's (_ERNIE_MOE_NAMES);
    every other tensor as it is. gpt-oss: its stacked experts split per expert, from MXFP4 where the
    checkpoint has them so: dequantized, or with keep_mxfp4 kept as MXFP4 QuantizedTensors
    (quantization "mxfp4"; model/gpt_oss_checkpoint.py)."""
    gpt_oss = GptOssCheckpoint(config, keep_mxfp4) if config.family == "gpt_oss" else None
    for name, t in weights:
        if gpt_oss is not None and gpt_oss.takes(name):
            yield from gpt_oss.split(name, t)
            continue
        ernie = _ERNIE_MOE_NAMES.match(name) if config.family == "ernie4_5_moe" else None
        if ernie is not None:
            prefix, kind = ernie.group(1), ernie.group(2)
            yield (prefix + "selection_bias", t.reshape(-1)) if kind == "moe_statics.e_score_correction_bias" \
                else (prefix + "shared_expert." + kind[len("shared_experts."):], t)
            continue
        granite = _GRANITE_EXPERTS.match(name)
        if granite is not None:
            yield from _granite_experts(granite.group(1), granite.group(2), t, config)
            continue
        fused = next((f for f in _FUSED_PROJECTIONS if name.endswith("." + f)), None)
        if fused is None:
            yield name, t
            continue
        sizes = (config.q_size, config.kv_size, config.kv_size) if fused.startswith("self_attn.") \
            else (config.intermediate_size,) * 2
        if t.shape[0] != sum(sizes):
            raise ValueError(f"{config.source}: tensor {name!r} has {t.shape[0]} rows, but the config implies "
                             f"{' + '.join(map(str, sizes))}")
        prefix, start = name[: -len(fused)], 0
        for part, size in zip(_FUSED_PROJECTIONS[fused], sizes):
            yield prefix + part, row_slice(t, start, start + size, name)
            start += size
    if gpt_oss is not None:
        gpt_oss.check_complete()


def _granite_experts(prefix: str, kind: str, t: torch.Tensor, config: ModelConfig
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """A Granite-MoE layer's router or stacked experts (prefix: the layer's block_sparse_moe.) under
    Mixtral's names (views)."""
    if kind == "router.layer":
        yield prefix + "gate.weight", t
        return
    inter, experts = config.moe_intermediate_size, config.num_experts
    rows = 2 * inter if kind == "input_linear" else config.hidden_size
    if tuple(t.shape[:2]) != (experts, rows):
        raise ValueError(f"{config.source}: tensor {prefix + kind}.weight has shape {tuple(t.shape)}, but the config "
                         f"implies ({experts}, {rows}, ...)")
    for e in range(experts):
        if kind == "input_linear":
            yield f"{prefix}experts.{e}.w1.weight", t[e, :inter]
            yield f"{prefix}experts.{e}.w3.weight", t[e, inter:]
        else:
            yield f"{prefix}experts.{e}.w2.weight", t[e]


def _mlp_destinations(prefix: str, mlp: MLP, intermediate: int, hidden: int,
                      names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj"),
                      ) -> dict[str, tuple[Destination, int, int]]:
    """A gated MLP's three weights (named gate, up, down after `prefix`) into its fused gate_up and down."""
    gate, up, down = names
    dest: dict[str, tuple[Destination, int, int]] = {
        prefix + gate + ".weight": (mlp.gate_up_proj, 0, intermediate),
        prefix + up + ".weight": (mlp.gate_up_proj, intermediate, intermediate),
        prefix + down + ".weight": (mlp.down_proj, 0, hidden)}
    if mlp.gate_up_proj.bias is not None:  # (gpt-oss's experts)
        dest[prefix + gate + ".bias"] = (mlp.gate_up_proj.bias, 0, intermediate)
        dest[prefix + up + ".bias"] = (mlp.gate_up_proj.bias, intermediate, intermediate)
        dest[prefix + down + ".bias"] = (mlp.down_proj.bias, 0, hidden)
    return dest


class LlamaForCausalLM:
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                 rope_factors: torch.Tensor | None = None, max_position: int | None = None,
                 tp: TensorParallel = TensorParallel(), max_model_len: int | None = None,
                 classifier_token_ids: list[int] | None = None):
        """tp: this process's place in a tensor-parallel group (model/tensor_parallel.py): the model
        then holds its share (self.config: the share's sizes; full_config: the whole model's).
        max_position: the rotary table's rows (default max_position_embeddings); max_model_len: the
        longest sequence the engine will run, which picks LongRoPE's factors (model/rope.py).
        classifier_token_ids: the ids of config.classifier_from_tokens, whose output rows make the
        score matrix (a causal checkpoint read as a classifier)."""
        self.full_config = config
        self.tp = tp
        if tp.size > 1:
            config = shard_config(config, tp.size)
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)
        self.embed = Embedding(config.vocab_size, config.hidden_size, dtype, self.device)
        # OLMoE's whole-row q/k norms over a group see the whole rows (tensor_parallel.WholeRowColumns)
        qk_whole = WholeRowColumns.of(self.full_config, tp.rank, tp.size) if config.qk_norm_whole and tp.size > 1 \
            else None
        self.layers = [DecoderLayer(config, dtype, self.device, i, tp, qk_whole)
                       for i in range(config.num_hidden_layers)]
        self.norm = torch.empty(config.hidden_size, dtype=dtype, device=self.device)
        self.lm_head = Linear(config.vocab_size, config.hidden_size, False, dtype, self.device)
        # A sequence classifier's head (num_labels x hidden), whole on every rank; None: a generator.
        self.score = (torch.empty(len(config.classifier_labels), config.hidden_size, dtype=dtype, device=self.device)
                      if config.classifier_labels else None)
        self.classifier_token_ids = list(classifier_token_ids or [])
        if len(self.classifier_token_ids) != len(config.classifier_from_tokens):
            raise ValueError(f"{config.source}: classifier_from_token names {len(config.classifier_from_tokens)} "
                             f"tokens, {len(self.classifier_token_ids)} ids given")
        inv_freq = inverse_frequencies(config, max_model_len=max_model_len)
        if config.rope_type == "longrope" and tp.rank == 0:
            long = longrope_is_long(config, max_model_len)
            logger.info("LongRoPE: the %s factors (max_model_len %s %s the pretrained %d positions)",
                        "long" if long else "short", max_model_len or config.max_position_embeddings,
                        "exceeds" if long else "is within", config.rope_scaling["original_max_position_embeddings"])
        if rope_factors is not None:  # llama3-style factors stored in a GGUF file
            inv_freq = inv_freq / rope_factors.float()
        positions = max_position or config.max_position_embeddings
        self.cos_sin_cache = cos_sin_cache(config, positions, inv_freq, attention_factor(config)).to(self.device)
        # Per layer: the global cache, or (Gemma 3's sliding layers) one for their own rope base, unscaled.
        self.layer_cos_sin_caches = [self.cos_sin_cache] * config.num_hidden_layers
        if config.rope_local_theta and config.layer_types:
            local = cos_sin_cache(config, positions, inverse_frequencies(config, config.rope_local_theta, scaled=False))
            local = local.to(self.device)
            self.layer_cos_sin_caches = [local if t == "sliding_attention" else self.cos_sin_cache
                                         for t in config.layer_types]

    # ------------------------------------------------------------------ weights
    def _destinations(self) -> dict[str, tuple[Destination, int, int]]:
        """HF tensor name -> (fused destination, row offset, rows)."""
        c = self.config
        dest: dict[str, tuple[Destination, int, int]] = {
            "model.embed_tokens.weight": (self.embed, 0, c.vocab_size),
            "model.norm.weight": (self.norm, 0, c.hidden_size),
        }
        if not c.tie_word_embeddings:
            dest["lm_head.weight"] = (self.lm_head, 0, c.vocab_size)
        if self.score is not None and not c.classifier_from_tokens:
            dest["score.weight"] = (self.score, 0, self.score.shape[0])
        q, kv = c.q_size, c.kv_size
        for i, layer in enumerate(self.layers):
            p = f"model.layers.{i}."
            a = layer.attn
            for hf_name, norm in _layer_norm_names(c).items():
                dest[p + hf_name + ".weight"] = (getattr(layer, norm), 0, c.hidden_size)
            qkv = a.qkv_proj
            dest[p + "self_attn.q_proj.weight"] = (qkv, 0, q)
            dest[p + "self_attn.k_proj.weight"] = (qkv, q, kv)
            dest[p + "self_attn.v_proj.weight"] = (qkv, q + kv, kv)
            dest[p + "self_attn.o_proj.weight"] = (a.o_proj, 0, c.hidden_size)
            if a.o_proj.bias is not None:  # (gpt-oss)
                dest[p + "self_attn.o_proj.bias"] = (a.o_proj.bias, 0, c.hidden_size)
            if a.sinks is not None:
                dest[p + "self_attn.sinks"] = (a.sinks, 0, c.num_attention_heads)
            if qkv.bias is not None:
                dest[p + "self_attn.q_proj.bias"] = (qkv.bias, 0, q)
                dest[p + "self_attn.k_proj.bias"] = (qkv.bias, q, kv)
                dest[p + "self_attn.v_proj.bias"] = (qkv.bias, q + kv, kv)
            if a.q_norm is not None:
                dest[p + "self_attn.q_norm.weight"] = (a.q_norm, 0, a.q_norm.shape[0])  # a head's, or all of q
                dest[p + "self_attn.k_norm.weight"] = (a.k_norm, 0, a.k_norm.shape[0])
            if isinstance(layer.mlp, SparseMoe):
                dest.update(self._expert_destinations(i, layer.mlp))
            else:
                dest.update(_mlp_destinations(p + "mlp.", layer.mlp, c.intermediate_size, c.hidden_size))
        return dest

    def _expert_destinations(self, index: int, moe: SparseMoe) -> dict[str, tuple[Destination, int, int]]:
        """A sparse layer's router and experts, by the checkpoint's names: Mixtral's
        block_sparse_moe.gate and experts.E.w1 / w3 / w2 (gate, up, down), Qwen3-MoE's mlp.gate and
        mlp.experts.E.gate_proj / up_proj / down_proj."""
        c = self.config
        p, names = expert_tensor_names(c.family, index)
        dest: dict[str, tuple[Destination, int, int]] = {p + "gate.weight": (moe.router, 0, c.num_experts)}
        if moe.router.bias is not None:  # (gpt-oss's router.bias, renamed)
            dest[p + "gate.bias"] = (moe.router.bias, 0, c.num_experts)
        for e, expert in enumerate(moe.experts):
            dest.update(_mlp_destinations(f"{p}experts.{e}.", expert, c.moe_intermediate_size, c.hidden_size, names))
        if moe.shared_expert is not None:  # Qwen2-MoE (ERNIE 4.5's shared_experts: renamed, ungated)
            dest.update(_mlp_destinations(p + "shared_expert.", moe.shared_expert, c.shared_expert_intermediate_size,
                                          c.hidden_size))
            if moe.shared_expert_gate is not None:
                dest[p + "shared_expert_gate.weight"] = (moe.shared_expert_gate, 0, 1)
        if moe.selection_bias is not None:  # ERNIE 4.5's moe_statics.e_score_correction_bias, renamed
            dest[p + "selection_bias"] = (moe.selection_bias, 0, c.num_experts)
        return dest

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]], source: str,
                     scaled_type: str | None = None) -> None:
        """Copies every tensor to its place (a quantized one is kept by the linear layer or the
        embedding); raises ValueError naming the file and the tensor for an unknown name, a shape
        that does not match the config, or a tensor that is missing. scaled_type ("fp8" / "int8",
        on a GPU): the decoder layers' projections are then quantized for the scaled GEMM (the
        embedding and the LM head stay in the dtype, as in vLLM)."""
        dest = self._destinations()
        loaded: set[str] = set()
        if self.config.classifier_from_tokens:  # before the vocabulary is cut between ranks
            weights = self._score_from_output_rows(weights, source)
        if self.tp.size > 1:
            weights = shard_weights(weights, self.full_config, self.tp.rank, self.tp.size)
        for name, tensor in weights:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name == "lm_head.weight" and self.config.tie_word_embeddings:
                continue  # tied: the embedding serves as the output projection
            if name not in dest:
                raise ValueError(f"{source}: unexpected tensor {name!r} for {self.config.architecture}")
            target, offset, rows = dest[name]
            expected = (rows, *target.shape[1:])
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{source}: tensor {name!r} has shape {tuple(tensor.shape)}, but the config "
                                 f"implies {expected}")
            if isinstance(target, torch.Tensor):
                if isinstance(tensor, QuantizedTensor):
                    tensor = tensor.dequantize(torch.float32)
                if name.endswith("norm.weight") and self.config.norm_weight_offset:  # Gemma: x * (1 + w)
                    tensor = tensor.float() + self.config.norm_weight_offset
                target[offset : offset + rows].copy_(tensor)
            else:
                target.load(offset, tensor)
            loaded.add(name)
        missing = sorted(set(dest) - loaded)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"{source}: missing tensors {missing[:3]}{more}")
        for layer in self.layers:
            for linear in layer.linears():
                linear.finalize(scaled_type=scaled_type)
        if self.config.tie_word_embeddings:  # the embedding serves as the output projection too
            if self.embed.quantized is not None:
                self.lm_head.quantized = [(0, self.embed.quantized)]
            else:
                self.lm_head.weight = self.embed.weight
        self.lm_head.finalize(keep_weight=self.config.tie_word_embeddings)

    def _score_from_output_rows(self, weights: Iterable[tuple[str, torch.Tensor | QuantizedTensor]],
                                source: str) -> Iterable[tuple[str, torch.Tensor | QuantizedTensor]]:
        """The tensors as they come, the score matrix filled meanwhile from the output projection's
        rows of classifier_token_ids (the LM head's, or the tied embedding's): those rows, or with
        classifier_two_way the true token's row minus the false one's."""
        head = "model.embed_tokens.weight" if self.config.tie_word_embeddings else "lm_head.weight"
        found = False
        for name, tensor in weights:
            if name == head:
                rows = (tensor.dequantize(torch.float32) if isinstance(tensor, QuantizedTensor) else tensor.float())
                rows = rows[self.classifier_token_ids]
                self.score.copy_(rows[1:] - rows[:1] if self.config.classifier_two_way else rows)
                found = True
            yield name, tensor
        if not found:
            raise ValueError(f"{source}: classifier_from_token reads the output projection ({head}), which the "
                             f"checkpoint lacks")

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of the model's weights by storage type (a quantized type's name, or the dtype),
        each tensor counted once (a tied LM head is the embedding)."""
        seen: set[int] = set()
        totals: dict[str, int] = {}

        def count(kind: str, t: torch.Tensor | None) -> None:
            if t is None or t.data_ptr() in seen:
                return
            seen.add(t.data_ptr())
            totals[kind] = totals.get(kind, 0) + t.numel() * t.element_size()

        dense = str(self.dtype).replace("torch.", "")
        count(self.embed.quantized.type_name if self.embed.quantized else dense,
              self.embed.quantized.packed if self.embed.quantized else self.embed.weight)
        for linear in self.all_linears():
            for _, q in linear.quantized:
                count(q.type_name, q.packed)
            if linear.scaled is not None:
                count(linear.scaled.type_name, linear.scaled.weight)
                count("float32 (scales)", linear.scaled.scales)
            count(dense, linear.weight if linear.packed is None else linear.packed)
            count(dense, linear.bias)
        for t in self.other_weights():
            count(dense, t)
        return totals

    def all_linears(self) -> list[Linear]:
        """Every linear layer, the LM head first (weight_bytes; a subclass adds its own)."""
        return [self.lm_head] + [linear for layer in self.layers for linear in layer.linears()]

    def other_weights(self) -> list[torch.Tensor]:
        """The weights outside the embedding and the linear layers, in the dtype (the norms)."""
        return [t for layer in self.layers for t in layer.norms()] + [self.norm] + (
            [self.score] if self.score is not None else [])

    # ------------------------------------------------------------------ forward
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int32 [num_tokens] -> the decoder's input rows [num_tokens, hidden]."""
        if self.tp.size > 1:  # vocabulary-parallel: this rank's rows, zeros elsewhere, summed over the group
            local = input_ids - self.tp.rank * self.config.vocab_size
            inside = (local >= 0) & (local < self.config.vocab_size)
            h = self.embed(torch.where(inside, local, torch.zeros_like(local))) * inside[:, None].to(self.dtype)
            h = self.tp.all_reduce(h)
        else:
            h = self.embed(input_ids)
        if self.config.embedding_multiplier != 1.0:  # Gemma: times sqrt(hidden), rounded to the dtype as HF does
            h = h * torch.tensor(self.config.embedding_multiplier, dtype=h.dtype)
        return h

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                kv_caches: list[KVCache], hidden_states: list[torch.Tensor] | None = None,
                inputs_embeds: torch.Tensor | None = None, lora: LoraBatch | None = None) -> torch.Tensor:
        """input_ids, positions: int32 [num_tokens] -> final hidden states [num_tokens, hidden],
        op by op (the reference the native decoder stack is held to; which of the two runs a step
        is the model runner's choice). `hidden_states`, when given, receives the residual stream
        after each layer (HF's output_hidden_states[1:], before the final norm). inputs_embeds
        [num_tokens, hidden], when given, replaces embed_input_ids(input_ids) (image rows merged in).
        lora: the step's tokens' LoRA adapters (None: no token has one)."""
        h = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer, kv_cache, cache in zip(self.layers, kv_caches, self.layer_cos_sin_caches):
            h, residual = layer.forward(positions, h, residual, attn, kv_cache, cache, lora)
            if hidden_states is not None:
                hidden_states.append(h + residual)
        h, _ = ops.fused_add_rms_norm(h, residual, self.norm, self.config.rms_norm_eps)
        return h

    def classify(self, row: torch.Tensor) -> torch.Tensor:
        """A sequence classifier's pooled row (fp32 [hidden]) -> label logits: the score matrix
        times it, in fp32."""
        if self.score is None:
            raise ValueError("classify needs a sequence-classification model")
        return self.score.float().to(row.device) @ row

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor | None:
        """[n, hidden] -> float32 logits [n, vocab] (tensor parallelism: gathered on rank 0; the
        other ranks get None). out: a float32 [n, vocab] tensor to write them into, returned."""
        if self.tp.size == 1:
            logits = self.lm_head(hidden, out_dtype=torch.float32, out=out)
        else:
            full = self.tp.gather_last_dim(self.lm_head(hidden, out_dtype=torch.float32))
            if full is None:
                return None
            full = full[:, : self.full_config.vocab_size]
            logits = full if out is None else out.copy_(full)
        if self.config.logits_scaling != 1.0:  # Granite
            logits.div_(self.config.logits_scaling)
        cap = self.config.final_logit_softcapping
        if cap:  # Gemma 2: cap * tanh(logits / cap), in fp32 as HF computes it
            logits.div_(cap).tanh_().mul_(cap)
        return logits
