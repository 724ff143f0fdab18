// The last step of the bf16 GEMM's paths (packed_gemm_avx512.cpp, packed_gemm_amx.cpp): a row's
// fp32 sums for 16 columns of a panel, plus the bias, stored as fp32 or rounded once to bf16.
// Needs AVX-512-BF16: included only by the paths' sources, which are compiled for it.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

namespace corellm::gemm_store {

// The columns of panel half h (16 columns from col0 + 16 h) inside an n-column output; 0: none.
inline __mmask16 half_mask(int64_t n, int64_t col0, int h) {
  const int64_t cols = std::min<int64_t>(16, n - col0 - 16 * h);
  return cols <= 0 ? 0 : static_cast<__mmask16>(cols == 16 ? 0xFFFFu : (1u << cols) - 1u);
}

// bias[col .. col + 16) under mask, as fp32; zero without a bias.
inline __m512 bias_of(const uint16_t* bias, int64_t col, __mmask16 mask) {
  if (bias == nullptr) return _mm512_setzero_ps();
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(mask, bias + col)), 16));
}

// y[at .. at + 16) under mask = v: fp32, or bf16 rounded to nearest even.
inline void store(void* y, int64_t at, bool y_f32, __mmask16 mask, __m512 v) {
  if (y_f32) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + at, mask, v);
  } else {
    _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + at, mask, (__m256i)_mm512_cvtneps_pbh(v));
  }
}

}  // namespace corellm::gemm_store
