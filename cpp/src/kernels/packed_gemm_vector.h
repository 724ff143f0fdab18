// The bf16 GEMM on vector registers (the avx2, avx512 and avx512bf16 paths of packed_gemm.h),
// written once over a Lanes policy that says how one row times one 16-column half of a panel is
// multiplied on that path:
//   Lanes::Acc                   the row's fp32 sums for the 16 columns
//   Lanes::W  load_w(p)          one k pair of the 16 columns (32 bf16 at p), ready to multiply
//   Lanes::X  broadcast_x(pair)  one k pair of the row (two bf16 in 32 bits) on every lane
//   dot(acc, x, w)               acc + x0 w0 + x1 w1 on each column
//   zero(), store(y, at, y_f32, cols, acc, bias) (the bias added, then one rounding), opaque(acc)
//   kGatedStore, store_gated(y, at, acc, bias, col, gate, act)  where the path has gemm's gated pass: a
//                                gated GEMM's up half (act(gate) * the rounded sums + bias)
//   kMaxRows                     rows of x per block: their sums stay in registers
//   kNonTemporalOneRow           one row's panels fetched with the non-temporal hint on AMD CPUs
//                                (next_panel.h): true where that was measured faster
//   kWideX, widen_x_row(from, k, to, width), broadcast_wide_x(p)
//                                where the path widens a k pair of x to fp32 with two integer ops
//                                (no bf16 dot product): x's rows are widened once per chunk of rows
//                                into the thread's fp32 rows (k padded to even with a zero), and a
//                                pair is broadcast from there (loads only) instead of widened again
//                                for every panel; the values, and so the sums, are the same
//
// Per panel and block of up to kMaxRows x rows it walks the k pairs, accumulating 32 columns x
// the rows, and re-reads the panel from its caches for the next block of rows; meanwhile the
// thread's next panel is fetched into L2 (next_panel.h). Every row is accumulated the same way
// whatever the block (one chain per 16 columns, k pairs in order), so a row's result does not
// depend on the rows computed beside it.
//
// Include it inside the path's target region, after every system header (and packed_gemm_paths.h):
// its templates are compiled for that path's instructions, in each source its own copy.
#pragma once

#include <utility>

