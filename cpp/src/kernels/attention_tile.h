// Paged attention on bf16 caches, the avx512bf16 path: fold a span of KV blocks into the
// online-softmax state of many query rows at once (the rows of up to 16 query tokens, all heads
// sharing one KV head; a decode's are the rows of its one token). Versus a per-token fold
// (attention_block.h), each K/V load serves up to kTileRows rows, and the softmax bookkeeping
// (max, rescale, sum) happens once per span of up to 128 keys instead of once per 16. The
// path uses it for every token, so that a token's bits never depend on the tokens beside it.
// dpbf16 scores scaled in fp32, probabilities rounded to bf16 for P.V. Compiled for
// AVX-512-BF16 (namespace attention::avx512), run only where the process's path has it
// (paged_attention.cpp; the amx path's tile version: attention_amx.h). Internal to
// paged_attention.cpp.
//
// Per span [t0, t0 + keys):
//   S[r, j] = scale * q_r . k_j                       (all rows, all keys of the span)
//   masked to row r's visible keys [lo_r, hi_r) (causal or bidirectional, sliding window)
//   m'_r = max(m_r, max_j S[r, j]);  P[r, j] = e^(S[r, j] - m'_r);  l_r = l_r e^(m_r - m'_r) + sum_j P
//   acc_r = acc_r e^(m_r - m'_r) + sum_j P[r, j] v_j
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "attention_block.h"

namespace corellm::attention {

constexpr int kTileRows = 8;        // rows sharing each K/V load (accumulators in registers)
constexpr int64_t kSpanKeys = 128;  // the most keys one span holds (blocks of up to 128 keys)

// The blocks a thread folds after this span (the next span's K and V, or its next item's first),
// fetched into L2 while this span is folded: a few cache lines per step() of the fold, spread over
// the whole fold so that they arrive in time. Asked for at once, a span's 512 lines overflow the
// miss buffers and most are dropped: spread, batched decodes run 1.26-1.44x faster (AMD EPYC Zen 4,
// 2 threads, 16-64 sequences of 192-1024 tokens from memory, the two variants run alternately on
// bench/kernels.py's decode cases). The avx512 fold steps once per 16 keys of the scores and once
// per 16 keys x 16 dims of P V (a dozen lines a step), not once per dot product: the step's loads
// and stores of this object had sat in the dot products' loop (a decode's 3 rows: 3 dot products
// per step), and 30 layers of 64 decodes x 192 keys took 8.40-8.57 -> 7.85-8.02 ms with the caches
// warm, 11.56-12.66 -> 11.02-11.66 ms from memory (five alternating pairs, AMD EPYC Zen 4, 2 threads).
class NextSpanLines {
 public:
  explicit NextSpanLines(int64_t block_bytes) : block_bytes_(block_bytes) {}
  void add(const void* block) { block_[blocks_++] = static_cast<const char*>(block); }
  // per step, enough lines to have asked for every block within `steps` steps
  void spread_over(int64_t steps) {
    const int64_t lines = blocks_ * ((block_bytes_ + kLine - 1) / kLine);
    per_step_ = std::max<int64_t>(1, (lines + steps - 1) / std::max<int64_t>(steps, 1));
  }
  void fetch_all() { advance(INT64_MAX); }
  void step() { advance(per_step_); }

