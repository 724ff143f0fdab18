// The bf16 GEMM on AVX2 + FMA (the avx2 path of packed_gemm.h, the baseline every x86-64-v3 CPU
// runs). AVX2 has no bf16 dot product: each bf16 value is widened to fp32 (shifted up 16 bits) and
// multiplied with one fused multiply-add per k, column by column. Three ways, by the rows of x:
//   - 1 to 3 rows (memory-bound): as the avx512 path on 8-lane registers (packed_gemm_vector.h).
//     Each k pair of 16 columns is two registers of 8 pairs, widened in registers (the pair's low
//     element shifted up, the high one masked), two fused multiply-adds per 8 columns, even k then
//     odd; a whole panel (32 columns) per block of rows.
//   - 4 to 47 rows: x widened once into fp32 rows; per half panel (16 columns) and block of up to 5
//     rows, each k pair of the panel widened in registers for 4 fused multiply-adds per row: 10
//     sums, 4 widened weights, a broadcast and the mask fill the 16 registers. A pair's odd
//     elements are its 32-bit lanes masked to their high halves; its even ones the lanes of a load
//     one element earlier, masked the same way: 4 masks with their loads folded in, none of them a
//     shift (which would share a port with the multiply-adds). Rows split into blocks as even as
//     possible (16 = 4 x 4), since a block's few sums leave the multiply-add unit waiting on their
//     latency. The panel's half (18 KiB for k = 576) stays in L1 for the blocks after the first;
//     the next panel is fetched meanwhile.
//   - 48 rows and more: widening in registers for every block of rows costs more than once per
//     panel, so each panel is widened once into an fp32 copy ([k][32 columns], in the core's L2)
//     and x once into fp32 rows; then a 6 x 16 block of sums (12 registers) takes per k two loads
//     of the panel, six broadcasts of x and twelve fused multiply-adds (the classic fp32
//     micro-kernel's balance).
// All add, per column, x[k] w[k] to one fp32 sum in k order (k padded to even with zeros), then
// the bias, then one rounding: a row's bits are the same whichever of them computes it.
// AMD EPYC Zen 3, 2 threads, SmolLM2's projections (8 layers' worth, from memory), the builds before
// and after alternated: the middle way against the other two 1.16x at 4 rows, 1.2x at 8, 1.12x at
// 16, 1.08x at 24, 1.15x at 32, 1.18x at 40; at 48-64 no faster than the widened panel. Its masks
// instead of a shift and a mask per vector (30 layers and the LM head, 10 alternated processes):
// 1.06x at 4 rows, 1.16x at 8, 1.13x at 16, 1.11x at 24, 1.15x at 40.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "lanes_avx2.h"
#include "packed_gemm_paths.h"
#include "packed_gemm_vector.h"
#include "thread_scratch.h"

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
  static constexpr bool kGatedStore = false;  // no gated pass on this path
  static constexpr bool kNonTemporalOneRow = false;  // not measured faster here (next_panel.h)
  static constexpr bool kWideX = false;  // its 1-3 rows: not measured (the 4 to 47 rows widen x, below)
  static Acc zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
  static Pair widen(__m256i pairs) {
    return {_mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)),
            _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))))};
  }
  // The 8 pairs at p (p[-1] readable), by masks only (lanes_avx2.h).
  static Pair widen_in_place(const uint16_t* p) { return {avx2::even_of_pairs(p), avx2::odd_of_pairs(p)}; }
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

  // y[at .. at + cols) = v + bias[col .. col + cols), fp32 or rounded to bf16; a partial half
  // goes through a buffer (AVX2 has no 16-bit masked store).
  static void store(void* y, int64_t at, bool y_f32, int cols, Acc v, const uint16_t* bias, int64_t col) {
    if (bias != nullptr) {
      alignas(32) uint16_t b[16] = {};
      std::memcpy(b, bias + col, static_cast<size_t>(cols) * sizeof(uint16_t));
      v.lo = _mm256_add_ps(v.lo, avx2::load_bf16x8(b));
      v.hi = _mm256_add_ps(v.hi, avx2::load_bf16x8(b + 8));
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

// ---- 4 to 47 rows: the panel widened in registers ----

constexpr int64_t kRegisterRows = 4;   // from this many rows on
constexpr int kRegisterBlockRows = 5;  // rows per block at most: 10 sums in registers

// Rows of x -> fp32 rows of `width` (k padded with zeros to width): both ways below.
void widen_rows(const uint16_t* x, int64_t x_stride, int64_t rows, int64_t k, int64_t width, float* to) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* from = x + r * x_stride;
    float* row = to + r * width;
    int64_t c = 0;
    for (; c + 8 <= k; c += 8) {
      _mm256_storeu_ps(row + c, avx2::load_bf16x8(from + c));
    }
    for (; c < k; ++c) {
      const uint32_t bits = static_cast<uint32_t>(from[c]) << 16;
      std::memcpy(row + c, &bits, sizeof(bits));
    }
    for (; c < width; ++c) row[c] = 0.0f;
  }
}

