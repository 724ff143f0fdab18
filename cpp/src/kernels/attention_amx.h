// The span fold of attention_tile.h on AMX-BF16 tiles: the same online softmax (tile_softmax_row,
// on AVX-512), with S = q K^T and acc += P V as tile dot products, 16 query rows at a time. The
// K and V blocks are read in place: a bf16 block's K, [HD / 2, BS, 2], is already the B operand
// of a tile product (rows: dim pairs, columns: keys), and so are 8 key pairs of its V,
// [BS / 2, HD, 2] (rows: key pairs, columns: dims). Each row's sums come from its own query (or
// probabilities) and the block alone, in a fixed order: a row's result does not depend on the
// rows beside it in the tile. Compiled for AMX (namespace attention::amx), run only where the
// process's path is amx (select_span_fold). Internal to paged_attention.cpp.
//
// Tiles (one configuration, loaded per span): 0-3 fp32 sums (16 rows x 16 columns: scores of 16
// keys, or 16 dims of acc); 4: 16 query rows x 16 dim pairs; 6: 16 dim pairs x 16 keys of K;
// 5: 16 rows x 8 key pairs of P; 7: 8 key pairs x 16 dims of V. The row buffers (TileRows'
// qb and acc, TileScratch's s and p) hold whole tiles: tile_padded_rows(num_rows) rows.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "attention_span_avx2.h"
#include "attention_span_avx512.h"
#include "attention_tile.h"

