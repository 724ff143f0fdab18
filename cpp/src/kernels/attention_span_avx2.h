// The span fold of attention_tile.h on AVX2 + FMA (the avx2 path): a span of up to 128 keys
// folded into all the rows of a work item at once (the rows of up to 16 query tokens, every
// query head sharing the KV head; a decode's are the rows of its one token), where a per-token
// fold re-reads each block once per token and keeps its sums in memory.
// AVX2 has no bf16 dot product: each bf16 of a K or V pair is widened to fp32 (a shift, or a
// mask, of its 32-bit lane) and multiplied with one fused multiply-add.
//
// Per span [t0, t0 + keys), as attention_tile.h:
//   S[r, j] = q_r . k_j, then scaled: per row and key, one chain of fused multiply-adds over the
//             dims in order (dim 2i, then 2i + 1), on q widened from bf16 (exact);
//   masked to row r's visible keys; m'_r = max(m_r, max_j S); P = e^(S - m'_r) in fp32, written
//   over S; l_r = l_r e^(m_r - m'_r) + sum_j P (the 8-lane sums of the span's vectors in order,
//   then the lanes in a fixed order);
//   acc_r = acc_r e^(m_r - m'_r), then per dim one chain over the key pairs in order
//   (key 2j, then 2j + 1).
// Rows go up to 4 at a time (R x 2 vectors of 8 sums in registers), from their scores to their
// values, over the 16-key groups some row of the block sees; but every row's operations, and
// their order, are the same whatever R, the rows beside it or the keys they see (a hidden key's
// P is exactly 0, and its S is masked before it is read): a token gets the same bits in a
// prefill, in any chunk, as a decode.
// Compiled for the baseline (AVX2 + FMA). Internal to paged_attention.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "attention_tile.h"
#include "lanes_avx2.h"

