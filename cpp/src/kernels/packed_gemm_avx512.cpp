// The bf16 GEMM on plain AVX-512 (the avx512 path of packed_gemm.h: Skylake-SP, Ice Lake, no
// bf16 dot product): as the avx512bf16 path, but each k pair of 16 columns is widened to fp32 (a
// bf16 is the high half of an fp32: the pair's low element shifted up 16 bits, the high one
// masked), and the dot product is two fused multiply-adds, even column then odd. x's rows are
// widened once per chunk of rows (kWideX), so that the only integer work beside the multiply-adds
// is the panel's widening, shared by a block of 12 rows (24 sums, 4 widened weights and 2
// broadcasts in the 32 registers). Intel Xeon Ice Lake VM, 2 threads, the whole model's linears
// (bench/kernels.py's shapes), the builds alternated in three rounds, GFLOP/s: x widened per
// panel and 8-row blocks -> x widened once -> and 12-row blocks: 16 rows 181-184 -> 202-205 ->
// 188-193 (8 + 8 either way), 24 rows 203-211 -> 242-247, 64 rows 200-203 -> 244-256 -> 210-261,
// 512 rows 199-202 -> 242-261 -> 262-271. The same bits as before (the values widened are exact).
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
  static constexpr int kMaxRows = 12;  // 8: see above
  static constexpr int kPeakChains = 12;
  static Acc zero() { return _mm512_setzero_ps(); }
  static Pair widen(__m512i pairs) {
    return {_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)),
            _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))))};
  }
  static W load_w(const uint16_t* p) { return widen(_mm512_loadu_si512(p)); }
  static X broadcast_x(int32_t pair) { return widen(_mm512_set1_epi32(pair)); }
  // x widened once per chunk of rows (packed_gemm_vector.h): a pair's broadcast is then two loads,
  // where broadcast_x's widening put a shift and a mask beside each row's four multiply-adds on
  // the two ports that run them.
  static constexpr bool kWideX = true;
  static void widen_x_row(const uint16_t* from, int64_t k, float* to, int64_t width) {
    int64_t c = 0;
    for (; c + 16 <= k; c += 16) _mm512_storeu_ps(to + c, avx512::load_bf16x16(from + c));
    for (; c < k; ++c) {
      const uint32_t bits = static_cast<uint32_t>(from[c]) << 16;
      std::memcpy(to + c, &bits, sizeof(bits));
    }
    for (; c < width; ++c) to[c] = 0.0f;
  }
  static X broadcast_wide_x(const float* pair) { return {_mm512_set1_ps(pair[0]), _mm512_set1_ps(pair[1])}; }
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
