// The bf16 GEMM on AMX-BF16 tiles (the amx path of packed_gemm.h).
//
// Tiles: 0-3 hold the fp32 sums of a block of 32 rows x one 32-column panel (tile 2i + j: row
// tile i, column half j), 4-5 two tiles of 16 x rows x 32 input columns (read from x in place, or
// from a copy in tile order: XTiles), 6-7 the panel's two 16-column halves for the same 32 input
// columns (16 rows of pairs, loaded straight from the packed layout with a row stride of 128
// bytes). Per group of 32 input columns, four tile dot products; after the last group the sums
// are stored to a buffer, and while the next block's products run the bias is added and the row
// is rounded once (PendingRows), as on the avx512bf16 path. Every row's sums come from its own x
// row and the panel alone, over the groups in order: a row's result does not depend on the rows
// beside it.
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "corellm/check.h"
#include "fast_math.h"
#include "lanes_avx512.h"
#include "packed_gemm_paths.h"
#include "thread_scratch.h"

// Everything below is compiled for AMX-BF16 (and AVX-512-BF16), whatever the build's baseline;
// it runs only where cpu_isa() found those instructions and the OS's permission for tile data.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")

#include "amx_tile_config.h"
#include "packed_gemm_store.h"

namespace corellm {

// The path's own namespace: every function of it carries "amx" in its name, inlined or not
// (tests/ops/test_portable_build.py tells the paths' functions from the baseline's by their names).
namespace amx_gemm {
namespace {

// Rows of x taken at a time: the rows are cut into equal chunks (a multiple of 32 rows) of at most
// kChunkBytes of x, at least 128 rows: W streams from memory once per chunk, and x's chunk stays
// in the core's L2 (2 MiB on every CPU with AMX) while the thread's panels go past it, next to the
// panels and y's lines. Measured on the Intel Xeon VM (2 threads, SmolLM2's projections, x read in
// place): 1 MiB chunks cut 2048 rows into 896 + 896 + 256 and ran the 3072 x 576 projection at
// 3.0-3.2 ms; four chunks of 512 rows take 2.45-2.5 ms (and the 960-column one 780 vs 815-866 us),
// and 512 rows stay one chunk (the products per chunk keep the tiles busy while W arrives).
constexpr int64_t kChunkBytes = 768 << 10;
int64_t row_chunk(int64_t m, int64_t k) {
  const int64_t most = std::max<int64_t>(128, kChunkBytes / (k * 2) / 32 * 32);
  const int64_t chunks = (m + most - 1) / most;
  return ((m + chunks - 1) / chunks + 31) / 32 * 32;
}
constexpr int64_t kTileRows = 16;   // x rows (and rows of sums) per tile
constexpr int64_t kTileK = 32;      // input columns per tile: kGemmPairGroup pairs
constexpr int kPanelRowBytes = static_cast<int>(kGemmPanelCols * 2 * sizeof(uint16_t));  // one k pair

// Every tile 16 rows (kTileRows) x 64 bytes: 16 fp32 sums, or 16 bf16 pairs.
void configure_tiles() { amx_tiles::load_amx_config(amx_tiles::uniform_config()); }

// Where each 16-row x 32-column tile of x is read from. In place where x allows it (rows whose
// start is 64-byte aligned, k a whole number of groups, so each tile row is one whole cache line
// of x's own row): a tile load reads 16 lines, one per row; copying x instead costs a pass over
// m x k values written and read again (130 of the 680 us of a 2048 x 576 x 576 product). The row
// tiles x does not fill (the last one, when m is not a multiple of 16), and every row tile of an
// x that is not laid out so, are copied into `copied`: per row tile, per group, the 16 x 32 block
// as one contiguous kilobyte (zero past k and past the last row), each aligned to a cache line
// (read in place, rows split across two lines would cost about three aligned tile loads each).
struct XTiles {
  const uint16_t* x;        // x's first row, read in place for row tiles below in_place_tiles
  int64_t x_stride;         // elements between x's rows
  int64_t in_place_tiles;   // row tiles read from x itself
  const uint16_t* copied;   // the others, from row tile in_place_tiles on
  int64_t groups;

