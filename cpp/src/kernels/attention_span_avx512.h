// The span fold of attention_tile.h on AVX-512F without AVX-512-BF16 (the avx512 path: Intel
// Skylake-SP, Cascade Lake, Ice Lake): attention_span_avx2.h's arithmetic on 16-lane registers,
// 32 of them. A span of up to 128 keys is folded into all the rows of a work item at once (the
// rows of up to 16 query tokens, every query head sharing the KV head; a decode's are the rows of
// its one token), where a per-token fold re-reads each block once per token. No bf16 dot product:
// each bf16 of a K or V pair is widened to fp32 (a shift, or a mask, of its 32-bit lane) and
// multiplied with one fused multiply-add.
//
// Per span [t0, t0 + keys), as attention_tile.h:
//   S[r, j] = q_r . k_j, then scaled: per row and key, one chain of fused multiply-adds over the
//             dims in order (dim 2i, then 2i + 1), on q widened from bf16 (exact);
//   masked to row r's visible keys; m'_r = max(m_r, max_j S); P = e^(S - m'_r) in fp32, written
//   over S; l_r = l_r e^(m_r - m'_r) + sum_j P (the 16-lane sums of the span's vectors in order,
//   then the lanes in a fixed order);
//   acc_r = acc_r e^(m_r - m'_r), then per dim one chain over the key pairs in order
//   (key 2j, then 2j + 1).
// Rows go up to 8 at a time. The scores take two 16-key groups at once (R x 2 sums, 4 widened K
// vectors, 2 broadcasts: 22 registers at 8 rows), so that a decode's 3 rows still have 6
// independent chains; P V takes 32 dims at once (the same count). Every row's operations, and
// their order, are the same whatever the rows beside it or the keys they see (a hidden key's P is
// exactly 0, and its S is masked before it is read): a token gets the same bits in a prefill, in
// any chunk, as a decode.
// Compiled for AVX-512 F/BW/VL/DQ; run only where the process's path is avx512. Internal to
// paged_attention.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "attention_tile.h"
#include "lanes_avx512.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
namespace corellm::attention::avx512f {

constexpr int kLanes = 16;
constexpr int kBlockRows = kTileRows;  // rows folded together (8), in attention_tile.h's blocks

inline __m512i load_pairs(const uint16_t* p) { return _mm512_loadu_si512(p); }
// The first (low) / second (high) bf16 of each 32-bit pair, as fp32. (The shift's zero-masking
// form with every lane kept is the plain shift; GCC 12 warns that the plain form's "undefined"
// merge source is used uninitialized where it inlines it into group_scores' loops.)
inline __m512 widen_low(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_maskz_slli_epi32(static_cast<__mmask16>(0xFFFF), pairs, 16));
}
inline __m512 widen_high(__m512i pairs) {
  return _mm512_castsi512_ps(_mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

// Rows [r0, r0 + R)'s queries widened from bf16 pairs to fp32: q[r][HD].
template <int HD, int R>
void widen_queries(const TileRows& rows, int64_t r0, float (*q)[HD]) {
  for (int r = 0; r < R; ++r) {
    const uint16_t* qb = reinterpret_cast<const uint16_t*>(rows.qb + (r0 + r) * (HD / 2));
    for (int d = 0; d < HD; d += kLanes) _mm512_storeu_ps(q[r] + d, corellm::avx512::load_bf16x16(qb + d));
  }
}

// S for rows [0, R) over the G 16-key groups from g (one vector of sums per row and group): per
// dim pair, each group's K pairs are loaded and widened, then each row's two query values are
// broadcast once and used on every group.
template <int HD, int R, int G>
void group_scores(const float (*q)[HD], const Span& span, int64_t bs, int64_t g, float* s) {
  __m512 acc[R][G];
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < G; ++i) acc[r][i] = _mm512_setzero_ps();
  }
  for (int dp = 0; dp < HD / 2; ++dp) {
    if (span.next != nullptr) span.next->step();
    __m512 even[G], odd[G];
    for (int i = 0; i < G; ++i) {
      const __m512i pairs = load_pairs(span.k[g + i] + dp * bs * 2);
      even[i] = widen_low(pairs);
      odd[i] = widen_high(pairs);
    }
    for (int r = 0; r < R; ++r) {
      const __m512 qe = _mm512_set1_ps(q[r][2 * dp]), qo = _mm512_set1_ps(q[r][2 * dp + 1]);
      for (int i = 0; i < G; ++i) acc[r][i] = _mm512_fmadd_ps(qo, odd[i], _mm512_fmadd_ps(qe, even[i], acc[r][i]));
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int i = 0; i < G; ++i) _mm512_storeu_ps(s + r * kSpanKeys + kLanes * (g + i), acc[r][i]);
  }
}

