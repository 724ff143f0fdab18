// quant_gemm's vector loops for the types added on top of the classic ones: Q2_K and Q3_K (2-bit
// planes, 16-value sub-blocks; Q3_K's 3rd bits in a plane of their own) and IQ4_NL / IQ4_XS /
// MXFP4 (4-bit indices of levels, looked up in registers).
// Part of quant_gemm_kernel.h's loops (its header says what a Lanes policy provides): include that
// header, inside the path's target region, not this one.
#pragma once

#include "quant_kernel_classic_blocks.h"

namespace corellm::quant::kernel {
namespace {

// Q2_K over activation block a, from its integers T = sc_a S_a + sc_b S_b and M = mn_a Sx_a +
// mn_b Sx_b (sub-blocks a, b of 16).
template <class Lanes>
inline F<Lanes> q2_epilogue(F<Lanes> acc, I<Lanes> T, I<Lanes> M, F<Lanes> d, F<Lanes> dmin, const QuantizedRows& x,
                            int64_t row, int64_t a) {
  const F<Lanes> dx = Lanes::set1_f(x.row_d(row)[a]);
  acc = Lanes::fmadd(Lanes::cvt(T), Lanes::mul(d, dx), acc);
  return Lanes::fnmadd(Lanes::cvt(M), Lanes::mul(dmin, dx), acc);
}

// IQ4_NL / IQ4_XS / MXFP4 (T): 32 values' level indices (nibbles at q, a run of 32 laid out as the
// legacy types') looked up as u = kv + 128 (kv the type's levels, nibble_levels), in the form the
// Lanes' products take: |kv| and kv, 16 vectors (HasQ8Values: Q8_0's signed products on AVX2), or u
// itself, 8 vectors.
template <class Lanes, QuantType T = QuantType::kIQ4_NL>
inline void iq4_values(const uint8_t* q, I<Lanes>* V) {
  I<Lanes> U[8];
  for (int g = 0; g < 4; ++g) {
    const I<Lanes> v = Lanes::load(q + 64 * g);
    U[g] = Lanes::levels(Lanes::low_nibbles(v), nibble_levels(T));
    U[4 + g] = Lanes::levels(Lanes::high_nibbles(v), nibble_levels(T));
  }
  if constexpr (HasQ8Values<Lanes>::value) {
    Lanes::q8_values_of(U, V);
  } else {
    for (int v = 0; v < 8; ++v) V[v] = U[v];
  }
}

// The integer sum of kv x over the 32 values (xsum: the row block's sum of x): exact either way.
template <class Lanes>
inline I<Lanes> iq4_level_sum(const I<Lanes>* V, const int8_t* xq, int32_t xsum) {
  if constexpr (HasQ8Values<Lanes>::value) {
    return Lanes::q8_dots(V, xq, 0);  // the sum of |kv| sign(x, kv): kv x, without Q8_0's 128 x
  } else {
    return Lanes::sub(dots<Lanes, 8, 255>(V, xq), Lanes::set1_i(128 * xsum));
  }
}

// IQ4 over activation block a from its integer T (kv x, times the sub-block's scale for IQ4_XS).
template <class Lanes>
inline F<Lanes> iq4_epilogue(F<Lanes> acc, I<Lanes> T, F<Lanes> d, const QuantizedRows& x, int64_t row, int64_t a) {
  return Lanes::fmadd(Lanes::cvt(T), Lanes::mul(d, Lanes::set1_f(x.row_d(row)[a])), acc);
}

// IQ4_NL, or MXFP4 (Type): its levels and its scale in bf16.
template <class Lanes, int MR, QuantType Type = QuantType::kIQ4_NL>
inline void iq4_nl_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(Type);
  const F<Lanes> d = Type == QuantType::kMXFP4 ? Lanes::bf16(pb + L.d_off) : Lanes::f16(pb + L.d_off);
  I<Lanes> V[16];
  iq4_values<Lanes, Type>(pb + L.q_off, V);
  for (int r = 0; r < MR; ++r) {
    const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * b;
    const I<Lanes> S = iq4_level_sum<Lanes>(V, x.row_q(r0 + r) + 32 * b, sum16[0] + sum16[1]);
    acc[r] = iq4_epilogue<Lanes>(acc[r], S, d, x, r0 + r, b);
  }
}

template <class Lanes, int MR>
inline void iq4_xs_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(QuantType::kIQ4_XS);
  const F<Lanes> d = Lanes::f16(pb + L.d_off);
  for (int j = 0; j < 8; ++j) {  // sub-block j: activation block 8b + j
    const int64_t a = 8 * b + j;
    I<Lanes> V[16];
    iq4_values<Lanes>(pb + L.q_off + 256 * j, V);
    const I<Lanes> sc = Lanes::i8(pb + L.sc_off + 16 * j);
    for (int r = 0; r < MR; ++r) {
      const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * a;
      const I<Lanes> T = Lanes::mullo(sc, iq4_level_sum<Lanes>(V, x.row_q(r0 + r) + 32 * a, sum16[0] + sum16[1]));
      acc[r] = iq4_epilogue<Lanes>(acc[r], T, d, x, r0 + r, a);
    }
  }
}