struct RegisterBlock {
  const float* x;        // the block's first widened row; its rows `width` apart
  const uint16_t* half;  // the panel's half: 16 columns of bf16 pairs, pairs kGemmPanelCols * 2 apart
  int64_t width;         // k padded to even
};

// R rows x 16 columns, k pair kp: lo/hi[r] += x[r][2 kp] w[2 kp] then x[r][2 kp + 1] w[2 kp + 1].
template <int R>
inline void register_pair(const RegisterBlock& b, int64_t kp, const Avx2Lanes::Pair& w_lo, const Avx2Lanes::Pair& w_hi,
                          __m256* lo, __m256* hi) {
  const float* xk = b.x + 2 * kp;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m256 even = _mm256_broadcast_ss(xk + r * b.width);
    lo[r] = _mm256_fmadd_ps(even, w_lo.even, lo[r]);
    hi[r] = _mm256_fmadd_ps(even, w_hi.even, hi[r]);
    const __m256 odd = _mm256_broadcast_ss(xk + r * b.width + 1);
    lo[r] = _mm256_fmadd_ps(odd, w_lo.odd, lo[r]);
    hi[r] = _mm256_fmadd_ps(odd, w_hi.odd, hi[r]);
  }
}

// R rows x 16 columns over the whole of k: acc[r] = sum over k of x[r][k] w[k], in k order (per
// pair: the even k, then the odd one). The first pair is widened by shifting; the others by masks
// over loads one element apart (widen_in_place reads the element before the pair). GCC keeps the
// R x 2 sums in registers (no spill in R <= 5).
template <int R>
void register_block(const RegisterBlock& b, NextPanel& next, Avx2Lanes::Acc* acc) {
  __m256 lo[R], hi[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  next.step();  // the first pair as load_w widens it, written out (calling load_w moved the loops: 0.95-0.98x)
  register_pair<R>(b, 0, Avx2Lanes::widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.half))),
                   Avx2Lanes::widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.half + 16))), lo, hi);
  const int64_t pairs = b.width / 2;
  for (int64_t kp = 1; kp < pairs; ++kp) {
    next.step();
    const uint16_t* p = b.half + kp * kGemmPanelCols * 2;
    register_pair<R>(b, kp, Avx2Lanes::widen_in_place(p), Avx2Lanes::widen_in_place(p + 16), lo, hi);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = {lo[r], hi[r]};
}

// rows in [1, kRegisterBlockRows]: the caller's blocks hold ceil(m / blocks) rows at most.
void register_rows(const RegisterBlock& b, int64_t rows, NextPanel& next, Avx2Lanes::Acc* acc) {
  static_assert(kRegisterBlockRows == 5);
  switch (rows) {
    case 1: return register_block<1>(b, next, acc);
    case 2: return register_block<2>(b, next, acc);
    case 3: return register_block<3>(b, next, acc);
    case 4: return register_block<4>(b, next, acc);
    default: return register_block<5>(b, next, acc);
  }
}

