// quant_gemm on AMX-INT8 tiles (the amx path of quant_gemm.h), for whole tiles of 16 x rows; rows
// left over go to the avx512vnni loops, and every epilogue is theirs (quant_gemm_kernel.h).
//
// Per panel (16 rows of W) and chunk of x rows, the panel's values are first laid out as B tiles:
// for each group of 32 values (a legacy block, or a K type's sub-block of 32) 8 rows of 64
// bytes, row v holding values 4v .. 4v + 3 of each of the 16 panel rows — the vector paths'
// operand order, unpacked to bytes (Q8_0's panel-blocks already are that). Then per 16 x rows
// and group: TDPBSUD (x int8, signed; values unsigned) into a 16 x 16 int32 tile, the group's
// exact integer sums; stored, and the type's epilogue applied row by row to 16 accumulators.
// Integer sums are exact whatever computes them and the epilogue is the same float operations,
// so a row's result is the other paths' bit for bit: batch invariance holds across the tiles and
// the leftover rows. The epilogue, not the tiles, bounds the speed: 1.1-1.4x the avx512vnni loops
// on 16-512 rows (Q4_1, Q8_0, Q4_K); Q6_K, whose sub-blocks of 16 need two dot products of depth
// 16 and two stores per 32 values, gains nothing (0.9-1.1x) and stays on the vector loops; so
// do Q2_K and Q3_K, whose sub-blocks are of 16 too. IQ4_NL, MXFP4 and IQ4_XS lay their levels out
// (looked up once per panel, plus 128: unsigned bytes, the epilogue taking 128 x's sum back off, as
// Q8_0's; IQ4_XS's then times its sub-block's int8 scale): the whole model's projections, Intel Xeon
// VM, 2 threads, alternating builds, IQ4_NL / MXFP4 at 16 / 64 / 512 rows 10.1-10.4 -> 7.3-7.7,
// 35.1-36.1 -> 21.6-22.4 and 263-271 -> 162-167 ms; IQ4_XS (the down projections) 2.70-2.85 ->
// 2.06-2.34, 8.9-9.5 -> 6.0-6.8, 66.6-70.2 -> 44.8-48.7 ms. As on the vector loops, the thread's next panel is fetched into L2 (next_panel.h) a
// step per block of each 16 rows: SmolLM2 Q4_1 decode steps of 16 / 32 / 64 requests 15.0-15.7 ->
// 12.7-12.9 / 25.8-27.5 -> 22.2-23.7 / 49.8-51.3 -> 47.2-48.6 ms (Intel Xeon VM, 2 threads).
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "quant_formats.h"
#include "quant_gemm_paths.h"
#include "thread_scratch.h"

// Compiled for AMX-INT8 and AVX-512-VNNI whatever the build's baseline; it runs only where
// quant_path() found them and the OS granted tile data.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,amx-tile,amx-int8")

#include "amx_tile_config.h"
#include "quant_gemm_kernel.h"
#include "quant_lanes_avx512.h"

