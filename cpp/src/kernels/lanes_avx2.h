// 8-lane AVX2 helpers of the baseline kernels (the avx2 attention fold and GEMM, the activations'
// quantization): 8 bf16 widened (alone, or pairs by masks), reductions in a fixed order, and e^x.
// Private to the kernels library; compiled for the baseline (AVX2 + FMA).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "fast_math.h"

namespace corellm::avx2 {

// 8 bf16 values at p (unaligned) widened to fp32: each shifted up 16 bits.
inline __m256 load_bf16x8(const uint16_t* p) {
  const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
}

// The 8 32-bit pairs of bf16 at p, widened to fp32 by one mask of a load each: the second (odd)
// elements are the lanes' high halves; the first (even) ones the high halves of the lanes one
// element earlier, so p[-1] must be readable. No shift: on Zen 3 shifts share a port with the
// multiply-adds, masks run on any vector port (and fold their load). Used by the GEMM's 4-47-row
// way; in the attention's span fold the same was slower (0.85-0.97x, alternated builds), its K and
// V rows 64 bytes long so that every earlier load splits a cache line.
inline __m256 high_halves_at(const uint16_t* p) {  // the 8 32-bit lanes at p, low 16 bits cleared
  const __m256 high = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm256_and_ps(high, _mm256_loadu_ps(reinterpret_cast<const float*>(p)));
}
inline __m256 even_of_pairs(const uint16_t* p) { return high_halves_at(p - 1); }
inline __m256 odd_of_pairs(const uint16_t* p) { return high_halves_at(p); }

// The 8 lanes' max / sum, in a fixed order (halves, then pairs, then the last two).
inline float reduce_max8(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}
inline float reduce_add8(__m256 v) {
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// v rounded to bf16 to nearest even (a NaN kept, made quiet): dtype.h's f32_to_bf16 on 8 lanes,
// so that a vector loop and its scalar tail give the same bits. The bf16 bits in each lane's low half.
inline __m256i bf16_bits8(__m256 v) {
  const __m256i bits = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i up = _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd);  // to nearest, ties to even
  const __m256i rounded = _mm256_srli_epi32(_mm256_add_epi32(bits, up), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
  return _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
}

// v rounded to bf16 and stored at p (unaligned).
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m256i bits = bf16_bits8(v);
  // 8 lanes of at most 16 bits packed to 8 words (packus works within 128-bit halves: fix the order)
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bits, bits), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

// v rounded to bf16 and widened back: round_to on 8 lanes.
inline __m256 round_bf16x8(__m256 v) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v), 16)); }

// e^x on 8 lanes, the polynomial of fast_exp.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpLowest)), _mm256_set1_ps(kExpHighest));
  const __m256 y = _mm256_mul_ps(x, _mm256_set1_ps(kLog2e));
  const __m256 n = _mm256_round_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 f = _mm256_sub_ps(y, n);
  __m256 p = _mm256_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(kExp2Poly[i]));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

}  // namespace corellm::avx2
