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
//   f16(p), u8(p), u8i(p), i8(p)   16 fp16 / unsigned bytes (as floats, as integers) / signed
//                              bytes -> lanes
//   u8_pairs(lo, hi), madd16   lanes of lo[c] | hi[c] << 16 (two unsigned bytes); per lane the
//                              sum of its two 16-bit products
//   iq4_levels(v)              each byte's 4-bit level index -> the level plus 128 (a byte lookup)
//   q8_values_of(U, V)         (HasQ8Values) q8_values from 8 vectors of unsigned bytes in registers
//   cvt, fmadd, fnmadd, mul, set1_f, zero_f, store16(float*, F)
// Per panel and block of MR rows, for each weight block: the block's unsigned values are built
// once in registers (nibbles masked, high bits moved in), then for each row the integer dot
// products and the type's epilogue (quant_gemm.h), lane by lane the same float operations as the
// reference path. The integer sums are split into independent chains, or added in 16 bits as far
// as they cannot overflow (integers add exactly: the order does not change them).
// Meanwhile the thread's next panel is fetched into L2 (next_panel.h).
//
// Include it inside the path's target region, after every system header: its templates are
// compiled for that path's instructions, in each source its own copy.
#pragma once

namespace corellm::quant::kernel {
namespace {

template <class Lanes>
using I = typename Lanes::I;
template <class Lanes>
using F = typename Lanes::F;

// The largest unsigned weight value of a type (u = q, or q + offset): what bounds its products.
constexpr int max_unsigned(QuantType t) {
  if (t == QuantType::kQ8_0) return 255;
  if (t == QuantType::kQ6_K) return 63;
  if (t == QuantType::kQ2_K) return 3;
  if (t == QuantType::kQ3_K) return 7;
  if (is_iq4(t)) return 241;  // the largest level, 113, plus 128
  return layout_of(t).h_off >= 0 ? 31 : 15;  // a 5th bit, or 4 bits
}

// Whether Lanes adds its byte products in 16-bit pair sums (Lanes::pair_sums, add16, widen16:
// AVX2's maddubs) rather than dot products into 32 bits.
template <class Lanes, class = void>
struct HasPairSums : std::false_type {};
template <class Lanes>
struct HasPairSums<Lanes, std::void_t<decltype(&Lanes::pair_sums)>> : std::true_type {};

// Whether Lanes splits a Q8_0 block into values made once for all the rows (Lanes::q8_values, 16
// vectors) and each row's products (Lanes::q8_dots) rather than one q8_block per row.
template <class Lanes, class = void>
struct HasQ8Values : std::false_type {};
template <class Lanes>
struct HasQ8Values<Lanes, std::void_t<decltype(&Lanes::q8_values)>> : std::true_type {};

// Sum over vectors v of dot(V[v], xq + 4 v), for Count vectors (4 or 8) of values up to MaxU.
// Dot products into 32 bits: in up to four independent chains (a lone row is bound by the dot
// product's latency otherwise). 16-bit pair sums: as many vectors' pair sums added in 16 bits as
// cannot overflow them (each |u0 x0 + u1 x1| <= 2 MaxU 127: 8 vectors of 4-bit values, 4 of
// 5-bit, 2 of 6-bit), then widened to 32 bits: the same integers, in fewer instructions.
template <class Lanes, int Count, int MaxU>
inline I<Lanes> dots(const I<Lanes>* V, const int8_t* xq) {
  if constexpr (HasPairSums<Lanes>::value) {
    constexpr int kPerSum = std::min(Count, 32767 / (2 * MaxU * 127));  // x is in [-127, 127]
    static_assert(kPerSum >= 1 && Count % kPerSum == 0, "pair sums that fit 16 bits");
    I<Lanes> total{};
    for (int v0 = 0; v0 < Count; v0 += kPerSum) {
      I<Lanes> s16{};
      for (int v = v0; v < v0 + kPerSum; ++v) {
        int32_t x4;
        std::memcpy(&x4, xq + 4 * v, 4);
        const I<Lanes> pairs = Lanes::pair_sums(V[v], x4);
        s16 = v == v0 ? pairs : Lanes::add16(s16, pairs);
      }
      total = v0 == 0 ? Lanes::widen16(s16) : Lanes::add(total, Lanes::widen16(s16));
    }
    return total;
  } else {
    constexpr int kChains = Count >= 8 ? 4 : 2;
    I<Lanes> acc[kChains];
    for (int c = 0; c < kChains; ++c) acc[c] = Lanes::set1_i(0);
    for (int v = 0; v < Count; ++v) {
      int32_t x4;
      std::memcpy(&x4, xq + 4 * v, 4);
      acc[v % kChains] = Lanes::dot(acc[v % kChains], V[v], x4);
    }
    if constexpr (kChains == 4) return Lanes::add(Lanes::add(acc[0], acc[1]), Lanes::add(acc[2], acc[3]));
    return Lanes::add(acc[0], acc[1]);
  }
}

// Lanes with pair sums: the 16-bit pair sums of Count vectors added in 16 bits, not widened (the
// caller bounds them: Count x 2 x MaxU x 127 below 2^15).
template <class Lanes, int Count>
inline I<Lanes> pair_sums_of(const I<Lanes>* V, const int8_t* xq) {
  I<Lanes> s16{};
  for (int v = 0; v < Count; ++v) {
    int32_t x4;
    std::memcpy(&x4, xq + 4 * v, 4);
    const I<Lanes> pairs = Lanes::pair_sums(V[v], x4);
    s16 = v == 0 ? pairs : Lanes::add16(s16, pairs);
  }
  return s16;
}

// Bit `From` of each byte moved to bit `To` (masked to that bit, or to the 2-bit field at To when
// Width is 2): a 16-bit shift, then a byte mask (the field lies within its byte before and after
// the shift, so what the shift carries across bytes is masked off).
template <class Lanes, int From, int To, int Width>
inline I<Lanes> move_bits(I<Lanes> h) {
  constexpr int mask = ((1 << Width) - 1) << To;
  return Lanes::and_bytes(Lanes::template shift16<To - From>(h), static_cast<uint8_t>(mask));
}

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

// Q2_K over activation block a, from its integers T = sc_a S_a + sc_b S_b and M = mn_a Sx_a +
// mn_b Sx_b (sub-blocks a, b of 16).
template <class Lanes>
inline F<Lanes> q2_epilogue(F<Lanes> acc, I<Lanes> T, I<Lanes> M, F<Lanes> d, F<Lanes> dmin, const QuantizedRows& x,
                            int64_t row, int64_t a) {
  const F<Lanes> dx = Lanes::set1_f(x.row_d(row)[a]);
  acc = Lanes::fmadd(Lanes::cvt(T), Lanes::mul(d, dx), acc);
  return Lanes::fnmadd(Lanes::cvt(M), Lanes::mul(dmin, dx), acc);
}

// IQ4_NL / IQ4_XS: 32 values' level indices (nibbles at q, a run of 32 laid out as the legacy
// types') looked up as u = kv + 128, in the form the Lanes' products take: |kv| and kv, 16 vectors
// (HasQ8Values: Q8_0's signed products on AVX2), or u itself, 8 vectors.
template <class Lanes>
inline void iq4_values(const uint8_t* q, I<Lanes>* V) {
  I<Lanes> U[8];
  for (int g = 0; g < 4; ++g) {
    const I<Lanes> v = Lanes::load(q + 64 * g);
    U[g] = Lanes::iq4_levels(Lanes::low_nibbles(v));
    U[4 + g] = Lanes::iq4_levels(Lanes::high_nibbles(v));
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

template <class Lanes, int MR>
inline void iq4_nl_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(QuantType::kIQ4_NL);
  const F<Lanes> d = Lanes::f16(pb + L.d_off);
  I<Lanes> V[16];
  iq4_values<Lanes>(pb + L.q_off, V);
  for (int r = 0; r < MR; ++r) {
    const int32_t* sum16 = x.row_sum16(r0 + r) + 2 * b;
    const I<Lanes> T = iq4_level_sum<Lanes>(V, x.row_q(r0 + r) + 32 * b, sum16[0] + sum16[1]);
    acc[r] = iq4_epilogue<Lanes>(acc[r], T, d, x, r0 + r, b);
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

template <class Lanes, int MR>
inline void q2_block(const uint8_t* pb, const QuantizedRows& x, int64_t r0, int64_t b, F<Lanes>* acc) {
  constexpr Layout L = layout_of(QuantType::kQ2_K);
  const F<Lanes> d = Lanes::f16(pb + L.d_off), dmin = Lanes::f16(pb + L.m_off);
  for (int t = 0; t < 2; ++t) {
    I<Lanes> raw[8];
    for (int g = 0; g < 8; ++g) raw[g] = Lanes::load(pb + L.q_off + 512 * t + 64 * g);
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
    for (int g = 0; g < 8; ++g) raw[g] = Lanes::load(pb + L.q_off + 512 * t + 64 * g);
    const uint8_t* third = pb + L.h_off + 256 * t;        // vector j: quarter j's 3rd bits
    const uint8_t* s_bytes = pb + L.sc_off + 16 * 8 * t;  // sub-blocks 8t .. 8t + 7
    const int64_t a = 8 * b + 4 * t;
    q3_quarter<Lanes, 0, MR>(raw, third, s_bytes, d, x, r0, a, acc);
    q3_quarter<Lanes, 1, MR>(raw, third + 64, s_bytes + 32, d, x, r0, a + 1, acc);
    q3_quarter<Lanes, 2, MR>(raw, third + 128, s_bytes + 64, d, x, r0, a + 2, acc);
    q3_quarter<Lanes, 3, MR>(raw, third + 192, s_bytes + 96, d, x, r0, a + 3, acc);
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
    if constexpr (T == QuantType::kIQ4_NL) {
      iq4_nl_block<Lanes, MR>(panel + b * L.bytes, x, r0, b, acc);
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

// Rows in blocks of Lanes::kMaxRows, whose sums wait in memory where they outnumber the registers
// (each block's weight values are built once for all its rows); the rows left in blocks of
// kTailRows where kMaxRows is larger, then one at a time.
template <class Lanes, QuantType T>
void panels(const QuantGemmArgs& a, const QuantizedRows& x, const PanelRange& range) {
  constexpr int kRows = Lanes::kMaxRows;
  constexpr int kTailRows = kRows >= 16 && kRows % 4 == 0 ? 4 : 1;
  constexpr Layout L = layout_of(T);
  const int64_t panel_bytes = a.k / L.block * L.bytes, rows = range.r1 - range.r0;
  const int64_t left = rows % kRows;
  const int64_t blocks_of_rows = rows / kRows + left / kTailRows + left % kTailRows;
  for (int64_t p = range.p0; p < range.p1; ++p) {
    NextPanel next = p + 1 < range.p1 ? NextPanel(a.packed + (p + 1) * panel_bytes, panel_bytes,
                                                  blocks_of_rows * (a.k / L.block))
                                      : NextPanel();
    int64_t r = range.r0;
    for (; r + kRows <= range.r1; r += kRows) panel_rows<Lanes, T, kRows>(a, x, r, p, next);
    if constexpr (kTailRows > 1) {
      for (; r + kTailRows <= range.r1; r += kTailRows) panel_rows<Lanes, T, kTailRows>(a, x, r, p, next);
    }
    for (; r < range.r1; ++r) panel_rows<Lanes, T, 1>(a, x, r, p, next);
  }
}

template <class Lanes>
void run(const QuantGemmArgs& a, const QuantizedRows& x, const PanelRange& range) {
  switch (a.type) {
    case QuantType::kQ4_0: return panels<Lanes, QuantType::kQ4_0>(a, x, range);
    case QuantType::kQ4_1: return panels<Lanes, QuantType::kQ4_1>(a, x, range);
    case QuantType::kQ5_0: return panels<Lanes, QuantType::kQ5_0>(a, x, range);
    case QuantType::kQ5_1: return panels<Lanes, QuantType::kQ5_1>(a, x, range);
    case QuantType::kQ8_0: return panels<Lanes, QuantType::kQ8_0>(a, x, range);
    case QuantType::kQ2_K: return panels<Lanes, QuantType::kQ2_K>(a, x, range);
    case QuantType::kQ3_K: return panels<Lanes, QuantType::kQ3_K>(a, x, range);
    case QuantType::kIQ4_NL: return panels<Lanes, QuantType::kIQ4_NL>(a, x, range);
    case QuantType::kIQ4_XS: return panels<Lanes, QuantType::kIQ4_XS>(a, x, range);
    case QuantType::kQ4_K: return panels<Lanes, QuantType::kQ4_K>(a, x, range);
    case QuantType::kQ5_K: return panels<Lanes, QuantType::kQ5_K>(a, x, range);
    case QuantType::kQ6_K: return panels<Lanes, QuantType::kQ6_K>(a, x, range);
  }
}

}  // namespace
}  // namespace corellm::quant::kernel