// Each thread: x widened into its own fp32 rows (no barrier: at most 47 rows), then its contiguous
// range of panels, each half panel times every block of rows.
void gemm_register_widened(const GemmArgs& a) {
  const bool y_f32 = a.y_dtype == DType::F32;
  const int64_t pairs = (a.k + 1) / 2, width = 2 * pairs;
  const int64_t panels = gemm_num_panels(a.n), panel_size = gemm_panel_elements(a.k);
  const int64_t blocks = (a.m + kRegisterBlockRows - 1) / kRegisterBlockRows;
#pragma omp parallel num_threads(gemm_team_size(a))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    float* x_wide = thread_scratch<RegisterBlock, float>(a.m * width);
    widen_rows(a.x, a.x_stride, a.m, a.k, width, x_wide);
    const int64_t last = panels * (t + 1) / threads;
    for (int64_t p = panels * t / threads; p < last; ++p) {
      const uint16_t* panel = a.packed + p * panel_size;
      NextPanel next = p + 1 < last ? NextPanel(panel + panel_size, panel_size * sizeof(uint16_t), 2 * blocks * pairs)
                                    : NextPanel();
      const int64_t col0 = p * kGemmPanelCols;
      for (int h = 0; h < 2; ++h) {
        const int cols = gemm_half_columns(a.n, col0, h);
        if (cols == 0) break;
        for (int64_t b = 0, r = 0; b < blocks; ++b) {
          const int64_t rows = a.m / blocks + (b < a.m % blocks ? 1 : 0);  // blocks as even as possible
          Avx2Lanes::Acc acc[kRegisterBlockRows];
          register_rows({x_wide + r * width, panel + 32 * h, width}, rows, next, acc);
          for (int64_t i = 0; i < rows; ++i) {
            Avx2Lanes::store(a.y, (r + i) * a.y_stride + col0 + 16 * h, y_f32, cols, acc[i], a.bias, col0 + 16 * h);
          }
          r += rows;
        }
      }
    }
  }
}

// ---- many rows: the widened panel ----

constexpr int64_t kWidenedRows = 48;    // from this many rows on, widen the panels once
constexpr int64_t kWidenedChunk = 256; // rows of x widened at a time (shared by the threads)
constexpr int kBlockRows = 6;

// 8 bf16 pairs (16 values) -> the even and odd elements as fp32, stored at even_to / odd_to.
inline void widen_pairs_to(const uint16_t* pairs, float* even_to, float* odd_to) {
  const Avx2Lanes::Pair w = Avx2Lanes::widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs)));
  _mm256_store_ps(even_to, w.even);
  _mm256_store_ps(odd_to, w.odd);
}

// The panel's k pairs [0, pairs) -> fp32 [2 pairs][32 columns].
void widen_panel(const uint16_t* panel, int64_t pairs, float* to) {
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const uint16_t* from = panel + kp * kGemmPanelCols * 2;
    float* even = to + 2 * kp * kGemmPanelCols;
    for (int j = 0; j < 4; ++j) widen_pairs_to(from + 16 * j, even + 8 * j, even + kGemmPanelCols + 8 * j);
  }
}

struct WidenedBlock {
  const float* x;      // the block's first widened row; kBlockRows rows `width` apart
  const float* panel;  // the widened panel's half: 16 columns, rows kGemmPanelCols apart
  int64_t width;       // k padded to even
};

// kBlockRows (6) rows x 16 columns over the whole of k: acc[r] = sum over k of x[r][k] w[k], in k
// order. The twelve sums are named one by one: as an array GCC keeps two of them in memory
// (measured on a Zen 3 core: 29 GFLOP/s as an array, 76 named).
void widened_block(const WidenedBlock& b, Avx2Lanes::Acc* acc) {
  static_assert(kBlockRows == 6);
  __m256 lo0 = _mm256_setzero_ps(), hi0 = lo0, lo1 = lo0, hi1 = lo0, lo2 = lo0, hi2 = lo0;
  __m256 lo3 = lo0, hi3 = lo0, lo4 = lo0, hi4 = lo0, lo5 = lo0, hi5 = lo0;
  const float* x0 = b.x;
  const float *x1 = x0 + b.width, *x2 = x1 + b.width, *x3 = x2 + b.width, *x4 = x3 + b.width, *x5 = x4 + b.width;
  for (int64_t kk = 0; kk < b.width; ++kk) {
    const __m256 w_lo = _mm256_load_ps(b.panel + kk * kGemmPanelCols);
    const __m256 w_hi = _mm256_load_ps(b.panel + kk * kGemmPanelCols + 8);
    __m256 v = _mm256_broadcast_ss(x0 + kk);
    lo0 = _mm256_fmadd_ps(v, w_lo, lo0);
    hi0 = _mm256_fmadd_ps(v, w_hi, hi0);
    v = _mm256_broadcast_ss(x1 + kk);
    lo1 = _mm256_fmadd_ps(v, w_lo, lo1);
    hi1 = _mm256_fmadd_ps(v, w_hi, hi1);
    v = _mm256_broadcast_ss(x2 + kk);
    lo2 = _mm256_fmadd_ps(v, w_lo, lo2);
    hi2 = _mm256_fmadd_ps(v, w_hi, hi2);
    v = _mm256_broadcast_ss(x3 + kk);
    lo3 = _mm256_fmadd_ps(v, w_lo, lo3);
    hi3 = _mm256_fmadd_ps(v, w_hi, hi3);
    v = _mm256_broadcast_ss(x4 + kk);
    lo4 = _mm256_fmadd_ps(v, w_lo, lo4);
    hi4 = _mm256_fmadd_ps(v, w_hi, hi4);
    v = _mm256_broadcast_ss(x5 + kk);
    lo5 = _mm256_fmadd_ps(v, w_lo, lo5);
    hi5 = _mm256_fmadd_ps(v, w_hi, hi5);
  }
  acc[0] = {lo0, hi0};
  acc[1] = {lo1, hi1};
  acc[2] = {lo2, hi2};
  acc[3] = {lo3, hi3};
  acc[4] = {lo4, hi4};
  acc[5] = {lo5, hi5};
}

