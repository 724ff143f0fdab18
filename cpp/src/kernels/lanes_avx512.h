// 16-lane AVX-512 helpers: 16 bf16 widened to fp32 and rounded back (as dtype.h's scalar
// f32_to_bf16, so that a vector loop and its scalar tail give the same bits), a sum across the
// lanes in a fixed order, and e^x with fast_exp's polynomial. Private to the kernels library;
// compiled for AVX-512 F/BW/VL/DQ in a target region of its own, so any source may include it, and
// called only where the process's path has AVX-512 (the elementwise loops, the attention folds).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "fast_math.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace corellm::avx512 {

// 16 bf16 values at p (unaligned) widened to fp32: each shifted up 16 bits.
inline __m512 load_bf16x16(const uint16_t* p) {
  const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(h, 16));
}

// v rounded to bf16 to nearest even (a NaN kept, made quiet): dtype.h's f32_to_bf16 on 16 lanes,
// in integer arithmetic (AVX-512-BF16's conversion flushes denormals, which that does not), so
// that a vector loop and its scalar tail give the same bits. The bf16 bits in each lane's low half.
inline __m512i bf16_bits16(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i up = _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd);  // to nearest, ties to even
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, up), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), rounded, quiet_nan);
}

// v rounded to bf16 and stored at p (unaligned).
inline void store_bf16x16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(bf16_bits16(v)));
}

// v rounded to bf16 and widened back: round_to on 16 lanes.
inline __m512 round_bf16x16(__m512 v) { return _mm512_castsi512_ps(_mm512_slli_epi32(bf16_bits16(v), 16)); }

// The 16 lanes' sum in a fixed order (halves, then quarters, then pairs, then the last two).
inline float reduce_add16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
  __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

// e^x on 16 lanes, the polynomial of fast_exp (the same bits lane by lane).
inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpLowest)), _mm512_set1_ps(kExpHighest));
  const __m512 y = _mm512_mul_ps(x, _mm512_set1_ps(kLog2e));
  const __m512 n = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(y, n);
  __m512 p = _mm512_set1_ps(kExp2Poly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly[i]));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

}  // namespace corellm::avx512
#pragma GCC pop_options