 private:
  static constexpr int64_t kLine = 64;
  // Up to `lines` more lines, the cursor in locals and stored back once. Stepped through the
  // members, the cursor went through memory at each line (a store and a reload per prefetch), and
  // those instructions held a third of a decode's P V samples: 30 layers of 64 decodes x 192 keys
  // with the caches warm 7.14-7.22 -> 6.71-6.82 ms (avx512bf16, AMD EPYC Zen 4, 2 threads,
  // alternating runs); from memory level (the fold then waits on the lines themselves:
  // bench/kv_pages.py reads the KV at 23-26 GB/s, a plain read of random 2 KiB blocks with the same
  // prefetches 28-29, of one sequential stream 46), avx2 level.
  void advance(int64_t lines) {
    int64_t at = at_, offset = offset_;
    for (int64_t i = 0; i < lines && at < blocks_; ++i) {
      __builtin_prefetch(block_[at] + offset, 0, 2);
      offset += kLine;
      if (offset >= block_bytes_) offset = 0, ++at;
    }
    at_ = at, offset_ = offset;
  }
  const char* block_[2 * kSpanKeys / 16] = {};
  int64_t blocks_ = 0, block_bytes_, per_step_ = 1, at_ = 0, offset_ = 0;
};

// A span of consecutive keys (positions [t0, t0 + keys), keys a multiple of 16, at most
// kSpanKeys), as addresses per 16 keys into the blocks holding them.
struct Span {
  const uint16_t* k[kSpanKeys / 16];  // the 16 keys' first dim pair: block's kb + offset * 2
  const uint16_t* v[kSpanKeys / 16];  // the 16 keys' first key pair: block's vb + offset / 2 * HD * 2
  int64_t t0;
  int64_t keys;
  int64_t valid_end;  // keys at positions >= valid_end were never written for this sequence
  NextSpanLines* next;  // stepped through while the span is folded (null: nothing)
};

// The rows folded together: row r's query (bf16 pairs, unscaled), its online-softmax state, and
// its visible key positions [lo[r], hi[r]).
struct TileRows {
  const uint32_t* qb;  // [num_rows, HD / 2]
  float* m;
  float* l;
  float* acc;  // [num_rows, HD]
  const int64_t* lo;
  const int64_t* hi;
  int64_t num_rows;
};

// Scratch of one thread: S and P of every row for one span, and each row's rescale factor.
struct TileScratch {
  float* s;           // [num_rows, kSpanKeys]
  uint32_t* p;        // [num_rows, kSpanKeys / 2]
  float* correction;  // [num_rows]
};

// The rows of a span fold that see a key of the span, [r_begin, r_end), and the keys (relative
// to the span) any of them sees, [key_lo, key_hi); r_end <= r_begin: none.
struct SpanReach {
  int64_t r_begin, r_end, key_lo, key_hi;
};

// The reach of rows [first, last).
inline SpanReach span_reach_of_rows(const TileRows& rows, const Span& span, int64_t first, int64_t last) {
  SpanReach reach{last, first, span.keys, 0};
  for (int64_t r = first; r < last; ++r) {
    const int64_t lo = std::max<int64_t>(rows.lo[r] - span.t0, 0);
    const int64_t hi = std::min<int64_t>(rows.hi[r] - span.t0, span.keys);
    if (hi <= lo) continue;
    reach.r_begin = std::min(reach.r_begin, r);
    reach.r_end = r + 1;
    reach.key_lo = std::min(reach.key_lo, lo);
    reach.key_hi = std::max(reach.key_hi, hi);
  }
  return reach;
}

// The reach of all the rows.
inline SpanReach span_reach(const TileRows& rows, const Span& span) {
  return span_reach_of_rows(rows, span, 0, rows.num_rows);
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")
namespace avx512 {

// S = q . K^T for rows [r0, r0 + R): each K load feeds R dot products. bs: keys per block (the
// stride between dim pairs in a block's K).
template <int HD, int R>
void tile_scores(const TileRows& rows, const Span& span, int64_t bs, int64_t r0, float* s) {
  for (int64_t kv = 0; kv < span.keys / 16; ++kv) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
    const uint16_t* kb = span.k[kv];
    if (span.next != nullptr) span.next->step();
#pragma GCC unroll 4
    for (int dp = 0; dp < HD / 2; ++dp) {
      const __m512bh k = (__m512bh)_mm512_loadu_si512(kb + dp * bs * 2);
      for (int r = 0; r < R; ++r) {
        const auto q = static_cast<int32_t>(rows.qb[(r0 + r) * (HD / 2) + dp]);
        acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(q), k);
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(s + (r0 + r) * kSpanKeys + kv * 16, acc[r]);
  }
}

// Row r's softmax over the span's vectors of 16 keys (at most V, kept in registers): updates m and l,
// writes P as bf16 pairs (0 where hidden) and the factor acc is rescaled by. A row that sees no
// key of the span gets P = 0, factor 1.
template <int V>
void tile_softmax_row(const TileRows& rows, const Span& span, int64_t r, ScoreScaling scaling, const TileScratch& sc) {
  const int64_t lo = std::max<int64_t>(rows.lo[r] - span.t0, 0);
  const int64_t hi = std::min<int64_t>(rows.hi[r] - span.t0, span.keys);
  uint32_t* p_row = sc.p + r * (kSpanKeys / 2);
  const int64_t vectors = span.keys / 16;
  if (hi <= lo) {
    std::fill(p_row, p_row + vectors * 8, 0u);
    sc.correction[r] = 1.0f;
    return;
  }
  const float* s = sc.s + r * kSpanKeys;
  const bool all_visible = lo == 0 && hi == V * 16 && vectors == V;  // the common case: no mask
  __mmask16 visible[V];
  __m512 x[V];
  __m512 row_max = _mm512_set1_ps(kNegInf);
  for (int kv = 0; kv < V; ++kv) {
    if (kv >= vectors) {
      visible[kv] = 0;
      x[kv] = _mm512_set1_ps(kNegInf);
      continue;
    }
    x[kv] = scaled16(_mm512_loadu_ps(s + kv * 16), scaling);
    if (!all_visible) {
      int64_t first, last;
      visible[kv] = kv * 16 < hi && kv * 16 + 16 > lo ? visible_lanes(kv * 16, lo, hi, first, last) : 0;
      x[kv] = _mm512_mask_blend_ps(visible[kv], _mm512_set1_ps(kNegInf), x[kv]);
    }
    row_max = _mm512_max_ps(row_max, x[kv]);
  }
  const float m_new = std::max(rows.m[r], _mm512_reduce_max_ps(row_max));
  const float correction = rescale(rows.m[r], m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int kv = 0; kv < V && kv < vectors; ++kv) {
    __m512 p = exp16(_mm512_sub_ps(x[kv], _mm512_set1_ps(m_new)));
    if (!all_visible) p = _mm512_maskz_mov_ps(visible[kv], p);
    sum = _mm512_add_ps(sum, p);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p_row + kv * 8), (__m256i)_mm512_cvtneps_pbh(p));
  }
  rows.l[r] = rows.l[r] * correction + _mm512_reduce_add_ps(sum);
  rows.m[r] = m_new;
  sc.correction[r] = correction;
}

// tile_softmax_row for rows [r_begin, r_end), with as many registers as the span has vectors.
inline void tile_softmax_rows(const TileRows& rows, const Span& span, int64_t r_begin, int64_t r_end, ScoreScaling scaling,
                              const TileScratch& sc) {
  const int64_t vectors = span.keys / 16;
  for (int64_t r = r_begin; r < r_end; ++r) {
    if (vectors > 4) tile_softmax_row<8>(rows, span, r, scaling, sc);
    else if (vectors > 2) tile_softmax_row<4>(rows, span, r, scaling, sc);
    else if (vectors > 1) tile_softmax_row<2>(rows, span, r, scaling, sc);
    else tile_softmax_row<1>(rows, span, r, scaling, sc);
  }
}

// acc = acc * correction + P V for rows [r0, r0 + R), over the span's 16-key vectors that hold
// key pairs [pair_begin, pair_end) (pairs outside have P = 0 for these rows and finite V).
// V pairs holding a key never written (>= valid_end) are loaded as zero, so that a stale NaN
// cannot meet a zero probability.
template <int HD, int R>
void tile_values(const TileRows& rows, const Span& span, int64_t r0, int64_t pair_begin, int64_t pair_end,
                 const TileScratch& sc) {
  const int64_t kv_begin = pair_begin / 8, kv_end = (pair_end + 7) / 8;
  for (int c = 0; c < HD / 16; ++c) {
    __m512 acc[R];
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_mul_ps(_mm512_loadu_ps(rows.acc + (r0 + r) * HD + 16 * c),
                             _mm512_set1_ps(sc.correction[r0 + r]));
    }
    for (int64_t kv = kv_begin; kv < kv_end; ++kv) {
      const uint16_t* vv = span.v[kv] + 16 * c * 2;
      const uint32_t* pv = sc.p + r0 * (kSpanKeys / 2) + kv * 8;
      const int64_t written = span.valid_end - (span.t0 + kv * 16);  // keys of the vector written
      if (span.next != nullptr) span.next->step();
      if (written >= 16) {
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) {
          const __m512bh v = (__m512bh)_mm512_loadu_si512(vv + j * HD * 2);
          for (int r = 0; r < R; ++r) {
            const auto p = static_cast<int32_t>(pv[r * (kSpanKeys / 2) + j]);
            acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(p), v);
          }
        }
        continue;
      }
      for (int j = 0; 2 * j < written; ++j) {  // the sequence's last vector: written pairs only
        const __mmask32 keep = 2 * j + 1 < written ? 0xFFFFFFFFu : 0x55555555u;
        const __m512bh v = (__m512bh)_mm512_maskz_loadu_epi16(keep, vv + j * HD * 2);
        for (int r = 0; r < R; ++r) {
          const auto p = static_cast<int32_t>(pv[r * (kSpanKeys / 2) + j]);
          acc[r] = _mm512_dpbf16_ps(acc[r], (__m512bh)_mm512_set1_epi32(p), v);
        }
      }
    }
    for (int r = 0; r < R; ++r) _mm512_storeu_ps(rows.acc + (r0 + r) * HD + 16 * c, acc[r]);
  }
}

