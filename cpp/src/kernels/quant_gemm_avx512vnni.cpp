// quant_gemm on AVX-512-VNNI (the avx512vnni path of quant_gemm.h): one lane per panel row, one
// vpdpbusd per 4 values x 16 rows, the activation's 4 bytes broadcast.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "quant_formats.h"
#include "quant_gemm_paths.h"

// Everything below is compiled for AVX-512 with VNNI, whatever the build's baseline; it runs only
// where quant_path() found those instructions.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")

#include "quant_gemm_kernel.h"

namespace corellm::quant {

namespace {

struct Avx512VnniLanes {
  using I = __m512i;
  using F = __m512;
  static constexpr int kMaxRows = 8;
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
  // Sum of u x over the 8 vectors, then minus 128 times the sum of x: (u - 128) x.
  static I q8_block(const uint8_t* p, const int8_t* xq, int32_t xsum) {
    I a = set1_i(0), b = set1_i(0);
    for (int v = 0; v < 8; v += 2) {
      int32_t x0, x1;
      std::memcpy(&x0, xq + 4 * v, 4);
      std::memcpy(&x1, xq + 4 * v + 4, 4);
      a = dot(a, load(p + 64 * v), x0);
      b = dot(b, load(p + 64 * v + 64), x1);
    }
    return sub(add(a, b), set1_i(128 * xsum));
  }
  static F f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static F u8(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
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

void quant_gemm_avx512vnni(const QuantGemmArgs& a, const QuantizedRows& x, const PanelRange& range) {
  kernel::run<Avx512VnniLanes>(a, x, range);
}

}  // namespace corellm::quant

#pragma GCC pop_options