namespace corellm::gemm_vector {
namespace {

constexpr int64_t kRowChunk = 128;

// x row's pair kp as one 32-bit lane (the high half zero past an odd k).
inline int32_t x_pair(const uint16_t* x_row, int64_t kp, int64_t k) {
  uint32_t v = x_row[2 * kp];
  if (2 * kp + 1 < k) v |= static_cast<uint32_t>(x_row[2 * kp + 1]) << 16;
  return static_cast<int32_t>(v);
}

struct PanelRows {
  const uint16_t* x;  // the block's first row
  int64_t x_stride;
  const uint16_t* panel;
  const uint16_t* bias;
  void* y;  // the block's first row
  int64_t y_stride;
  bool y_f32;
  int64_t col0, n, k;  // the panel's first column of W (and of the bias), W's columns, x's
  int64_t y_col;       // y's column for col0
  // A gated GEMM's up half: the gate's rounded values for the block's first row (32 a row, the
  // panel's columns), combined by Lanes::store_gated into y's bf16. Null: y = the sums + bias.
  const uint16_t* gate = nullptr;
  GatedActivation act = GatedActivation::kSilu;
  // Lanes::kWideX: the block's first row of x widened to fp32, its rows x_wide_stride apart.
  const float* x_wide = nullptr;
  int64_t x_wide_stride = 0;
};

// The thread's fp32 rows of x (Lanes::kWideX).
struct WideX {};

template <class Lanes, int MR>
void panel_rows(const PanelRows& b, NextPanel& next) {
  const int64_t pairs = (b.k + 1) / 2, full = b.k / 2;
  typename Lanes::Acc acc[MR][2];
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = Lanes::zero();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    next.step();
    const uint16_t* wp = b.panel + kp * kGemmPanelCols * 2;
    const typename Lanes::W w0 = Lanes::load_w(wp);
    const typename Lanes::W w1 = Lanes::load_w(wp + 32);
    for (int r = 0; r < MR; ++r) {
      typename Lanes::X xb;
      if constexpr (Lanes::kWideX) {
        xb = Lanes::broadcast_wide_x(b.x_wide + r * b.x_wide_stride + 2 * kp);
      } else {
        int32_t xv;
        if (kp == full) {  // an odd k's last column: its pair's other half is zero
          xv = x_pair(b.x + r * b.x_stride, kp, b.k);
        } else {
          std::memcpy(&xv, b.x + r * b.x_stride + 2 * kp, sizeof(xv));
        }
        xb = Lanes::broadcast_x(xv);
      }
      acc[r][0] = Lanes::dot(acc[r][0], xb, w0);
      acc[r][1] = Lanes::dot(acc[r][1], xb, w1);
    }
  }
  for (int h = 0; h < 2; ++h) {
    const int cols = gemm_half_columns(b.n, b.col0, h);
    if (cols == 0) break;
    const int64_t y_at = b.y_col + 16 * h, col = b.col0 + 16 * h;
    if constexpr (Lanes::kGatedStore) {
      if (b.gate != nullptr) {  // the gated pass's panels are whole
        for (int r = 0; r < MR; ++r) {
          Lanes::store_gated(static_cast<uint16_t*>(b.y), r * b.y_stride + y_at, acc[r][h], b.bias, col,
                             b.gate + r * kGemmPanelCols + 16 * h, b.act);
        }
        continue;
      }
    }
    for (int r = 0; r < MR; ++r) Lanes::store(b.y, r * b.y_stride + y_at, b.y_f32, cols, acc[r][h], b.bias, col);
  }
}

// One block of m <= kMaxRows rows of the panel (MR = m, found at run time).
template <class Lanes, int MR = Lanes::kMaxRows>
void panel_tail_rows(PanelRows b, int64_t m, NextPanel& next) {
  if constexpr (MR >= 1) {
    if (m == MR) return panel_rows<Lanes, MR>(b, next);
    return panel_tail_rows<Lanes, MR - 1>(b, m, next);
  }
}

// Rows [0, m) in blocks of kMaxRows; a remainder under half a block is not left alone but shares
// the last full block's rows evenly (16 rows as 8 + 8 rather than 12 + 4: a small block's few
// accumulators leave the dot-product unit waiting on their latency). A row's sums do not depend on
// its block. next_panel: the panel this thread computes after this one (null: none), prefetched
// meanwhile with the hint read_once.
template <class Lanes>
void panel_all_rows(PanelRows b, int64_t m, const uint16_t* next_panel, ReadOnce read_once) {
  constexpr int64_t kRows = Lanes::kMaxRows;
  const int64_t y_item = b.y_f32 ? 4 : 2;
  int64_t full = m / kRows, rem = m % kRows;
  int64_t last_two = 0;  // rows of the last full block and the remainder, split in two
  if (full > 0 && rem > 0 && 2 * rem < kRows) last_two = kRows + rem, --full, rem = 0;
  const int64_t blocks = (m + kRows - 1) / kRows;  // the split keeps the count
  NextPanel next = next_panel == nullptr ? NextPanel()
                                         : NextPanel(next_panel, gemm_panel_elements(b.k) * sizeof(uint16_t),
                                                     blocks * ((b.k + 1) / 2),  // a step per k pair of each block
                                                     read_once);
  auto run_block = [&](int64_t r, int64_t rows) {
    PanelRows block = b;
    block.x = b.x + r * b.x_stride;
    if constexpr (Lanes::kWideX) block.x_wide = b.x_wide + r * b.x_wide_stride;
    block.y = static_cast<char*>(b.y) + r * b.y_stride * y_item;
    if (b.gate != nullptr) block.gate = b.gate + r * kGemmPanelCols;
    panel_tail_rows<Lanes>(block, rows, next);
  };
  int64_t r = 0;
  for (int64_t i = 0; i < full; ++i, r += kRows) run_block(r, kRows);
  if (last_two > 0) {
    run_block(r, (last_two + 1) / 2);
    run_block(r + (last_two + 1) / 2, last_two / 2);
  } else if (rem > 0) {
    run_block(r, rem);
  }
}

// Contiguous ranges of panels per thread (one sequential stream each), shared once a thread's
// own are done (SharedRanges: the other's from its back, so that a thread that loses its core
// does not hold the other at the end); small products stay on one thread. Threads write
// disjoint columns: no barrier between chunks of rows. Many rows: a chunk of rows at a time, so
// that the chunk of x stays in this core's L2 while the thread's panels stream past it.
//
// With `gated` (bf16_gemm_gated: a.n = 2d columns of W, the gate's d then the up half's, d a
// multiple of 32; y = [m, d] bf16) the units are pairs of panels, the gate's u and the up half's
// u + d / 32: per chunk of rows, the gate panel's pass stores its rounded sums (y's bits) into the
// thread's gate rows, and the up panel's pass combines them with its own in store_gated (act(gate)
// * up, silu_and_mul's arithmetic): the same bits as the GEMM then the activation, without the
// 2d-wide y's write and read.
template <class Lanes>
void gemm(const GemmArgs& a, const GatedActivation* gated = nullptr) {
  const bool y_f32 = a.y_dtype == DType::F32;
  const int64_t y_item = y_f32 ? 4 : 2;
  const int64_t panel_size = gemm_panel_elements(a.k);
  const int64_t pairs = gated ? a.n / 2 / kGemmPanelCols : 0;  // the up half's first panel
  CORELLM_DCHECK(gated == nullptr || Lanes::kGatedStore, "gemm_vector: no gated pass on this path");
  const int team = gemm_team_size(a);
  std::vector<SharedRanges> chunk_units =
      gemm_shared_panels(a.m, kRowChunk, gated ? pairs : gemm_num_panels(a.n), team);
  const auto chunks = static_cast<int64_t>(chunk_units.size());
#pragma omp parallel num_threads(team)
  {
    const int t = omp_get_thread_num();
    // The arguments read per unit from the thread's own copy: read through `a`, they sat on the
    // calling thread's stack beside lines that thread writes, and each unit's first read of them
    // on the other core missed (gemm's own code 3.5 % of a single-stream decode's samples -> 1.4 %;
    // the native forward 0.1-9 % faster in five alternating pairs, AMD EPYC Zen 4).
    const GemmArgs own = a;
    uint16_t* gate_rows = gated ? thread_scratch<PanelRows, uint16_t>(std::min(kRowChunk, own.m) * kGemmPanelCols) : nullptr;
    const int64_t wide_stride = 2 * ((own.k + 1) / 2);
    float* x_wide = Lanes::kWideX ? thread_scratch<WideX, float>(std::min(kRowChunk, own.m) * wide_stride) : nullptr;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t r = c * kRowChunk, rows = std::min(kRowChunk, own.m - r);
      const ReadOnce read_once = read_once_panel(Lanes::kNonTemporalOneRow, rows);
      if constexpr (Lanes::kWideX) {  // every row of the chunk: the thread's panels need them all
        for (int64_t i = 0; i < rows; ++i) {
          Lanes::widen_x_row(own.x + (r + i) * own.x_stride, own.k, x_wide + i * wide_stride, wide_stride);
        }
      }
      SharedRanges& shared = chunk_units[static_cast<size_t>(c)];
      for (int64_t u = shared.next(t); u >= 0; u = shared.next(t)) {
        const int64_t after = gemm_next_own_panel(chunk_units, static_cast<size_t>(c), t);  // fetched meanwhile
        const uint16_t* next = after < 0 ? nullptr : own.packed + after * panel_size;
        PanelRows b{own.x + r * own.x_stride, own.x_stride, own.packed + u * panel_size, own.bias,
                    static_cast<char*>(own.y) + r * own.y_stride * y_item, own.y_stride, y_f32,
                    u * kGemmPanelCols, own.n, own.k, u * kGemmPanelCols};
        b.x_wide = x_wide;
        b.x_wide_stride = wide_stride;
        if constexpr (Lanes::kGatedStore) {
          if (gated != nullptr) {
            PanelRows gate = b;  // into the gate rows; the up panel fetched meanwhile
            gate.y = gate_rows;
            gate.y_stride = kGemmPanelCols;
            gate.y_col = 0;
            const uint16_t* up_panel = own.packed + (u + pairs) * panel_size;
            panel_all_rows<Lanes>(gate, rows, up_panel, read_once);
            b.panel = up_panel;
            b.col0 = (u + pairs) * kGemmPanelCols;
            b.gate = gate_rows;
            b.act = *gated;
          }
        }
        panel_all_rows<Lanes>(b, rows, next, read_once);
      }
    }
  }
}

