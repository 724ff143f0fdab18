// The 8-bit floats of an fp8 KV cache (paged_attention.h's KVCacheElement: OCP e4m3fn and e5m2)
// to and from bf16, on the baseline instruction set (AVX2, F16C) so that every path shares them.
// Internal to the kernels library (kv_cache_write.cpp narrows, paged_attention.cpp widens).
//
// Narrowing, x (from bf16) to its nearest fp8, ties to even, |x| saturated at the format's largest
// finite value (NaN too): with a = min(|x|, max) and its fp32 bits A,
//   a >= the smallest normal: the code is A with its mantissa rounded to the format's (3 or 2 bits)
//     by adding half a unit less one plus the kept lowest bit, shifted down, less the exponent
//     bias difference (fp32's 127 against 7 or 15); a carry into the exponent is the right result;
//   below it: the subnormal code m = round(a / the subnormal unit) (0 .. 2^mantissa bits, the
//     last being the smallest normal's code);
// and the sign bit on top.
//
// Widening, code c to bf16 exactly (at most 3 significant bits), two ways giving the same bits:
//   AVX2 + F16C: a half's bits with c's digits, (c & 0x80) << 8 | (c & 0x7f) << 7 for e4m3 (the
//     same digits under an exponent bias of 15 instead of 7: the half is c's value times 2^-8,
//     subnormals included), c << 8 for e5m2 (a half's top byte); F16C widens the half to fp32,
//     e4m3's is multiplied by 2^8 (exact), and fp32's top 16 bits are the bf16;
//   AVX-512-BW, in 16-bit integers, 32 codes at a time: with v = c & 0x7f (exponent E and mantissa M
//     bits), a normal code's bf16 is (v << (7 - mantissa bits)) + ((127 - bias) << 7) — E moved
//     into bf16's exponent and rebiased, M to the top of its mantissa — and a subnormal one's (v
//     below 2^mantissa bits, zero included) is looked up in a table of those few values; then
//     the sign, (c & 0x80) << 8. ~2.5x fewer instructions per code than the F16C way: decode
//     attention on an fp8 cache widens every block it reads.
// e4m3's NaN codes (0x7f, 0xff) and e5m2's infinities and NaNs are never written (saturation) and
// widen to finite values or whatever the formula gives: attention masks the slots it did not write
// (and zeroes their values before a product, as for a bf16 cache's stale bits).
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "corellm/kernels/dtype.h"
#include "corellm/kernels/paged_attention.h"

namespace corellm::fp8 {

// A format's constants (the narrowing's and widening's).
struct Format {
  float max_finite;           // saturation
  float min_normal;           // below: subnormal codes
  float inverse_subnormal;    // 1 / the subnormal unit
  int mantissa_shift;         // 23 - mantissa bits
  uint32_t exponent_offset;   // (127 - bias) << mantissa bits
  float widen_factor;         // the half's value times this is the code's
  bool digits_shifted;        // e4m3: the half is (c & 0x80) << 8 | (c & 0x7f) << 7; e5m2: c << 8
  // the integer widening's: v << widen_shift plus widen_offset where v >= first_normal; below
  // it the bf16 of subnormal v (filled by format_of from the scalar widening)
  int widen_shift;
  uint16_t widen_offset;
  uint16_t first_normal;
  uint16_t subnormal_bf16[32];
};

inline float f32_of_fp8(uint8_t c, const Format& fmt);

// The format's constants, made once per process (attention asks for them per work item).
inline const Format& format_of(KVCacheElement e) {
  auto make = [](Format f) {
    for (uint8_t m = 0; m < f.first_normal; ++m) f.subnormal_bf16[m] = f32_to_bf16(f32_of_fp8(m, f));
    return f;
  };
  static const Format e4m3 = make({448.0f, 0x1p-6f, 0x1p9f, 20, 120u << 3, 0x1p8f, true, 4, 120u << 7, 8, {}});
  static const Format e5m2 = make({57344.0f, 0x1p-14f, 0x1p16f, 21, 112u << 2, 1.0f, false, 5, 112u << 7, 4, {}});
  return e == KVCacheElement::kFp8E4M3 ? e4m3 : e5m2;
}

// The fp8 code nearest to f (ties to even), saturated (the scalar form of narrow_bf16 below).
inline uint8_t fp8_of_f32(float f, const Format& fmt) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const auto sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  float a = std::fabs(f);
  if (!(a <= fmt.max_finite)) a = fmt.max_finite;
  uint32_t code;
  if (a < fmt.min_normal) {
    code = static_cast<uint32_t>(std::nearbyint(a * fmt.inverse_subnormal));
  } else {
    uint32_t abits;
    std::memcpy(&abits, &a, sizeof(abits));
    const uint32_t half_unit = (1u << (fmt.mantissa_shift - 1)) - 1u;
    code = ((abits + half_unit + ((abits >> fmt.mantissa_shift) & 1u)) >> fmt.mantissa_shift) - fmt.exponent_offset;
  }
  return static_cast<uint8_t>(sign | code);
}

