// RMSNorm, residual add + RMSNorm, SiLU- and GELU-and-multiply and rotary embedding on the CPU: the loops
// (elementwise_loops.h) compiled for AVX2 and for AVX-512, the process's path choosing (cpu_isa.h).
#include "corellm/kernels/elementwise.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "corellm/check.h"
#include "corellm/kernels/cpu_isa.h"
#include "fast_math.h"
#include "lanes_avx2.h"
#include "lanes_avx512.h"

namespace corellm {

// Each path's vector lanes (elementwise_loops.h's Lanes): its register of fp32 lanes, bf16 in and
// out of it (and rounded in place), the sum across it, and e^x.
namespace elementwise_avx2 {
struct Lanes {
  using Vec = __m256;
  static constexpr int64_t kWidth = 8;
  static Vec load(const uint16_t* p) { return avx2::load_bf16x8(p); }
  static void store(uint16_t* p, Vec v) { avx2::store_bf16x8(p, v); }
  static Vec round(Vec v) { return avx2::round_bf16x8(v); }
  static float sum(Vec v) { return avx2::reduce_add8(v); }
  static Vec exp(Vec x) { return avx2::exp8(x); }
};
#include "elementwise_loops.h"
}  // namespace elementwise_avx2

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,prefer-vector-width=512")
namespace elementwise_avx512 {
struct Lanes {
  using Vec = __m512;
  static constexpr int64_t kWidth = 16;
  static Vec load(const uint16_t* p) { return avx512::load_bf16x16(p); }
  static void store(uint16_t* p, Vec v) { avx512::store_bf16x16(p, v); }
  static Vec round(Vec v) { return avx512::round_bf16x16(v); }
  static float sum(Vec v) { return avx512::reduce_add16(v); }
  static Vec exp(Vec x) { return avx512::exp16(x); }
};
#include "elementwise_loops.h"
}  // namespace elementwise_avx512
#pragma GCC pop_options

namespace {

// Calls f with the loops of the process's path: 16-lane registers where it has AVX-512.
template <class F>
void with_loops(F&& f) {
  if (isa_at_least(cpu_isa(), CpuIsa::kAvx512)) {
    f(elementwise_avx512::Loops{});
  } else {
    f(elementwise_avx2::Loops{});
  }
}

}  // namespace

void rms_norm(void* out, int64_t out_stride, const void* x, int64_t x_stride, const void* weight,
              int64_t num_tokens, int64_t hidden, float eps, DType dtype) {
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.rms_norm(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                     static_cast<const float*>(weight), num_tokens, hidden, eps);
    } else {
      loops.rms_norm(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(x), x_stride,
                     static_cast<const uint16_t*>(weight), num_tokens, hidden, eps);
    }
  });
}

void fused_add_rms_norm(void* x, int64_t x_stride, void* residual, int64_t residual_stride,
                        const void* weight, int64_t num_tokens, int64_t hidden, float eps, DType dtype) {
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.fused_add_rms_norm(static_cast<float*>(x), x_stride, static_cast<float*>(residual),
                               residual_stride, static_cast<const float*>(weight), num_tokens, hidden, eps);
    } else {
      loops.fused_add_rms_norm(static_cast<uint16_t*>(x), x_stride, static_cast<uint16_t*>(residual),
                               residual_stride, static_cast<const uint16_t*>(weight), num_tokens, hidden, eps);
    }
  });
}

void scale(void* x, int64_t x_stride, int64_t num_tokens, int64_t d, float factor, DType dtype) {
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.scale(static_cast<float*>(x), x_stride, num_tokens, d, factor);
    } else {
      loops.scale(static_cast<uint16_t*>(x), x_stride, num_tokens, d, factor);
    }
  });
}

void silu_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                  int64_t d, DType dtype) {
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.silu_and_mul(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                         num_tokens, d);
    } else {
      loops.silu_and_mul(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(x),
                         x_stride, num_tokens, d);
    }
  });
}

void gelu_tanh_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d, DType dtype) {
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.gelu_tanh_and_mul(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                              num_tokens, d);
    } else {
      loops.gelu_tanh_and_mul(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(x),
                              x_stride, num_tokens, d);
    }
  });
}

void swigluoai_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d, float alpha, float limit, DType dtype) {
  CORELLM_CHECK_ARG(alpha > 0.0f && limit > 0.0f && std::isfinite(alpha) && std::isfinite(limit),
                    "swigluoai_and_mul: alpha and limit must be positive and finite, got ", alpha, " and ", limit);
  // A scalar loop with the library's exp: the models that use it run it once per layer on an
  // expert's few rows, beside GEMMs thousands of times its work.
  auto one = [&](float gate, float up) {
    const float g = std::min(gate, limit), u = std::min(std::max(up, -limit), limit);
    const float glu = g * (1.0f / (1.0f + std::exp(-(alpha * g))));
    return (u + 1.0f) * glu;
  };
  for (int64_t t = 0; t < num_tokens; ++t) {
    if (dtype == DType::F32) {
      const float* row = static_cast<const float*>(x) + t * x_stride;
      float* o = static_cast<float*>(out) + t * out_stride;
      for (int64_t i = 0; i < d; ++i) o[i] = one(row[i], row[d + i]);
    } else {
      const uint16_t* row = static_cast<const uint16_t*>(x) + t * x_stride;
      uint16_t* o = static_cast<uint16_t*>(out) + t * out_stride;
      for (int64_t i = 0; i < d; ++i) o[i] = f32_to_bf16(one(bf16_to_f32(row[i]), bf16_to_f32(row[d + i])));
    }
  }
}

void gated_activation_and_mul(GatedActivation act, void* out, int64_t out_stride, const void* x, int64_t x_stride,
                              int64_t num_tokens, int64_t d, DType dtype) {
  CORELLM_CHECK_ARG(act == GatedActivation::kSilu || act == GatedActivation::kGeluTanh,
                    "gated_activation_and_mul: silu or gelu_tanh, got activation ", static_cast<int32_t>(act));
  if (act == GatedActivation::kGeluTanh) {
    gelu_tanh_and_mul(out, out_stride, x, x_stride, num_tokens, d, dtype);
  } else {
    silu_and_mul(out, out_stride, x, x_stride, num_tokens, d, dtype);
  }
}

void rotary_embedding(const int32_t* positions, void* q, int64_t q_stride, void* k, int64_t k_stride,
                      const float* cos_sin_cache, int64_t max_position, int64_t num_tokens,
                      int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t rot_dim,
                      bool is_neox, DType dtype) {
  CORELLM_CHECK_ARG(rot_dim > 0 && rot_dim % 2 == 0 && rot_dim <= head_size,
                    "rot_dim must be even and in (0, head_size=", head_size, "], got ", rot_dim);
  for (int64_t t = 0; t < num_tokens; ++t) {
    CORELLM_CHECK_ARG(positions[t] >= 0 && positions[t] < max_position, "positions[", t, "] = ",
                      positions[t], " is outside the rotary cache [0, ", max_position, ")");
  }
  with_loops([&](auto loops) {
    if (dtype == DType::F32) {
      loops.rotary(positions, static_cast<float*>(q), q_stride, static_cast<float*>(k), k_stride,
                   cos_sin_cache, num_tokens, num_heads, num_kv_heads, head_size, rot_dim, is_neox);
    } else {
      loops.rotary(positions, static_cast<uint16_t*>(q), q_stride, static_cast<uint16_t*>(k), k_stride,
                   cos_sin_cache, num_tokens, num_heads, num_kv_heads, head_size, rot_dim, is_neox);
    }
  });
}

}  // namespace corellm
