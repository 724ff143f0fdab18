"""A weight kept in a GGUF quantized type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
IQ4_NL, IQ4_XS, MXFP4), its
blocks packed once for corellm's quantized GEMM (cpp/include/corellm/kernels/quant_gemm.h: the
file's bits rearranged into panels of 16 rows; activations quantized per row to int8 in blocks of
32, integer dot products, a fixed float epilogue — each row's result independent of the batch)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch

from corellm.native import _core

logger = logging.getLogger("corellm")
_K = _core.kernels
_DTYPE_CODES = {torch.float32: _K.DTYPE_F32, torch.bfloat16: _K.DTYPE_BF16}
_Q8_0 = 8  # GGUF's ggml_type number (the kernels name every type: quant_type_name)


def supported(ggml_type: int) -> bool:
    """Whether quant_gemm computes on this ggml type."""
    return bool(_K.quant_type_supported(int(ggml_type)))


def quant_path() -> str:
    """The instruction-set path of the quantized GEMM on this CPU (amx, avx512vnni or avx2)."""
    return _K.quant_path()


@dataclass
class QuantizedTensor:
    ggml_type: int
    shape: tuple[int, int]  # (n, k): n output rows of k values
    packed: torch.Tensor  # uint8, quant_gemm_pack's layout

    @property
    def type_name(self) -> str:
        return _K.quant_type_name(self.ggml_type)

    @property
    def nbytes(self) -> int:
        return self.packed.numel()

    @classmethod
    def pack(cls, ggml_type: int, rows: np.ndarray, shape: tuple[int, int],
             row_order: np.ndarray | None = None) -> QuantizedTensor:
        """rows: the file's blocks, [n, row bytes] uint8 (a memory map is fine: it is read once).
        Packed row i is file row row_order[i] when given."""
        n, k = shape
        blocks = np.ascontiguousarray(rows, dtype=np.uint8)
        expected = k // _K.quant_block_elements(ggml_type) * _K.quant_block_bytes(ggml_type)
        if blocks.shape != (n, expected):
            raise ValueError(f"{_K.quant_type_name(ggml_type)} tensor of shape {shape}: expected "
                             f"{n} rows of {expected} bytes, got {blocks.shape}")
        packed = torch.empty(_K.quant_gemm_packed_size(ggml_type, n, k), dtype=torch.uint8)
        order = None if row_order is None else np.ascontiguousarray(row_order, dtype=np.int32)
        _K.quant_gemm_pack(ggml_type, blocks.ctypes.data, packed.data_ptr(), n, k,
                           0 if order is None else order.ctypes.data)
        return cls(int(ggml_type), (int(n), int(k)), packed)

    def dequantize_rows(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` (int32 [m], each in [0, n)) dequantized: [m, k] in dtype (an embedding lookup)."""
        ids = ids.to(torch.int32).contiguous()
        out = torch.empty((ids.numel(), self.shape[1]), dtype=dtype)
        _K.quant_dequantize_rows(self.ggml_type, self.packed.data_ptr(), self.shape[0], self.shape[1],
                                 ids.data_ptr(), ids.numel(), out.data_ptr(), _DTYPE_CODES[dtype])
        return out

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return self.dequantize_rows(torch.arange(self.shape[0], dtype=torch.int32), dtype)

    def matmul_into(self, x: torch.Tensor, y: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        """y[:, :n] = x W^T (+ bias): x [m, k] fp32 or bf16 (unit column stride), y [m, >= n] a view
        with unit column stride, fp32 or bf16 (y may be a column slice of a wider output)."""
        n, k = self.shape
        if x.shape[-1] != k or y.shape[0] != x.shape[0] or y.shape[1] < n:
            raise ValueError(f"quantized matmul: x {tuple(x.shape)}, y {tuple(y.shape)} for a weight {self.shape}")
        if x.stride(-1) != 1 or x.dtype not in _DTYPE_CODES:
            x = x.float().contiguous()
        _K.quant_gemm(x.data_ptr(), x.stride(0), _DTYPE_CODES[x.dtype], self.ggml_type, self.packed.data_ptr(),
                      0 if bias is None else bias.data_ptr(), y.data_ptr(), y.stride(0), _DTYPE_CODES[y.dtype],
                      x.shape[0], n, k)

    # ------------------------------------------------------------------ shards (tensor parallelism)
    # The packed layout is panels of 16 rows, each the k / block panel-blocks of those rows:
    #   packed = [panel 0: block 0 | block 1 | ... ][panel 1: ...] ...
    # so whole panels are a range of rows, and the same blocks of every panel a range of columns:
    # a shard keeps the file's bits.
    @property
    def _panel_block_bytes(self) -> int:
        return _K.quant_gemm_packed_size(self.ggml_type, 16, _K.quant_block_elements(self.ggml_type))

    def rows(self, start: int, end: int) -> QuantizedTensor | None:
        """Rows [start, end) as a tensor of their own, or None when start is not a multiple of 16
        (a panel boundary). The last panel may hold rows past `end`: computed, never stored."""
        n, k = self.shape
        if not 0 <= start < end <= n or start % 16:
            return None
        panel = self.packed.numel() // -(-n // 16)
        return QuantizedTensor(self.ggml_type, (end - start, k),
                               self.packed[start // 16 * panel : -(-end // 16) * panel].clone())

    def columns(self, start: int, end: int) -> QuantizedTensor | None:
        """Columns [start, end) of every row, or None when they are not whole blocks of the type."""
        n, k = self.shape
        block = _K.quant_block_elements(self.ggml_type)
        if not 0 <= start < end <= k or start % block or end % block:
            return None
        blocks = self.packed.view(-(-n // 16), k // block, self._panel_block_bytes)
        return QuantizedTensor(self.ggml_type, (n, end - start),
                               blocks[:, start // block : end // block].contiguous().view(-1))

    def padded(self, n: int) -> QuantizedTensor:
        """The tensor with rows appended up to n (zero blocks: every type's zero scales make zero
        values; a padded vocabulary's rows, never looked up and whose logits are cut)."""
        rows, k = self.shape
        extra = _K.quant_gemm_packed_size(self.ggml_type, n, k) - self.packed.numel()
        if n < rows or extra < 0:
            raise ValueError(f"cannot pad a {self.type_name} tensor of {rows} rows to {n}")
        return QuantizedTensor(self.ggml_type, (n, k), torch.cat([self.packed, self.packed.new_zeros(extra)]))

    @classmethod
    def int8_per_channel(cls, w: torch.Tensor) -> QuantizedTensor:
        """w [n, k] (k a multiple of 32) quantized to int8 with one scale per output row
        (--quantization int8, vLLM's W8A8 weights): scale = max |w_row| / 127 (rounded to fp16),
        q = round(w / scale) in [-127, 127], stored in Q8_0's blocks with the row's scale in each."""
        n, k = w.shape
        if k % 32:
            raise ValueError(f"int8 quantization needs k a multiple of 32, got a weight of shape {tuple(w.shape)}")
        w = w.float()
        scale = (w.abs().amax(dim=1) / 127).to(torch.float16)
        inverse = torch.where(scale > 0, 1.0 / scale.float(), torch.zeros_like(scale, dtype=torch.float32))
        q = torch.clamp(torch.round(w * inverse[:, None]), -127, 127).to(torch.int8)
        blocks = torch.empty((n, k // 32, 34), dtype=torch.uint8)
        blocks[:, :, :2] = scale.view(torch.uint8).view(n, 1, 2)
        blocks[:, :, 2:] = q.view(torch.uint8).view(n, k // 32, 32)
        return cls.pack(_Q8_0, blocks.view(n, -1).numpy(), (n, k))

    @staticmethod
    def concat(parts: list[QuantizedTensor]) -> QuantizedTensor | None:
        """The parts stacked along n as one tensor (q, k, v -> qkv), or None when they cannot be:
        different types or k, or a part whose rows do not fill whole panels of 16."""
        first = parts[0]
        if any(p.ggml_type != first.ggml_type or p.shape[1] != first.shape[1] for p in parts):
            return None
        if any(p.shape[0] % 16 for p in parts[:-1]):
            return None
        n = sum(p.shape[0] for p in parts)
        return QuantizedTensor(first.ggml_type, (n, first.shape[1]), torch.cat([p.packed for p in parts]))


def row_slice(t: torch.Tensor | QuantizedTensor, start: int, end: int, name: str) -> torch.Tensor | QuantizedTensor:
    """Rows [start, end) of a checkpoint tensor (a tensor-parallel shard, a part of a fused
    projection): a quantized one's panels as they are where the cut falls on them, else its values
    dequantized (that layer then runs in the dtype)."""
    if isinstance(t, QuantizedTensor):
        return t.rows(start, end) or _dequantized_for_cut(t, name)[start:end]
    return t[start:end]


def column_slice(t: torch.Tensor | QuantizedTensor, start: int, end: int,
                 name: str) -> torch.Tensor | QuantizedTensor:
    """Columns [start, end) of every row: a quantized tensor's blocks where the cut falls on them."""
    if isinstance(t, QuantizedTensor):
        return t.columns(start, end) or _dequantized_for_cut(t, name)[:, start:end]
    return t[:, start:end]


def _dequantized_for_cut(t: QuantizedTensor, name: str) -> torch.Tensor:
    logger.info("%s (%s) is dequantized: a cut of it does not fall on the type's panels or blocks", name, t.type_name)
    return t.dequantize(torch.float32)