// Its own namespace: every function of this path carries "amx" in its name (tests/ops/
// test_portable_build.py tells the paths' functions from the baseline's by their names).
namespace corellm::quant::amx {

namespace {

using Lanes = Avx512VnniLanes;
using kernel::I;
using kernel::F;

constexpr int kTileRows = 16;
constexpr int kGroupBytes = 512;  // one group's B tile: 8 rows x 64 bytes
// Tiles (the tile intrinsics take literal numbers): 0 the sums (16 x 16 int32), 1 x (16 rows x 32
// values), 2 the values (8 x 64 bytes).
enum Tile { kSums = 0, kX = 1, kValues = 2 };

void configure_tiles() {
  amx_tiles::TileConfig cfg{};
  cfg.palette_id = 1;
  auto set = [&](int t, int rows, int bytes) {
    cfg.rows[t] = static_cast<uint8_t>(rows);
    cfg.colsb[t] = static_cast<uint16_t>(bytes);
  };
  set(kSums, 16, 64);
  set(kX, 16, 32);
  set(kValues, 8, 64);
  amx_tiles::load_amx_config(cfg);
}

void store_vectors(uint8_t* out, const I<Lanes>* V, int count) {
  for (int v = 0; v < count; ++v) _mm512_store_si512(out + 64 * v, V[v]);
}

// The panel's values as B tiles, group after group (group g: values 32g .. 32g + 31 along k);
// Q4_K / Q5_K runs of 64 values give two groups each; IQ4_XS's sub-blocks of 32 one each.
template <QuantType T>
void lay_out_values(const uint8_t* panel, int64_t blocks, uint8_t* out) {
  constexpr Layout L = layout_of(T);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* pb = panel + b * L.bytes;
    if constexpr (L.block == 32) {
      I<Lanes> V[8];
      if constexpr (T == QuantType::kIQ4_NL || T == QuantType::kMXFP4) {
        kernel::iq4_values<Lanes, T>(pb + L.q_off, V);  // the levels plus 128, unsigned as the tiles take them
      } else {
        kernel::legacy_values<Lanes, T>(pb, V);
      }
      store_vectors(out + b * kGroupBytes, V, 8);
    } else if constexpr (T == QuantType::kIQ4_XS) {
      for (int j = 0; j < 8; ++j) {
        I<Lanes> V[8];
        kernel::iq4_values<Lanes, T>(pb + L.q_off + 256 * j, V);
        store_vectors(out + (8 * b + j) * kGroupBytes, V, 8);
      }
    } else {
      for (int t = 0; t < 4; ++t) {
        I<Lanes> V[16];
        kernel::k_run_values<Lanes, T>(pb, t, V);
        store_vectors(out + (8 * b + 2 * t) * kGroupBytes, V, 16);  // groups 8b + 2t and 8b + 2t + 1
      }
    }
  }
}

// 16 x rows from r0: the integer sums of group g (x at values 32 g + offset) into `sums`.
inline void tile_sums(const QuantizedRows& x, int64_t r0, int64_t g, const uint8_t* values, int32_t* sums) {
  // Every other group, the 16 rows' next lines of x (two groups each) asked for into L1: the x
  // tile's load, 16 lines from L2, was where the tiles waited most (a quarter of the samples in a
  // Q4_1 prefill). Whole-model Q4_1 GEMM, Intel Xeon VM, 2 threads, three alternating runs: 64 rows
  // 20.4-20.9 -> 18.5-19.1 ms, 512 rows 136-151 -> 131-146.
  if (g % 2 == 0 && 32 * (g + 2) < x.k) {
    const int8_t* ahead = x.row_q(r0) + 32 * (g + 2);
#pragma GCC unroll 16
    for (int r = 0; r < kTileRows; ++r) _mm_prefetch(reinterpret_cast<const char*>(ahead + r * x.k), _MM_HINT_T0);
  }
  _tile_zero(0);                                   // kSums
  _tile_loadd(1, x.row_q(r0) + 32 * g, x.k);       // kX
  _tile_loadd(2, values, 64);                      // kValues
  _tile_dpbsud(0, 1, 2);
  _tile_stored(0, sums, 64);
}

inline I<Lanes> sums_row(const int32_t* sums, int r) { return _mm512_load_si512(sums + 16 * r); }

// Rows [r0, r0 + 16) x panel p.
template <QuantType T>
void tile_rows(const QuantGemmArgs& a, const QuantizedRows& x, int64_t r0, int64_t p, const uint8_t* values,
               int32_t* sums, NextPanel& next) {
  constexpr Layout L = layout_of(T);
  const int64_t blocks = a.k / L.block;
  const uint8_t* panel = a.packed + p * blocks * L.bytes;
  // The 16 fp32 sums stay in registers: every loop over them unrolled (constant indices), and only a
  // copy's address given to store_rows. Otherwise acc lived on the stack, loaded and stored around
  // each fused multiply-add, because the tile store may write any memory whose address escaped.
  F<Lanes> acc[kTileRows];
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r) acc[r] = Lanes::zero_f();
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* pb = panel + b * L.bytes;
    next.step();
    const F<Lanes> d = T == QuantType::kMXFP4 ? Lanes::bf16(pb + L.d_off) : Lanes::f16(pb + L.d_off);
    if constexpr (L.block == 32) {
      F<Lanes> m{};
      if constexpr (L.has_min) m = Lanes::f16(pb + L.m_off);
      tile_sums(x, r0, b, T == QuantType::kQ8_0 ? pb + L.q_off : values + b * kGroupBytes, sums);
#pragma GCC unroll 16
      for (int r = 0; r < kTileRows; ++r) {
        acc[r] = kernel::legacy_epilogue<Lanes, T>(acc[r], sums_row(sums, r), d, m, x, r0 + r, b);
      }
    } else if constexpr (T == QuantType::kIQ4_XS) {  // iq4_xs_block's: sc_j (S_j - 128 Sx_j), then d d_x
      for (int j = 0; j < 8; ++j) {
        const int64_t g = 8 * b + j;
        const I<Lanes> sc = Lanes::i8(pb + L.sc_off + 16 * j);
        tile_sums(x, r0, g, values + g * kGroupBytes, sums);
#pragma GCC unroll 16
        for (int r = 0; r < kTileRows; ++r) {
          const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * g;
          const I<Lanes> S = Lanes::sub(sums_row(sums, r), Lanes::set1_i(128 * (sum16[0] + sum16[1])));
          acc[r] = kernel::iq4_epilogue<Lanes>(acc[r], Lanes::mullo(sc, S), d, x, r0 + r, g);
        }
      }
    } else {
      const F<Lanes> dmin = Lanes::f16(pb + L.m_off);
      for (int j = 0; j < 8; ++j) {
        const int64_t g = 8 * b + j;
        const F<Lanes> scale = Lanes::mul(d, Lanes::u8(pb + L.sc_off + 16 * j));
        const F<Lanes> mins = Lanes::mul(dmin, Lanes::u8(pb + L.mn_off + 16 * j));
        tile_sums(x, r0, g, values + g * kGroupBytes, sums);
#pragma GCC unroll 16
        for (int r = 0; r < kTileRows; ++r) {
          acc[r] = kernel::k_epilogue<Lanes>(acc[r], sums_row(sums, r), scale, mins, x, r0 + r, g);
        }
      }
    }
  }
  F<Lanes> out[kTileRows];
