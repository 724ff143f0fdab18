"""NativeDecoderStack: a loaded Llama-family model's decoder stack handed to _core's DecoderStack
(cpp/include/corellm/kernels/decoder_stack.h), which runs a step in one native call instead of
~10 Python op calls per layer. Same kernels, same order: the result is bit-identical to
LlamaForCausalLM's per-op forward.

It holds raw addresses: the model's weights and the KV caches must outlive it (the model keeps
it, the model runner keeps the caches)."""

from __future__ import annotations

import torch

from corellm.native import _core
from corellm.model.attention_metadata import AttentionMetadata

def _address(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def supports(model) -> bool:
    """Whether the model's weights are in the form the native stack reads (bf16 on a CPU with
    AVX512-BF16, every projection packed for bf16_gemm)."""
    return (model.device.type == "cpu" and model.dtype == torch.bfloat16 and _core.kernels.bf16_gemm_available()
            and all(linear._gemm_packed is not None for layer in model.layers for linear in layer.linears()))


class NativeDecoderStack:
    def __init__(self, model, kv_caches: list[tuple[torch.Tensor, torch.Tensor]]):
        c = model.config
        if len(kv_caches) != len(model.layers):
            raise ValueError(f"NativeDecoderStack: {len(kv_caches)} KV caches for {len(model.layers)} layers")
        layers = []
        for layer, (key_cache, value_cache) in zip(model.layers, kv_caches):
            a, m = layer.attn, layer.mlp
            layers.append((layer.input_norm.data_ptr(), layer.post_attention_norm.data_ptr(),
                           a.qkv_proj._gemm_packed.data_ptr(), _address(a.qkv_proj.bias), _address(a.q_norm),
                           _address(a.k_norm), a.o_proj._gemm_packed.data_ptr(), m.gate_up_proj._gemm_packed.data_ptr(),
                           m.down_proj._gemm_packed.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr()))
        key_cache = kv_caches[0][0]  # [num_blocks, num_kv_heads, head_size / x, block_size, x]
        num_blocks, _, _, block_size, _ = key_cache.shape
        self.kv_caches = kv_caches
        attn = model.layers[0].attn
        self._stack = _core.kernels.DecoderStack(
            vocab_size=c.vocab_size, hidden=c.hidden_size, num_heads=c.num_attention_heads,
            num_kv_heads=c.num_key_value_heads, head_size=c.head_dim, intermediate=c.intermediate_size,
            eps=c.rms_norm_eps, scale=attn.scale, sliding_window=attn.sliding_window or 0,
            cos_sin_cache=model.cos_sin_cache.data_ptr(), max_position=model.cos_sin_cache.shape[0],
            rot_dim=model.cos_sin_cache.shape[1], embed=model.embed.data_ptr(), layers=layers,
            final_norm=model.norm.data_ptr(), num_blocks=num_blocks, block_size=block_size)
        self.hidden_size = c.hidden_size

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions: int32 [num_tokens], contiguous -> the final norm's output
        [num_tokens, hidden] bf16."""
        n = input_ids.shape[0]
        out = torch.empty((n, self.hidden_size), dtype=torch.bfloat16)
        bt = attn.block_table
        self._stack.forward(input_ids.data_ptr(), positions.data_ptr(), n, attn.slot_mapping.data_ptr(),
                            bt.data_ptr(), bt.stride(0), attn.seq_lens.data_ptr(), attn.query_start_loc.data_ptr(),
                            bt.shape[0], out.data_ptr())
        return out
