// The bf16 GEMM on AMX-BF16 tiles (the amx path of packed_gemm.h).
//
// Tiles: 0-3 hold the fp32 sums of a block of 32 rows x one 32-column panel (tile 2i + j: row
// tile i, column half j), 4-5 two tiles of 16 x rows x 32 input columns (from x copied into
// tile order: TiledX), 6-7 the panel's two 16-column halves for the same 32 input columns (16
// rows of pairs, loaded straight from the packed layout with a row stride of 128 bytes). Per group of 32 input columns, four tile dot
// products; after the last group the sums are stored to a buffer, the bias is added and the row
// is rounded once, as on the avx512bf16 path. Every row's sums come from its own x row and the
// panel alone, over the groups in order: a row's result does not depend on the rows beside it.
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

// Rows of x taken at a time: as many as fit in half of the core's L2 (2 MiB on every CPU with
// AMX), at least 128 and a multiple of 32: W streams from memory once per chunk, and the tiles
// go through W so fast that a small chunk would leave them waiting on it.
constexpr int64_t kChunkBytes = 1 << 20;
int64_t row_chunk(int64_t k) { return std::max<int64_t>(128, kChunkBytes / (k * 2) / 32 * 32); }
constexpr int64_t kTileRows = 16;   // x rows (and rows of sums) per tile
constexpr int64_t kTileK = 32;      // input columns per tile: kGemmPairGroup pairs
constexpr int kPanelRowBytes = static_cast<int>(kGemmPanelCols * 2 * sizeof(uint16_t));  // one k pair

// Every tile 16 rows (kTileRows) x 64 bytes: 16 fp32 sums, or 16 bf16 pairs.
void configure_tiles() { amx_tiles::load_amx_config(amx_tiles::uniform_config()); }

// x laid out as tiles: for each 16 rows, for each group of 32 input columns, the 16 x 32 block
// as one contiguous kilobyte (zero past k and past the last row), each aligned to a cache line.
// A tile load then reads 16 whole, consecutive cache lines, which the prefetchers follow; read in
// place, it would be 16 rows k apart, and each row split across two lines wherever x's rows are
// not 64-byte aligned (a split tile load costs about three aligned ones). Copying x is a pass
// over m x k values, small next to the m x n x k products.
struct TiledX {
  const uint16_t* tiles;
  int64_t groups;

  static constexpr int64_t kTileElements = kTileRows * kTileK;
  const uint16_t* tile(int64_t row_tile, int64_t group) const {
    return tiles + (row_tile * groups + group) * kTileElements;
  }
};