#pragma GCC unroll 16
  for (int r = 0; r < kTileRows; ++r) out[r] = acc[r];
  kernel::store_rows<Lanes>(a, out, r0, kTileRows, p);
}

// Per panel the thread claims: rows in tiles of 16 through AMX (the tile configuration once per
// call), then the rows past the last whole tile through the vector kernel while the panel is in
// the caches.
template <QuantType T>
void run_type(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  constexpr Layout L = layout_of(T);
  const int64_t blocks = a.k / L.block;
  const int64_t tiled_end = claims.r0 + (claims.r1 - claims.r0) / kTileRows * kTileRows;
  if (tiled_end == claims.r0) return kernel::panels<Lanes, T>(a, x, claims);
  configure_tiles();
  uint8_t* values = thread_scratch<struct LaidOutValues, uint8_t>(a.k / 32 * kGroupBytes + 1024);
  auto* sums = reinterpret_cast<int32_t*>(values + a.k / 32 * kGroupBytes);
  const int64_t panel_bytes = blocks * L.bytes;
  for (int64_t p = claims.take(); p >= 0; p = claims.take()) {
    if constexpr (T != QuantType::kQ8_0) lay_out_values<T>(a.packed + p * panel_bytes, blocks, values);
    const int64_t after = claims.likely_next();
    NextPanel next = after >= 0 ? NextPanel(a.packed + after * panel_bytes, panel_bytes,
                                            (tiled_end - claims.r0) / kTileRows * blocks)
                                : NextPanel();
    for (int64_t r = claims.r0; r < tiled_end; r += kTileRows) tile_rows<T>(a, x, r, p, values, sums, next);
    if (tiled_end < claims.r1) kernel::panel<Lanes, T>(a, x, tiled_end, claims.r1, p, /*after=*/-1);
  }
  _tile_release();
}

}  // namespace
}  // namespace corellm::quant::amx

namespace corellm::quant {

void quant_gemm_amx(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  using amx::run_type;
  switch (a.type) {
    case QuantType::kQ4_0: return run_type<QuantType::kQ4_0>(a, x, claims);
    case QuantType::kQ4_1: return run_type<QuantType::kQ4_1>(a, x, claims);
    case QuantType::kQ5_0: return run_type<QuantType::kQ5_0>(a, x, claims);
    case QuantType::kQ5_1: return run_type<QuantType::kQ5_1>(a, x, claims);
    case QuantType::kQ8_0: return run_type<QuantType::kQ8_0>(a, x, claims);
    case QuantType::kQ4_K: return run_type<QuantType::kQ4_K>(a, x, claims);
    case QuantType::kQ5_K: return run_type<QuantType::kQ5_K>(a, x, claims);
    case QuantType::kQ6_K: return kernel::panels<Avx512VnniLanes, QuantType::kQ6_K>(a, x, claims);
    case QuantType::kQ2_K: return kernel::panels<Avx512VnniLanes, QuantType::kQ2_K>(a, x, claims);
    case QuantType::kQ3_K: return kernel::panels<Avx512VnniLanes, QuantType::kQ3_K>(a, x, claims);
    case QuantType::kIQ4_NL: return run_type<QuantType::kIQ4_NL>(a, x, claims);
    case QuantType::kMXFP4: return run_type<QuantType::kMXFP4>(a, x, claims);
    case QuantType::kIQ4_XS: return run_type<QuantType::kIQ4_XS>(a, x, claims);
  }
}

}  // namespace corellm::quant

#pragma GCC pop_options
