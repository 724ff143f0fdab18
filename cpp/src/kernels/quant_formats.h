// The quantized types' blocks: as the GGUF file stores them (ggml's block_q4_0 ... block_q6_K),
// decoded into one plain form (QuantBlock: unsigned integers and scale bits), and where each
// value and scale lives in quant_gemm's packed panel-block (layout in quant_gemm.h). Private to
// the kernels library; plain C++, compiled for the baseline.
//
// Panel-block layouts, per 16 rows (bytes):
//   Q4_0  d 32 | nibbles 256                                   288
//   Q4_1  d 32 | m 32 | nibbles 256                            320
//   Q5_0  d 32 | nibbles 256 | 5th bits 64                     352
//   Q5_1  d 32 | m 32 | nibbles 256 | 5th bits 64              384
//   Q8_0  d 32 | values 512                                    544
//   Q2_K  d 32 | dmin 32 | sc|mn 256 | 2-bit values 1024                   1344
//   Q3_K  d 32 | sc 256 | 2-bit values 1024 | 3rd bits 512                  1824
//   IQ4_NL d 32 | nibbles 256                                  288
//   MXFP4  d 32 (bf16) | nibbles 256                           288
//   IQ4_XS d 32 | sc 128 | nibbles 2048                        2208
//   Q4_K  d 32 | dmin 32 | sc 128 | mn 128 | nibbles 2048      2368
//   Q5_K  d 32 | dmin 32 | sc 128 | mn 128 | nibbles 2048 | 5th bits 512   2880
//   Q6_K  d 32 | sc 256 | nibbles 2048 | 2-bit highs 1024      3360
// Nibbles come in runs of R values (R = 32; 64 for Q4_K, Q5_K, Q6_K): vector g of a run (64 bytes)
// holds, at byte 4c + i, row c's values 4g + i (low nibble) and R/2 + 4g + i (high nibble).
// Q5_0/Q5_1's 5th bits: one vector, byte 4c + i, bit g (value 4g + i) and bit 4 + g (value
// 16 + 4g + i). Q5_K's: two vectors per run (low half, high half), byte 4c + i, bit g. Q6_K's two
// high bits: four vectors per run, vector g / 2, byte 4c + i, bits 4 (g % 2) (low half's value)
// and 4 (g % 2) + 2 (high half's). Q8_0: vector g, byte 4c + i, value 4g + i. Q2_K: runs of 128
// values, 8 vectors each; vector g, byte 4c + i, bits 2j (j = 0..3): value 32j + 4g + i of the
// run; its scale bytes as the file's (scale in the low nibble, min in the high one). Q3_K: its two
// low bits as Q2_K's; the 3rd bits four vectors per run, vector j, byte 4c + i, bit g (value
// 32j + 4g + i of the run); its 6-bit scales decoded to int8 (s - 32).
#pragma once

#include <cstdint>
#include <cstring>

#include "corellm/kernels/quant_gemm.h"