// Row tiles [begin, end) of x into `tiles` (TiledX's layout).
void tile_x(const GemmArgs& a, int64_t groups, int64_t begin, int64_t end, uint16_t* tiles) {
  for (int64_t rt = begin; rt < end; ++rt) {
    for (int64_t g = 0; g < groups; ++g) {
      uint16_t* dst = tiles + (rt * groups + g) * TiledX::kTileElements;
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

// How a row tile pair's products fetch their operands: measured on the Intel Xeon VM (2 threads,
// bench/kernels.py --linear-only and SmolLM2's projections one by one).
struct TileLoads {
  // Software prefetches, 4 groups ahead, only for long rows (k >= 1024: 32 groups, a panel of 64
  // KiB or more, which the first level cannot keep between the row tiles that reuse it). Below
  // that the 48 prefetches a group cost more than they bring: the whole-model GEMM took 85 / 337
  // ms at 512 / 2048 rows against 95 / 389 ms with them; the k = 1536 projection ran 5-10 %
  // slower without.
  bool prefetch;
  // x's tiles loaded with the non-temporal hint (TILELOADDT1) where many row tiles go past each
  // panel (a chunk of 128 rows or more) and the panel fits the first level (k < 1024): x, read once
  // per panel, then no longer evicts the panel that every row tile reuses. k = 576 projections at
  // 512 and 2048 rows: +10-25 % (one thread: +20-45 %); at 16 rows, where x itself stays in the
  // first level across the panels, the hint cost 10 %.
  bool stream_x;
};
constexpr int64_t kPrefetchGroups = 4;
constexpr int64_t kPrefetchMinGroups = 32;
constexpr int64_t kStreamMinRows = 128;

// sums[16 RowTiles][32] (fp32, rows `stride` bytes apart) for RowTiles (1 or 2) tiles of x rows
// from row tile rt x one panel.
template <int RowTiles>
void panel_sums(const TiledX& x, int64_t rt, const uint16_t* panel, float* sums, int stride, TileLoads loads) {
  constexpr int kTileRowBytes = kTileK * sizeof(uint16_t);
  _tile_zero(0);
  _tile_zero(1);
  if (RowTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t g = 0; g < x.groups; ++g) {
    if (loads.prefetch && g + kPrefetchGroups < x.groups) {  // x's tiles come from L2, W's from L2 or memory: ask ahead
      for (int r = 0; r < RowTiles; ++r) {
        const char* next = reinterpret_cast<const char*>(x.tile(rt + r, g + kPrefetchGroups));
        for (int line = 0; line < 16; ++line) _mm_prefetch(next + 64 * line, _MM_HINT_T0);
      }
      const char* next_w = reinterpret_cast<const char*>(panel + (g + kPrefetchGroups) * kGemmPairGroup * kGemmPanelCols * 2);
      for (int line = 0; line < 32; ++line) _mm_prefetch(next_w + 64 * line, _MM_HINT_T0);
    }
    // Each load as late as its first use, so that it overlaps the product before it (a tile
    // is not renamed: loading one waits for the products that still read it).
    const uint16_t* b = panel + g * kGemmPairGroup * kGemmPanelCols * 2;
    if (loads.stream_x) {
      _tile_stream_loadd(4, x.tile(rt, g), kTileRowBytes);
    } else {
      _tile_loadd(4, x.tile(rt, g), kTileRowBytes);
    }
    _tile_loadd(6, b, kPanelRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if (RowTiles == 2) {
      if (loads.stream_x) {
        _tile_stream_loadd(5, x.tile(rt + 1, g), kTileRowBytes);
      } else {
        _tile_loadd(5, x.tile(rt + 1, g), kTileRowBytes);
      }
      _tile_dpbf16ps(2, 5, 6);
    }
    _tile_loadd(7, b + kGemmPanelCols, kPanelRowBytes);  // columns 16-31: the row's second 64 bytes
    _tile_dpbf16ps(1, 4, 7);
    if (RowTiles == 2) _tile_dpbf16ps(3, 5, 7);
  }
  _tile_stored(0, sums, stride);
  _tile_stored(1, sums + 16, stride);
  if (RowTiles == 2) {
    float* lower = reinterpret_cast<float*>(reinterpret_cast<char*>(sums) + kTileRows * stride);
    _tile_stored(2, lower, stride);
    _tile_stored(3, lower + 16, stride);
  }
}

// y[rows][col0 .. col0 + 32) = sums + bias, rounded to bf16 or kept fp32. A whole panel of bf16
// goes out one 64-byte store per row (two 32-byte halves would cost a third more: y is written
// to memory, and every partial line is read first).
void store_rows(const float* sums, int64_t rows, const GemmArgs& a, int64_t row0, int64_t col0) {
  const bool y_f32 = a.y_dtype == DType::F32;
  if (!y_f32 && gemm_half_columns(a.n, col0, 1) == 16) {
    const __m512 b0 = gemm_store::bias_of(a.bias, col0, 0xFFFF), b1 = gemm_store::bias_of(a.bias, col0 + 16, 0xFFFF);
    for (int64_t r = 0; r < rows; ++r) {
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
    for (int64_t r = 0; r < rows; ++r) {
      gemm_store::store<true>(a.y, (row0 + r) * a.y_stride + col0 + c0, y_f32, mask,
                        _mm512_add_ps(_mm512_loadu_ps(sums + r * kGemmPanelCols + c0), b));
    }
  }
}

}  // namespace

void bf16_gemm_amx(const GemmArgs& a) {
  const int64_t groups = gemm_padded_pairs(a.k) * 2 / kTileK;
  const int64_t panels = gemm_num_panels(a.n), panel_size = gemm_panel_elements(a.k);
  const int64_t row_tiles = (a.m + kTileRows - 1) / kTileRows;
  uint16_t* tiles = thread_scratch<TiledX, uint16_t>(row_tiles * groups * TiledX::kTileElements);
  const TiledX x{tiles, groups};
#pragma omp parallel if (gemm_worth_threads(a))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    tile_x(a, groups, row_tiles * t / threads, row_tiles * (t + 1) / threads, tiles);
#pragma omp barrier
    configure_tiles();
    alignas(64) float sums[2 * kTileRows * kGemmPanelCols];
    const int64_t chunk = row_chunk(a.k);
    const bool direct_f32 = a.y_dtype == DType::F32 && a.bias == nullptr;
    const bool long_rows = groups >= kPrefetchMinGroups;
    for (int64_t r0 = 0; r0 < a.m; r0 += chunk) {
      const int64_t chunk_end = std::min(a.m, r0 + chunk);
      const TileLoads loads{long_rows, !long_rows && chunk_end - r0 >= kStreamMinRows};
      for (int64_t p = panels * t / threads; p < panels * (t + 1) / threads; ++p) {
        const uint16_t* panel = a.packed + p * panel_size;
        for (int64_t r = r0; r < chunk_end; r += 2 * kTileRows) {
          const int64_t rows = std::min(2 * kTileRows, chunk_end - r);
          // fp32 out (logits) without a bias, whole tiles: the tiles are the result, stored in place.
          const bool in_place = direct_f32 && rows % kTileRows == 0 && gemm_half_columns(a.n, p * kGemmPanelCols, 1) == 16;
          float* out = in_place ? static_cast<float*>(a.y) + r * a.y_stride + p * kGemmPanelCols : sums;
          const int stride = in_place ? static_cast<int>(a.y_stride * sizeof(float)) : kGemmPanelCols * sizeof(float);
          if (rows > kTileRows) {
            panel_sums<2>(x, r / kTileRows, panel, out, stride, loads);
          } else {
            panel_sums<1>(x, r / kTileRows, panel, out, stride, loads);
          }
          if (!in_place) store_rows(sums, rows, a, r, p * kGemmPanelCols);
        }
      }
    }
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
