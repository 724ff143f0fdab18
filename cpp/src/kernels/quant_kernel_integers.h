// quant_gemm's vector loops, the integer pieces every type's blocks use: the lane types, which
// products a Lanes policy makes (16-bit pair sums or 32-bit dot products), the integer dot products
// of a block's vectors with a row's int8 values, and bits moved within bytes.
// Part of quant_gemm_kernel.h's loops (its header says what a Lanes policy provides): include that
// header, inside the path's target region, not this one.
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

}  // namespace
}  // namespace corellm::quant::kernel
