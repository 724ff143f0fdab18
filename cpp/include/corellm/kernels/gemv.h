// y = x W^T (+ b) for a few rows of x in bf16: the decode-time matrix-vector products, where the
// whole cost is streaming W from memory once (AVX512-BF16 dot products, rows of W split across
// threads).
#pragma once

#include <cstdint>

namespace corellm {

// Largest number of rows of x handled (beyond it, GEMM libraries reuse W better).
constexpr int64_t kGemvMaxRows = 4;

// True when this build can run bf16_gemv (AVX512-BF16).
bool bf16_gemv_available();

// x [m, k] (row stride x_stride), w [n, k] contiguous, bias [n] or null, y [m, n] (row stride
// y_stride); all bf16, fp32 accumulation, y rounded to bf16. Requires 1 <= m <= kGemvMaxRows.
void bf16_gemv(const uint16_t* x, int64_t x_stride, const uint16_t* w, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k);

}  // namespace corellm