namespace corellm::quant {

// One row's block, decoded: the unsigned integer values and the scale bits.
struct QuantBlock {
  uint8_t u[256];      // Q2_K: 0..3, Q3_K: 0..7, Q4 and IQ4 (level index): 0..15, Q5: 0..31, Q6_K: 0..63,
                       // Q8_0: q + 128
  uint16_t d = 0;      // fp16 scale (MXFP4: bf16, 2^(e - 128) from its E8M0 byte)
  uint16_t m = 0;      // fp16: the min (Q4_1, Q5_1) or dmin (Q2_K, Q4_K, Q5_K)
  uint8_t sc[16] = {};  // Q4_K, Q5_K: 6-bit scale per 32 values; Q6_K, Q3_K: int8 scale per 16
                        // values; Q2_K: 4-bit scale per 16 values; IQ4_XS: int8 scale per 32
  uint8_t mn[16] = {};  // Q4_K, Q5_K: 6-bit min per 32 values; Q2_K: 4-bit min per 16 values
};

struct Layout {
  int block;      // values per block
  int run;        // values per nibble run (32 or 64); 0: 8-bit values (Q8_0)
  int offset;     // the integer to subtract: w = d (u - offset) for Q4_0, Q5_0, Q8_0, Q3_K, Q6_K, IQ4
                  // (u = kv[q] + 128)
  bool has_min;   // Q4_1, Q5_1, Q4_K, Q5_K: the m / dmin scale
  bool k_scales;  // Q4_K, Q5_K: sc and mn per 32 values; Q3_K, Q6_K: sc per 16; Q2_K: sc | mn << 4 per 16;
                  // IQ4_XS: sc per 32
  int d_off, m_off, sc_off, mn_off, q_off, h_off;  // byte offsets in a panel-block (-1: none)
  int bytes;      // a panel-block's bytes
};

constexpr Layout layout_of(QuantType t) {
  switch (t) {
    case QuantType::kQ4_0: return {32, 32, 8, false, false, 0, -1, -1, -1, 32, -1, 288};
    case QuantType::kQ4_1: return {32, 32, 0, true, false, 0, 32, -1, -1, 64, -1, 320};
    case QuantType::kQ5_0: return {32, 32, 16, false, false, 0, -1, -1, -1, 32, 288, 352};
    case QuantType::kQ5_1: return {32, 32, 0, true, false, 0, 32, -1, -1, 64, 320, 384};
    case QuantType::kQ8_0: return {32, 0, 128, false, false, 0, -1, -1, -1, 32, -1, 544};
    case QuantType::kQ2_K: return {256, 128, 0, true, true, 0, 32, 64, -1, 320, -1, 1344};
    case QuantType::kQ3_K: return {256, 128, 4, false, true, 0, -1, 32, -1, 288, 1312, 1824};
    case QuantType::kIQ4_NL: return {32, 32, 128, false, false, 0, -1, -1, -1, 32, -1, 288};
    case QuantType::kMXFP4: return {32, 32, 128, false, false, 0, -1, -1, -1, 32, -1, 288};
    case QuantType::kIQ4_XS: return {256, 32, 128, false, true, 0, -1, 32, -1, 160, -1, 2208};
    case QuantType::kQ4_K: return {256, 64, 0, true, true, 0, 32, 64, 192, 320, -1, 2368};
    case QuantType::kQ5_K: return {256, 64, 0, true, true, 0, 32, 64, 192, 320, 2368, 2880};
    case QuantType::kQ6_K: return {256, 64, 32, false, true, 0, -1, 32, -1, 288, 2336, 3360};
  }
  return {32, 0, 128, false, false, 0, -1, -1, -1, 32, -1, 544};  // unreachable: types are checked on entry
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// IQ4_NL / IQ4_XS: the 16 int8 levels a 4-bit index q stands for (llama.cpp's kvalues_iq4nl).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

constexpr bool is_iq4(QuantType t) { return t == QuantType::kIQ4_NL || t == QuantType::kIQ4_XS; }

// MXFP4: E2M1's values doubled (llama.cpp's kvalues_mxfp4), the scale 2^(e - 128) halving them back.
constexpr int8_t kMxfp4Levels[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

// The 16 levels of a type whose 4-bit indices are looked up (IQ4_NL, IQ4_XS, MXFP4).
constexpr const int8_t* nibble_levels(QuantType t) { return t == QuantType::kMXFP4 ? kMxfp4Levels : kIq4Levels; }

// MXFP4's scale 2^(e - 128) as bf16 bits (exact for every byte e: bf16's exponent range is fp32's,
// its subnormals reach 2^-133).
inline uint16_t e8m0_half_bf16(uint8_t e) {
  if (e >= 2) return static_cast<uint16_t>((e - 1) << 7);   // 2^(e - 1 - 127), a normal number
  return static_cast<uint16_t>(e == 1 ? 0x0040 : 0x0020);   // 2^-127, 2^-128: subnormals
}

// ggml's get_scale_min_k4: sub-block j's 6-bit scale and min from the 12 packed bytes.
inline void k4_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// A block as the file stores it -> QuantBlock.
inline void decode_file_block(QuantType t, const uint8_t* b, QuantBlock* out) {
  switch (t) {
    case QuantType::kQ4_0:
    case QuantType::kQ4_1: {
      const bool min = t == QuantType::kQ4_1;
      out->d = load_u16(b);
      if (min) out->m = load_u16(b + 2);
      const uint8_t* qs = b + (min ? 4 : 2);
      for (int i = 0; i < 16; ++i) {
        out->u[i] = qs[i] & 0xF;
        out->u[i + 16] = qs[i] >> 4;
      }
      return;
    }
    case QuantType::kQ5_0:
    case QuantType::kQ5_1: {
      const bool min = t == QuantType::kQ5_1;
      out->d = load_u16(b);
      if (min) out->m = load_u16(b + 2);
      const uint32_t qh = load_u32(b + (min ? 4 : 2));
      const uint8_t* qs = b + (min ? 8 : 6);
      for (int i = 0; i < 16; ++i) {
        out->u[i] = static_cast<uint8_t>((qs[i] & 0xF) | (((qh >> i) & 1u) << 4));
        out->u[i + 16] = static_cast<uint8_t>((qs[i] >> 4) | (((qh >> (i + 16)) & 1u) << 4));
      }
      return;
    }
    case QuantType::kIQ4_NL:  // d | qs[16]: value i the low nibble of qs[i], 16 + i the high one
      out->d = load_u16(b);
      for (int i = 0; i < 16; ++i) {
        out->u[i] = b[2 + i] & 0xF;
        out->u[i + 16] = b[2 + i] >> 4;
      }
      return;
    case QuantType::kMXFP4:  // e | qs[16]: value i the low nibble of qs[i], 16 + i the high one
      out->d = e8m0_half_bf16(b[0]);
      for (int i = 0; i < 16; ++i) {
        out->u[i] = b[1 + i] & 0xF;
        out->u[i + 16] = b[1 + i] >> 4;
      }
      return;
    case QuantType::kIQ4_XS: {  // d | scales_h (2 bytes) | scales_l[4] | qs[128], 32 values per 16 bytes
      out->d = load_u16(b);
      const uint16_t high = load_u16(b + 2);
      const uint8_t *low = b + 4, *qs = b + 8;
      for (int j = 0; j < 8; ++j) {
        const int scale = ((low[j / 2] >> (4 * (j % 2))) & 0xF) | (((high >> (2 * j)) & 3) << 4);
        out->sc[j] = static_cast<uint8_t>(static_cast<int8_t>(scale - 32));
        for (int i = 0; i < 16; ++i) {
          out->u[32 * j + i] = qs[16 * j + i] & 0xF;
          out->u[32 * j + 16 + i] = qs[16 * j + i] >> 4;
        }
      }
      return;
    }
    case QuantType::kQ8_0:
      out->d = load_u16(b);
      for (int i = 0; i < 32; ++i) out->u[i] = static_cast<uint8_t>(b[2 + i] ^ 0x80u);
      return;
    case QuantType::kQ4_K:
    case QuantType::kQ5_K: {
      const bool five = t == QuantType::kQ5_K;
      out->d = load_u16(b);
      out->m = load_u16(b + 2);
      const uint8_t* scales = b + 4;
      for (int j = 0; j < 8; ++j) k4_scale_min(j, scales, &out->sc[j], &out->mn[j]);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int c = 0; c < 4; ++c) {  // 64 values per chunk: 32 low nibbles, then 32 high
        for (int l = 0; l < 32; ++l) {
          int lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
          if (five) {
            lo |= ((qh[l] >> (2 * c)) & 1) << 4;
            hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
          }
          out->u[64 * c + l] = static_cast<uint8_t>(lo);
          out->u[64 * c + 32 + l] = static_cast<uint8_t>(hi);
        }
      }
      return;
    }
    case QuantType::kQ2_K: {  // scales[16] | qs[64] | d | dmin
      const uint8_t *scales = b, *qs = b + 16;
      out->d = load_u16(b + 80);
      out->m = load_u16(b + 82);
      for (int s = 0; s < 16; ++s) {
        out->sc[s] = scales[s] & 0xF;
        out->mn[s] = scales[s] >> 4;
      }
      for (int h = 0; h < 2; ++h)  // value 128 h + 32 j + l: bits 2j of qs[32 h + l]
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l) out->u[128 * h + 32 * j + l] = (qs[32 * h + l] >> (2 * j)) & 3;
      return;
    }
    case QuantType::kQ3_K: {  // hmask[32] | qs[64] | scales[12] | d
      const uint8_t *hmask = b, *qs = b + 32, *scales = b + 96;
      out->d = load_u16(b + 108);
      // Scale s: its low nibble in byte s % 8 (nibble s / 8), its 2 high bits in byte 8 + s % 4 (bits 2 (s / 4)).
      for (int s = 0; s < 16; ++s) {
        const int low = (scales[s % 8] >> (4 * (s / 8))) & 0xF, high = (scales[8 + s % 4] >> (2 * (s / 4))) & 3;
        out->sc[s] = static_cast<uint8_t>(static_cast<int8_t>((low | (high << 4)) - 32));
      }
      for (int h = 0; h < 2; ++h)  // value 128 h + 32 j + l: bits 2j of qs[32 h + l], bit 4h + j of hmask[l]
        for (int j = 0; j < 4; ++j)
          for (int l = 0; l < 32; ++l)
            out->u[128 * h + 32 * j + l] =
                static_cast<uint8_t>(((qs[32 * h + l] >> (2 * j)) & 3) | (((hmask[l] >> (4 * h + j)) & 1) << 2));
      return;
    }
    case QuantType::kQ6_K: {
      const uint8_t *ql = b, *qh = b + 128, *scales = b + 192;
      out->d = load_u16(b + 208);
      std::memcpy(out->sc, scales, 16);
      for (int h = 0; h < 2; ++h) {  // two halves of 128 values
        const uint8_t *l4 = ql + 64 * h, *h2 = qh + 32 * h;
        uint8_t* u = out->u + 128 * h;
        for (int l = 0; l < 32; ++l) {
          u[l] = static_cast<uint8_t>((l4[l] & 0xF) | ((h2[l] & 3) << 4));
          u[l + 32] = static_cast<uint8_t>((l4[l + 32] & 0xF) | (((h2[l] >> 2) & 3) << 4));
          u[l + 64] = static_cast<uint8_t>((l4[l] >> 4) | (((h2[l] >> 4) & 3) << 4));
          u[l + 96] = static_cast<uint8_t>((l4[l + 32] >> 4) | (((h2[l] >> 6) & 3) << 4));
        }
      }
      return;
    }
  }
}

// Where value e of row c's block sits in a panel-block: the byte of its low bits (nibble or
// whole byte), and whether it is the high nibble.
struct ValuePlace {
  int byte;
  int nibble;  // 0: low, 1: high (8-bit values: 0)
  int g, i, half, run;
};

inline ValuePlace place_of(const Layout& L, int c, int e) {
  ValuePlace p{};
  if (L.run == 0) {  // Q8_0
    p.g = e / 4;
    p.i = e % 4;
    p.byte = L.q_off + p.g * 64 + 4 * c + p.i;
    return p;
  }
  p.run = e / L.run;
  const int w = e % L.run, half_len = L.run / 2;
  p.half = w / half_len;
  p.g = (w % half_len) / 4;
  p.i = w % 4;
  p.nibble = p.half;
  p.byte = L.q_off + p.run * 8 * L.run + p.g * 64 + 4 * c + p.i;
  return p;
}

// The byte and bit of value e's high bit(s): Q5 (one bit) and Q6_K (two).
inline void high_place(QuantType t, const Layout& L, const ValuePlace& p, int c, int* byte, int* bit) {
  if (t == QuantType::kQ6_K) {
    *byte = L.h_off + p.run * 256 + (p.g / 2) * 64 + 4 * c + p.i;
    *bit = 4 * (p.g % 2) + 2 * p.half;
  } else if (L.block == 256) {  // Q5_K
    *byte = L.h_off + p.run * 128 + p.half * 64 + 4 * c + p.i;
    *bit = p.g;
  } else {  // Q5_0, Q5_1
    *byte = L.h_off + 4 * c + p.i;
    *bit = 4 * p.half + p.g;
  }
}

inline bool has_high_bits(QuantType t) {
  return t == QuantType::kQ5_0 || t == QuantType::kQ5_1 || t == QuantType::kQ5_K || t == QuantType::kQ6_K;
}

// Q2_K, Q3_K: the byte and bit shift of value e's two low bits (row c of a panel-block), and of
// Q3_K's 3rd bit.
inline void low2_place(const Layout& L, int c, int e, int* byte, int* shift) {
  const int run = e / 128, w = e % 128, j = w / 32, g = (w % 32) / 4, i = w % 4;
  *byte = L.q_off + 512 * run + 64 * g + 4 * c + i;
  *shift = 2 * j;
}
inline void third_bit_place(const Layout& L, int c, int e, int* byte, int* shift) {
  const int run = e / 128, w = e % 128, j = w / 32, g = (w % 32) / 4, i = w % 4;
  *byte = L.h_off + 256 * run + 64 * j + 4 * c + i;
  *shift = g;
}

inline bool has_low2_plane(QuantType t) { return t == QuantType::kQ2_K || t == QuantType::kQ3_K; }

// Writes row c's block into the panel-block pb (zeroed beforehand).
inline void encode_panel_block(QuantType t, const QuantBlock& q, int c, uint8_t* pb) {
  const Layout L = layout_of(t);
  if (has_low2_plane(t)) {
    std::memcpy(pb + L.d_off + 2 * c, &q.d, 2);
    if (L.m_off >= 0) std::memcpy(pb + L.m_off + 2 * c, &q.m, 2);
    for (int s = 0; s < 16; ++s) {
      pb[L.sc_off + 16 * s + c] = t == QuantType::kQ2_K ? static_cast<uint8_t>(q.sc[s] | (q.mn[s] << 4)) : q.sc[s];
    }
    for (int e = 0; e < L.block; ++e) {
      int byte, shift;
      low2_place(L, c, e, &byte, &shift);
      pb[byte] = static_cast<uint8_t>(pb[byte] | ((q.u[e] & 3) << shift));
      if (t == QuantType::kQ3_K) {
        third_bit_place(L, c, e, &byte, &shift);
        pb[byte] = static_cast<uint8_t>(pb[byte] | ((q.u[e] >> 2) << shift));
      }
    }
    return;
  }
  std::memcpy(pb + L.d_off + 2 * c, &q.d, 2);
  if (L.m_off >= 0) std::memcpy(pb + L.m_off + 2 * c, &q.m, 2);
  if (L.k_scales) {
    const int subs = t == QuantType::kQ6_K ? 16 : 8;
    for (int j = 0; j < subs; ++j) pb[L.sc_off + 16 * j + c] = q.sc[j];
    if (L.mn_off >= 0)
      for (int j = 0; j < 8; ++j) pb[L.mn_off + 16 * j + c] = q.mn[j];
  }
  const bool high = has_high_bits(t);
  const int high_bits = t == QuantType::kQ6_K ? 2 : 1;
  for (int e = 0; e < L.block; ++e) {
    const ValuePlace p = place_of(L, c, e);
    if (L.run == 0) {
      pb[p.byte] = q.u[e];
      continue;
    }
    pb[p.byte] = static_cast<uint8_t>(pb[p.byte] | ((q.u[e] & 0xF) << (4 * p.nibble)));
    if (high) {
      int byte, bit;
      high_place(t, L, p, c, &byte, &bit);
      const int hv = (q.u[e] >> 4) & ((1 << high_bits) - 1);
      pb[byte] = static_cast<uint8_t>(pb[byte] | (hv << bit));
    }
  }
}

// Reads row c's block back from the panel-block.
inline void decode_panel_block(QuantType t, const uint8_t* pb, int c, QuantBlock* q) {
  const Layout L = layout_of(t);
  q->d = load_u16(pb + L.d_off + 2 * c);
  q->m = L.m_off >= 0 ? load_u16(pb + L.m_off + 2 * c) : 0;
  if (has_low2_plane(t)) {
    for (int s = 0; s < 16; ++s) {
      const uint8_t v = pb[L.sc_off + 16 * s + c];
      q->sc[s] = t == QuantType::kQ2_K ? v & 0xF : v;
      q->mn[s] = t == QuantType::kQ2_K ? v >> 4 : 0;
    }
    for (int e = 0; e < L.block; ++e) {
      int byte, shift;
      low2_place(L, c, e, &byte, &shift);
      int u = (pb[byte] >> shift) & 3;
      if (t == QuantType::kQ3_K) {
        third_bit_place(L, c, e, &byte, &shift);
        u |= ((pb[byte] >> shift) & 1) << 2;
      }
      q->u[e] = static_cast<uint8_t>(u);
    }
    return;
  }
  if (L.k_scales) {
    const int subs = t == QuantType::kQ6_K ? 16 : 8;
    for (int j = 0; j < subs; ++j) q->sc[j] = pb[L.sc_off + 16 * j + c];
    if (L.mn_off >= 0)
      for (int j = 0; j < 8; ++j) q->mn[j] = pb[L.mn_off + 16 * j + c];
  }
  const bool high = has_high_bits(t);
  const int high_bits = t == QuantType::kQ6_K ? 2 : 1;
  for (int e = 0; e < L.block; ++e) {
    const ValuePlace p = place_of(L, c, e);
    if (L.run == 0) {
      q->u[e] = pb[p.byte];
      continue;
    }
    int v = (pb[p.byte] >> (4 * p.nibble)) & 0xF;
    if (high) {
      int byte, bit;
      high_place(t, L, p, c, &byte, &bit);
      v |= ((pb[byte] >> bit) & ((1 << high_bits) - 1)) << 4;
    }
    q->u[e] = static_cast<uint8_t>(v);
  }
}

}  // namespace corellm::quant