// Each thread: its contiguous range of panels, each widened once per chunk of rows, times every
// row of the chunk. The chunk of x is widened by both threads into one shared buffer, its rows
// padded with zero rows to whole blocks (computed, never stored).
void gemm_widened(const GemmArgs& a) {
  const bool y_f32 = a.y_dtype == DType::F32;
  const int64_t pairs = (a.k + 1) / 2, width = 2 * pairs;
  const int64_t panels = gemm_num_panels(a.n), panel_size = gemm_panel_elements(a.k);
  const int64_t chunk = std::min(kWidenedChunk, a.m);
  const int64_t chunk_blocks = (chunk + kBlockRows - 1) / kBlockRows;
  float* x_wide = thread_scratch<WidenedBlock, float>(chunk_blocks * kBlockRows * width);  // the calling thread's, shared
#pragma omp parallel num_threads(gemm_team_size(a))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    float* panel_wide = thread_scratch<Avx2Lanes, float>(width * kGemmPanelCols);
    for (int64_t r0 = 0; r0 < a.m; r0 += chunk) {
      const int64_t rows = std::min(chunk, a.m - r0);
      const int64_t first = rows * t / threads, last = rows * (t + 1) / threads;
      widen_rows(a.x + (r0 + first) * a.x_stride, a.x_stride, last - first, a.k, width, x_wide + first * width);
      if (t == 0) {
        const int64_t padded = (rows + kBlockRows - 1) / kBlockRows * kBlockRows;
        std::fill(x_wide + rows * width, x_wide + padded * width, 0.0f);
      }
#pragma omp barrier
      for (int64_t p = panels * t / threads; p < panels * (t + 1) / threads; ++p) {
        widen_panel(a.packed + p * panel_size, pairs, panel_wide);
        const int64_t col0 = p * kGemmPanelCols;
        for (int h = 0; h < 2; ++h) {
          const int cols = gemm_half_columns(a.n, col0, h);
          if (cols == 0) break;
          for (int64_t r = 0; r < rows; r += kBlockRows) {
            const int64_t block = std::min<int64_t>(kBlockRows, rows - r);
            Avx2Lanes::Acc acc[kBlockRows];
            widened_block({x_wide + r * width, panel_wide + 16 * h, width}, acc);
            for (int64_t i = 0; i < block; ++i) {
              Avx2Lanes::store(a.y, (r0 + r + i) * a.y_stride + col0 + 16 * h, y_f32, cols, acc[i], a.bias,
                               col0 + 16 * h);
            }
          }
        }
      }
#pragma omp barrier  // x_wide is rewritten for the next chunk
    }
  }
}

}  // namespace

void bf16_gemm_avx2(const GemmArgs& a) {
  if (a.m >= kWidenedRows) return gemm_widened(a);
  if (a.m >= kRegisterRows) return gemm_register_widened(a);
  gemm_vector::gemm<Avx2Lanes>(a);
}

double bf16_dot_peak_avx2(int64_t iterations) { return gemm_vector::dot_peak<Avx2Lanes>(iterations); }

}  // namespace corellm
