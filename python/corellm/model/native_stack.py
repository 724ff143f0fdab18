"""NativeDecoderStack: a loaded Llama-family model (Gemma 3 and the mixtures of experts included)
run as one native model, _core.model's DecoderStack (cpp/include/corellm/model/decoder_stack.h),
which computes a step in one call instead of about ten Python op calls per layer. Same kernels,
same order: the result is bit-identical to LlamaForCausalLM's per-op forward
(tests/model/test_native_stack.py).

It holds raw addresses: the model's weights and the KV caches must outlive it (the model runner
keeps both). Under tensor parallelism it runs this rank's share and all-reduces the partial sums
itself, through the group's shared-memory all-reduce (every rank on this machine, on the CPU); the
ranks' collectives pair up whichever forward each runs."""

from __future__ import annotations

import torch

from corellm import ops
from corellm.lora.lora_adapter import LoraAdapter
from corellm.model.attention_metadata import AttentionMetadata
from corellm.model.layers import SparseMoe
from corellm.native import _core


def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


_ACTIVATIONS = {"silu": _core.model.GatedActivation.SILU, "gelu_pytorch_tanh": _core.model.GatedActivation.GELU_TANH,
                "swigluoai": _core.model.GatedActivation.SWIGLU_OAI}


def supports(model) -> bool:
    """Whether the native stack computes this model (the Llama layer and Gemma 3's variant of it:
    GeGLU, sandwich norms, scaled embeddings, per-layer windows and rope tables) and its weights are
    in the form it reads (bf16 on the CPU, every projection packed for bf16_gemm or quantized for
    quant_gemm); under tensor parallelism, when the group's all-reduce is one native code can call
    (shared memory)."""
    c = model.config
    tp = getattr(model, "tp", None)
    collectives_native = tp is None or tp.size == 1 or tp.shm_all_reduce is not None
    rope_tables_alike = len({tuple(t.shape) for t in model.layer_cos_sin_caches}) == 1
    return (c.hidden_activation in _ACTIVATIONS and rope_tables_alike and collectives_native
            and model.device.type == "cpu" and model.dtype == torch.bfloat16
            and _core.kernels.bf16_gemm_available()
            and all(linear.packed is not None or linear.quantized
                    for layer in model.layers for linear in layer.linears()))


def linear_weight(linear):
    """A Linear's packed parts as the native stack's LinearWeight (linear_weight.h)."""
    w = _core.model.LinearWeight()
    w.n, w.k = linear.shape
    w.bias = _address(linear.bias)
    parts = []
    stored = [(offset, q.ggml_type, q.packed, q.shape[0]) for offset, q in linear.quantized] or \
        [(0, _core.model.BF16_PACKED, linear.packed, linear.shape[0])]
    for offset, ggml_type, packed, rows in stored:
        part = _core.model.LinearPart()
        part.ggml_type, part.data, part.row_offset, part.rows = ggml_type, packed.data_ptr(), offset, rows
        parts.append(part)
    w.parts = parts
    return w


def moe_weights(moe: SparseMoe):
    """A SparseMoe's router and experts as the native stack's MoeWeights (decoder_stack.h)."""
    w = _core.model.MoeWeights()
    w.router = linear_weight(moe.router)
    w.gate_up = [linear_weight(e.gate_up_proj) for e in moe.experts]
    w.down = [linear_weight(e.down_proj) for e in moe.experts]
    w.top_k, w.renormalize, w.renormalize_min = moe.top_k, moe.renormalize, moe.renormalize_min
    if moe.selection_bias is not None:  # ERNIE 4.5
        w.selection_bias = moe.selection_bias.tolist()
    w.intermediate = moe.experts[0].down_proj.shape[1]
    if moe.shared_expert is not None:  # Qwen2-MoE, ERNIE 4.5 (ungated)
        w.shared_gate_up, w.shared_down = linear_weight(moe.shared_expert.gate_up_proj), \
            linear_weight(moe.shared_expert.down_proj)
        if moe.shared_expert_gate is not None:
            w.shared_gate = linear_weight(moe.shared_expert_gate)
        w.shared_intermediate = moe.shared_expert.down_proj.shape[1]
    return w


def embedding_weight(embed):
    w = _core.model.EmbeddingWeight()
    if embed.quantized is not None:
        w.ggml_type, w.data = embed.quantized.ggml_type, embed.quantized.packed.data_ptr()
    else:
        w.data = embed.weight.data_ptr()
    return w


