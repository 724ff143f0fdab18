"""The paged KV cache: writing K/V into slots, and varlen causal paged attention.

KV cache layout of one layer (see cpp/include/corellm/kernels/paged_attention.h), with x the
elements per 32-bit lane (1 for float32, 2 for bfloat16, whose dot-product instructions take pairs):
    key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]   (keys transposed per block)
    value_cache [num_blocks, num_kv_heads, block_size / x, head_size, x]
An 8-bit cache (float8_e4m3fn or float8_e5m2: vLLM's kv_cache_dtype "fp8" / "fp8_e4m3", "fp8_e5m2";
CPU only, for a bfloat16 model) keeps bfloat16's layout element for element (x = 2), so that a block
widens to bfloat16 in place of the same shape; its keys and values are written from bfloat16,
rounded to the nearest 8-bit float and saturated at the format's largest finite value.
"""

from __future__ import annotations

import math

import torch

from corellm.native import _core
from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride


FP8_KV_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def kv_pack(dtype: torch.dtype) -> int:
    """Elements per 32-bit lane of the cache layout (an 8-bit cache: bfloat16's pairs)."""
    return 2 if dtype in FP8_KV_DTYPES else 4 // dtype.itemsize


def _compute_dtype(key_cache: torch.Tensor) -> torch.dtype:
    """The dtype of the keys and values written into caches of key_cache's dtype, and of the
    queries read against them: bfloat16 for an 8-bit cache, else the cache's own."""
    return torch.bfloat16 if key_cache.dtype in FP8_KV_DTYPES else key_cache.dtype


def kv_cache_element(dtype: torch.dtype) -> int:
    """The CPU kernels' tag (paged_attention.h's KVCacheElement) for caches of `dtype`."""
    k = _core.kernels
    return {torch.float8_e4m3fn: k.KV_FP8_E4M3, torch.float8_e5m2: k.KV_FP8_E5M2}.get(dtype, k.KV_MODEL_DTYPE)


def _kv_element(op: str, key_cache: torch.Tensor, be) -> tuple[int, ...]:
    """The kernel's trailing kv_element argument for caches of key_cache's dtype: none for a cache
    of the model's dtype; ValueError for an 8-bit cache on CUDA."""
    if key_cache.dtype not in FP8_KV_DTYPES:
        return ()
    if be.extra:
        raise ValueError(f"{op}: {key_cache.dtype} KV caches are not implemented in the CUDA kernels")
    return (kv_cache_element(key_cache.dtype),)


def kv_cache_shapes(num_blocks: int, num_kv_heads: int, head_size: int, block_size: int,
                    dtype: torch.dtype) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(key_cache shape, value_cache shape) of one layer."""
    x = kv_pack(dtype)
    if head_size % x or block_size % x:
        raise ValueError(f"{dtype} KV caches need head_size ({head_size}) and block_size ({block_size}) "
                         f"divisible by {x}")
    return ((num_blocks, num_kv_heads, head_size // x, block_size, x),
            (num_blocks, num_kv_heads, block_size // x, head_size, x))


def unpack_kv_cache(key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both caches as [num_blocks, block_size, num_kv_heads, head_size] (copies; for tests and tools)."""
    nb, nkv, hdx, bs, x = key_cache.shape
    k = key_cache.permute(0, 3, 1, 2, 4).reshape(nb, bs, nkv, hdx * x)
    v = value_cache.permute(0, 2, 4, 1, 3).reshape(nb, bs, nkv, hdx * x)
    return k, v


