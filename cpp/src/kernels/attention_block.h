// The inner step of paged attention: fold one KV block into one query row's online-softmax
// state. Implementations of the same algorithm: portable C++ on fp32 copies of the block (the
// baseline, AVX2; bf16 caches of shapes no span fold serves) and AVX-512 on fp32 caches (read in
// place, in a region of its own: namespace attention::avx512), chosen at run time by select_fold.
// bf16 caches are folded a span at a time on every path (attention_tile.h, attention_amx.h,
// attention_span_avx512.h, attention_span_avx2.h); the helpers here (exp16, softmax_step,
// visible_lanes) serve those folds too.
// Internal to paged_attention.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "corellm/kernels/cpu_isa.h"
#include "fast_math.h"
#include "lanes_avx512.h"

namespace corellm::attention {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One query row's state. Keys [lo, hi) of the block are visible to it.
struct RowState {
  const float* q;      // [head_size] fp32, pre-scaled (fp32 and generic paths)
  const uint32_t* qb;  // [head_size / 2] bf16 pairs, unscaled (bf16 path)
  float* m;            // running max of the scores
  float* l;            // running sum of e^(score - m)
  float* acc;          // [head_size] running sum of e^(score - m) * v
};

// What a score q . k becomes before the softmax: times `scale`, then, where softcap > 0,
// softcap * tanh(x / softcap) (Gemma 2's attention logit soft-capping: fast_math.h's
// soft_capped_by, here and in the vector forms, scaled16 below and attention_span_avx2.h's scaled8).
struct ScoreScaling {
  float scale = 1.0f;
  float softcap = 0.0f;  // 0: none
};

inline float soft_capped(float x, float softcap) {
  return soft_capped_by(x, softcap, [](float v) { return fast_exp(v); });
}

// Rescale factor of the old state when the max grows (0 before the first visible key).
inline float rescale(float m_old, float m_new) { return m_old == kNegInf ? 0.0f : fast_exp(m_old - m_new); }

// Portable fold. kf: [head_size, block_size] keys transposed, vf: [block_size, head_size], fp32;
// s: scratch of block_size floats.
inline void fold_block_generic(const RowState& row, const float* kf, const float* vf, int64_t hd, int64_t bs,
                               int64_t lo, int64_t hi, float* s, float softcap) {
  std::fill(s, s + bs, 0.0f);
  for (int64_t d = 0; d < hd; ++d) {
    const float qd = row.q[d];
    const float* kd = kf + d * bs;
    for (int64_t t = 0; t < bs; ++t) s[t] += qd * kd[t];
  }
  if (softcap > 0.0f) {
    for (int64_t t = lo; t < hi; ++t) s[t] = soft_capped(s[t], softcap);
  }
  float block_max = kNegInf;
  for (int64_t t = lo; t < hi; ++t) block_max = std::max(block_max, s[t]);
  const float m_new = std::max(*row.m, block_max);
  const float correction = rescale(*row.m, m_new);
  float sum = 0.0f;
  for (int64_t t = lo; t < hi; ++t) {
    s[t] = fast_exp(s[t] - m_new);
    sum += s[t];
  }
  *row.l = *row.l * correction + sum;
  *row.m = m_new;
  for (int64_t d = 0; d < hd; ++d) row.acc[d] *= correction;
  for (int64_t t = lo; t < hi; ++t) {
    const float* vt = vf + t * hd;
    for (int64_t d = 0; d < hd; ++d) row.acc[d] += s[t] * vt[d];
  }
}

// ---- AVX-512 F/BW/VL/DQ: fp32 caches, and the helpers of the bf16 folds ----
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace avx512 {

using corellm::avx512::exp16;

// Visible lanes of the 16 keys starting at t0, for keys [lo, hi).
inline __mmask16 visible_lanes(int64_t t0, int64_t lo, int64_t hi, int64_t& first, int64_t& last) {
  first = std::max<int64_t>(lo - t0, 0);
  last = std::min<int64_t>(hi - t0, 16);
  return static_cast<__mmask16>(((1u << last) - 1u) & ~((1u << first) - 1u));
}

// x scaled and soft-capped as `scaling` says, on 16 lanes (soft_capped's function).
inline __m512 scaled16(__m512 x, ScoreScaling scaling) {
  x = _mm512_mul_ps(x, _mm512_set1_ps(scaling.scale));
  if (scaling.softcap <= 0.0f) return x;
  return soft_capped_by(x, scaling.softcap, [](__m512 v) { return exp16(v); });
}

// Masked online-softmax update for 16 scores; returns the probabilities (0 on hidden lanes)
// and the factor the accumulator must be multiplied by.
inline __m512 softmax_step(const RowState& row, __m512 s, __mmask16 visible, float& correction) {
  s = _mm512_mask_blend_ps(visible, _mm512_set1_ps(kNegInf), s);
  const float m_new = std::max(*row.m, _mm512_reduce_max_ps(s));
  correction = rescale(*row.m, m_new);
  const __m512 p = _mm512_maskz_mov_ps(visible, exp16(_mm512_sub_ps(s, _mm512_set1_ps(m_new))));
  *row.l = *row.l * correction + _mm512_reduce_add_ps(p);
  *row.m = m_new;
  return p;
}

// fp32 cache read in place: kf [HD, BS] (keys transposed), vf [BS, HD]. Sizes are template
// parameters so that the scores and the accumulator live in registers.
template <int HD, int BS>
void fold_block_fp32(const RowState& row, const float* kf, const float* vf, int64_t lo, int64_t hi,
                     ScoreScaling scaling) {
  constexpr int kChunks = HD / 16;
  for (int64_t t0 = lo - lo % 16; t0 < hi; t0 += 16) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;  // four chains over the dims
#pragma GCC unroll 4
    for (int d = 0; d < HD; d += 4) {
      s0 = _mm512_fmadd_ps(_mm512_set1_ps(row.q[d]), _mm512_loadu_ps(kf + d * BS + t0), s0);
      s1 = _mm512_fmadd_ps(_mm512_set1_ps(row.q[d + 1]), _mm512_loadu_ps(kf + (d + 1) * BS + t0), s1);
      s2 = _mm512_fmadd_ps(_mm512_set1_ps(row.q[d + 2]), _mm512_loadu_ps(kf + (d + 2) * BS + t0), s2);
      s3 = _mm512_fmadd_ps(_mm512_set1_ps(row.q[d + 3]), _mm512_loadu_ps(kf + (d + 3) * BS + t0), s3);
    }
    int64_t first, last;
    const __mmask16 visible = visible_lanes(t0, lo, hi, first, last);
    float correction;
    // q was scaled already: only the soft cap is left to apply.
    const __m512 p = softmax_step(row, scaled16(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)),
                                                ScoreScaling{1.0f, scaling.softcap}),
                                  visible, correction);
    alignas(64) float pv[16];
    _mm512_store_ps(pv, p);
    const __m512 corr = _mm512_set1_ps(correction);
    __m512 acc[kChunks];
    for (int c = 0; c < kChunks; ++c) acc[c] = _mm512_mul_ps(_mm512_loadu_ps(row.acc + 16 * c), corr);
    for (int64_t t = first; t < last; ++t) {
      const __m512 pt = _mm512_set1_ps(pv[t]);
      const float* vt = vf + (t0 + t) * HD;
      for (int c = 0; c < kChunks; ++c) acc[c] = _mm512_fmadd_ps(pt, _mm512_loadu_ps(vt + 16 * c), acc[c]);
    }
    for (int c = 0; c < kChunks; ++c) _mm512_storeu_ps(row.acc + 16 * c, acc[c]);
  }
}

