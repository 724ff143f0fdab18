// quant_gemm's vector loops (quant_gemm.h), written once over a Lanes policy that holds one
// 32-bit lane per panel row (16 lanes: one AVX-512 register, or two AVX2 ones):
//   Lanes::I, Lanes::F         16 int32 / fp32 lanes
//   load(p)                    64 bytes: 4 bytes per lane
//   low_nibbles(v), high_nibbles(v), shift16<S>(v) (S > 0 left, < 0 right, in 16-bit lanes),
//   and_bytes(v, b), or_(a, b), add, sub, mullo, set1_i
//   the products, one of two ways:
//   dot(acc, u, x4)            acc + sum over the lane's 4 bytes of u (unsigned, < 128) times
//                              x4's 4 bytes (signed): vpdpbusd
//   q8_block(p, xq)            sum over a Q8_0 panel-block's 8 vectors of u times xq (u = q + 128
//                              up to 255)
//   or (HasPairSums, HasQ8Values: AVX2's maddubs, whose pair sums are 16-bit)
//   pair_sums(u, x4), add16, widen16   the lane's two 16-bit pair sums, added, widened to 32 bits
//   q8_values(p, V), q8_dots(V, xq, xsum)   a Q8_0 block's values made once for all rows
//                              (16 vectors), then each row's sum of u times xq
//   f16(p), bf16(p), u8(p), u8i(p), i8(p)   16 fp16 / bf16 / unsigned bytes (as floats, as
//                              integers) / signed bytes -> lanes
//   u8_pairs(lo, hi), madd16   lanes of lo[c] | hi[c] << 16 (two unsigned bytes); per lane the
//                              sum of its two 16-bit products
//   levels(v, values)          each byte's 4-bit level index -> the table's level plus 128 (a byte
//                              lookup; IQ4's and MXFP4's tables: quant_formats.h's nibble_levels)
//   q8_values_of(U, V)         (HasQ8Values) q8_values from 8 vectors of unsigned bytes in registers
//   cvt, fmadd, fnmadd, mul, set1_f, zero_f, store16(float*, F)
//   kNonTemporalOneRow         one row's panels of the streaming types fetched with the
//                              non-temporal hint on AMD CPUs (next_panel.h): where measured faster
// Per panel and block of MR rows, for each weight block: the block's unsigned values are built
// once in registers (nibbles masked, high bits moved in), then for each row the integer dot
// products and the type's epilogue (quant_gemm.h), lane by lane the same float operations as the
// reference path. The integer sums are split into independent chains, or added in 16 bits as far
// as they cannot overflow (integers add exactly: the order does not change them).
// Meanwhile the thread's next panel is fetched into L2 (next_panel.h). The pieces, one header
// each: quant_kernel_integers.h (the integer dot products and bit moves every type uses),
// quant_kernel_classic_blocks.h (Q4_0 ... Q8_0, Q4_K ... Q6_K), quant_kernel_low_bit_blocks.h (Q2_K,
// Q3_K, IQ4_NL, IQ4_XS, MXFP4); this one drives them over panels and rows.
//
// Include it inside the path's target region, after every system header: its templates are
// compiled for that path's instructions, in each source its own copy.
#pragma once

#include "quant_kernel_classic_blocks.h"
#include "quant_kernel_integers.h"
#include "quant_kernel_low_bit_blocks.h"

