// Element types of kernel tensors and the bf16 <-> fp32 conversions the CPU kernels use.
#pragma once

#include <cstdint>
#include <cstring>

namespace corellm {

// Tag passed with raw pointers (the kernels do not link torch). Values match the Python side.
enum class DType : int32_t { F32 = 0, BF16 = 1 };

inline float bf16_to_f32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// Round to nearest even, as torch does; NaN stays NaN (quiet). Both results are computed and one
// selected, without a branch: loops of it vectorize on AVX2 too (no masked stores there).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// Element access in a kernel templated on the storage type: float or uint16_t (bf16 bits).
inline float load_f32(const float* p) { return *p; }
inline float load_f32(const uint16_t* p) { return bf16_to_f32(*p); }
inline void store_f32(float* p, float v) { *p = v; }
inline void store_f32(uint16_t* p, float v) { *p = f32_to_bf16(v); }

// Rounds a float to what storing it in T and loading it back gives.
inline float round_to(float v, const float*) { return v; }
inline float round_to(float v, const uint16_t*) { return bf16_to_f32(f32_to_bf16(v)); }

}  // namespace corellm
