// The bf16 GEMM on AVX-512-BF16 (the avx512bf16 path of packed_gemm.h): per panel and block of
// up to 12 x rows, for each k pair, two register loads of W, one broadcast of each row's x pair, and
// a dpbf16 per (row, 16 columns) into fp32 registers (24 accumulators, 27 of the 32 registers);
// then the bias, and one rounding (packed_gemm_vector.h has the loops). 12 rows rather than 8: on
// an AMD EPYC Zen 5 (two full-width dpbf16 a cycle) the 8-row block's loads held it to 75-82 % of
// the dot-product peak from 512 rows on (0.92-0.96x oneDNN); 12 rows reach 89-95 % (1.03-1.11x).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "fast_math.h"
#include "lanes_avx512.h"
#include "packed_gemm_paths.h"

// Everything below is compiled for AVX-512-BF16, whatever the build's baseline; it runs only
// where cpu_isa() found those instructions.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

#include "packed_gemm_store.h"
#include "packed_gemm_vector.h"

namespace corellm {

namespace {

struct Avx512Bf16Lanes {
  using Acc = __m512;
  using W = __m512bh;  // the 16 columns' (k, k + 1) pairs: dpbf16's operand as it is
  using X = __m512bh;
  static constexpr int kMaxRows = 12;
  static constexpr int kPeakChains = 12;  // independent accumulators: enough to cover the latency
  static Acc zero() { return _mm512_setzero_ps(); }
  static W load_w(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
  static X broadcast_x(int32_t pair) { return (__m512bh)_mm512_set1_epi32(pair); }
  static Acc dot(Acc acc, X x, W w) { return _mm512_dpbf16_ps(acc, x, w); }
  static void store(void* y, int64_t at, bool y_f32, int cols, Acc v, const uint16_t* bias, int64_t col) {
    gemm_store::store_with_bias<true>(y, at, y_f32, cols, v, bias, col);
  }
  static constexpr bool kGatedStore = true;
  static constexpr bool kNonTemporalOneRow = true;  // next_panel.h
  static constexpr bool kWideX = false;  // a pair of x is one broadcast, dpbf16's operand as it is
  static void store_gated(uint16_t* y, int64_t at, Acc v, const uint16_t* bias, int64_t col, const uint16_t* gate,
                          GatedActivation act) {
    gemm_store::store_gated<true>(y, at, v, gemm_store::bias_of(bias, col, 0xFFFF), gate, act);
  }
  static void opaque(Acc& v) { __asm__ volatile("" : "+v"(v)); }
};

}  // namespace

void bf16_gemm_avx512bf16(const GemmArgs& a) { gemm_vector::gemm<Avx512Bf16Lanes>(a); }

void bf16_gemm_gated_avx512bf16(const GemmArgs& a, GatedActivation act) { gemm_vector::gemm<Avx512Bf16Lanes>(a, &act); }

double bf16_dot_peak_avx512bf16(int64_t iterations) { return gemm_vector::dot_peak<Avx512Bf16Lanes>(iterations); }

}  // namespace corellm

#pragma GCC pop_options
