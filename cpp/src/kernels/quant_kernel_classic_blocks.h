// quant_gemm's vector loops for the types whose values are nibbles, 5th or 6th bits, or bytes:
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32-value blocks) and Q4_K, Q5_K, Q6_K (256-value blocks): each
// block's values built once for the MR rows, then each row's integer sums and the type's epilogue
// (quant_gemm.h). The AMX path (quant_gemm_amx.cpp) ends in these same epilogues.
// Part of quant_gemm_kernel.h's loops (its header says what a Lanes policy provides): include that
// header, inside the path's target region, not this one.
#pragma once

#include "quant_kernel_integers.h"

namespace corellm::quant::kernel {
namespace {

// The 32 (legacy types) values of one row's block in the panel as 8 vectors V, V[v] pairing with
// activation values 4v .. 4v + 3.
template <class Lanes, QuantType T>
inline void legacy_values(const uint8_t* pb, I<Lanes>* V) {
  constexpr Layout L = layout_of(T);
  I<Lanes> h{};
  if constexpr (L.h_off >= 0) h = Lanes::load(pb + L.h_off);
  for (int g = 0; g < 4; ++g) {
    const I<Lanes> v = Lanes::load(pb + L.q_off + 64 * g);
    V[g] = Lanes::low_nibbles(v);
    V[4 + g] = Lanes::high_nibbles(v);
  }
  if constexpr (L.h_off >= 0) {  // 5th bits: value 4g + i at bit g, 16 + 4g + i at bit 4 + g
    V[0] = Lanes::or_(V[0], move_bits<Lanes, 0, 4, 1>(h));
    V[1] = Lanes::or_(V[1], move_bits<Lanes, 1, 4, 1>(h));
    V[2] = Lanes::or_(V[2], move_bits<Lanes, 2, 4, 1>(h));
    V[3] = Lanes::or_(V[3], move_bits<Lanes, 3, 4, 1>(h));
    V[4] = Lanes::or_(V[4], move_bits<Lanes, 4, 4, 1>(h));
    V[5] = Lanes::or_(V[5], move_bits<Lanes, 5, 4, 1>(h));
    V[6] = Lanes::or_(V[6], move_bits<Lanes, 6, 4, 1>(h));
    V[7] = Lanes::or_(V[7], move_bits<Lanes, 7, 4, 1>(h));
  }
}

// The epilogues of quant_gemm.h on one row's 16 lanes, from the integer sums S of a weight block
// (legacy types; Q8_0's values are u = q + 128, its offset 128) or sub-block: every path (the
// vector loops here, the AMX tiles of quant_gemm_amx.cpp) ends in these same float operations.
template <class Lanes, QuantType T>
inline F<Lanes> legacy_epilogue(F<Lanes> acc, I<Lanes> S, F<Lanes> d, F<Lanes> m, const QuantizedRows& x,
                                int64_t row, int64_t b) {
  constexpr Layout L = layout_of(T);
  const F<Lanes> scale = Lanes::mul(d, Lanes::set1_f(x.row_d(row)[b]));
  if constexpr (L.has_min) {
    acc = Lanes::fmadd(Lanes::cvt(S), scale, acc);
    return Lanes::fmadd(m, Lanes::set1_f(x.row_s(row)[b]), acc);
  }
  const int32_t* sum16 = x.row_sum16(row) + 2 * b;
  const I<Lanes> t = Lanes::sub(S, Lanes::set1_i(L.offset * (sum16[0] + sum16[1])));
  return Lanes::fmadd(Lanes::cvt(t), scale, acc);
}

// Q4_K / Q5_K sub-block of activation block a: scale = d sc_j, mins = dmin mn_j (per lane).
template <class Lanes>
inline F<Lanes> k_epilogue(F<Lanes> acc, I<Lanes> S, F<Lanes> scale, F<Lanes> mins, const QuantizedRows& x,
                           int64_t row, int64_t a) {
  acc = Lanes::fmadd(Lanes::cvt(S), Lanes::mul(scale, Lanes::set1_f(x.row_d(row)[a])), acc);
  return Lanes::fnmadd(mins, Lanes::set1_f(x.row_s(row)[a]), acc);
}

// Q6_K (Offset 32) or Q3_K (Offset 4) over activation block a: its two sub-blocks of 16 (sums Sa,
// Sb; int8 scales sc_a, sc_b).
template <class Lanes, int Offset>
inline F<Lanes> signed16_epilogue(F<Lanes> acc, I<Lanes> Sa, I<Lanes> Sb, I<Lanes> sc_a, I<Lanes> sc_b, F<Lanes> d,
                                  const QuantizedRows& x, int64_t row, int64_t a) {
  const int32_t* sum16 = x.row_sum16(row) + 2 * a;
  const I<Lanes> ta = Lanes::sub(Sa, Lanes::set1_i(Offset * sum16[0]));
  const I<Lanes> tb = Lanes::sub(Sb, Lanes::set1_i(Offset * sum16[1]));
  const I<Lanes> T = Lanes::add(Lanes::mullo(sc_a, ta), Lanes::mullo(sc_b, tb));
  return Lanes::fmadd(Lanes::cvt(T), Lanes::mul(d, Lanes::set1_f(x.row_d(row)[a])), acc);
}

template <class Lanes, QuantType T, int MR>
inline void legacy_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(T);
  const F<Lanes> d = Lanes::f16(pb + L.d_off);
  F<Lanes> m{};
  if constexpr (L.has_min) m = Lanes::f16(pb + L.m_off);
  I<Lanes> V[16];
  if constexpr (T != QuantType::kQ8_0) legacy_values<Lanes, T>(pb, V);
  if constexpr (T == QuantType::kQ8_0 && HasQ8Values<Lanes>::value) Lanes::q8_values(pb + L.q_off, V);
  for (int r = 0; r < MR; ++r) {
    const int8_t* xq = x.row_q(r0 + r) + 32 * b;
    I<Lanes> S;
    if constexpr (T == QuantType::kQ8_0 && HasQ8Values<Lanes>::value) {
      const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * b;
      S = Lanes::q8_dots(V, xq, sum16[0] + sum16[1]);
    } else if constexpr (T == QuantType::kQ8_0) {
      S = Lanes::q8_block(pb + L.q_off, xq);
    } else {
      S = dots<Lanes, 8, max_unsigned(T)>(V, xq);
    }
    acc[r] = legacy_epilogue<Lanes, T>(acc[r], S, d, m, x, r0 + r, b);
  }
}

// Run t (64 values) of a K-type block: V[g] pairs with values 4g .. (low half), V[8 + g] with
// 32 + 4g .. (high half).
template <class Lanes, QuantType T>
inline void k_run_values(const uint8_t* pb, int t, I<Lanes>* V) {
  constexpr Layout L = layout_of(T);
  for (int g = 0; g < 8; ++g) {
    const I<Lanes> v = Lanes::load(pb + L.q_off + 512 * t + 64 * g);
    V[g] = Lanes::low_nibbles(v);
    V[8 + g] = Lanes::high_nibbles(v);
  }
  if constexpr (T == QuantType::kQ5_K) {  // 5th bits: two vectors, bit g of byte 4c + i
    const I<Lanes> h0 = Lanes::load(pb + L.h_off + 128 * t), h1 = Lanes::load(pb + L.h_off + 128 * t + 64);
#define CORELLM_Q5K_BIT(g)                                              \
  V[g] = Lanes::or_(V[g], move_bits<Lanes, g, 4, 1>(h0));               \
  V[8 + g] = Lanes::or_(V[8 + g], move_bits<Lanes, g, 4, 1>(h1));
    CORELLM_Q5K_BIT(0) CORELLM_Q5K_BIT(1) CORELLM_Q5K_BIT(2) CORELLM_Q5K_BIT(3)
    CORELLM_Q5K_BIT(4) CORELLM_Q5K_BIT(5) CORELLM_Q5K_BIT(6) CORELLM_Q5K_BIT(7)
#undef CORELLM_Q5K_BIT
  } else if constexpr (T == QuantType::kQ6_K) {  // two high bits: vector g / 2, bits 4 (g % 2) (+ 2)
    for (int v = 0; v < 4; ++v) {
      const I<Lanes> h = Lanes::load(pb + L.h_off + 256 * t + 64 * v);
      V[2 * v] = Lanes::or_(V[2 * v], move_bits<Lanes, 0, 4, 2>(h));
      V[8 + 2 * v] = Lanes::or_(V[8 + 2 * v], move_bits<Lanes, 2, 4, 2>(h));
      V[2 * v + 1] = Lanes::or_(V[2 * v + 1], move_bits<Lanes, 4, 4, 2>(h));
      V[8 + 2 * v + 1] = Lanes::or_(V[8 + 2 * v + 1], move_bits<Lanes, 6, 4, 2>(h));
    }
  }
}

template <class Lanes, QuantType T, int MR>
inline void k_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(T);
  const F<Lanes> d = Lanes::f16(pb + L.d_off);
  for (int t = 0; t < 4; ++t) {
    I<Lanes> V[16];
    k_run_values<Lanes, T>(pb, t, V);
    if constexpr (T == QuantType::kQ6_K) {
      I<Lanes> sc[4];  // sub-blocks of 16: 4t (V 0-3), 4t + 1 (V 4-7), 4t + 2 (V 8-11), 4t + 3 (V 12-15)
      for (int s = 0; s < 4; ++s) sc[s] = Lanes::i8(pb + L.sc_off + 16 * (4 * t + s));
      for (int r = 0; r < MR; ++r) {
        for (int h = 0; h < 2; ++h) {  // activation block 8b + 2t + h
          const int64_t a = 8 * b + 2 * t + h;
          const int8_t* xq = x.row_q(r0 + r) + 32 * a;
          acc[r] = signed16_epilogue<Lanes, 32>(acc[r], dots<Lanes, 4, 63>(V + 8 * h, xq),
                                                dots<Lanes, 4, 63>(V + 8 * h + 4, xq + 16), sc[2 * h], sc[2 * h + 1],
                                                d, x, r0 + r, a);
        }
      }
    } else {
      const F<Lanes> dmin = Lanes::f16(pb + L.m_off);
      F<Lanes> scale[2], mins[2];  // sub-blocks 2t (V 0-7) and 2t + 1 (V 8-15)
      for (int h = 0; h < 2; ++h) {
        scale[h] = Lanes::mul(d, Lanes::u8(pb + L.sc_off + 16 * (2 * t + h)));
        mins[h] = Lanes::mul(dmin, Lanes::u8(pb + L.mn_off + 16 * (2 * t + h)));
      }
      for (int r = 0; r < MR; ++r) {
        for (int h = 0; h < 2; ++h) {
          const int64_t a = 8 * b + 2 * t + h;
          const I<Lanes> S = dots<Lanes, 8, max_unsigned(T)>(V + 8 * h, x.row_q(r0 + r) + 32 * a);
          acc[r] = k_epilogue<Lanes>(acc[r], S, scale[h], mins[h], x, r0 + r, a);
        }
      }
    }
  }
}

}  // namespace
}  // namespace corellm::quant::kernel
