// moe_route and moe_combine (moe.h): plain loops over a token's experts and hidden values, in a
// fixed order; the expert GEMMs between them are where a mixture-of-experts layer spends its time.
#include "corellm/kernels/moe.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "corellm/check.h"

namespace corellm {

namespace {

template <typename T>
void combine_rows(T* out, int64_t out_stride, const T* rows, int64_t rows_stride, const float* weights, int64_t m,
                  int64_t top_k, int64_t hidden, const MoeSharedExpert& shared) {
#pragma omp parallel
  {
    std::vector<float> sum(static_cast<size_t>(hidden));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < m; ++t) {
      for (int64_t d = 0; d < hidden; ++d) sum[d] = 0.0f;
      for (int64_t j = 0; j < top_k; ++j) {
        const float w = weights[t * top_k + j];
        const T* row = rows + (t * top_k + j) * rows_stride;
        for (int64_t d = 0; d < hidden; ++d) sum[d] += w * load_f32(row + d);
      }
      if (shared.rows != nullptr) {
        const float w = shared.gate == nullptr ? 1.0f : 1.0f / (1.0f + std::exp(-shared.gate[t]));
        const T* row = static_cast<const T*>(shared.rows) + t * shared.stride;
        for (int64_t d = 0; d < hidden; ++d) sum[d] += w * load_f32(row + d);
      }
      T* y = out + t * out_stride;
      for (int64_t d = 0; d < hidden; ++d) store_f32(y + d, sum[d]);
    }
  }
}

}  // namespace

void moe_route(const float* logits, int64_t logits_stride, int64_t m, int64_t num_experts, int64_t top_k,
               bool renormalize, int32_t* expert_ids, float* expert_weights, const float* selection_bias,
               float renormalize_min) {
  CORELLM_CHECK_ARG(num_experts >= 1 && top_k >= 1 && top_k <= num_experts, "moe_route: top_k (", top_k,
                    ") must be in [1, num_experts (", num_experts, ")]");
  std::vector<float> p(static_cast<size_t>(num_experts));
  std::vector<bool> taken(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < m; ++t) {
    const float* row = logits + t * logits_stride;
    float max = row[0];
    for (int64_t e = 1; e < num_experts; ++e) max = std::fmax(max, row[e]);
    float total = 0.0f;
    for (int64_t e = 0; e < num_experts; ++e) {
      p[e] = std::exp(row[e] - max);
      total += p[e];
    }
    for (int64_t e = 0; e < num_experts; ++e) p[e] /= total;
    // top_k by selection: k is small (2 to 8) beside the experts (8 to 128).
    std::fill(taken.begin(), taken.end(), false);
    int32_t* ids = expert_ids + t * top_k;
    float* w = expert_weights + t * top_k;
    float chosen = 0.0f;
    // What the choice ranks: p, or (ERNIE 4.5's) p + the expert's selection bias, in fp32.
    const auto score = [&](int64_t e) { return selection_bias == nullptr ? p[e] : p[e] + selection_bias[e]; };
    for (int64_t j = 0; j < top_k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < num_experts; ++e) {
        // A NaN logit (a broken checkpoint) makes the row's p NaN, as torch's softmax would: no
        // comparison holds then, and the first experts not taken are chosen (ids stay in range).
        if (!taken[e] && (best < 0 || score(e) > score(best))) best = e;
      }
      taken[best] = true;
      ids[j] = static_cast<int32_t>(best);
      w[j] = p[best];
      chosen += p[best];
    }
    if (renormalize) {
      const float by = chosen < renormalize_min ? renormalize_min : chosen;  // (a NaN sum stays NaN)
      for (int64_t j = 0; j < top_k; ++j) w[j] /= by;
    }
  }
}

void moe_combine(void* out, int64_t out_stride, const void* rows, int64_t rows_stride, const float* weights,
                 int64_t m, int64_t top_k, int64_t hidden, DType dtype, const MoeSharedExpert& shared) {
  CORELLM_CHECK_ARG(top_k >= 1 && hidden >= 1, "moe_combine: top_k (", top_k, ") and hidden (", hidden,
                    ") must be positive");
  if (dtype == DType::F32) {
    combine_rows(static_cast<float*>(out), out_stride, static_cast<const float*>(rows), rows_stride, weights, m,
                 top_k, hidden, shared);
  } else {
    combine_rows(static_cast<uint16_t*>(out), out_stride, static_cast<const uint16_t*>(rows), rows_stride, weights,
                 m, top_k, hidden, shared);
  }
}

}  // namespace corellm