// Calls f(std::integral_constant<int, R>, r0) over rows [begin, end) in blocks of R = kTileRows,
// then one block of the 1-7 rows left (a decode token's query heads of one KV head: 1-7).
template <class F>
void for_row_blocks(int64_t begin, int64_t end, F&& f) {
  int64_t r = begin;
  for (; r + kTileRows <= end; r += kTileRows) f(std::integral_constant<int, kTileRows>{}, r);
  switch (end - r) {
    case 7: return f(std::integral_constant<int, 7>{}, r);
    case 6: return f(std::integral_constant<int, 6>{}, r);
    case 5: return f(std::integral_constant<int, 5>{}, r);
    case 4: return f(std::integral_constant<int, 4>{}, r);
    case 3: return f(std::integral_constant<int, 3>{}, r);
    case 2: return f(std::integral_constant<int, 2>{}, r);
    case 1: return f(std::integral_constant<int, 1>{}, r);
    default: return;
  }
}

// Folds the span into every row that sees a key of it.
template <int HD>
void fold_span_bf16(const TileRows& rows, const Span& span, int64_t bs, ScoreScaling scaling, const TileScratch& sc) {
  const auto [r_begin, r_end, key_lo, key_hi] = span_reach(rows, span);
  if (r_end <= r_begin) return;
  for_row_blocks(r_begin, r_end, [&](auto rows_in_block, int64_t r0) {
    tile_scores<HD, decltype(rows_in_block)::value>(rows, span, bs, r0, sc.s);
  });
  tile_softmax_rows(rows, span, r_begin, r_end, scaling, sc);
  const int64_t pair_begin = key_lo / 2, pair_end = (key_hi + 1) / 2;
  for_row_blocks(r_begin, r_end, [&](auto rows_in_block, int64_t r0) {
    tile_values<HD, decltype(rows_in_block)::value>(rows, span, r0, pair_begin, pair_end, sc);
  });
}

}  // namespace avx512
#pragma GCC pop_options

}  // namespace corellm::attention