namespace corellm::attention {

constexpr int64_t kAmxTileRows = 16;

// Rows the row buffers of a span fold hold: whole tiles of rows for the amx fold.
inline int64_t tile_padded_rows(int64_t rows) { return (rows + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows; }

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
}  // namespace corellm::attention
#include "amx_tile_config.h"
namespace corellm::attention {
namespace amx {

inline void configure_tiles() {
  amx_tiles::TileConfig cfg = amx_tiles::uniform_config();
  cfg.colsb[5] = 32;  // P: 8 key pairs per row
  cfg.rows[7] = 8;    // V: 8 key pairs
  amx_tiles::load_amx_config(cfg);
}

// Sums tile j (0-3) stored to p with a row stride of `stride` bytes. (Tile numbers are
// immediates.)
inline void store_sums(int j, float* p, int stride) {
  switch (j) {
    case 0: _tile_stored(0, p, stride); break;
    case 1: _tile_stored(1, p, stride); break;
    case 2: _tile_stored(2, p, stride); break;
    default: _tile_stored(3, p, stride); break;
  }
}

// S[r0 .. r0 + 16) x the span's keys, four 16-key tiles at a time, over the head's dim pairs in
// groups of 16.
template <int HD>
void tile_scores(const TileRows& rows, const Span& span, int64_t bs, int64_t r0, float* s) {
  const int k_stride = static_cast<int>(bs * 2 * sizeof(uint16_t));
  const int64_t vectors = span.keys / 16;
  for (int64_t kv0 = 0; kv0 < vectors; kv0 += 4) {
    const int64_t n = std::min<int64_t>(4, vectors - kv0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int dc = 0; dc < HD / 32; ++dc) {
      _tile_loadd(4, rows.qb + r0 * (HD / 2) + dc * 16, HD * 2);
      const int64_t dim_pairs = static_cast<int64_t>(dc) * 16 * bs * 2;  // elements to dim pair 16 dc
      _tile_loadd(6, span.k[kv0] + dim_pairs, k_stride);
      _tile_dpbf16ps(0, 4, 6);
      if (n > 1) {
        _tile_loadd(6, span.k[kv0 + 1] + dim_pairs, k_stride);
        _tile_dpbf16ps(1, 4, 6);
      }
      if (n > 2) {
        _tile_loadd(6, span.k[kv0 + 2] + dim_pairs, k_stride);
        _tile_dpbf16ps(2, 4, 6);
      }
      if (n > 3) {
        _tile_loadd(6, span.k[kv0 + 3] + dim_pairs, k_stride);
        _tile_dpbf16ps(3, 4, 6);
      }
    }
    for (int j = 0; j < n; ++j) store_sums(j, s + r0 * kSpanKeys + (kv0 + j) * 16, kSpanKeys * sizeof(float));
  }
}

// V's 8 key pairs x 16 dims at vv, for the tile product: in place when every key of the vector
// was written, else copied with the pairs (and pair halves) past `written` keys zeroed into
// `copy` (so that a stale NaN cannot meet a zero probability). Returns the address and row
// stride to load from.
template <int HD>
const uint16_t* values_operand(const uint16_t* vv, int64_t written, uint16_t* copy, int& stride) {
  if (written >= 16) {
    stride = HD * 2 * sizeof(uint16_t);
    return vv;
  }
  for (int j = 0; j < 8; ++j) {
    const __mmask32 keep = 2 * j + 1 < written ? 0xFFFFFFFFu : 2 * j < written ? 0x55555555u : 0u;
    _mm512_store_si512(copy + j * 32, _mm512_maskz_loadu_epi16(keep, vv + j * HD * 2));
  }
  stride = 64;
  return copy;
}

// acc[r0 .. r0 + 16) += P V over the span's vectors [kv_begin, kv_end), 64 dims at a time. acc
// was already rescaled. Rows of the tile outside [r_begin, r_end) (they see no key of the span:
// their P is stale) go through `spill` and are not written back.
template <int HD>
void tile_values(const TileRows& rows, const Span& span, int64_t r0, int64_t r_begin, int64_t r_end,
                 int64_t kv_begin, int64_t kv_end, const TileScratch& sc) {
  constexpr int kChunks = HD / 16;
  constexpr int kAccStride = HD * sizeof(float);
  alignas(64) uint16_t copy[8 * 32];
  alignas(64) float spill[kAmxTileRows * HD];
  const bool whole = r0 >= r_begin && r0 + kAmxTileRows <= r_end;
  float* acc = rows.acc + r0 * HD;
  for (int c0 = 0; c0 < kChunks; c0 += 4) {
    const int n = std::min(4, kChunks - c0);
    _tile_loadd(0, acc + 16 * c0, kAccStride);
    if (n > 1) _tile_loadd(1, acc + 16 * (c0 + 1), kAccStride);
    if (n > 2) _tile_loadd(2, acc + 16 * (c0 + 2), kAccStride);
    if (n > 3) _tile_loadd(3, acc + 16 * (c0 + 3), kAccStride);
    for (int64_t kv = kv_begin; kv < kv_end; ++kv) {
      _tile_loadd(5, sc.p + r0 * (kSpanKeys / 2) + kv * 8, kSpanKeys / 2 * sizeof(uint32_t));
      const int64_t written = span.valid_end - (span.t0 + kv * 16);
      for (int j = 0; j < n; ++j) {
        int stride = 0;
        const uint16_t* v = values_operand<HD>(span.v[kv] + 16 * (c0 + j) * 2, written, copy, stride);
        _tile_loadd(7, v, stride);
        switch (j) {
          case 0: _tile_dpbf16ps(0, 5, 7); break;
          case 1: _tile_dpbf16ps(1, 5, 7); break;
          case 2: _tile_dpbf16ps(2, 5, 7); break;
          default: _tile_dpbf16ps(3, 5, 7); break;
        }
      }
    }
    for (int j = 0; j < n; ++j) {
      if (whole) {
        store_sums(j, acc + 16 * (c0 + j), kAccStride);
      } else {
        store_sums(j, spill + 16 * (c0 + j), kAccStride);
      }
    }
  }
  if (!whole) {
    for (int64_t r = std::max(r0, r_begin); r < std::min(r0 + kAmxTileRows, r_end); ++r) {
      std::copy(spill + (r - r0) * HD, spill + (r - r0 + 1) * HD, acc + (r - r0) * HD);
    }
  }
}

// Folds the span into every row that sees a key of it (attention_tile.h's fold_span_bf16, on
// tiles).
template <int HD>
void fold_span_bf16(const TileRows& rows, const Span& span, int64_t bs, ScoreScaling scaling, const TileScratch& sc) {
  const auto [r_begin, r_end, key_lo, key_hi] = span_reach(rows, span);
  if (r_end <= r_begin) return;
  configure_tiles();
  const int64_t tile_begin = r_begin / kAmxTileRows * kAmxTileRows;
  for (int64_t r0 = tile_begin; r0 < r_end; r0 += kAmxTileRows) tile_scores<HD>(rows, span, bs, r0, sc.s);
  avx512::tile_softmax_rows(rows, span, r_begin, r_end, scaling, sc);
  for (int64_t r = r_begin; r < r_end; ++r) {  // acc rescaled here, before the tile products
    const __m512 correction = _mm512_set1_ps(sc.correction[r]);
    float* acc = rows.acc + r * HD;
    for (int c = 0; c < HD / 16; ++c) _mm512_storeu_ps(acc + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(acc + 16 * c), correction));
  }
  const int64_t kv_begin = key_lo / 16, kv_end = (key_hi + 15) / 16;
  for (int64_t r0 = tile_begin; r0 < r_end; r0 += kAmxTileRows) {
    tile_values<HD>(rows, span, r0, r_begin, r_end, kv_begin, kv_end, sc);
  }
  _tile_release();
}

}  // namespace amx
#pragma GCC pop_options

using SpanFoldFn = void (*)(const TileRows& rows, const Span& span, int64_t bs, ScoreScaling scaling,
                           const TileScratch& sc);

// A path's fold for head size hd among its four instantiations (null: another head size).
inline SpanFoldFn fold_for_head_size(int64_t hd, SpanFoldFn hd32, SpanFoldFn hd64, SpanFoldFn hd128,
                                     SpanFoldFn hd256) {
  switch (hd) {
    case 32: return hd32;
    case 64: return hd64;
    case 128: return hd128;
    case 256: return hd256;
    default: return nullptr;
  }
}

// The span fold for this head size and block size on path `isa` (amx: the tile fold above;
// avx512bf16: attention_tile.h's; avx512: attention_span_avx512.h's and avx2:
// attention_span_avx2.h's, widened), or null for other shapes (the generic per-token fold).
inline SpanFoldFn select_span_fold(int64_t hd, int64_t bs, CpuIsa isa) {
  if (bs % 16 != 0 || bs > kSpanKeys) return nullptr;
  switch (isa) {
    case CpuIsa::kAmx:
      return fold_for_head_size(hd, &amx::fold_span_bf16<32>, &amx::fold_span_bf16<64>, &amx::fold_span_bf16<128>,
                                &amx::fold_span_bf16<256>);
    case CpuIsa::kAvx512Bf16:
      return fold_for_head_size(hd, &avx512::fold_span_bf16<32>, &avx512::fold_span_bf16<64>,
                                &avx512::fold_span_bf16<128>, &avx512::fold_span_bf16<256>);
    case CpuIsa::kAvx512:
      return fold_for_head_size(hd, &avx512f::fold_span_bf16<32>, &avx512f::fold_span_bf16<64>,
                                &avx512f::fold_span_bf16<128>, &avx512f::fold_span_bf16<256>);
    default:
      return fold_for_head_size(hd, &avx2::fold_span_bf16<32>, &avx2::fold_span_bf16<64>, &avx2::fold_span_bf16<128>,
                                &avx2::fold_span_bf16<256>);
  }
}

}  // namespace corellm::attention
