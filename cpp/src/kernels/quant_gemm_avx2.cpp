// quant_gemm on AVX2 (the avx2 path of quant_gemm.h, any x86-64-v3 CPU): the 16 lanes of a
// panel as two 8-lane registers (rows 0-7: bytes 0-31 of each 64-byte vector, rows 8-15: bytes
// 32-63). The 4-byte products are maddubs (u8 x s8 -> two int16 pair sums per lane), added in
// int16 over as many vectors as cannot overflow (quant_gemm_kernel.h's dots: 8 for 4-bit values,
// 4 for 5-bit, 2 for 6-bit), then madd with ones (-> int32): exact. Q8_0's 8-bit values would
// overflow a pair sum, so its block is the signed product |q| x sign(x, q) instead (|q| and q
// made once per block for all the rows, q8_values), one pair sum per madd, plus 128 times the sum
// of x: the same integers. Blocks of 16 rows share each block's values (their sums wait in
// memory: 32 registers' worth); the rows left go 4, then 1, at a time. Versus one madd per
// maddubs, 2 rows a block and Q8_0 values remade per row (AMD EPYC Zen 3, 2 threads, SmolLM2's
// projections, interleaved): Q4_1 1.18-1.22x, Q5_0 1.21-1.36x, Q6_K 1.36-1.62x, Q8_0 1.45-1.6x
// from 16 rows on with blocks of 4 rows; blocks of 16 then 1.04-1.35x faster again (Q4_1, Q5_0,
// Q6_K, Q8_0 at 16-512 rows); the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>

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
  static constexpr int kMaxRows = 16;
  static constexpr bool kNonTemporalOneRow = false;  // not measured faster here (next_panel.h)
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
  // Per lane, the two 16-bit sums u0 x0 + u1 x1 and u2 x2 + u3 x3 of its 4 bytes and x4's.
  static I pair_sums(I u, int32_t x4) {
    const __m256i x = _mm256_set1_epi32(x4);
    return {_mm256_maddubs_epi16(u.lo, x), _mm256_maddubs_epi16(u.hi, x)};
  }
  static I add16(I a, I b) { return {_mm256_add_epi16(a.lo, b.lo), _mm256_add_epi16(a.hi, b.hi)}; }
  static I widen16(I s) {  // the lane's two 16-bit sums added into 32 bits
    const __m256i ones = _mm256_set1_epi16(1);
    return {_mm256_madd_epi16(s.lo, ones), _mm256_madd_epi16(s.hi, ones)};
  }
  // A Q8_0 panel-block's values, for every row: V[v] = |q| (an unsigned byte up to 128), V[8 + v]
  // = q, of vector v (u = q + 128 in the panel; q8_values_of: from 8 vectors of u in registers).
  static void q8_values_of(const I* U, I* V) {
    const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
    for (int v = 0; v < 8; ++v) {
      const __m256i lo = _mm256_xor_si256(U[v].lo, flip), hi = _mm256_xor_si256(U[v].hi, flip);
      V[8 + v] = {lo, hi};
      V[v] = {_mm256_abs_epi8(lo), _mm256_abs_epi8(hi)};
    }
  }
  static void q8_values(const uint8_t* p, I* V) {
    I U[8];
    for (int v = 0; v < 8; ++v) U[v] = load(p + 64 * v);
    q8_values_of(U, V);
  }
  // A type's 16 levels (IQ4's, MXFP4's: nibble_levels) plus 128 (the sign bit flipped) by the 4-bit
  // index in each byte (pshufb's lookup).
  static I levels(I v, const int8_t* values) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values));
    const __m256i table = _mm256_broadcastsi128_si256(_mm_xor_si128(levels, _mm_set1_epi8(static_cast<char>(0x80))));
    return {_mm256_shuffle_epi8(table, v.lo), _mm256_shuffle_epi8(table, v.hi)};
  }
  // Sum of u x = sum of |q| sign(x, q) + 128 sum of x (xsum): each pair sum (up to 2 x 128 x 127)
  // widened at once.
  static I q8_dots(const I* V, const int8_t* xq, int32_t xsum) {
    const __m256i ones = _mm256_set1_epi16(1);
    I s = set1_i(128 * xsum);
    for (int v = 0; v < 8; ++v) {
      int32_t x4;
      std::memcpy(&x4, xq + 4 * v, 4);
      const __m256i x = _mm256_set1_epi32(x4);
      const __m256i lo = _mm256_maddubs_epi16(V[v].lo, _mm256_sign_epi8(x, V[8 + v].lo));
      const __m256i hi = _mm256_maddubs_epi16(V[v].hi, _mm256_sign_epi8(x, V[8 + v].hi));
      s = {_mm256_add_epi32(s.lo, _mm256_madd_epi16(lo, ones)), _mm256_add_epi32(s.hi, _mm256_madd_epi16(hi, ones))};
    }
    return s;
  }
  static F f16(const uint8_t* p) {
    return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
  }
  static F bf16(const uint8_t* p) {  // 16 bf16 values, exactly
    auto half = [](const uint8_t* h) {
      return _mm256_castsi256_ps(
          _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))), 16));
    };
    return {half(p), half(p + 16)};
  }
  static __m256i u8x8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static __m256i i8x8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))); }
  static F u8(const uint8_t* p) { return {_mm256_cvtepi32_ps(u8x8(p)), _mm256_cvtepi32_ps(u8x8(p + 8))}; }
  static I u8i(const uint8_t* p) { return {u8x8(p), u8x8(p + 8)}; }
  static I u8_pairs(const uint8_t* lo, const uint8_t* hi) {  // bytes lo[c], hi[c] interleaved, widened to 16 bits
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi));
    return {_mm256_cvtepu8_epi16(_mm_unpacklo_epi8(a, b)), _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(a, b))};
  }
  static I madd16(I a, I b) { return {_mm256_madd_epi16(a.lo, b.lo), _mm256_madd_epi16(a.hi, b.hi)}; }
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

void quant_gemm_avx2(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  kernel::run<Avx2Lanes>(a, x, claims);
}

}  // namespace corellm::quant
