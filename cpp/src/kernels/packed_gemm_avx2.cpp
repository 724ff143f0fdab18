// The bf16 GEMM on AVX2 + FMA (the avx2 path of packed_gemm.h, the baseline every x86-64-v3 CPU
// runs): as the avx512 path on 8-lane registers. Each k pair of 16 columns is two registers of
// 8 pairs, widened to fp32 (the pair's low element shifted up 16 bits, the high one masked), and
// the dot product is two fused multiply-adds per 8 columns, even column then odd. Rows go four at
// a time: their sums (16 registers) and the panel's widened pair (8) exceed AVX2's 16 registers,
// but the spills cost less than re-reading and re-widening the panel for every two rows (2 rows:
// 95 GFLOP/s, 4: 125, 6-8: 100-130 on the Xeon, bench/kernels.py's [avx2] rows).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "packed_gemm_paths.h"
#include "packed_gemm_vector.h"

namespace corellm {

namespace {

struct Avx2Lanes {
  struct Acc {
    __m256 lo, hi;  // columns 0-7, 8-15
  };
  struct Pair {
    __m256 even, odd;  // elements k and k + 1 of 8 columns (W) or of the row, broadcast (X)
  };
  struct W {
    Pair lo, hi;
  };
  using X = Pair;
  static constexpr int kMaxRows = 4;
  static constexpr int kPeakChains = 5;  // 10 registers of sums, 6 of operands
  static Acc zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Pair widen(__m256i pairs) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))))};
  }
  static W load_w(const uint16_t* p) {
    return {widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))),
            widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)))};
  }
  static X broadcast_x(int32_t pair) { return widen(_mm256_set1_epi32(pair)); }
  static __m256 dot8(__m256 acc, const Pair& x, const Pair& w) {
    return _mm256_fmadd_ps(x.odd, w.odd, _mm256_fmadd_ps(x.even, w.even, acc));
  }
  static Acc dot(Acc acc, const X& x, const W& w) { return {dot8(acc.lo, x, w.lo), dot8(acc.hi, x, w.hi)}; }

  // fp32 -> bf16 to nearest even in integer arithmetic (NaN stays a quiet NaN), 8 lanes.
  static __m256i round_to_bf16(__m256 v) {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, quiet, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
  }
  static __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }

  // y[at .. at + cols) = v + bias[col .. col + cols), fp32 or rounded to bf16; a partial half
  // goes through a buffer (AVX2 has no 16-bit masked store).
  static void store(void* y, int64_t at, bool y_f32, int cols, Acc v, const uint16_t* bias, int64_t col) {
    if (bias != nullptr) {
      alignas(32) uint16_t b[16] = {};
      std::memcpy(b, bias + col, static_cast<size_t>(cols) * sizeof(uint16_t));
      v.lo = _mm256_add_ps(v.lo, widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(b))));
      v.hi = _mm256_add_ps(v.hi, widen_bf16(_mm_load_si128(reinterpret_cast<const __m128i*>(b + 8))));
    }
    if (y_f32) {
      float* out = static_cast<float*>(y) + at;
      alignas(32) float buffer[16];
      float* to = cols == 16 ? out : buffer;
      _mm256_storeu_ps(to, v.lo);
      _mm256_storeu_ps(to + 8, v.hi);
      if (to == buffer) std::memcpy(out, buffer, static_cast<size_t>(cols) * sizeof(float));
      return;
    }
    // packus interleaves the 128-bit halves: (lo 0-3, hi 0-3, lo 4-7, hi 4-7) -> reorder them.
    const __m256i halves = _mm256_packus_epi32(round_to_bf16(v.lo), round_to_bf16(v.hi));
    const __m256i packed = _mm256_permute4x64_epi64(halves, 0xD8);
    uint16_t* out = static_cast<uint16_t*>(y) + at;
    if (cols == 16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), packed);
    } else {
      alignas(32) uint16_t buffer[16];
      _mm256_store_si256(reinterpret_cast<__m256i*>(buffer), packed);
      std::memcpy(out, buffer, static_cast<size_t>(cols) * sizeof(uint16_t));
    }
  }
  static void opaque(Acc& v) { __asm__ volatile("" : "+x"(v.lo), "+x"(v.hi)); }
};

}  // namespace

void bf16_gemm_avx2(const GemmArgs& a) { gemm_vector::gemm<Avx2Lanes>(a); }

double bf16_dot_peak_avx2(int64_t iterations) { return gemm_vector::dot_peak<Avx2Lanes>(iterations); }

}  // namespace corellm
