// The merge of a row's splits (attention_work_plan.h): each split folded from a fresh state leaves
// [m, l, acc...] in a partial slot; the row's output rescales every split to the global max, in
// split order, and divides by the merged denominator (or the sink's: output_factor). Internal to
// paged_attention.cpp.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention_block.h"
#include "attention_work_plan.h"
#include "corellm/kernels/dtype.h"
#include "corellm/kernels/paged_attention.h"
#include "fast_math.h"

namespace corellm::attention {

// What a row's fp32 sums acc are multiplied by to give its output, from its running max m and
// denominator l (the sum of exp(s - m) over its visible keys): 1 / l, or with a sink (head's logit
// `sink`, PagedAttentionArgs::sinks) exp(m - M) / (l exp(m - M) + exp(sink - M)), M = max(m, sink),
// which keeps both exponents at most 0. A row that saw no key gives 0.
inline float output_factor(float m, float l, const float* sink) {
  if (l <= 0.0f) return 0.0f;
  if (sink == nullptr) return 1.0f / l;
  const float top = std::max(m, *sink);
  const float kept = std::exp(m - top);
  return kept / (l * kept + std::exp(*sink - top));
}

// Row r's partial result in slot `slot` of `partials`: [m, l, acc...].
template <class F>
F* partial_row(F* partials, int64_t slot, int64_t group, int64_t r, int64_t hd) {
  return partials + (slot * kQueryChunk * group + r) * (hd + 2);
}

// Merges the splits of one (sequence, KV head, chunk), slots first.partial .. + num_splits, into
// its rows of `out`.
template <class T>
void merge_splits(const PagedAttentionArgs& a, const WorkItem& first, int64_t num_splits, const float* partials) {
  const int64_t hd = a.cache.head_size;
  const int64_t group = a.num_heads / a.cache.num_kv_heads;
  const int64_t rows = (first.q_end - first.q_begin) * group;
  const int64_t q0 = a.query_start_loc[first.seq];
  std::vector<float> acc(static_cast<size_t>(hd));
  for (int64_t r = 0; r < rows; ++r) {
    float m = kNegInf;
    for (int64_t sp = 0; sp < num_splits; ++sp) m = std::max(m, partial_row(partials, first.partial + sp, group, r, hd)[0]);
    std::fill(acc.begin(), acc.end(), 0.0f);
    float l = 0.0f;
    for (int64_t sp = 0; sp < num_splits; ++sp) {
      const float* p = partial_row(partials, first.partial + sp, group, r, hd);
      if (p[1] == 0.0f) continue;  // a split with no visible key
      const float weight = fast_exp(p[0] - m);
      l += p[1] * weight;
      for (int64_t d = 0; d < hd; ++d) acc[static_cast<size_t>(d)] += p[2 + d] * weight;
    }
    const int64_t i = first.q_begin + r / group, head = first.kv_head * group + r % group;
    T* o = static_cast<T*>(a.out) + ((q0 + i) * a.num_heads + head) * hd;
    const float inv = output_factor(m, l, a.sinks == nullptr ? nullptr : a.sinks + head);
    for (int64_t d = 0; d < hd; ++d) store_f32(o + d, acc[static_cast<size_t>(d)] * inv);
  }
}

}  // namespace corellm::attention
