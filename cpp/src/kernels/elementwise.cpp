// RMSNorm, residual add + RMSNorm, SiLU-and-multiply and rotary embedding on the CPU.
#include "corellm/kernels/elementwise.h"

#include <cmath>

#include "corellm/check.h"
#include "fast_math.h"

namespace corellm {

namespace {

// Work below this many elements runs on the calling thread: a parallel region costs more.
constexpr int64_t kParallelMinElements = 1 << 15;

template <class T>
void rms_norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
  float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
  for (int64_t i = 0; i < n; ++i) {
    const float v = load_f32(x + i);
    sum_sq += v * v;
  }
  const float inv = 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    // HF order: normalize in fp32, round to the dtype, then multiply by the weight.
    const float normed = round_to(load_f32(x + i) * inv, x);
    store_f32(out + i, load_f32(w + i) * normed);
  }
}

template <class T>
void rms_norm_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                   int64_t num_tokens, int64_t hidden, float eps) {
#pragma omp parallel for schedule(static) if (num_tokens * hidden >= kParallelMinElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    rms_norm_row(out + t * out_stride, x + t * x_stride, w, hidden, eps);
  }
}

template <class T>
void fused_add_rms_norm_impl(T* x, int64_t x_stride, T* residual, int64_t residual_stride, const T* w,
                             int64_t num_tokens, int64_t hidden, float eps) {
#pragma omp parallel for schedule(static) if (num_tokens * hidden >= kParallelMinElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    T* xr = x + t * x_stride;
    T* rr = residual + t * residual_stride;
#pragma omp simd
    for (int64_t i = 0; i < hidden; ++i) store_f32(rr + i, load_f32(xr + i) + load_f32(rr + i));
    rms_norm_row(xr, rr, w, hidden, eps);
  }
}

template <class T>
void silu_and_mul_impl(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t num_tokens,
                       int64_t d) {
#pragma omp parallel for schedule(static) if (num_tokens * d >= kParallelMinElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const T* gate = x + t * x_stride;
    const T* up = gate + d;
    T* o = out + t * out_stride;
#pragma omp simd
    for (int64_t i = 0; i < d; ++i) store_f32(o + i, silu(load_f32(gate + i)) * load_f32(up + i));
  }
}

template <class T>
void rotate_head(T* x, const float* cos, const float* sin, int64_t rot_dim, bool is_neox) {
  const int64_t half = rot_dim / 2;
  if (is_neox) {
#pragma omp simd
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = load_f32(x + i);
      const float x2 = load_f32(x + i + half);
      store_f32(x + i, x1 * cos[i] - x2 * sin[i]);
      store_f32(x + i + half, x2 * cos[i] + x1 * sin[i]);
    }
  } else {
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = load_f32(x + 2 * i);
      const float x2 = load_f32(x + 2 * i + 1);
      store_f32(x + 2 * i, x1 * cos[i] - x2 * sin[i]);
      store_f32(x + 2 * i + 1, x2 * cos[i] + x1 * sin[i]);
    }
  }
}

template <class T>
void rotary_impl(const int32_t* positions, T* q, int64_t q_stride, T* k, int64_t k_stride,
                 const float* cache, int64_t num_tokens, int64_t num_heads, int64_t num_kv_heads,
                 int64_t head_size, int64_t rot_dim, bool is_neox) {
  const int64_t work = num_tokens * (num_heads + num_kv_heads) * rot_dim;
#pragma omp parallel for schedule(static) if (work >= kParallelMinElements)
  for (int64_t t = 0; t < num_tokens; ++t) {
    const float* cos = cache + static_cast<int64_t>(positions[t]) * rot_dim;
    const float* sin = cos + rot_dim / 2;
    for (int64_t h = 0; h < num_heads; ++h) rotate_head(q + t * q_stride + h * head_size, cos, sin, rot_dim, is_neox);
    for (int64_t h = 0; h < num_kv_heads; ++h) rotate_head(k + t * k_stride + h * head_size, cos, sin, rot_dim, is_neox);
  }
}

}  // namespace

void rms_norm(void* out, int64_t out_stride, const void* x, int64_t x_stride, const void* weight,
              int64_t num_tokens, int64_t hidden, float eps, DType dtype) {
  if (dtype == DType::F32) {
    rms_norm_impl(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                  static_cast<const float*>(weight), num_tokens, hidden, eps);
  } else {
    rms_norm_impl(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(x), x_stride,
                  static_cast<const uint16_t*>(weight), num_tokens, hidden, eps);
  }
}

void fused_add_rms_norm(void* x, int64_t x_stride, void* residual, int64_t residual_stride,
                        const void* weight, int64_t num_tokens, int64_t hidden, float eps, DType dtype) {
  if (dtype == DType::F32) {
    fused_add_rms_norm_impl(static_cast<float*>(x), x_stride, static_cast<float*>(residual),
                            residual_stride, static_cast<const float*>(weight), num_tokens, hidden, eps);
  } else {
    fused_add_rms_norm_impl(static_cast<uint16_t*>(x), x_stride, static_cast<uint16_t*>(residual),
                            residual_stride, static_cast<const uint16_t*>(weight), num_tokens, hidden, eps);
  }
}

void silu_and_mul(void* out, int64_t out_stride, const void* x, int64_t x_stride, int64_t num_tokens,
                  int64_t d, DType dtype) {
  if (dtype == DType::F32) {
    silu_and_mul_impl(static_cast<float*>(out), out_stride, static_cast<const float*>(x), x_stride,
                      num_tokens, d);
  } else {
    silu_and_mul_impl(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(x),
                      x_stride, num_tokens, d);
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
  if (dtype == DType::F32) {
    rotary_impl(positions, static_cast<float*>(q), q_stride, static_cast<float*>(k), k_stride,
                cos_sin_cache, num_tokens, num_heads, num_kv_heads, head_size, rot_dim, is_neox);
  } else {
    rotary_impl(positions, static_cast<uint16_t*>(q), q_stride, static_cast<uint16_t*>(k), k_stride,
                cos_sin_cache, num_tokens, num_heads, num_kv_heads, head_size, rot_dim, is_neox);
  }
}

}  // namespace corellm