  static constexpr int64_t kTileElements = kTileRows * kTileK;
  const uint16_t* tile(int64_t row_tile, int64_t group) const {
    if (row_tile < in_place_tiles) return x + row_tile * kTileRows * x_stride + group * kTileK;
    return copied + ((row_tile - in_place_tiles) * groups + group) * kTileElements;
  }
  int row_bytes(int64_t row_tile) const {
    return row_tile < in_place_tiles ? static_cast<int>(x_stride * sizeof(uint16_t)) : static_cast<int>(kTileK * sizeof(uint16_t));
  }
};

// The row tiles of x that can be read in place (XTiles).
int64_t in_place_row_tiles(const GemmArgs& a) {
  const bool aligned = reinterpret_cast<uintptr_t>(a.x) % 64 == 0 && (a.x_stride * sizeof(uint16_t)) % 64 == 0;
  return aligned && a.k % kTileK == 0 ? a.m / kTileRows : 0;
}

// Row tiles [begin, end) of x, from row tile x.in_place_tiles on, into `copied` (XTiles' layout).
void copy_x_tiles(const GemmArgs& a, const XTiles& x, int64_t begin, int64_t end, uint16_t* copied) {
  for (int64_t rt = std::max(begin, x.in_place_tiles); rt < end; ++rt) {
    for (int64_t g = 0; g < x.groups; ++g) {
      uint16_t* dst = copied + ((rt - x.in_place_tiles) * x.groups + g) * XTiles::kTileElements;
      const int64_t cols = std::min(kTileK, a.k - g * kTileK);
      for (int64_t i = 0; i < kTileRows; ++i) {
        const int64_t r = rt * kTileRows + i;
        uint16_t* row = dst + i * kTileK;
        if (r < a.m) {
          std::memcpy(row, a.x + r * a.x_stride + g * kTileK, cols * sizeof(uint16_t));
          std::memset(row + cols, 0, (kTileK - cols) * sizeof(uint16_t));
        } else {
          std::memset(row, 0, kTileK * sizeof(uint16_t));
        }
      }
    }
  }
}

// x's tiles are loaded with the non-temporal hint (TILELOADDT1) where many row tiles go past each
// panel (a chunk of 128 rows or more): x, read once per panel, then no longer evicts the panel
// that every row tile reuses. Measured on the Intel Xeon VM (2 threads): k = 576 projections at
// 512 and 2048 rows +10-25 % (one thread: +20-45 %); at 16 rows, where x itself stays in the first
// level across the panels, the hint cost 10 %. Software prefetches of the next groups' tiles only
// slowed it: 48 prefetches a group cost more than they bring, even for k = 1536, whose panel (96
// KiB) the first level cannot keep (1.40 vs 1.52 ms at 2048 rows, x read in place).
constexpr int64_t kStreamMinRows = 128;

// The thread's next panel is fetched into L2 while a chunk of more than kFetchNextMinRows rows
// goes past the current one (NextPanel, a step per group of each row block): the first row block
// of a panel read from memory otherwise waits on it, and memory idles while the later blocks run.
// Measured on the Intel Xeon VM (2 threads, SmolLM2's projections each with its own weights, the
// whole model's 270 MB streamed from memory, four alternating runs): 64 rows 16.4-17.2 -> 16.0-17.1
// ms, 512 rows 67.6-70.6 -> 64.8-67.2, 2048 rows 266-271 -> 254-259; an engine decode step of 32
// requests 24.6-24.9 -> 22.2-24.0 ms. From 1 to 16 rows, where the products hardly delay the panel
// stream, it cost 5-12 %. Where the weights come from the last level instead (30 layers of one
// projection alone), about even: at 64 rows gate_up 4.8-4.9 -> 4.4-4.6 ms, qkv 1.33-1.39 ->
// 1.41-1.47.
constexpr int64_t kFetchNextMinRows = kTileRows;

// Where a block's sums go once PendingRows rounds them:
//   kY      y's columns [col, col + 32), + bias[col ..] (the plain GEMM);
//   kGate   a gated GEMM's gate half (bf16_gemm_gated): + bias[col ..] and rounded to bf16 as y's
//           would be, into the thread's gate rows (32 a row, from the chunk's first row: gate_row0);
//   kGated  its up half: + bias[col ..], rounded, times act(the gate's value), rounded again, into
//           y's columns [out_col, out_col + 32) — silu_and_mul's arithmetic, the same bits.
enum class SumsTo { kY, kGate, kGated };
struct SumsTarget {
  SumsTo to = SumsTo::kY;
  int64_t col = 0;               // the panel's first column of W (and of the bias)
  int64_t out_col = 0;           // kGated: its first column of y
  uint16_t* gate_rows = nullptr;  // kGate, kGated
  int64_t gate_row0 = 0;
  GatedActivation act = GatedActivation::kSilu;
  bool stream = false;  // kY: y's whole lines written past the caches (streams_y)
  // kY, bf16 y: each value rounded as y's would be, then GELU (erf form), rounded again —
  // bf16_gemm then GELU on its output (bf16_gemm_gelu)
  bool gelu = false;
};

// Whether y's whole lines are written with non-temporal stores, past the caches: where y is at
// least kStreamYMinBytesPerThread per thread (it leaves the caches before anyone reads it, and a
// line written the usual way is first read from memory) and each panel's row starts on a 64-byte
// line. The LM head over many rows (prompt logprobs; a decode step of hundreds of requests).
// Measured on the Intel Xeon VM (2 threads, alternating builds): 512 x 49152 bf16 13.0-13.5 ->
// 9.3 ms, 512 x 12288 2.52-2.54 -> 2.32-2.34 ms.
constexpr int64_t kStreamYMinBytesPerThread = int64_t{4} << 20;
bool streams_y(const GemmArgs& a, int threads) {
  const int64_t bytes = a.y_dtype == DType::F32 ? 4 : 2;
  const bool on_lines = reinterpret_cast<uintptr_t>(a.y) % 64 == 0 && a.y_stride * bytes % 64 == 0;
  return on_lines && a.m * a.n * bytes >= kStreamYMinBytesPerThread * threads;
}

// Rows [begin, end) of a block's sums (rows 32 floats apart, the block's row 0 being x's row
// row0) to their target, rounded to bf16 or kept fp32 (kY with an fp32 y). A whole panel of bf16
// goes out one 64-byte store per row (two 32-byte halves would cost a third more: y is written to
// memory, and every partial line is read first).
void store_rows(const float* sums, int64_t begin, int64_t end, const GemmArgs& a, int64_t row0, const SumsTarget& t) {
  const bool y_f32 = a.y_dtype == DType::F32;
  if (t.to == SumsTo::kY && (y_f32 || gemm_half_columns(a.n, t.col, 1) < 16)) {  // masked halves
    for (int h = 0; h < 2; ++h) {
      const int cols = gemm_half_columns(a.n, t.col, h);
      if (cols == 0) break;
      const __mmask16 mask = gemm_store::mask_of(cols);
      const int64_t c0 = 16 * h;
      const __m512 b = gemm_store::bias_of(a.bias, t.col + c0, mask);
      for (int64_t r = begin; r < end; ++r) {
        __m512 v = _mm512_add_ps(_mm512_loadu_ps(sums + r * kGemmPanelCols + c0), b);
        if (t.gelu) v = gemm_store::gelu_erf16(gemm_store::rounded_as_stored<true>(v));
        const int64_t at = (row0 + r) * a.y_stride + t.col + c0;
        if (t.stream && y_f32 && cols == 16) {
          _mm512_stream_ps(static_cast<float*>(a.y) + at, v);
        } else {
          gemm_store::store<true>(a.y, at, y_f32, mask, v);
        }
      }
    }
    return;
  }
  const __m512 b0 = gemm_store::bias_of(a.bias, t.col, 0xFFFF), b1 = gemm_store::bias_of(a.bias, t.col + 16, 0xFFFF);
  auto* y = static_cast<uint16_t*>(a.y);
  for (int64_t r = begin; r < end; ++r) {
    const float* s = sums + r * kGemmPanelCols;
    if (t.to == SumsTo::kGated) {
      const uint16_t* g = t.gate_rows + (row0 + r - t.gate_row0) * kGemmPanelCols;
      uint16_t* out = y + (row0 + r) * a.y_stride + t.out_col;
      gemm_store::store_gated<true>(out, 0, _mm512_loadu_ps(s), b0, g, t.act);
      gemm_store::store_gated<true>(out, 16, _mm512_loadu_ps(s + 16), b1, g + 16, t.act);
      continue;
    }
    // Both halves rounded by one instruction (the second operand's into the low half).
    __m512 lo = _mm512_add_ps(_mm512_loadu_ps(s), b0), hi = _mm512_add_ps(_mm512_loadu_ps(s + 16), b1);
    if (t.gelu) {
      lo = gemm_store::gelu_erf16(gemm_store::rounded_as_stored<true>(lo));
      hi = gemm_store::gelu_erf16(gemm_store::rounded_as_stored<true>(hi));
    }
    const __m512i v = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
    uint16_t* out = t.to == SumsTo::kGate ? t.gate_rows + (row0 + r - t.gate_row0) * kGemmPanelCols
                                          : y + (row0 + r) * a.y_stride + t.col;
    if (t.stream) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(out), v);
    } else {
      _mm512_storeu_si512(out, v);
    }
  }
}

// A block's sums not yet stored: the next block's group loop stores them a few rows per group
// (step), so that their rounding and y's stores run on the vector unit while the tiles compute,
// instead of after the products with the tiles idle; finish() stores the rest. Measured on the
// Intel Xeon VM (2 threads, SmolLM2's projections with the whole model's weights, alternating
// runs): 64 rows 15.4-17.9 -> 14.1-14.2 ms, 512 rows 67.0-68.6 -> 61.5-62.7, 2048 rows 267 -> 249-258;
// gate_up alone (30 layers, 512 rows) 22.2-23.7 -> 19.5-19.9 ms; 1 and 16 rows unchanged.
struct PendingRows {
  const float* sums = nullptr;
  int64_t rows = 0, done = 0, per_step = 0, row0 = 0;
  SumsTarget target;

