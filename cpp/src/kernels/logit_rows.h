// The scans over one row of logits that the sampler and token_logprobs share: the row's largest
// logit, its k largest tokens, its log-normaliser and top n, a logit's rank. Vectorized for AVX2,
// the baseline every CPU kernel is compiled for. Internal to sampler.cpp and token_logprobs.cpp.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "fast_math.h"

namespace corellm::logit_rows {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Largest logit of a row and whether any logit is NaN, in one pass: 32 logits a step into four
// independent maxima (one chain of maxima would wait on each one's latency; the compiler left the
// reduction scalar, 5 % of a 64-request decode step), combined at the end, then the tail. The
// maximum of numbers does not depend on their order; with a NaN in the row the maximum is
// meaningless and the caller fails the row.
inline float row_max(const float* x, int64_t v, bool* has_nan = nullptr) {
  __m256 mx[4], nan = _mm256_setzero_ps();
  for (__m256& m : mx) m = _mm256_set1_ps(kNegInf);
  int64_t t = 0;
  for (; t + 32 <= v; t += 32) {
    for (int j = 0; j < 4; ++j) {
      const __m256 xj = _mm256_loadu_ps(x + t + 8 * j);
      mx[j] = _mm256_max_ps(mx[j], xj);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(xj, xj, _CMP_UNORD_Q));
    }
  }
  const __m256 m8 = _mm256_max_ps(_mm256_max_ps(mx[0], mx[1]), _mm256_max_ps(mx[2], mx[3]));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m8);
  float m = kNegInf;
  for (const float lane : lanes) m = std::max(m, lane);
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  for (; t < v; ++t) {
    m = std::max(m, x[t]);
    any_nan |= x[t] != x[t];
  }
  if (has_nan) *has_nan = any_nan;
  return m;
}

// The order of (value, token id) pairs for top-n logprobs and top-p: larger values first, ties
// to the lower id.
inline bool ranks_before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& c) {
  return a.first > c.first || (a.first == c.first && a.second < c.second);
}

// Tokens x[t] > bound, 8 compared at a time (AVX2, the baseline): calls on_above(t) for each, in
// order; on_above returns the bound for the tokens after t (it may raise it).
template <class OnAbove>
inline void scan_above(const float* x, int64_t v, float bound, OnAbove on_above) {
  int64_t t = 0;
  for (; t + 8 <= v; t += 8) {
    auto hits = static_cast<unsigned>(_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + t), _mm256_set1_ps(bound), _CMP_GT_OQ)));
    while (hits != 0) {
      const int j = __builtin_ctz(hits);
      hits &= hits - 1;
      if (x[t + j] > bound) bound = on_above(t + j);  // the bound may have risen since the compare
    }
  }
  for (; t < v; ++t) {
    if (x[t] > bound) bound = on_above(t);
  }
}

inline float value_of(float e) { return e; }
inline float value_of(const std::pair<float, int32_t>& e) { return e.first; }

// The k largest of x[0, v) (1 <= k <= v) in `heap`, a heap under `order` (a comparator that ranks
// the better first, so that the heap's front is the worst kept); entry(t) makes token t's element.
// The first k seed it; after them only a value above the worst kept enters (a later token loses a
// tie), the rest of the row compared 8 at a time (scan_above).
template <class Entry, class Order, class MakeEntry>
inline void keep_largest(const float* x, int64_t v, int64_t k, std::vector<Entry>& heap, Order order, MakeEntry entry) {
  heap.clear();
  for (int64_t t = 0; t < k; ++t) heap.push_back(entry(t));
  std::make_heap(heap.begin(), heap.end(), order);
  scan_above(x + k, v - k, value_of(heap.front()), [&](int64_t t) {
    std::pop_heap(heap.begin(), heap.end(), order);
    heap.back() = entry(k + t);
    std::push_heap(heap.begin(), heap.end(), order);
    return value_of(heap.front());
  });
}

// A raw row's log-normaliser log Z = max + log sum exp(x - max), and for n > 0 its top n tokens
// by logit (descending, ties to the lower id) with their logprobs x - log Z, into top_ids[0, n)
// and top_logprobs[0, n). `best` is the caller's scratch.
inline float raw_log_z_and_top(const float* x, int64_t v, int64_t n, int32_t* top_ids, float* top_logprobs,
                        std::vector<std::pair<float, int32_t>>& best) {
  const float mx = row_max(x, v);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < v; ++t) sum += fast_exp(x[t] - mx);
  const float log_z = mx + std::log(sum);
  if (n <= 0) return log_z;
  best.clear();
  best.reserve(static_cast<size_t>(n) + 1);
  keep_largest(x, v, std::min(n, v), best, ranks_before,
               [&](int64_t t) { return std::pair<float, int32_t>(x[t], static_cast<int32_t>(t)); });
  std::sort(best.begin(), best.end(), ranks_before);
  for (int64_t k = 0; k < n; ++k) {
    top_ids[k] = best[static_cast<size_t>(k)].second;
    top_logprobs[k] = best[static_cast<size_t>(k)].first - log_z;
  }
  return log_z;
}

// A logit's rank in its raw row: 1 + the tokens with a larger logit (1 = most likely).
inline int32_t rank_in_row(const float* x, int64_t v, float logit) {
  int32_t above = 0;
#pragma omp simd reduction(+ : above)
  for (int64_t t = 0; t < v; ++t) above += x[t] > logit ? 1 : 0;
  return above + 1;
}

}  // namespace corellm::logit_rows