def _check_caches(op: str, key_cache: torch.Tensor, value_cache: torch.Tensor) -> tuple[int, int, int, int]:
    check(op, "key_cache", key_cache, ndim=5, contiguous=True)
    check(op, "value_cache", value_cache, ndim=5, dtype=key_cache.dtype, device=key_cache.device, contiguous=True)
    num_blocks, num_kv_heads, hdx, block_size, x = key_cache.shape
    if x != kv_pack(key_cache.dtype):
        raise ValueError(f"{op}: key_cache's last dimension must be {kv_pack(key_cache.dtype)} for "
                         f"{key_cache.dtype}, got {x} (use kv_cache_shapes)")
    head_size = hdx * x
    check_shape(op, "value_cache", value_cache, (num_blocks, num_kv_heads, block_size // x, head_size, x))
    return num_blocks, num_kv_heads, head_size, block_size


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """key/value [num_tokens, num_kv_heads * head_size] -> their slots (negative slot: skipped)."""
    op = "reshape_and_cache"
    num_blocks, num_kv_heads, head_size, block_size = _check_caches(op, key_cache, value_cache)
    n = slot_mapping.shape[0] if isinstance(slot_mapping, torch.Tensor) else 0
    check(op, "slot_mapping", slot_mapping, ndim=1, dtype=torch.int32, device=key_cache.device, contiguous=True)
    for name, t in (("key", key), ("value", value)):
        check(op, name, t, ndim=2, dtype=_compute_dtype(key_cache), device=key_cache.device)
        check_shape(op, name, t, (n, num_kv_heads * head_size))
    be = backend(op, key)
    element = _kv_element(op, key_cache, be)
    be.kernels.reshape_and_cache(key.data_ptr(), row_stride(key), value.data_ptr(), row_stride(value),
                                    key_cache.data_ptr(), value_cache.data_ptr(), slot_mapping.data_ptr(), n,
                                    num_blocks, num_kv_heads, head_size, block_size, be.dtype, *be.extra, *element)


def paged_attention(
    q: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    sliding_window: int = 0,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    max_seq_len: int | None = None,
    cpu_isa: str = "",
    softcap: float = 0.0,
    sinks: torch.Tensor | None = None,
    causal: bool = True,
) -> torch.Tensor:
    """Causal attention of each sequence's query tokens (its last ones) over its cached K/V.
    q [num_tokens, num_heads * head_size]; block_table [num_seqs, max_blocks] int32;
    seq_lens [num_seqs] int32; query_start_loc [num_seqs + 1] int32. Returns [num_tokens,
    num_heads * head_size]. max_query_len and max_seq_len (CUDA): the longest query and the longest
    sequence of the batch (or more: a captured graph's worst case), when the caller knows them;
    otherwise they are read from the device (a sync). They size the kernels' grids, and a decode
    batch's workspace for its split contexts. cpu_isa (CPU): the instruction-set path to run
    ("avx2", "avx512", "avx512bf16", "amx"; empty: the process's), for tests and benchmarks. softcap
    > 0: each scaled score s becomes softcap * tanh(s / softcap) before the softmax (Gemma 2's
    attention logit soft-capping; the CPU kernels only). sinks [num_heads] fp32 (CPU kernels only):
    each head's sink logit, one more term of its rows' softmax denominators with no value
    (gpt-oss's attention sinks; paged_attention.h). causal=False (CPU kernels only): bidirectional,
    an encoder's: each query token sees every key of its sequence, or with sliding_window > 0 those
    less than sliding_window positions away on either side."""
    op = "paged_attention"
    num_blocks, num_kv_heads, head_size, block_size = _check_caches(op, key_cache, value_cache)
    check(op, "q", q, ndim=2, dtype=_compute_dtype(key_cache), device=key_cache.device)
    be = backend(op, q)
    _kv_element(op, key_cache, be)  # refuses an 8-bit cache on CUDA
    if cpu_isa and be.extra:
        raise ValueError(f"{op}: cpu_isa={cpu_isa!r} names a CPU path, but the caches are on {key_cache.device}")
    if not (softcap >= 0 and math.isfinite(softcap)):
        raise ValueError(f"{op}: softcap must be 0 (none) or positive, got {softcap}")
    if softcap and be.extra:
        raise ValueError(f"{op}: attention logit soft-capping (softcap={softcap}) is not implemented in the CUDA "
                         f"kernels")
    if sinks is not None and be.extra:
        raise ValueError(f"{op}: attention sinks are not implemented in the CUDA kernels")
    if not causal and be.extra:
        raise ValueError(f"{op}: bidirectional attention (causal=False) is not implemented in the CUDA kernels")
    if q.shape[1] % head_size or (q.shape[1] // head_size) % num_kv_heads:
        raise ValueError(f"{op}: q width {q.shape[1]} is not a multiple of num_kv_heads ({num_kv_heads}) "
                         f"x head_size ({head_size})")
    num_heads = q.shape[1] // head_size
    if sinks is not None:
        check(op, "sinks", sinks, ndim=1, dtype=torch.float32, device=key_cache.device, contiguous=True)
        check_shape(op, "sinks", sinks, (num_heads,))
    check(op, "block_table", block_table, ndim=2, dtype=torch.int32, device=key_cache.device)
    num_seqs = block_table.shape[0]
    check(op, "seq_lens", seq_lens, ndim=1, dtype=torch.int32, device=key_cache.device, contiguous=True)
    check(op, "query_start_loc", query_start_loc, ndim=1, dtype=torch.int32, device=key_cache.device,
          contiguous=True)
    check_shape(op, "seq_lens", seq_lens, (num_seqs,))
    check_shape(op, "query_start_loc", query_start_loc, (num_seqs + 1,))
    # (Checked on the CPU only: on a GPU reading it would stall the stream and break graph capture.)
    if num_seqs and query_start_loc.is_cpu and int(query_start_loc[-1]) != q.shape[0]:
        raise ValueError(f"{op}: query_start_loc[-1] = {int(query_start_loc[-1])} but q has {q.shape[0]} tokens")
    if out is None:
        out = torch.empty((q.shape[0], q.shape[1]), dtype=q.dtype, device=q.device)
    else:
        check(op, "out", out, ndim=2, dtype=q.dtype, device=q.device, contiguous=True)
        check_shape(op, "out", out, (q.shape[0], q.shape[1]))
    extra = be.extra
    if be.extra:  # CUDA: the grid's extents, the workspace, then the stream
        if max_query_len is None:
            max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max()) if num_seqs else 0
        if max_seq_len is None:
            max_seq_len = int(seq_lens.max()) if num_seqs else 0
        size = be.kernels.paged_attention_workspace_size(num_seqs, num_heads, num_kv_heads, head_size, block_size,
                                                         int(max_query_len), int(max_seq_len), be.dtype)
        workspace = torch.empty(size, dtype=torch.uint8, device=q.device) if size else None
        extra = (int(max_query_len), int(max_seq_len), 0 if workspace is None else workspace.data_ptr(), *be.extra)
    else:
        extra = (cpu_isa, float(softcap), 0 if sinks is None else sinks.data_ptr(), kv_cache_element(key_cache.dtype),
                 bool(causal))
    be.kernels.paged_attention(out.data_ptr(), q.data_ptr(), row_stride(q), key_cache.data_ptr(),
                               value_cache.data_ptr(), num_blocks, num_kv_heads, head_size, block_size,
                               block_table.data_ptr(), row_stride(block_table), seq_lens.data_ptr(),
                               query_start_loc.data_ptr(), num_seqs, num_heads, float(scale),
                               int(sliding_window), be.dtype, *extra)
    return out
