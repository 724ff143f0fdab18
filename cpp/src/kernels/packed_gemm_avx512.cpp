// The bf16 GEMM on AVX-512-BF16 (packed_gemm.h's layout and loop order): per panel and block of
// up to 8 x rows, for each k pair, two register loads of W, one broadcast of each row's x pair, and
// a dpbf16 per (row, 16 columns) into fp32 registers; then the bias, and one rounding.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "packed_gemm_paths.h"
#include "packed_gemm_store.h"

namespace corellm {

namespace {

constexpr int64_t kRowChunk = 128;
int64_t num_pairs(int64_t k) { return (k + 1) / 2; }

// x row r's pair kp as one 32-bit lane (the high half zero past an odd k).
inline int32_t x_pair(const uint16_t* x_row, int64_t kp, int64_t k) {
  uint32_t v = x_row[2 * kp];
  if (2 * kp + 1 < k) v |= static_cast<uint32_t>(x_row[2 * kp + 1]) << 16;
  return static_cast<int32_t>(v);
}

// y[0..MR) x [columns of panel p) for MR rows of x. Every row is accumulated the same way
// whatever MR (one fp32 chain per 16 columns, k pairs in order), so a row's result does not
// depend on the rows computed beside it.
template <int MR>
void panel_rows(const uint16_t* x, int64_t x_stride, const uint16_t* panel, const uint16_t* bias, void* y,
                int64_t y_stride, bool y_f32, int64_t col0, int64_t n, int64_t k) {
  const int64_t pairs = num_pairs(k), full = k / 2;
  __m512 acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint16_t* wp = panel + kp * kGemmPanelCols * 2;
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(wp);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(wp + 32);
    if (kp == full) {  // an odd k's last column: its pair's other half is zero
      for (int r = 0; r < MR; ++r) {
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(x_pair(x + r * x_stride, kp, k));
        acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
        acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
      }
      break;
    }
    for (int r = 0; r < MR; ++r) {
      int32_t xv;
      std::memcpy(&xv, x + r * x_stride + 2 * kp, sizeof(xv));
      const __m512bh xb = (__m512bh)_mm512_set1_epi32(xv);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], xb, w0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], xb, w1);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const __mmask16 mask = gemm_store::half_mask(n, col0, h);
    if (mask == 0) break;
    const __m512 b = gemm_store::bias_of(bias, col0 + 16 * h, mask);
    for (int r = 0; r < MR; ++r) {
      gemm_store::store(y, r * y_stride + col0 + 16 * h, y_f32, mask, _mm512_add_ps(acc[r][h], b));
    }
  }
}

void panel_all_rows(const uint16_t* x, int64_t x_stride, const uint16_t* panel, const uint16_t* bias, void* y,
                    int64_t y_stride, bool y_f32, int64_t m, int64_t col0, int64_t n, int64_t k) {
  constexpr int64_t kBlock = 8;
  const int64_t y_item = y_f32 ? 4 : 2;
  auto rows_at = [&](int64_t r) { return static_cast<char*>(y) + r * y_stride * y_item; };
  int64_t r = 0;
  for (; r + kBlock <= m; r += kBlock) {
    panel_rows<kBlock>(x + r * x_stride, x_stride, panel, bias, rows_at(r), y_stride, y_f32, col0, n, k);
  }
  const uint16_t* xr = x + r * x_stride;
  void* yr = rows_at(r);
  switch (m - r) {
    case 7: return panel_rows<7>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 6: return panel_rows<6>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 5: return panel_rows<5>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 4: return panel_rows<4>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 3: return panel_rows<3>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 2: return panel_rows<2>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    case 1: return panel_rows<1>(xr, x_stride, panel, bias, yr, y_stride, y_f32, col0, n, k);
    default: return;
  }
}

}  // namespace

void bf16_gemm_avx512bf16(const GemmArgs& a) {
  const bool y_f32 = a.y_dtype == DType::F32;
  const int64_t y_item = y_f32 ? 4 : 2;
  const int64_t panels = gemm_num_panels(a.n), panel_size = gemm_panel_elements(a.k);
  // Contiguous ranges of panels per thread (one sequential stream each); small products stay on
  // one thread. Threads write disjoint columns: no barrier between chunks of rows.
#pragma omp parallel if (a.n * a.k * a.m >= (1 << 16))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    // Many rows: a chunk of rows at a time, so that the chunk of x stays in this core's L2 while
    // the thread's panels stream past it.
    for (int64_t r = 0; r < a.m; r += kRowChunk) {
      const int64_t rows = std::min(kRowChunk, a.m - r);
      for (int64_t p = panels * t / threads; p < panels * (t + 1) / threads; ++p) {
        panel_all_rows(a.x + r * a.x_stride, a.x_stride, a.packed + p * panel_size, a.bias,
                       static_cast<char*>(a.y) + r * a.y_stride * y_item, a.y_stride, y_f32, rows, p * kGemmPanelCols,
                       a.n, a.k);
      }
    }
  }
}

double bf16_dot_peak_avx512bf16(int64_t iterations) {
  int64_t threads = 1;
  constexpr int kChains = 12;  // independent accumulators: enough to cover the instruction's latency
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
    __m512 acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_setzero_ps();
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80), b = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    for (int64_t i = 0; i < iterations; ++i) {
      for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
      __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]));
    }
    float sink = 0;
    for (int c = 0; c < kChains; ++c) sink += _mm512_reduce_add_ps(acc[c]);
    __asm__ volatile("" : : "r"(sink));
  }
  return static_cast<double>(threads) * static_cast<double>(iterations) * kChains * 64.0;
}

}  // namespace corellm
