// Branch-free math the compiler can vectorize (no libm calls in hot loops).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace corellm {

// e^x = 2^n 2^f with y = x log2(e), n = round(y), f = y - n in [-0.5, 0.5], 2^f by a degree-6
// polynomial (Taylor coefficients of 2^f, error < 2e-7 on [-0.5, 0.5]), x clamped first. The
// constants of fast_exp and of its vector forms (exp8 in lanes_avx2.h, exp16 in attention_block.h).
constexpr float kExpLowest = -87.3f, kExpHighest = 88.7f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kExp2Poly[7] = {1.5403530393381606e-4f, 1.3333558146428443e-3f, 9.6181291076284772e-3f,
                                5.5504108664821580e-2f, 2.4022650695910072e-1f, 6.9314718055994531e-1f,
                                1.0f};  // highest degree first

// e^x with relative error below 2e-7 over the float range; exp(-inf) is handled by callers
// (masked entries are skipped, never exponentiated). NaN propagates.
inline float fast_exp(float x) {
  x = std::min(std::max(x, kExpLowest), kExpHighest);
  const float y = x * kLog2e;
  // Round to nearest by the 1.5 * 2^23 trick (floor() would block vectorization).
  const float n = (y + 12582912.0f) - 12582912.0f;
  const float f = y - n;  // in [-0.5, 0.5]
  float p = kExp2Poly[0];
  for (int i = 1; i < 7; ++i) p = p * f + kExp2Poly[i];
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

// The activations written once for one float or a register of them (GCC's vector arithmetic, as
// the elementwise loops use them), given e^x for that type: the same operations in the same order,
// so the same bits lane by lane.
template <class V, class Exp>
inline V silu_by(V x, Exp exp) {
  return x / (1.0f + exp(-x));
}

// GELU with the tanh approximation (PyTorch's approximate="tanh", Gemma's gelu_pytorch_tanh):
// 0.5 x (1 + tanh(u)), u = sqrt(2 / pi) (x + 0.044715 x^3), computed as x / (1 + e^(-2u)) — the
// same function, since 0.5 (1 + tanh(u)) = 1 / (1 + e^(-2u)) — so that it needs one exponential.
template <class V, class Exp>
inline V gelu_tanh_by(V x, Exp exp) {
  const V u = 0.7978845608028654f * (x + 0.044715f * x * x * x);
  return x / (1.0f + exp(-2.0f * u));
}

// Gemma 2's soft cap: cap tanh(x / cap), with tanh(y) = 1 - 2 / (e^(2y) + 1), so one exponential.
template <class V, class Exp>
inline V soft_capped_by(V x, float cap, Exp exp) {
  return cap - (cap + cap) / (exp(x * (2.0f / cap)) + 1.0f);
}

}  // namespace corellm