class NativeDecoderStack:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        if not supports(model):
            raise ValueError("NativeDecoderStack: the model's weights are not packed for corellm's GEMMs "
                             "(bf16 on the CPU is needed)")
        if len(kv_caches) != len(model.layers):
            raise ValueError(f"NativeDecoderStack: {len(kv_caches)} KV caches for {len(model.layers)} layers")
        c = model.config
        attn = model.layers[0].attn
        dims = _core.model.DecoderDims()
        dims.vocab_size, dims.hidden, dims.intermediate = c.vocab_size, c.hidden_size, c.intermediate_size
        dims.num_heads, dims.num_kv_heads, dims.head_size = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        dims.eps, dims.scale, dims.attn_softcap = c.rms_norm_eps, attn.scale, c.attn_logit_softcapping
        dims.max_position, dims.rot_dim = model.cos_sin_cache.shape
        dims.activation = _ACTIVATIONS[c.hidden_activation]
        dims.swiglu_alpha, dims.swiglu_limit = c.swiglu_alpha, c.swiglu_limit  # (gpt-oss's)
        dims.embedding_multiplier = c.embedding_multiplier
        dims.residual_multiplier = c.residual_multiplier
        dims.qk_norm_whole = c.qk_norm_whole
        dims.rope_interleaved = c.rope_interleaved
        layers = [self._layer_weights(layer, rope, key_cache, value_cache)
                  for layer, rope, (key_cache, value_cache) in zip(model.layers, model.layer_cos_sin_caches,
                                                                   kv_caches)]
        key_cache = kv_caches[0][0]  # [num_blocks, num_kv_heads, head_size / x, block_size, x]
        cache = _core.model.KVCacheShape(num_blocks=key_cache.shape[0], num_kv_heads=c.num_key_value_heads,
                                         head_size=c.head_dim, block_size=key_cache.shape[3],
                                         element=ops.kv_cache_element(key_cache.dtype))
        tp = getattr(model, "tp", None)
        parallel = {} if tp is None or tp.size == 1 else dict(
            all_reduce=tp.shm_all_reduce, vocab_start=tp.rank * c.vocab_size,
            timeout_s=tp.timeout_s)
        qk_whole = model.layers[0].attn.qk_whole  # OLMoE's whole-row q/k norms over the group
        if qk_whole is not None:
            parallel["qk_whole"] = (qk_whole.q_start, qk_whole.q_whole, qk_whole.k_start, qk_whole.kv_whole,
                                    qk_whole.writes_k)
        self._stack = _core.model.DecoderStack(dims=dims, embed=embedding_weight(model.embed), layers=layers,
                                               final_norm=model.norm.data_ptr(), cache=cache, **parallel)
        self.kv_caches = kv_caches
        self.hidden_size = c.hidden_size

    @staticmethod
    def _layer_weights(layer, cos_sin_cache: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor):
        a, m = layer.attn, layer.mlp
        w = _core.model.DecoderLayerWeights()
        w.input_norm, w.post_attention_norm = _address(layer.input_norm), _address(layer.post_attention_norm)
        w.attention_output_norm = _address(layer.attention_output_norm)
        w.mlp_output_norm = _address(layer.mlp_output_norm)
        w.cos_sin_cache = cos_sin_cache.data_ptr() if a.use_rope else 0  # 0: a NoPE layer
        w.sliding_window = a.sliding_window or 0
        w.sinks = _address(a.sinks)  # (gpt-oss's; 0: none)
        w.qkv, w.o = linear_weight(a.qkv_proj), linear_weight(a.o_proj)
        w.q_norm, w.k_norm = _address(a.q_norm), _address(a.k_norm)
        if isinstance(m, SparseMoe):
            w.moe = moe_weights(m)
        else:
            w.gate_up, w.down = linear_weight(m.gate_up_proj), linear_weight(m.down_proj)
        w.key_cache, w.value_cache = key_cache.data_ptr(), value_cache.data_ptr()
        return w

    @property
    def last_groups(self) -> int:
        """How many groups of sequences the last forward cut its step into, each run by one thread
        (1: the whole step, every kernel on the whole team; decoder_stack.h's step split)."""
        return self._stack.last_groups

    def set_lora(self, slot: int, adapter: LoraAdapter) -> None:
        """Slot `slot` holds `adapter` (which must outlive its use here), for the tokens that name it."""
        self._stack.set_lora(slot=slot, layers=adapter.native_layers())

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata,
                inputs_embeds: torch.Tensor | None = None, lora_slots: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: int32 [num_tokens] -> the final norm's output [num_tokens, hidden]
        bf16 (LlamaForCausalLM.forward's result). inputs_embeds [num_tokens, hidden], when given,
        replaces the embedding lookup (a LLaVA step's merged rows). lora_slots: int32 [num_tokens],
        each token's LoRA slot (set_lora; -1: none), or None: no token has an adapter."""
        input_ids, positions = input_ids.to(torch.int32).contiguous(), positions.to(torch.int32).contiguous()
        n = input_ids.shape[0]
        if inputs_embeds is not None:
            if inputs_embeds.shape != (n, self.hidden_size):
                raise ValueError(f"NativeDecoderStack: inputs_embeds of shape {tuple(inputs_embeds.shape)} for "
                                 f"{n} tokens of {self.hidden_size}")
            inputs_embeds = inputs_embeds.to(torch.bfloat16).contiguous()
        if lora_slots is not None:
            if lora_slots.dtype != torch.int32 or lora_slots.shape != (n,) or not lora_slots.is_contiguous():
                raise ValueError(f"NativeDecoderStack: lora_slots must be int32 [{n}], contiguous")
        out = torch.empty((n, self.hidden_size), dtype=torch.bfloat16)
        bt = attn.block_table
        self._stack.forward(input_ids=input_ids.data_ptr(), positions=positions.data_ptr(), num_tokens=n,
                            slot_mapping=attn.slot_mapping.data_ptr(), block_table=bt.data_ptr(),
                            block_table_stride=bt.stride(0), seq_lens=attn.seq_lens.data_ptr(),
                            query_start_loc=attn.query_start_loc.data_ptr(), num_seqs=bt.shape[0],
                            out=out.data_ptr(), inputs_embeds=_address(inputs_embeds), lora_slots=_address(lora_slots))
        return out
