// y = x W^T (+ b) in bf16 over a weight packed once, after loading: corellm's CPU linear layer.
// It beats oneDNN's bf16 GEMM on a prepacked weight at decode sizes, where oneDNN's per-call cost
// and its blocking for large M lose and one pass over W must serve every row, and on AVX-512-BF16
// (no AMX) holds level beyond; bench/kernels.py ("linear (whole model)") measures both on this
// machine.
//
// Packing: panels of 32 output columns; in a panel, for each pair of input columns (k, k+1), the
// 32 columns' two values side by side (128 bytes: two AVX-512 registers of (W[n][k], W[n][k+1])
// pairs, the operand order of the dpbf16 instruction). A panel is one contiguous run of memory.
// Each thread streams a contiguous range of panels; per panel and block of up to 8 rows of x it
// walks the k pairs, accumulating 32 columns x the rows in fp32 registers (no horizontal
// reductions), and re-reads the panel from its caches for the next block of rows. Beyond 128
// rows, x is taken 128 rows at a time, so that those rows stay in the core's L2.
#pragma once

#include <cstdint>

#include "corellm/kernels/dtype.h"

namespace corellm {

constexpr int64_t kGemmPanelCols = 32;

// True when this build can run bf16_gemm (AVX512-BF16).
bool bf16_gemm_available();

// Elements of the packed form of an [n, k] weight: n rounded up to 32, k to 2.
int64_t bf16_gemm_packed_size(int64_t n, int64_t k);

// w [n, k] row-major -> packed (bf16_gemm_packed_size(n, k) elements, zero padding):
// packed[((p * k_pairs + kp) * 32 + c) * 2 + j] = w[p * 32 + c][2 * kp + j].
void bf16_gemm_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k);

// x [m, k] (row stride x_stride), packed W of an [n, k] weight, bias [n] or null: bf16; fp32
// accumulation. y [m, n] (row stride y_stride, in elements): bf16 (rounded to nearest even) or,
// y_dtype F32, the fp32 sums themselves (logits, without a separate conversion pass). Each row's
// result does not depend on m (every row is computed alike). m = 0: nothing.
void bf16_gemm(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, void* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k, DType y_dtype = DType::BF16);

}  // namespace corellm