  PendingRows() = default;
  PendingRows(const float* sums_, int64_t rows_, int64_t row0_, const SumsTarget& target_, int64_t steps)
      : sums(sums_), rows(rows_), per_step((rows_ + steps - 1) / steps), row0(row0_), target(target_) {}
  void step(const GemmArgs& a) {
    if (done >= rows) return;
    const int64_t end = std::min(rows, done + per_step);
    store_rows(sums, done, end, a, row0, target);
    done = end;
  }
  void finish(const GemmArgs& a) {
    if (done < rows) store_rows(sums, done, rows, a, row0, target);
    done = rows;
  }
};

// sums[16 RowTiles][32] (fp32, rows `stride` bytes apart) for RowTiles (1 or 2) tiles of x rows
// from row tile rt x one panel.
template <int RowTiles>
void panel_sums(const XTiles& x, int64_t rt, const uint16_t* panel, float* sums, int stride, bool stream_x,
                NextPanel& next, PendingRows& pending, const GemmArgs& a) {
  _tile_zero(0);
  _tile_zero(1);
  if (RowTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t g = 0; g < x.groups; ++g) {
    // Each load as late as its first use, so that it overlaps the product before it (a tile
    // is not renamed: loading one waits for the products that still read it).
    const uint16_t* b = panel + g * kGemmPairGroup * kGemmPanelCols * 2;
    next.step();
    if (stream_x) {
      _tile_stream_loadd(4, x.tile(rt, g), x.row_bytes(rt));
    } else {
      _tile_loadd(4, x.tile(rt, g), x.row_bytes(rt));
    }
    _tile_loadd(6, b, kPanelRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if (RowTiles == 2) {
      if (stream_x) {
        _tile_stream_loadd(5, x.tile(rt + 1, g), x.row_bytes(rt + 1));
      } else {
        _tile_loadd(5, x.tile(rt + 1, g), x.row_bytes(rt + 1));
      }
      _tile_dpbf16ps(2, 5, 6);
    }
    _tile_loadd(7, b + kGemmPanelCols, kPanelRowBytes);  // columns 16-31: the row's second 64 bytes
    _tile_dpbf16ps(1, 4, 7);
    if (RowTiles == 2) _tile_dpbf16ps(3, 5, 7);
    pending.step(a);
  }
  pending.finish(a);
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + 16, stride);
  if (RowTiles == 2) {
    float* lower = reinterpret_cast<float*>(reinterpret_cast<char*>(sums) + kTileRows * stride);
    _tile_stored(2, lower, stride);
    _tile_stored(3, lower + 16, stride);
  }
}

// A thread's blocks of 32 rows of [r0, r1) x one panel, each block's sums stored by the next
// block (pending) to `target`; the panel fetched next (next) a step per group.
void panel_pass(const XTiles& x, const GemmArgs& a, const uint16_t* panel, int64_t r0, int64_t r1, bool stream_x,
                NextPanel& next, const SumsTarget& target, float (&sums)[2][2 * kTileRows * kGemmPanelCols],
                int& which, PendingRows& pending) {
  // fp32 out (logits) without a bias, whole tiles: the tiles are the result, stored in place
  // (unless y is written past the caches).
  const bool direct_f32 = target.to == SumsTo::kY && a.y_dtype == DType::F32 && a.bias == nullptr &&
                          gemm_half_columns(a.n, target.col, 1) == 16 && !target.stream;
  for (int64_t r = r0; r < r1; r += 2 * kTileRows) {
    const int64_t rows = std::min(2 * kTileRows, r1 - r);
    const bool in_place = direct_f32 && rows % kTileRows == 0;
    float* out = in_place ? static_cast<float*>(a.y) + r * a.y_stride + target.col : sums[which];
    const int stride = in_place ? static_cast<int>(a.y_stride * sizeof(float)) : kGemmPanelCols * sizeof(float);
    if (rows > kTileRows) {
      panel_sums<2>(x, r / kTileRows, panel, out, stride, stream_x, next, pending, a);
    } else {
      panel_sums<1>(x, r / kTileRows, panel, out, stride, stream_x, next, pending, a);
    }
    if (!in_place) {
      pending = PendingRows(sums[which], rows, r, target, x.groups);
      which ^= 1;
    }
  }
}

// From this many rows per thread, where x's rows were written by the team (XRows::kByThread), the
// rows are split between the threads (each computing every panel for its own rows:
// row_split_start) instead of the panels: each thread's x rows are then the ones its core wrote,
// which stay in its L2, where with the panels split every thread reads all of x, half of it from
// the other core. Measured on the Intel Xeon VM (2 threads, 30 layers' norms and projections
// chained as in a decoder step): 512 rows 62.0-64.5 -> 55.5-60.8 ms, 1024 rows 110-114 -> 98-100,
// 2048 rows 226-237 -> 177-201; 256 rows split were 31.7-33.0 -> 34.6-35.5 (slower), 128 rows
// 21.4-22.2 -> 26.2-26.7. With x read alike by both cores (the whole model's projections on one
// x, bench/kernels.py) the split is slower (512 rows 92-93 -> 98-101 ms): a panel then serves half
// the rows, and every thread streams all of W.
constexpr int64_t kRowSplitMinRowsPerThread = 256;

// Thread t's first row of m rows split between `threads` (multiples of two row tiles; the last
// thread's range ends at m).
int64_t row_split_start(int64_t m, int64_t t, int64_t threads) {
  if (t >= threads) return m;
  return m * t / threads / (2 * kTileRows) * (2 * kTileRows);
}

// The GEMM (with `gelu`, each value of y rounded, GELU'd and rounded again as it is stored:
// SumsTarget::gelu), or with `gated` the gated one (a.n = 2d columns of W, y d columns): its units are then
// pairs of panels, the gate's panel u and the up half's u + d / 32, whose passes run one after the
// other over the chunk's rows (each panel stays in the first level over its pass), the gate's
// rounded values kept in the thread's gate rows for the up pass to combine. The threads share
// each chunk's units (SharedRanges), or (kRowSplitMinRowsPerThread) split the rows and compute
// every unit for their own.
void gemm_amx(const GemmArgs& a, const GatedActivation* gated, bool gelu = false) {
  const int64_t groups = gemm_padded_pairs(a.k) * 2 / kTileK;
  const int64_t panel_size = gemm_panel_elements(a.k);
  const int64_t row_tiles = (a.m + kTileRows - 1) / kTileRows;
  const int64_t in_place_tiles = in_place_row_tiles(a);
  uint16_t* copied = thread_scratch<XTiles, uint16_t>((row_tiles - in_place_tiles) * groups * XTiles::kTileElements);
  const XTiles x{a.x, a.x_stride, in_place_tiles, copied, groups};
  const int64_t pairs = gated ? a.n / 2 / kGemmPanelCols : 0;  // the up half's first panel
  const int64_t num_units = gemm_num_panels(gated ? a.n / 2 : a.n);  // panels, or pairs of them
  const int max_threads = gemm_team_size(a);
  const bool row_split = a.x_rows == XRows::kByThread && max_threads > 1 && a.m >= kRowSplitMinRowsPerThread * max_threads;
  const int64_t chunk = row_split ? row_chunk(row_split_start(a.m, 1, max_threads), a.k) : row_chunk(a.m, a.k);
  std::vector<SharedRanges> chunk_panels = row_split ? std::vector<SharedRanges>() : gemm_shared_panels(a.m, chunk, num_units, max_threads);
  const bool stream_y = gated == nullptr && streams_y(a, max_threads);
#pragma omp parallel num_threads(max_threads)
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    if (in_place_tiles < row_tiles) {
      copy_x_tiles(a, x, row_tiles * t / threads, row_tiles * (t + 1) / threads, copied);
#pragma omp barrier
    }
    configure_tiles();
    alignas(64) float sums[2][2 * kTileRows * kGemmPanelCols];  // a block's, and the block's before
    int which = 0;
    PendingRows pending;
    uint16_t* gate_rows = gated ? thread_scratch<SumsTarget, uint16_t>(std::min(chunk, a.m) * kGemmPanelCols) : nullptr;
    // Unit u over rows [r0, r1), the thread's unit after it fetched meanwhile (-1: none, and for
    // chunks of kFetchNextMinRows rows or fewer).
    auto compute_unit = [&](int64_t u, int64_t r0, int64_t r1, int64_t after) {
      const bool stream_x = r1 - r0 >= kStreamMinRows;
      NextPanel next, next_up;
      if (after >= 0) {
        const int64_t steps = (r1 - r0 + 2 * kTileRows - 1) / (2 * kTileRows) * groups;
        const auto bytes = static_cast<int64_t>(panel_size * sizeof(uint16_t));
        next = NextPanel(a.packed + after * panel_size, bytes, steps);
        if (gated) next_up = NextPanel(a.packed + (after + pairs) * panel_size, bytes, steps);
      }
      if (!gated) {
        SumsTarget to;
        to.col = u * kGemmPanelCols;
        to.stream = stream_y;
        to.gelu = gelu;
        panel_pass(x, a, a.packed + u * panel_size, r0, r1, stream_x, next, to, sums, which, pending);
        return;
      }
      SumsTarget gate;
      gate.to = SumsTo::kGate;
      gate.col = u * kGemmPanelCols;
      gate.gate_rows = gate_rows;
      gate.gate_row0 = r0;
      panel_pass(x, a, a.packed + u * panel_size, r0, r1, stream_x, next, gate, sums, which, pending);
      // The up pass's first block stores the gate pass's last (pending holds one block): every
      // gate row is in place before a block of up reads it, and read before the next unit (or
      // chunk) overwrites it.
      SumsTarget up = gate;
      up.to = SumsTo::kGated;
      up.col = (u + pairs) * kGemmPanelCols;
      up.out_col = u * kGemmPanelCols;
      up.act = *gated;
      panel_pass(x, a, a.packed + (u + pairs) * panel_size, r0, r1, stream_x, next_up, up, sums, which, pending);
    };
    if (row_split) {  // chunks of at least kRowSplitMinRowsPerThread / 2 rows: always fetching
      const int64_t lo = row_split_start(a.m, t, threads), hi = row_split_start(a.m, t + 1, threads);
      for (int64_t r0 = lo; r0 < hi; r0 += chunk) {
        const int64_t r1 = std::min(hi, r0 + chunk);
        for (int64_t u = 0; u < num_units; ++u) compute_unit(u, r0, r1, u + 1 < num_units ? u + 1 : r1 < hi ? 0 : -1);
      }
    } else {
      for (int64_t r0 = 0, c = 0; r0 < a.m; r0 += chunk, ++c) {
        const int64_t r1 = std::min(a.m, r0 + chunk);
        const bool fetch_next = r1 - r0 > kFetchNextMinRows;
        SharedRanges& shared = chunk_panels[static_cast<size_t>(c)];
        for (int64_t u = shared.next(static_cast<int>(t)); u >= 0; u = shared.next(static_cast<int>(t))) {
          const int64_t after =
              fetch_next ? gemm_next_own_panel(chunk_panels, static_cast<size_t>(c), static_cast<int>(t)) : -1;
          compute_unit(u, r0, r1, after);
        }
      }
    }
    pending.finish(a);
    if (stream_y) _mm_sfence();  // the non-temporal stores ordered before the region ends
    _tile_release();
  }
}

}  // namespace
}  // namespace amx_gemm

