"""corellm's ops: one Python function per kernel, checking device, dtype, shape and layout,
then dispatching on the tensors' device (CPU: corellm._core's C++ kernels)."""

from corellm.ops.activation import gelu_tanh_and_mul, silu_and_mul, swigluoai_and_mul
from corellm.ops.attention import (FP8_KV_DTYPES, kv_cache_element, kv_cache_shapes, kv_pack, paged_attention,
                                   reshape_and_cache, unpack_kv_cache)
from corellm.ops.lora import lora_add
from corellm.ops.moe import moe_combine, moe_route
from corellm.ops.norm import fused_add_rms_norm, rms_norm
from corellm.ops.rejection_sampler import rejection_sample
from corellm.ops.rotary import rotary_embedding
from corellm.ops.sampler import SamplerOutput, SamplingMetadata, TokenLists, sample
from corellm.ops.scale import scale
from corellm.ops.scaled_gemm import quantize_rows, scaled_gemm
from corellm.ops.token_logprobs import TokenLogprobs, token_logprobs

__all__ = [
    "FP8_KV_DTYPES",
    "SamplerOutput",
    "SamplingMetadata",
    "TokenLists",
    "TokenLogprobs",
    "fused_add_rms_norm",
    "gelu_tanh_and_mul",
    "kv_cache_element",
    "kv_cache_shapes",
    "kv_pack",
    "lora_add",
    "moe_combine",
    "moe_route",
    "paged_attention",
    "quantize_rows",
    "rejection_sample",
    "reshape_and_cache",
    "rms_norm",
    "rotary_embedding",
    "sample",
    "scale",
    "scaled_gemm",
    "silu_and_mul",
    "swigluoai_and_mul",
    "token_logprobs",
    "unpack_kv_cache",
]