// Quarter J (values 32 J .. 32 J + 31, activation block a) of a Q2_K run whose 8 vectors are
// `raw`: its 2-bit values (bits 2J of each byte) pair V[g] with activation values 4g .. 4g + 3;
// the two sub-blocks' scale bytes (sc | mn << 4) at s_bytes and s_bytes + 16. M is one 16-bit
// multiply-add per lane: (mn_a, mn_b) by the row's (Sx_a, Sx_b), each below 2^15. T: with 16-bit
// pair sums (AVX2), each sub-block's pair sums (at most 4 x 2 x 3 x 127) multiplied by its scale
// in both halves of the lane and added in the same multiply-add; with 32-bit dot products, two
// 32-bit multiplies. The same integers either way.
template <class Lanes, int J, int MR>
inline void q2_quarter(const I<Lanes>* raw, const uint8_t* s_bytes, F<Lanes> d, F<Lanes> dmin,
                       const QuantizedRows& x, int64_t r0, int64_t a, F<Lanes>* acc) {
  I<Lanes> V[8];
  for (int g = 0; g < 8; ++g) V[g] = move_bits<Lanes, 2 * J, 0, 2>(raw[g]);
  const uint8_t *bytes_a = s_bytes, *bytes_b = s_bytes + 16;
  const I<Lanes> mn_ab = Lanes::template shift16<-4>(Lanes::u8_pairs(bytes_a, bytes_b));
  I<Lanes> sc_a, sc_b;  // pair sums: the scale in both 16-bit halves; dot products: in 32 bits
  if constexpr (HasPairSums<Lanes>::value) {
    sc_a = Lanes::and_bytes(Lanes::u8_pairs(bytes_a, bytes_a), 0x0F);
    sc_b = Lanes::and_bytes(Lanes::u8_pairs(bytes_b, bytes_b), 0x0F);
  } else {
    sc_a = Lanes::and_bytes(Lanes::u8i(bytes_a), 0x0F);
    sc_b = Lanes::and_bytes(Lanes::u8i(bytes_b), 0x0F);
  }
  for (int r = 0; r < MR; ++r) {
    const int8_t* xq = x.row_q(r0 + r) + 32 * a;
    const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * a;
    const I<Lanes> M = Lanes::madd16(mn_ab, Lanes::set1_i(static_cast<int32_t>(
                                                 static_cast<uint32_t>(static_cast<uint16_t>(sum16[0])) |
                                                 (static_cast<uint32_t>(static_cast<uint16_t>(sum16[1])) << 16))));
    I<Lanes> T;
    if constexpr (HasPairSums<Lanes>::value) {
      T = Lanes::add(Lanes::madd16(pair_sums_of<Lanes, 4>(V, xq), sc_a),
                     Lanes::madd16(pair_sums_of<Lanes, 4>(V + 4, xq + 16), sc_b));
    } else {
      T = Lanes::add(Lanes::mullo(sc_a, dots<Lanes, 4, 3>(V, xq)),
                     Lanes::mullo(sc_b, dots<Lanes, 4, 3>(V + 4, xq + 16)));
    }
    acc[r] = q2_epilogue<Lanes>(acc[r], T, M, d, dmin, x, r0 + r, a);
  }
}

