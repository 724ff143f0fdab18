// y = x W^T (+ b) for a few rows of x in bf16: the decode-time matrix-vector products, where the
// whole cost is streaming W from memory once (AVX512-BF16 dot products, W's row groups split
// across threads). W is packed once, after loading, so that the stream is sequential: rows in
// groups of four, each group stored chunk by chunk (32 columns of its four rows side by side,
// 256 bytes), zero-padded to whole groups and chunks. Each thread then reads one contiguous run
// of memory instead of four row streams that cross pages at different points.
#pragma once

#include <cstdint>

namespace corellm {

// Largest number of rows of x handled (beyond it, GEMM libraries reuse W better).
constexpr int64_t kGemvMaxRows = 4;
constexpr int64_t kGemvGroupRows = 4;
constexpr int64_t kGemvChunk = 32;

// True when this build can run bf16_gemv (AVX512-BF16).
bool bf16_gemv_available();

// Elements of the packed form of an [n, k] weight.
int64_t bf16_gemv_packed_size(int64_t n, int64_t k);

// w [n, k] row-major -> packed (bf16_gemv_packed_size(n, k) elements).
void bf16_gemv_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k);

// x [m, k] (row stride x_stride), packed W of an [n, k] weight, bias [n] or null, y [m, n] (row
// stride y_stride); all bf16, fp32 accumulation, y rounded to bf16. Requires 1 <= m <= kGemvMaxRows.
void bf16_gemv(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k);

}  // namespace corellm
