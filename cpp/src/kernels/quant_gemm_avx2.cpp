// quant_gemm on AVX2 (the avx2 path of quant_gemm.h, any x86-64-v3 CPU): the 16 lanes of a
// panel as two 8-lane registers (rows 0-7: bytes 0-31 of each 64-byte vector, rows 8-15: bytes
// 32-63). The 4-byte dot product is maddubs (u8 x s8 -> pairs of int16) then madd with ones
// (-> int32): exact, as no pair sum of u < 128 times |x| <= 127 reaches 32767. Q8_0's 8-bit
// values would, so its block is the signed product |q| x sign(x, q) instead, plus 128 times the
// sum of x: the same integers.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quant_formats.h"
#include "quant_gemm_paths.h"
#include "quant_gemm_kernel.h"

namespace corellm::quant {

namespace {

struct Avx2Lanes {
  struct I {
    __m256i lo, hi;
  };
  struct F {
    __m256 lo, hi;
  };
  static constexpr int kMaxRows = 2;
  static __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static I load(const uint8_t* p) { return {load32(p), load32(p + 32)}; }
  static I and_bytes(I v, uint8_t b) {
    const __m256i m = _mm256_set1_epi8(static_cast<char>(b));
    return {_mm256_and_si256(v.lo, m), _mm256_and_si256(v.hi, m)};
  }
  static I low_nibbles(I v) { return and_bytes(v, 0x0F); }
  static I high_nibbles(I v) { return and_bytes({_mm256_srli_epi16(v.lo, 4), _mm256_srli_epi16(v.hi, 4)}, 0x0F); }
  template <int S>
  static I shift16(I v) {
    if constexpr (S > 0) return {_mm256_slli_epi16(v.lo, S), _mm256_slli_epi16(v.hi, S)};
    else if constexpr (S < 0) return {_mm256_srli_epi16(v.lo, -S), _mm256_srli_epi16(v.hi, -S)};
    else return v;
  }
  static I or_(I a, I b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
  static I add(I a, I b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
  static I sub(I a, I b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
  static I mullo(I a, I b) { return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)}; }
  static I set1_i(int32_t v) { return {_mm256_set1_epi32(v), _mm256_set1_epi32(v)}; }
  static __m256i dot8(__m256i acc, __m256i u, __m256i x) {
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
  }
  static I dot(I acc, I u, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    return {dot8(acc.lo, u.lo, x), dot8(acc.hi, u.hi, x)};
  }
  static __m256i signed_dot8(__m256i acc, __m256i u, __m256i x) {
    const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8(static_cast<char>(0x80)));
    return dot8(acc, _mm256_abs_epi8(q), _mm256_sign_epi8(x, q));
  }
  // Sum of u x = sum of q x + 128 sum of x (u = q + 128): the signed products, then the offset.
  static I q8_block(const uint8_t* p, const int8_t* xq) {
    I s = set1_i(0);
    int32_t xsum = 0;
    for (int e = 0; e < 32; ++e) xsum += xq[e];
    for (int v = 0; v < 8; ++v) {
      int32_t x4;
      std::memcpy(&x4, xq + 4 * v, 4);
      const __m256i x = _mm256_set1_epi32(x4);
      s = {signed_dot8(s.lo, load32(p + 64 * v), x), signed_dot8(s.hi, load32(p + 64 * v + 32), x)};
    }
    return add(s, set1_i(128 * xsum));
  }
  static F f16(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static __m256i i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static F u8(const uint8_t* p) { return {_mm256_cvtepi32_ps(u8x8(p)), _mm256_cvtepi32_ps(u8x8(p + 8))}; }
  static I i8(const uint8_t* p) { return {i8x8(p), i8x8(p + 8)}; }
  static F cvt(I v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
  static F fmadd(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
  static F fnmadd(F a, F b, F c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
  static F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
  static F set1_f(float v) { return {_mm256_set1_ps(v), _mm256_set1_ps(v)}; }
  static F zero_f() { return set1_f(0.0f); }
  static void store16(float* p, F v) {
    _mm256_storeu_ps(p, v.lo);
    _mm256_storeu_ps(p + 8, v.hi);
  }
};

}  // namespace

void quant_gemm_avx2(const QuantGemmArgs& a, const QuantizedRows& x, const PanelRange& range) {
  kernel::run<Avx2Lanes>(a, x, range);
}

}  // namespace corellm::quant