// Run t (values 128 t .. 128 t + 127) of a Q2_K / Q3_K block's 2-bit plane at pb + QOff: 8 vectors,
// quarter J's values in bits 2J of each byte.
template <class Lanes, int QOff>
inline void low2_run(const uint8_t* pb, int t, I<Lanes>* raw) {
  for (int g = 0; g < 8; ++g) raw[g] = Lanes::load(pb + QOff + 512 * t + 64 * g);
}

template <class Lanes, int MR>
inline void q2_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(QuantType::kQ2_K);
  const F<Lanes> d = Lanes::f16(pb + L.d_off), dmin = Lanes::f16(pb + L.m_off);
  for (int t = 0; t < 2; ++t) {
    I<Lanes> raw[8];
    low2_run<Lanes, L.q_off>(pb, t, raw);
    const uint8_t* s_bytes = pb + L.sc_off + 16 * 8 * t;  // sub-blocks 8t .. 8t + 7
    const int64_t a = 8 * b + 4 * t;
    q2_quarter<Lanes, 0, MR>(raw, s_bytes, d, dmin, x, r0, a, acc);
    q2_quarter<Lanes, 1, MR>(raw, s_bytes + 32, d, dmin, x, r0, a + 1, acc);
    q2_quarter<Lanes, 2, MR>(raw, s_bytes + 64, d, dmin, x, r0, a + 2, acc);
    q2_quarter<Lanes, 3, MR>(raw, s_bytes + 96, d, dmin, x, r0, a + 3, acc);
  }
}

// Q3_K's values of quarter J: the two low bits as Q2_K's, the 3rd bit of V[g] at bit g of `third`.
template <class Lanes, int J, int... G>
inline void q3_values(const I<Lanes>* raw, I<Lanes> third, I<Lanes>* V, std::integer_sequence<int, G...>) {
  ((V[G] = Lanes::or_(move_bits<Lanes, 2 * J, 0, 2>(raw[G]), move_bits<Lanes, G, 2, 1>(third))), ...);
}

// Quarter J (activation block a) of a Q3_K run: its 8 vectors of 3-bit values, then per row the
// two sub-blocks' sums with Q6_K's epilogue (offset 4).
template <class Lanes, int J, int MR>
inline void q3_quarter(const I<Lanes>* raw, const uint8_t* third, const uint8_t* s_bytes, F<Lanes> d,
                       const QuantizedRows& x, int64_t r0, int64_t a, F<Lanes>* acc) {
  I<Lanes> V[8];
  q3_values<Lanes, J>(raw, Lanes::load(third), V, std::make_integer_sequence<int, 8>{});
  const I<Lanes> sc_a = Lanes::i8(s_bytes), sc_b = Lanes::i8(s_bytes + 16);
  for (int r = 0; r < MR; ++r) {
    const int8_t* xq = x.row_q(r0 + r) + 32 * a;
    acc[r] = signed16_epilogue<Lanes, 4>(acc[r], dots<Lanes, 4, 7>(V, xq), dots<Lanes, 4, 7>(V + 4, xq + 16), sc_a,
                                         sc_b, d, x, r0 + r, a);
  }
}

template <class Lanes, int MR>
inline void q3_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(QuantType::kQ3_K);
  const F<Lanes> d = Lanes::f16(pb + L.d_off);
  for (int t = 0; t < 2; ++t) {
    I<Lanes> raw[8];
    low2_run<Lanes, L.q_off>(pb, t, raw);
    const uint8_t* third = pb + L.h_off + 256 * t;        // vector j: quarter j's 3rd bits
    const uint8_t* s_bytes = pb + L.sc_off + 16 * 8 * t;  // sub-blocks 8t .. 8t + 7
    const int64_t a = 8 * b + 4 * t;
    q3_quarter<Lanes, 0, MR>(raw, third, s_bytes, d, x, r0, a, acc);
    q3_quarter<Lanes, 1, MR>(raw, third + 64, s_bytes + 32, d, x, r0, a + 1, acc);
    q3_quarter<Lanes, 2, MR>(raw, third + 128, s_bytes + 64, d, x, r0, a + 2, acc);
    q3_quarter<Lanes, 3, MR>(raw, third + 192, s_bytes + 96, d, x, r0, a + 3, acc);
  }
}

}  // namespace
}  // namespace corellm::quant::kernel