namespace corellm::quant::kernel {
namespace {

// Rows [r0, r0 + rows) of panel p's 16 columns of y from their fp32 sums: the bias, then one
// rounding, as the reference path.
template <class Lanes>
void store_rows(const QuantGemmArgs& a, const F<Lanes>* acc, int64_t r0, int rows, int64_t p) {
  const int64_t col0 = p * kQuantPanelRows;
  const int cols = static_cast<int>(std::min<int64_t>(kQuantPanelRows, a.n - col0));
  for (int r = 0; r < rows; ++r) {
    float sums[16];
    Lanes::store16(sums, acc[r]);
    for (int c = 0; c < cols; ++c) {
      float v = sums[c];
      if (a.bias != nullptr) v += bf16_to_f32(a.bias[col0 + c]);
      const int64_t at = (r0 + r) * a.y_stride + col0 + c;
      if (a.y_dtype == DType::F32) {
        static_cast<float*>(a.y)[at] = v;
      } else {
        static_cast<uint16_t*>(a.y)[at] = f32_to_bf16(v);
      }
    }
  }
}

// Rows [r0, r0 + MR) x panel p; the thread's next panel fetched meanwhile (next_panel.h).
template <class Lanes, QuantType T, int MR>
void panel_rows(const QuantGemmArgs& a, const QuantizedRows& x, int64_t r0, int64_t p, NextPanel& next) {
  constexpr Layout L = layout_of(T);
  const int64_t nb = a.k / L.block;
  const uint8_t* panel = a.packed + p * nb * L.bytes;
  F<Lanes> acc[MR];
  for (int r = 0; r < MR; ++r) acc[r] = Lanes::zero_f();
  for (int64_t b = 0; b < nb; ++b) {
    next.step();
    if constexpr (T == QuantType::kIQ4_NL || T == QuantType::kMXFP4) {
      iq4_nl_block<Lanes, MR, T>(panel + b * L.bytes, x, r0, b, acc);
    } else if constexpr (T == QuantType::kIQ4_XS) {
      iq4_xs_block<Lanes, MR>(panel + b * L.bytes, x, r0, b, acc);
    } else if constexpr (L.block == 32) {
      legacy_block<Lanes, T, MR>(panel + b * L.bytes, x, r0, b, acc);
    } else if constexpr (T == QuantType::kQ2_K) {
      q2_block<Lanes, MR>(panel + b * L.bytes, x, r0, b, acc);
    } else if constexpr (T == QuantType::kQ3_K) {
      q3_block<Lanes, MR>(panel + b * L.bytes, x, r0, b, acc);
    } else {
      k_block<Lanes, T, MR>(panel + b * L.bytes, x, r0, b, acc);
    }
  }
  store_rows<Lanes>(a, acc, r0, MR, p);
}

// Rows [r0, r1) x panel p in blocks of Lanes::kMaxRows, whose sums wait in memory where they
// outnumber the registers (each block's weight values are built once for all its rows); the rows
// left in blocks of kTailRows where kMaxRows is larger, then one at a time. `after`: the panel to
// fetch meanwhile (-1: none).
template <class Lanes, QuantType T>
void panel(const QuantGemmArgs& a, const QuantizedRows& x, int64_t r0, int64_t r1, int64_t p, int64_t after) {
  constexpr int kRows = Lanes::kMaxRows;
  constexpr int kTailRows = kRows >= 16 && kRows % 4 == 0 ? 4 : 1;
  constexpr Layout L = layout_of(T);
  const int64_t panel_bytes = a.k / L.block * L.bytes, rows = r1 - r0;
  const int64_t left = rows % kRows;
  const int64_t blocks_of_rows = rows / kRows + left / kTailRows + left % kTailRows;
  // the types whose panels gained from the non-temporal hint, on the paths where it did (next_panel.h)
  constexpr bool kStreams = Lanes::kNonTemporalOneRow && (T == QuantType::kQ4_0 || T == QuantType::kQ4_1 ||
                                                          T == QuantType::kQ8_0 || T == QuantType::kIQ4_NL ||
                                                          T == QuantType::kMXFP4);
  NextPanel next = after >= 0 ? NextPanel(a.packed + after * panel_bytes, panel_bytes,
                                          blocks_of_rows * (a.k / L.block), read_once_panel(kStreams, rows))
                              : NextPanel();
  int64_t r = r0;
  for (; r + kRows <= r1; r += kRows) panel_rows<Lanes, T, kRows>(a, x, r, p, next);
  if constexpr (kTailRows > 1) {
    for (; r + kTailRows <= r1; r += kTailRows) panel_rows<Lanes, T, kTailRows>(a, x, r, p, next);
  }
  for (; r < r1; ++r) panel_rows<Lanes, T, 1>(a, x, r, p, next);
}

// Every panel the thread claims, for the claims' rows.
template <class Lanes, QuantType T>
void panels(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  for (int64_t p = claims.take(); p >= 0; p = claims.take()) {
    panel<Lanes, T>(a, x, claims.r0, claims.r1, p, claims.likely_next());
  }
}

template <class Lanes>
void run(const QuantGemmArgs& a, const QuantizedRows& x, const PanelClaims& claims) {
  switch (a.type) {
    case QuantType::kQ4_0: return panels<Lanes, QuantType::kQ4_0>(a, x, claims);
    case QuantType::kQ4_1: return panels<Lanes, QuantType::kQ4_1>(a, x, claims);
    case QuantType::kQ5_0: return panels<Lanes, QuantType::kQ5_0>(a, x, claims);
    case QuantType::kQ5_1: return panels<Lanes, QuantType::kQ5_1>(a, x, claims);
    case QuantType::kQ8_0: return panels<Lanes, QuantType::kQ8_0>(a, x, claims);
    case QuantType::kQ2_K: return panels<Lanes, QuantType::kQ2_K>(a, x, claims);
    case QuantType::kQ3_K: return panels<Lanes, QuantType::kQ3_K>(a, x, claims);
    case QuantType::kIQ4_NL: return panels<Lanes, QuantType::kIQ4_NL>(a, x, claims);
    case QuantType::kMXFP4: return panels<Lanes, QuantType::kMXFP4>(a, x, claims);
    case QuantType::kIQ4_XS: return panels<Lanes, QuantType::kIQ4_XS>(a, x, claims);
    case QuantType::kQ4_K: return panels<Lanes, QuantType::kQ4_K>(a, x, claims);
    case QuantType::kQ5_K: return panels<Lanes, QuantType::kQ5_K>(a, x, claims);
    case QuantType::kQ6_K: return panels<Lanes, QuantType::kQ6_K>(a, x, claims);
  }
}

}  // namespace
}  // namespace corellm::quant::kernel