template <int HD, int BS>
void fold_fp32(const RowState* rows, int num_rows, const float* kf, const float* vf, int64_t lo, int64_t hi,
               ScoreScaling scaling) {
  for (int r = 0; r < num_rows; ++r) fold_block_fp32<HD, BS>(rows[r], kf, vf, lo, hi, scaling);
}

}  // namespace avx512
#pragma GCC pop_options

// A fold of up to kMaxRows rows of one query token (same visible keys); null: the generic path.
constexpr int kMaxRows = 4;
template <class T>
using FoldFn = void (*)(const RowState* rows, int num_rows, const T* kb, const T* vb, int64_t lo, int64_t hi,
                        ScoreScaling scaling);

// The per-token fold for this cache type and shape on path `isa`: AVX-512 for fp32 caches. Null:
// the generic path (bf16 caches of shapes no span fold serves (attention_amx.h's
// select_span_fold), other shapes, or fp32 caches on an AVX2 CPU).
template <class T>
FoldFn<T> select_fold(int64_t hd, int64_t bs, CpuIsa isa) {
  if constexpr (sizeof(T) == 2) {
    return nullptr;
  } else {
    if (!isa_at_least(isa, CpuIsa::kAvx512)) return nullptr;
#define CORELLM_FOLD(HD, BS) \
  if (hd == HD && bs == BS) return &avx512::fold_fp32<HD, BS>;
    CORELLM_FOLD(64, 16)
    CORELLM_FOLD(64, 32)
    CORELLM_FOLD(64, 64)
    CORELLM_FOLD(64, 128)
    CORELLM_FOLD(128, 16)
    CORELLM_FOLD(128, 32)
    CORELLM_FOLD(128, 64)
    CORELLM_FOLD(128, 128)
    CORELLM_FOLD(256, 16)  // Gemma's head size
    CORELLM_FOLD(256, 32)
    CORELLM_FOLD(32, 16)
    CORELLM_FOLD(32, 32)
#undef CORELLM_FOLD
    return nullptr;
  }
}

}  // namespace corellm::attention