namespace corellm::attention::avx2 {

constexpr int kLanes = 8;
constexpr int kBlockRows = 4;  // rows folded together: 8 sums, 4 widened K or V vectors, 2 broadcasts

inline __m256i load_pairs(const uint16_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
// The first (low) / second (high) bf16 of each 32-bit pair, as fp32.
inline __m256 widen_low(__m256i pairs) { return _mm256_castsi256_ps(_mm256_slli_epi32(pairs, 16)); }
inline __m256 widen_high(__m256i pairs) {
  return _mm256_castsi256_ps(_mm256_and_si256(pairs, _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

using corellm::avx2::exp8;
using corellm::avx2::reduce_add8;
using corellm::avx2::reduce_max8;

// x scaled and soft-capped as `scaling` says, on 8 lanes (attention_block.h's soft_capped).
inline __m256 scaled8(__m256 x, ScoreScaling scaling) {
  x = _mm256_mul_ps(x, _mm256_set1_ps(scaling.scale));
  if (scaling.softcap <= 0.0f) return x;
  return soft_capped_by(x, scaling.softcap, [](__m256 v) { return exp8(v); });
}

// Rows [r0, r0 + R)'s queries widened from bf16 pairs to fp32: q[r][HD].
template <int HD, int R>
void widen_queries(const TileRows& rows, int64_t r0, float (*q)[HD]) {
  for (int r = 0; r < R; ++r) {
    const uint16_t* qb = reinterpret_cast<const uint16_t*>(rows.qb + (r0 + r) * (HD / 2));
    for (int d = 0; d < HD; d += kLanes) {
      _mm256_storeu_ps(q[r] + d, corellm::avx2::load_bf16x8(qb + d));
    }
  }
}

// S for rows [r0, r0 + R) over the 16-key groups [g_begin, g_end) (keys of other groups are seen
// by none of these rows: their S stays unwritten, and the softmax masks it). Per dim pair, the
// group's two vectors of 8 keys are loaded and widened (4 registers), then each row's two query
// values are broadcast once and used on both: 2R accumulators + 4 + 2 registers, none spilled
// (a spilled sum puts a store and a load in its chain).
template <int HD, int R>
void span_scores(const float (*q)[HD], const Span& span, int64_t bs, int64_t g_begin, int64_t g_end, float* s) {
  for (int64_t g = g_begin; g < g_end; ++g) {
    const uint16_t* k = span.k[g];
    __m256 acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int dp = 0; dp < HD / 2; ++dp) {
      if (span.next != nullptr) span.next->step();
      const __m256i lo = load_pairs(k + dp * bs * 2), hi = load_pairs(k + dp * bs * 2 + 16);
      const __m256 even0 = widen_low(lo), odd0 = widen_high(lo), even1 = widen_low(hi), odd1 = widen_high(hi);
      for (int r = 0; r < R; ++r) {
        const __m256 qe = _mm256_broadcast_ss(&q[r][2 * dp]), qo = _mm256_broadcast_ss(&q[r][2 * dp + 1]);
        acc[r][0] = _mm256_fmadd_ps(qo, odd0, _mm256_fmadd_ps(qe, even0, acc[r][0]));
        acc[r][1] = _mm256_fmadd_ps(qo, odd1, _mm256_fmadd_ps(qe, even1, acc[r][1]));
      }
    }
    for (int r = 0; r < R; ++r) {
      _mm256_storeu_ps(s + r * kSpanKeys + 16 * g, acc[r][0]);
      _mm256_storeu_ps(s + r * kSpanKeys + 16 * g + 8, acc[r][1]);
    }
  }
}

// Row r's softmax over the span: S scaled and masked to its visible keys, m and l updated, P
// (fp32, 0 where hidden) written over S, and the factor acc is rescaled by. A row that sees no
// key of the span gets P = 0, factor 1.
inline void softmax_row(const TileRows& rows, const Span& span, int64_t r, ScoreScaling scaling, const TileScratch& sc) {
  const int64_t lo = std::max<int64_t>(rows.lo[r] - span.t0, 0);
  const int64_t hi = std::min<int64_t>(rows.hi[r] - span.t0, span.keys);
  float* s = sc.s + r * kSpanKeys;
  const int64_t vectors = span.keys / kLanes;
  if (hi <= lo) {
    std::fill(s, s + span.keys, 0.0f);
    sc.correction[r] = 1.0f;
    return;
  }
  const __m256 neg_inf = _mm256_set1_ps(kNegInf);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const bool all_visible = lo == 0 && hi == span.keys;
  __m256 row_max = neg_inf;
  for (int64_t v = 0; v < vectors; ++v) {
    __m256 x = scaled8(_mm256_loadu_ps(s + kLanes * v), scaling);
    if (!all_visible) {  // a select, not a product: a stale NaN score stays out
      const __m256i key = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(kLanes * v)));
      const __m256i visible = _mm256_andnot_si256(_mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(lo)), key),
                                                  _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(hi)), key));
      x = _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(visible));
    }
    _mm256_storeu_ps(s + kLanes * v, x);
    row_max = _mm256_max_ps(row_max, x);
  }
  const float m_new = std::max(rows.m[r], reduce_max8(row_max));
  const float correction = rescale(rows.m[r], m_new);
  const __m256 m = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t v = 0; v < vectors; ++v) {
    const __m256 x = _mm256_loadu_ps(s + kLanes * v);
    // e^(-inf) would be e^-87.3 through the clamp: hidden keys are zeroed explicitly.
    const __m256 p = _mm256_and_ps(exp8(_mm256_sub_ps(x, m)), _mm256_cmp_ps(x, neg_inf, _CMP_NEQ_OQ));
    sum = _mm256_add_ps(sum, p);
    _mm256_storeu_ps(s + kLanes * v, p);
  }
  rows.l[r] = rows.l[r] * correction + reduce_add8(sum);
  rows.m[r] = m_new;
  sc.correction[r] = correction;
}

// The vector operations attention_span_widened.h is written with.
using V = __m256;
inline V load(const float* p) { return _mm256_loadu_ps(p); }
inline void store(float* p, V v) { _mm256_storeu_ps(p, v); }
inline V mul(V a, V b) { return _mm256_mul_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
inline V splat(float x) { return _mm256_set1_ps(x); }
inline V broadcast(const float* p) { return _mm256_broadcast_ss(p); }

// Calls f(std::integral_constant<int, R>, r0) over rows [begin, end) in blocks of kBlockRows,
// then one block of the 1-3 rows left.
template <class F>
void for_row_blocks(int64_t begin, int64_t end, F&& f) {
  int64_t r = begin;
  for (; r + kBlockRows <= end; r += kBlockRows) f(std::integral_constant<int, kBlockRows>{}, r);
  switch (end - r) {
    case 3: return f(std::integral_constant<int, 3>{}, r);
    case 2: return f(std::integral_constant<int, 2>{}, r);
    case 1: return f(std::integral_constant<int, 1>{}, r);
    default: return;
  }
}

// The number of NextSpanLines steps fold_span_bf16 makes for `rows` rows that all see a whole
// span of `keys` keys (the caller spreads the next span's lines over them).
inline int64_t fold_steps(int64_t rows, int64_t keys, int64_t hd) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows;
  return blocks * (keys / 16) * (hd / 2 + hd / 16 * 8);
}

#include "attention_span_widened.h"  // span_values and fold_span_bf16

}  // namespace corellm::attention::avx2
