// Fused elementwise CPU kernels: RMSNorm, residual add + RMSNorm, scaling, SiLU- and GELU-and-multiply,
// rotary embedding. Raw pointers, row strides in elements, a dtype tag; parallel over tokens (OpenMP,
// the same runtime torch uses, so the two share one thread pool).
#pragma once

#include <cstdint>

#include "corellm/kernels/dtype.h"

namespace corellm {

// out[t, :] = weight * x[t, :] / sqrt(mean(x[t, :]^2) + eps), computed in fp32 and rounded as
// HF's LlamaRMSNorm rounds (the normalized value to the dtype, then the product).
void rms_norm(void* out, int64_t out_stride, const void* x, int64_t x_stride, const void* weight,
              int64_t num_tokens, int64_t hidden, float eps, DType dtype);

// residual[t] = x[t] + residual[t] (rounded to the dtype); x[t] = rms_norm(residual[t]).
void fused_add_rms_norm(void* x, int64_t x_stride, void* residual, int64_t residual_stride,
                        const void* weight, int64_t num_tokens, int64_t hidden, float eps, DType dtype);

// x[t, :d] *= factor, in place, the product in fp32 rounded once to the dtype (Granite's
// residual_multiplier on a layer's attention and MLP outputs, as HF's bf16 product rounds).
void scale(void* x, int64_t x_stride, int64_t num_tokens, int64_t d, float factor, DType dtype);

// The activation of a gated MLP: out = act(gate) * up (SwiGLU: silu; GeGLU: gelu_tanh, or gelu_erf —
// ModernBERT's, GELU in its erf form — which only the fused gated GEMM computes: bf16_gemm_gated;
// swiglu_oai, gpt-oss's clamped SwiGLU, with its two parameters: swigluoai_and_mul only).
enum class GatedActivation : int32_t { kSilu = 0, kGeluTanh = 1, kGeluErf = 2, kSwigluOai = 3 };

// out[t, :d] = silu(x[t, :d]) * x[t, d:2d].
void silu_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                  int64_t d, DType dtype);

// out[t, :d] = gelu_tanh(x[t, :d]) * x[t, d:2d] (GeGLU; GELU's tanh approximation), in fp32,
// rounded once to the dtype.
void gelu_tanh_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d, DType dtype);

// gpt-oss's clamped SwiGLU: with g = min(x[t, i], limit) and u = clamp(x[t, d + i], -limit, limit),
// out[t, i] = (u + 1) * (g * sigmoid(alpha * g)), in fp32 (sigmoid(z) = 1 / (1 + e^-z)), rounded once
// to the dtype. InvalidArgument unless alpha and limit are positive and finite.
void swigluoai_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d, float alpha, float limit, DType dtype);

// silu_and_mul or gelu_tanh_and_mul, by `act` (kGeluErf: refused, there is no unfused kernel for it).
void gated_activation_and_mul(GatedActivation act, void* out, int64_t out_stride, const void* x, int64_t x_stride,
                              int64_t num_tokens, int64_t d, DType dtype);

// In place on q [num_tokens, num_heads, head_size] and k [num_tokens, num_kv_heads, head_size]
// (token strides given; heads contiguous): rotates the first rot_dim dims of every head by the
// angle of its position. cos_sin_cache [max_position, rot_dim] fp32: cos in the first half,
// sin in the second. NeoX style rotates (x[i], x[i + rot_dim/2]); GPT-J style (x[2i], x[2i+1]).
void rotary_embedding(const int32_t* positions, void* q, int64_t q_stride, void* k, int64_t k_stride,
                      const float* cos_sin_cache, int64_t max_position, int64_t num_tokens,
                      int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t rot_dim,
                      bool is_neox, DType dtype);

}  // namespace corellm
