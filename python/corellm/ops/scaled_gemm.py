"""The scaled low-precision GEMM of W8A8 inference on the GPU (cuda/scaled_gemm.cu: CUTLASS 3.x
kernels for Hopper) and the dynamic per-row quantization that feeds it its activations.

    q, scales = quantize_rows(x, "fp8")                     # x [m, k] -> fp8 [m, k], fp32 [m]
    y = scaled_gemm(q, scales, w_q, w_scales)               # bf16 [m, n]

Types: "fp8" (e4m3, the range +-448) and "int8" (+-127, symmetric). CUDA tensors only."""

from __future__ import annotations

import torch

from corellm.native import _cuda
from corellm.ops._backend import backend
from corellm.ops._checks import check, check_shape, row_stride

# A scaled type's name -> (torch dtype, the largest magnitude a quantized value takes).
SCALED_TYPES: dict[str, tuple[torch.dtype, float]] = {"fp8": (torch.float8_e4m3fn, 448.0), "int8": (torch.int8, 127.0)}


def scaled_gemm_built() -> bool:
    """Whether corellm._cuda holds the CUTLASS kernels (built with CUTLASS's headers for sm_90a)."""
    return _cuda is not None and bool(_cuda.scaled_gemm_built())


def _type_tag(op: str, qtype: str) -> int:
    if qtype not in SCALED_TYPES:
        raise ValueError(f"{op}: type {qtype!r} is not one of {', '.join(SCALED_TYPES)}")
    return _cuda.SCALED_FP8_E4M3 if qtype == "fp8" else _cuda.SCALED_INT8


def _require_cuda(op: str, t: torch.Tensor) -> None:
    """t is on a GPU and corellm._cuda is built (t's dtype is the caller's to check: the GEMM's
    operands are fp8 / int8, which no elementwise backend takes)."""
    if not t.is_cuda:
        raise ValueError(f"{op}: runs on CUDA tensors only (got a tensor on {t.device}); on the CPU, "
                         f"quantized linears run through corellm's quantized GEMM (QuantizedTensor)")
    if _cuda is None:
        raise NotImplementedError(f"{op}: CUDA tensors need corellm._cuda, which is not built in this "
                                  f"installation (build with nvcc present, or CORELLM_CUDA=ON)")


def quantize_rows(x: torch.Tensor, qtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [m, k] (bf16, fp16 or fp32; rows may be strided) -> (q [m, k] in the type, scales fp32 [m]):
    scales[i] = max |x[i]| / R, q[i] = x[i] / scales[i] rounded to the type (R = 448 for fp8, 127
    for int8; a row of zeros gets the scale 1)."""
    op = "quantize_rows"
    check(op, "x", x, ndim=2)
    _require_cuda(op, x)
    be = backend(op, x)
    tag = _type_tag(op, qtype)
    m, k = x.shape
    q = torch.empty((m, k), dtype=SCALED_TYPES[qtype][0], device=x.device)
    scales = torch.empty(m, dtype=torch.float32, device=x.device)
    _cuda.quantize_rows(q=q.data_ptr(), scales=scales.data_ptr(), x=x.data_ptr(), x_stride=row_stride(x), m=m, k=k,
                        type=tag, dtype=be.dtype, stream=be.extra[0])
    return q, scales


def scaled_gemm(a: torch.Tensor, a_scales: torch.Tensor, b: torch.Tensor, b_scales: torch.Tensor,
                out: torch.Tensor | None = None) -> torch.Tensor:
    """out [m, n] bf16 = (a_scales[:, None] * b_scales[None, :]) * (a @ b.T), the sum exact in int32
    (int8) or in the tensor cores' fp32 (fp8). a [m, k] and b [n, k] contiguous, both fp8 e4m3 or both
    int8; a_scales fp32 [m] or [1] (per token or per tensor), b_scales fp32 [n] or [1] (per channel
    or per tensor). out may be a column slice of a wider bf16 tensor (row stride a multiple of 8).
    Needs k a multiple of 16, n a multiple of 8, and a Hopper GPU (compute capability 9.0)."""
    op = "scaled_gemm"
    check(op, "a", a, ndim=2, dtype=(torch.float8_e4m3fn, torch.int8), contiguous=True)
    _require_cuda(op, a)
    qtype = "fp8" if a.dtype == torch.float8_e4m3fn else "int8"
    m, k = a.shape
    check(op, "b", b, ndim=2, dtype=a.dtype, device=a.device, contiguous=True)
    n = b.shape[0]
    check_shape(op, "b", b, (n, k))
    check(op, "a_scales", a_scales, ndim=1, dtype=torch.float32, device=a.device, contiguous=True)
    check(op, "b_scales", b_scales, ndim=1, dtype=torch.float32, device=a.device, contiguous=True)
    if a_scales.numel() not in (1, m):
        raise ValueError(f"{op}: a_scales must have 1 or m = {m} values, got {a_scales.numel()}")
    if b_scales.numel() not in (1, n):
        raise ValueError(f"{op}: b_scales must have 1 or n = {n} values, got {b_scales.numel()}")
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=a.device)
    check(op, "out", out, ndim=2, dtype=torch.bfloat16, device=a.device)
    check_shape(op, "out", out, (m, n))
    _cuda.scaled_gemm(type=_type_tag(op, qtype), a=a.data_ptr(), b=b.data_ptr(), a_scales=a_scales.data_ptr(),
                      a_scales_per_row=a_scales.numel() == m and m != 1, b_scales=b_scales.data_ptr(),
                      b_scales_per_column=b_scales.numel() == n and n != 1, out=out.data_ptr(),
                      out_stride=row_stride(out) if m > 1 else n, m=m, n=n, k=k,
                      stream=torch.cuda.current_stream(a.device).cuda_stream)
    return out