// `iterations` rounds of one dot product on each accumulator, the accumulators passed as separate
// values (function parameters, not an array: an array of them is kept on the stack by GCC, and each
// dot then waits on a store and a load, which measured half the real peak on an AMD EPYC).
template <class Lanes, class... Acc>
void dot_chains(int64_t iterations, typename Lanes::X x, typename Lanes::W w, Acc... acc) {
  for (int64_t i = 0; i < iterations; ++i) {
    ((acc = Lanes::dot(acc, x, w)), ...);
    (Lanes::opaque(acc), ...);
  }
  float sink[16];
  (Lanes::store(sink, 0, true, 16, acc, nullptr, 0), ...);
  __asm__ volatile("" : : "r"(sink) : "memory");
}

template <class Lanes, size_t... I>
void zeroed_dot_chains(int64_t iterations, typename Lanes::X x, typename Lanes::W w, std::index_sequence<I...>) {
  dot_chains<Lanes>(iterations, x, w, ((void)I, Lanes::zero())...);
}

// `iterations` rounds of kPeakChains independent dot products on operands in registers, on every
// thread of the team; returns the flops done (2 x 2 per column of each dot).
template <class Lanes>
double dot_peak(int64_t iterations) {
  int64_t threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
    uint16_t ones[32];
    std::fill(ones, ones + 32, uint16_t{0x3f80});  // bf16 1.0
    zeroed_dot_chains<Lanes>(iterations, Lanes::broadcast_x(0x3f803f80), Lanes::load_w(ones),
                             std::make_index_sequence<Lanes::kPeakChains>{});
  }
  return static_cast<double>(threads) * static_cast<double>(iterations) * Lanes::kPeakChains * 64.0;
}

}  // namespace
}  // namespace corellm::gemm_vector
