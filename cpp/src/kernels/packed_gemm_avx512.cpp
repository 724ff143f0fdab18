// The bf16 GEMM on plain AVX-512 (the avx512 path of packed_gemm.h: Skylake-SP, Ice Lake, no
// bf16 dot product): as the avx512bf16 path, but each k pair of 16 columns is widened to fp32 (a
// bf16 is the high half of an fp32: the pair's low element shifted up 16 bits, the high one
// masked), and the dot product is two fused multiply-adds, even column then odd.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "fast_math.h"
#include "lanes_avx512.h"
#include "packed_gemm_paths.h"

// Everything below is compiled for AVX-512 F/BW/VL/DQ, whatever the build's baseline; it runs
// only where cpu_isa() found those instructions.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

#include "packed_gemm_store.h"
#include "packed_gemm_vector.h"

namespace corellm {

namespace {

struct Avx512Lanes {
  struct Pair {
    __m512 even, odd;  // elements k and k + 1, as fp32
  };
  using Acc = __m512;
  using W = Pair;
  using X = Pair;
  static constexpr int kMaxRows = 8;
  static constexpr int kPeakChains = 12;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Pair widen(__m512i pairs) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))))};
  }
  static W load_w(const uint16_t* p) { return widen(_mm512_loadu_si512(p)); }
  static X broadcast_x(int32_t pair) { return widen(_mm512_set1_epi32(pair)); }
  static Acc dot(Acc acc, X x, W w) { return _mm512_fmadd_ps(x.odd, w.odd, _mm512_fmadd_ps(x.even, w.even, acc)); }
  static void store(void* y, int64_t at, bool y_f32, int cols, Acc v, const uint16_t* bias, int64_t col) {
    gemm_store::store_with_bias<false>(y, at, y_f32, cols, v, bias, col);
  }
  static constexpr bool kGatedStore = true;
  static constexpr bool kNonTemporalOneRow = false;  // not measured (next_panel.h)
  static void store_gated(uint16_t* y, int64_t at, Acc v, const uint16_t* bias, int64_t col, const uint16_t* gate,
                          GatedActivation act) {
    gemm_store::store_gated<false>(y, at, v, gemm_store::bias_of(bias, col, 0xFFFF), gate, act);
  }
  static void opaque(Acc& v) { __asm__ volatile("" : "+v"(v)); }
};

}  // namespace

void bf16_gemm_avx512(const GemmArgs& a) { gemm_vector::gemm<Avx512Lanes>(a); }

void bf16_gemm_gated_avx512(const GemmArgs& a, GatedActivation act) { gemm_vector::gemm<Avx512Lanes>(a, &act); }

double bf16_dot_peak_avx512(int64_t iterations) { return gemm_vector::dot_peak<Avx512Lanes>(iterations); }

}  // namespace corellm

#pragma GCC pop_options