using amx_gemm::configure_tiles;
using amx_gemm::gemm_amx;
using amx_gemm::kTileK;
using amx_gemm::kTileRows;

void bf16_gemm_amx(const GemmArgs& a) { gemm_amx(a, nullptr); }

void bf16_gemm_gelu_amx(const GemmArgs& a) {
  CORELLM_CHECK_ARG(a.y_dtype == DType::BF16, "bf16_gemm_gelu_amx: y must be bf16");
  gemm_amx(a, nullptr, true);
}

void bf16_gemm_gated_amx(const GemmArgs& a, GatedActivation act) {
  CORELLM_CHECK_ARG(a.n % (2 * kGemmPanelCols) == 0 && a.y_dtype == DType::BF16,
                    "bf16_gemm_gated_amx: n / 2 must be a multiple of 32 and y bf16");
  gemm_amx(a, &act);
}

double bf16_dot_peak_amx(int64_t iterations) {
  int64_t threads = 1;
#pragma omp parallel
  {
#pragma omp single
    threads = omp_get_num_threads();
    configure_tiles();
    alignas(64) uint16_t operand[kTileRows * 32] = {};
    _tile_loadd(4, operand, 64);
    _tile_loadd(5, operand, 64);
    _tile_loadd(6, operand, 64);
    _tile_loadd(7, operand, 64);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t i = 0; i < iterations; ++i) {
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
    alignas(64) float sink[kTileRows * 16];
    _tile_stored(0, sink, 64);
    _tile_release();
  }
  return static_cast<double>(threads) * static_cast<double>(iterations) * 4 * (2.0 * kTileRows * 16 * kTileK);
}

}  // namespace corellm

#pragma GCC pop_options
