// The loops of RMSNorm, residual add + RMSNorm, scaling, SiLU- and GELU-and-multiply and rotary embedding, written
// once and compiled once per register width: elementwise.cpp includes this file twice, inside
// namespace elementwise_avx2 (the baseline) and inside namespace elementwise_avx512 under an
// AVX-512 target region, and calls the one of the process's path. Every loop is lane-wise except
// RMSNorm's sum of squares, whose order follows the register width: each path is batch-invariant
// on its own. No include guard and no includes: the includer provides dtype.h, fast_math.h,
// <cmath> and <type_traits> first, and the path's Lanes (Vec, a register of kWidth fp32 lanes;
// load and store of kWidth bf16, round as round_to rounds; sum across the lanes in a fixed order;
// exp, fast_exp's polynomial lane by lane).

struct Loops {
  // Work below this many elements runs on the calling thread: a parallel region costs more.
  static constexpr int64_t kParallelMinElements = 1 << 15;

  template <class T>
  static void rms_norm_row(T* out, const T* x, const T* w, int64_t n, float eps) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (n % (2 * Lanes::kWidth) == 0) {
        return normalize_lanes(out, x, w, n, inverse_rms(sum_of_squares_lanes(x, n), n, eps));
      }
    }
    float sum_sq = 0.0f;
#pragma omp simd reduction(+ : sum_sq)
    for (int64_t i = 0; i < n; ++i) {
      const float v = load_f32(x + i);
      sum_sq += v * v;
    }
    const float inv = inverse_rms(sum_sq, n, eps);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      // HF order: normalize in fp32, round to the dtype, then multiply by the weight.
      const float normed = round_to(load_f32(x + i) * inv, x);
      store_f32(out + i, load_f32(w + i) * normed);
    }
  }

  static float inverse_rms(float sum_sq, int64_t n, float eps) {
    return 1.0f / std::sqrt(sum_sq / static_cast<float>(n) + eps);
  }

  // A bf16 row of whole pairs of registers, in explicit registers (GCC's own vectorization summed
  // its 32 partial sums one after another through memory): the squares summed in two registers
  // (alternate registers of columns), added lane by lane, then across the lanes (Lanes::sum); the
  // order depends on the path and the row's length alone.
  static float sum_of_squares_lanes(const uint16_t* x, int64_t n) {
    typename Lanes::Vec even{}, odd{};
    for (int64_t i = 0; i < n; i += 2 * Lanes::kWidth) {
      const typename Lanes::Vec a = Lanes::load(x + i), b = Lanes::load(x + i + Lanes::kWidth);
      even += a * a;
      odd += b * b;
    }
    return Lanes::sum(even + odd);
  }
  // out = w * round(x * inv) (HF's order), rounded.
  static void normalize_lanes(uint16_t* out, const uint16_t* x, const uint16_t* w, int64_t n, float inv) {
    for (int64_t i = 0; i < n; i += Lanes::kWidth) {
      Lanes::store(out + i, Lanes::load(w + i) * Lanes::round(Lanes::load(x + i) * inv));
    }
  }

  template <class T>
  static void rms_norm(T* out, int64_t out_stride, const T* x, int64_t x_stride, const T* w,
                       int64_t num_tokens, int64_t hidden, float eps) {
#pragma omp parallel for schedule(static) if (num_tokens * hidden >= kParallelMinElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
      rms_norm_row(out + t * out_stride, x + t * x_stride, w, hidden, eps);
    }
  }

  template <class T>
  static void fused_add_rms_norm(T* x, int64_t x_stride, T* residual, int64_t residual_stride, const T* w,
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

  // e^x on one value (fast_exp) or on a register of them (Lanes::exp, the same bits lane by lane).
  struct ExpOf {
    float operator()(float x) const { return fast_exp(x); }
    typename Lanes::Vec operator()(typename Lanes::Vec x) const { return Lanes::exp(x); }
  };

  // out[t, i] = act(gate[t, i]) * up[t, i] in fp32, rounded once: the gated MLPs' activation
  // (SwiGLU: act = silu; GeGLU: act = gelu_tanh). bf16 rows go Lanes::kWidth columns at a time in
  // explicit registers, the last few one at a time, with the same bits: left to the compiler, the
  // loop divided twice per register (the exponential's clamp made two versions of the quotient),
  // and SwiGLU on 256 x 1536 took 100-112 us instead of 83-85 (Intel Xeon VM, 2 threads).
  template <class T, class Act>
  static void gated_activation(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t num_tokens,
                               int64_t d, Act act) {
#pragma omp parallel for schedule(static) if (num_tokens * d >= kParallelMinElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
      const T* gate = x + t * x_stride;
      const T* up = gate + d;
      T* o = out + t * out_stride;
      int64_t i = 0;
      if constexpr (std::is_same_v<T, uint16_t>) {
        for (; i + Lanes::kWidth <= d; i += Lanes::kWidth) {
          Lanes::store(o + i, act(Lanes::load(gate + i)) * Lanes::load(up + i));
        }
      }
#pragma omp simd
      for (int64_t j = i; j < d; ++j) store_f32(o + j, act(load_f32(gate + j)) * load_f32(up + j));
    }
  }

  template <class T>
  static void scale(T* x, int64_t x_stride, int64_t num_tokens, int64_t d, float factor) {
#pragma omp parallel for schedule(static) if (num_tokens * d >= kParallelMinElements)
    for (int64_t t = 0; t < num_tokens; ++t) {
      T* row = x + t * x_stride;
#pragma omp simd
      for (int64_t i = 0; i < d; ++i) store_f32(row + i, load_f32(row + i) * factor);
    }
  }

  template <class T>
  static void silu_and_mul(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t num_tokens,
                           int64_t d) {
    gated_activation(out, out_stride, x, x_stride, num_tokens, d, [](auto g) { return silu_by(g, ExpOf{}); });
  }

  template <class T>
  static void gelu_tanh_and_mul(T* out, int64_t out_stride, const T* x, int64_t x_stride, int64_t num_tokens,
                                int64_t d) {
    gated_activation(out, out_stride, x, x_stride, num_tokens, d, [](auto g) { return gelu_tanh_by(g, ExpOf{}); });
  }

  template <class T>
  static void rotate_head(T* x, const float* cos, const float* sin, int64_t rot_dim, bool is_neox) {
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
  static void rotary(const int32_t* positions, T* q, int64_t q_stride, T* k, int64_t k_stride,
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
};