// S for rows [0, R) over the 16-key groups [g_begin, g_end) (keys of other groups are seen by
// none of these rows: their S stays unwritten, and the softmax masks it), two groups at a time.
template <int HD, int R>
void span_scores(const float (*q)[HD], const Span& span, int64_t bs, int64_t g_begin, int64_t g_end, float* s) {
  int64_t g = g_begin;
  for (; g + 2 <= g_end; g += 2) group_scores<HD, R, 2>(q, span, bs, g, s);
  if (g < g_end) group_scores<HD, R, 1>(q, span, bs, g, s);
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
  const __m512 neg_inf = _mm512_set1_ps(kNegInf);
  const bool all_visible = lo == 0 && hi == span.keys;
  __mmask16 visible[kSpanKeys / kLanes];
  __m512 row_max = neg_inf;
  for (int64_t v = 0; v < vectors; ++v) {
    __m512 x = avx512::scaled16(_mm512_loadu_ps(s + kLanes * v), scaling);
    if (!all_visible) {  // a select, not a product: a stale NaN score stays out
      int64_t first, last;
      visible[v] = kLanes * v < hi && kLanes * v + kLanes > lo ? avx512::visible_lanes(kLanes * v, lo, hi, first, last) : 0;
      x = _mm512_mask_blend_ps(visible[v], neg_inf, x);
    }
    _mm512_storeu_ps(s + kLanes * v, x);
    row_max = _mm512_max_ps(row_max, x);
  }
  const float m_new = std::max(rows.m[r], _mm512_reduce_max_ps(row_max));
  const float correction = rescale(rows.m[r], m_new);
  const __m512 m = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t v = 0; v < vectors; ++v) {
    __m512 p = corellm::avx512::exp16(_mm512_sub_ps(_mm512_loadu_ps(s + kLanes * v), m));
    // e^(-inf) would be e^-87.3 through the clamp: hidden keys are zeroed explicitly.
    if (!all_visible) p = _mm512_maskz_mov_ps(visible[v], p);
    sum = _mm512_add_ps(sum, p);
    _mm512_storeu_ps(s + kLanes * v, p);
  }
  rows.l[r] = rows.l[r] * correction + corellm::avx512::reduce_add16(sum);
  rows.m[r] = m_new;
  sc.correction[r] = correction;
}

// The vector operations attention_span_widened.h is written with.
using V = __m512;
inline V load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, V v) { _mm512_storeu_ps(p, v); }
inline V mul(V a, V b) { return _mm512_mul_ps(a, b); }
inline V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
inline V splat(float x) { return _mm512_set1_ps(x); }
inline V broadcast(const float* p) { return _mm512_set1_ps(*p); }

// The number of NextSpanLines steps fold_span_bf16 makes for `rows` rows that all see a whole
// span of `keys` keys (the caller spreads the next span's lines over them): per block of rows,
// one per dim pair of every two groups' scores and one per key pair of every 32 dims' values.
inline int64_t fold_steps(int64_t rows, int64_t keys, int64_t hd) {
  const int64_t blocks = (rows + kBlockRows - 1) / kBlockRows, groups = keys / 16;
  return blocks * ((groups + 1) / 2 * (hd / 2) + hd / 32 * groups * 8);
}

using avx512::for_row_blocks;  // attention_tile.h's blocks of kTileRows
#include "attention_span_widened.h"  // span_values and fold_span_bf16

}  // namespace corellm::attention::avx512f
#pragma GCC pop_options