// The value of code c (the scalar form of widen_to_bf16 below).
inline float f32_of_fp8(uint8_t c, const Format& fmt) {
  const auto half = static_cast<uint16_t>(fmt.digits_shifted ? ((c & 0x80u) << 8) | ((c & 0x7fu) << 7) : c << 8);
  return _cvtsh_ss(half) * fmt.widen_factor;
}

// n bf16 values -> n fp8 codes.
inline void narrow_bf16(const uint16_t* x, uint8_t* out, int64_t n, const Format& fmt) {
  int64_t i = 0;
  const __m256 max_finite = _mm256_set1_ps(fmt.max_finite), min_normal = _mm256_set1_ps(fmt.min_normal);
  const __m256 inverse_subnormal = _mm256_set1_ps(fmt.inverse_subnormal);
  const __m256i half_unit = _mm256_set1_epi32(static_cast<int>((1u << (fmt.mantissa_shift - 1)) - 1u));
  const __m256i one = _mm256_set1_epi32(1), offset = _mm256_set1_epi32(static_cast<int>(fmt.exponent_offset));
  const __m128i shift = _mm_cvtsi32_si128(fmt.mantissa_shift);
  // byte 0 of each 32-bit lane to the lane's first four bytes
  const __m256i first_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                               0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  for (; i + 8 <= n; i += 8) {
    const __m256i bits =
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))), 16);
    const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(bits, 24), _mm256_set1_epi32(0x80));
    // min(max, a) gives max for a NaN (the second operand where either is NaN)
    const __m256 a = _mm256_min_ps(_mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff))),
                                   max_finite);
    const __m256i abits = _mm256_castps_si256(a);
    const __m256i kept_low = _mm256_and_si256(_mm256_srl_epi32(abits, shift), one);
    const __m256i normal = _mm256_sub_epi32(
        _mm256_srl_epi32(_mm256_add_epi32(_mm256_add_epi32(abits, half_unit), kept_low), shift), offset);
    const __m256i subnormal = _mm256_cvtps_epi32(_mm256_mul_ps(a, inverse_subnormal));  // ties to even
    const __m256i below = _mm256_castps_si256(_mm256_cmp_ps(a, min_normal, _CMP_LT_OQ));
    const __m256i code = _mm256_or_si256(_mm256_blendv_epi8(normal, subnormal, below), sign);
    const __m256i packed = _mm256_shuffle_epi8(code, first_bytes);
    const __m128i eight = _mm_unpacklo_epi32(_mm256_castsi256_si128(packed), _mm256_extracti128_si256(packed, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), eight);
  }
  for (; i < n; ++i) out[i] = fp8_of_f32(bf16_to_f32(x[i]), fmt);
}

// n fp8 codes -> n bf16 values (exact).
inline void widen_to_bf16(const uint8_t* c, uint16_t* out, int64_t n, const Format& fmt) {
  int64_t i = 0;
  const __m256 factor = _mm256_set1_ps(fmt.widen_factor);
  for (; i + 16 <= n; i += 16) {
    const __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
    const __m256i half =
        fmt.digits_shifted
            ? _mm256_or_si256(_mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8),
                              _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7))
            : _mm256_slli_epi16(w, 8);
    const __m256 lo = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(half)), factor);
    const __m256 hi = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(half, 1)), factor);
    const __m256i words = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                              _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_permute4x64_epi64(words, 0xd8));
  }
  for (; i < n; ++i) {
    const float f = f32_of_fp8(c[i], fmt);
    uint32_t bits;
    std::memcpy(&bits, &f, sizeof(bits));
    out[i] = static_cast<uint16_t>(bits >> 16);
  }
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
// n fp8 codes -> n bf16 values (exact), the integer way (AVX-512-BW): the same bits as widen_to_bf16.
inline void widen_to_bf16_avx512(const uint8_t* c, uint16_t* out, int64_t n, const Format& fmt) {
  int64_t i = 0;
  const __m512i subnormals = _mm512_loadu_si512(fmt.subnormal_bf16);
  const __m512i offset = _mm512_set1_epi16(static_cast<int16_t>(fmt.widen_offset));
  const __m512i first_normal = _mm512_set1_epi16(static_cast<int16_t>(fmt.first_normal));
  const __m512i magnitude_bits = _mm512_set1_epi16(0x7f), sign_bit = _mm512_set1_epi16(0x80);
  const __m128i shift = _mm_cvtsi32_si128(fmt.widen_shift);
  for (; i + 32 <= n; i += 32) {
    const __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + i)));
    const __m512i v = _mm512_and_si512(w, magnitude_bits);
    const __m512i normal = _mm512_add_epi16(_mm512_sll_epi16(v, shift), offset);
    const __m512i subnormal = _mm512_permutexvar_epi16(v, subnormals);  // (v's low 5 bits)
    const __m512i magnitude = _mm512_mask_blend_epi16(_mm512_cmplt_epu16_mask(v, first_normal), normal, subnormal);
    const __m512i sign = _mm512_slli_epi16(_mm512_and_si512(w, sign_bit), 8);
    _mm512_storeu_si512(out + i, _mm512_or_si512(magnitude, sign));
  }
  widen_to_bf16(c + i, out + i, n - i, fmt);
}
#pragma GCC pop_options

}  // namespace corellm::fp8
