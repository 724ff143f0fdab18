// quant_gemm's lanes on AVX-512 with VNNI (the Lanes policy of quant_gemm_kernel.h): one 32-bit
// lane per panel row, vpdpbusd for the 4-byte dot products. Shared by the avx512vnni path and the
// AMX path's epilogues (quant_gemm_amx.cpp).
//
// Include it inside an AVX-512-VNNI target region, after every system header and
// quant_gemm_kernel.h's prerequisites: each source its own copy (anonymous namespace).
#pragma once

namespace corellm::quant {
namespace {

struct Avx512VnniLanes {
  using I = __m512i;
  using F = __m512;
  static constexpr int kMaxRows = 8;
  static constexpr bool kNonTemporalOneRow = true;  // next_panel.h
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static I and_bytes(I v, uint8_t b) { return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(b))); }
  static I low_nibbles(I v) { return and_bytes(v, 0x0F); }
  static I high_nibbles(I v) { return and_bytes(_mm512_srli_epi16(v, 4), 0x0F); }
  template <int S>
  static I shift16(I v) {
    if constexpr (S > 0) return _mm512_slli_epi16(v, S);
    else if constexpr (S < 0) return _mm512_srli_epi16(v, -S);
    else return v;
  }
  static I or_(I a, I b) { return _mm512_or_si512(a, b); }
  static I add(I a, I b) { return _mm512_add_epi32(a, b); }
  static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
  static I mullo(I a, I b) { return _mm512_mullo_epi32(a, b); }
  static I set1_i(int32_t v) { return _mm512_set1_epi32(v); }
  static I dot(I acc, I u, int32_t x4) { return _mm512_dpbusd_epi32(acc, u, _mm512_set1_epi32(x4)); }
  // Sum of u x over the 8 vectors (vpdpbusd takes u up to 255 as it is).
  static I q8_block(const uint8_t* p, const int8_t* xq) {
    I a = set1_i(0), b = set1_i(0);
    for (int v = 0; v < 8; v += 2) {
      int32_t x0, x1;
      std::memcpy(&x0, xq + 4 * v, 4);
      std::memcpy(&x1, xq + 4 * v + 4, 4);
      a = dot(a, load(p + 64 * v), x0);
      b = dot(b, load(p + 64 * v + 64), x1);
    }
    return add(a, b);
  }
  // A type's 16 levels (IQ4's, MXFP4's: nibble_levels) plus 128 (the sign bit flipped) by the 4-bit
  // index in each byte (pshufb's lookup per 128 bits).
  static I levels(I v, const int8_t* values) {
    const __m128i levels = _mm_loadu_si128(reinterpret_cast<const __m128i*>(values));
    return _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(static_cast<char>(0x80)))), v);
  }
  static F f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F bf16(const uint8_t* p) {  // 16 bf16 values, exactly
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
  }
  static F u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static I u8_pairs(const uint8_t* lo, const uint8_t* hi) {  // bytes lo[c], hi[c] interleaved, widened to 16 bits
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(lo));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi));
    return _mm512_cvtepu8_epi16(_mm256_set_m128i(_mm_unpackhi_epi8(a, b), _mm_unpacklo_epi8(a, b)));
  }
  static I madd16(I a, I b) { return _mm512_madd_epi16(a, b); }
  static I u8i(const uint8_t* p) { return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I i8(const uint8_t* p) { return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static F cvt(I v) { return _mm512_cvtepi32_ps(v); }
  static F fmadd(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fnmadd(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F set1_f(float v) { return _mm512_set1_ps(v); }
  static F zero_f() { return _mm512_setzero_ps(); }
  static void store16(float* p, F v) { _mm512_storeu_ps(p, v); }
};

}  // namespace
}  // namespace corellm::quant
