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

#include "packed_gemm_paths.h"
#include "thread_scratch.h"

// Everything below is compiled for AMX-BF16 (and AVX-512-BF16), whatever the build's baseline;
// it runs only where cpu_isa() found those instructions and the OS's permission for tile data.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")

#include "amx_tile_config.h"
#include "packed_gemm_store.h"

namespace corellm {

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

// y[row0 + begin .. row0 + end)[col0 .. col0 + 32) = sums' rows [begin, end) + bias, rounded to
// bf16 or kept fp32. A whole panel of bf16 goes out one 64-byte store per row (two 32-byte halves
// would cost a third more: y is written to memory, and every partial line is read first).
void store_rows(const float* sums, int64_t begin, int64_t end, const GemmArgs& a, int64_t row0, int64_t col0) {
  const bool y_f32 = a.y_dtype == DType::F32;
  if (!y_f32 && gemm_half_columns(a.n, col0, 1) == 16) {
    const __m512 b0 = gemm_store::bias_of(a.bias, col0, 0xFFFF), b1 = gemm_store::bias_of(a.bias, col0 + 16, 0xFFFF);
    for (int64_t r = begin; r < end; ++r) {
      const float* s = sums + r * kGemmPanelCols;
      const __m256i lo = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(s), b0));
      const __m256i hi = (__m256i)_mm512_cvtneps_pbh(_mm512_add_ps(_mm512_loadu_ps(s + 16), b1));
      _mm512_storeu_si512(static_cast<uint16_t*>(a.y) + (row0 + r) * a.y_stride + col0,
                          _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1));
    }
    return;
  }
  for (int h = 0; h < 2; ++h) {
    const int cols = gemm_half_columns(a.n, col0, h);
    if (cols == 0) break;
    const __mmask16 mask = gemm_store::mask_of(cols);
    const int64_t c0 = 16 * h;
    const __m512 b = gemm_store::bias_of(a.bias, col0 + c0, mask);
    for (int64_t r = begin; r < end; ++r) {
      gemm_store::store<true>(a.y, (row0 + r) * a.y_stride + col0 + c0, y_f32, mask,
                        _mm512_add_ps(_mm512_loadu_ps(sums + r * kGemmPanelCols + c0), b));
    }
  }
}

// A block's sums not yet stored to y: the next block's group loop stores them a few rows per group
// (step), so that their rounding and y's stores run on the vector unit while the tiles compute,
// instead of after the products with the tiles idle; finish() stores the rest. Measured on the
// Intel Xeon VM (2 threads, SmolLM2's projections with the whole model's weights, alternating
// runs): 64 rows 15.4-17.9 -> 14.1-14.2 ms, 512 rows 67.0-68.6 -> 61.5-62.7, 2048 rows 267 -> 249-258;
// gate_up alone (30 layers, 512 rows) 22.2-23.7 -> 19.5-19.9 ms; 1 and 16 rows unchanged.
struct PendingRows {
  const float* sums = nullptr;
  int64_t rows = 0, done = 0, per_step = 0, row0 = 0, col0 = 0;

  PendingRows() = default;
  PendingRows(const float* sums_, int64_t rows_, int64_t row0_, int64_t col0_, int64_t steps)
      : sums(sums_), rows(rows_), per_step((rows_ + steps - 1) / steps), row0(row0_), col0(col0_) {}
  void step(const GemmArgs& a) {
    if (done >= rows) return;
    const int64_t end = std::min(rows, done + per_step);
    store_rows(sums, done, end, a, row0, col0);
    done = end;
  }
  void finish(const GemmArgs& a) {
    if (done < rows) store_rows(sums, done, rows, a, row0, col0);
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

}  // namespace

void bf16_gemm_amx(const GemmArgs& a) {
  const int64_t groups = gemm_padded_pairs(a.k) * 2 / kTileK;
  const int64_t panel_size = gemm_panel_elements(a.k);
  const int64_t row_tiles = (a.m + kTileRows - 1) / kTileRows;
  const int64_t in_place_tiles = in_place_row_tiles(a);
  uint16_t* copied = thread_scratch<XTiles, uint16_t>((row_tiles - in_place_tiles) * groups * XTiles::kTileElements);
  const XTiles x{a.x, a.x_stride, in_place_tiles, copied, groups};
  const int64_t chunk = row_chunk(a.m, a.k);
  std::vector<SharedRanges> chunk_panels = gemm_shared_panels(a, chunk);
#pragma omp parallel if (gemm_worth_threads(a))
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
    const bool direct_f32 = a.y_dtype == DType::F32 && a.bias == nullptr;
    for (int64_t r0 = 0, c = 0; r0 < a.m; r0 += chunk, ++c) {
      const int64_t chunk_end = std::min(a.m, r0 + chunk);
      const bool stream_x = chunk_end - r0 >= kStreamMinRows;
      SharedRanges& shared = chunk_panels[static_cast<size_t>(c)];
      for (int64_t p = shared.next(static_cast<int>(t)); p >= 0; p = shared.next(static_cast<int>(t))) {
        const uint16_t* panel = a.packed + p * panel_size;
        NextPanel next;
        if (chunk_end - r0 > kFetchNextMinRows) {
          const int64_t after = gemm_next_own_panel(chunk_panels, static_cast<size_t>(c), static_cast<int>(t));
          const int64_t row_blocks = (chunk_end - r0 + 2 * kTileRows - 1) / (2 * kTileRows);
          if (after >= 0) next = NextPanel(a.packed + after * panel_size, panel_size * sizeof(uint16_t), row_blocks * groups);
        }
        for (int64_t r = r0; r < chunk_end; r += 2 * kTileRows) {
          const int64_t rows = std::min(2 * kTileRows, chunk_end - r);
          // fp32 out (logits) without a bias, whole tiles: the tiles are the result, stored in place.
          const bool in_place = direct_f32 && rows % kTileRows == 0 && gemm_half_columns(a.n, p * kGemmPanelCols, 1) == 16;
          float* out = in_place ? static_cast<float*>(a.y) + r * a.y_stride + p * kGemmPanelCols : sums[which];
          const int stride = in_place ? static_cast<int>(a.y_stride * sizeof(float)) : kGemmPanelCols * sizeof(float);
          if (rows > kTileRows) {
            panel_sums<2>(x, r / kTileRows, panel, out, stride, stream_x, next, pending, a);
          } else {
            panel_sums<1>(x, r / kTileRows, panel, out, stride, stream_x, next, pending, a);
          }
          if (!in_place) {
            pending = PendingRows(sums[which], rows, r, p * kGemmPanelCols, groups);
            which ^= 1;
          }
        }
      }
    }
    pending.finish(a);
    _tile_release();
  }
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
