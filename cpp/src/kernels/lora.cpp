// The LoRA update of a projection's output, token by token (algorithm in lora.h).
#include "corellm/kernels/lora.h"

#include <omp.h>

#include "corellm/check.h"

namespace corellm {

void LoraLinear::check(const char* what, int64_t n) const {
  for (const LoraPart& p : parts) {
    CORELLM_CHECK_ARG(p.a_t != nullptr && p.b_t != nullptr && p.rank > 0 && p.cols > 0 && p.col_offset >= 0 &&
                          p.col_offset + p.cols <= n && k > 0,
                      what, ": a LoRA part needs its matrices, a positive rank and columns inside [0, ", n,
                      "), got rank ", p.rank, ", columns [", p.col_offset, ", ", p.col_offset + p.cols, ")");
  }
}

namespace {

// One token's update by one adapter; u and d: scratch of at least the parts' rank and cols.
template <typename T>
void add_token(T* y, const T* x, const LoraLinear& lora, float* __restrict u, float* __restrict d) {
  for (const LoraPart& p : lora.parts) {
    const int64_t rank = p.rank, cols = p.cols;
    for (int64_t r = 0; r < rank; ++r) u[r] = 0.0f;
    for (int64_t i = 0; i < lora.k; ++i) {
      const float xi = load_f32(x + i);
      const float* __restrict a = p.a_t + i * rank;
      for (int64_t r = 0; r < rank; ++r) u[r] += xi * a[r];
    }
    for (int64_t j = 0; j < cols; ++j) d[j] = 0.0f;
    for (int64_t r = 0; r < rank; ++r) {
      const float ur = u[r];
      const float* __restrict b = p.b_t + r * cols;
      for (int64_t j = 0; j < cols; ++j) d[j] += ur * b[j];
    }
    T* out = y + p.col_offset;
    for (int64_t j = 0; j < cols; ++j) store_f32(out + j, load_f32(out + j) + d[j]);
  }
}

template <typename T>
void add_all(T* y, int64_t y_stride, const T* x, int64_t x_stride, int64_t m, const int32_t* slots,
             const LoraLinear* const* by_slot, int64_t num_slots) {
  int64_t most_rank = 0, most_cols = 0;
  for (int64_t s = 0; s < num_slots; ++s) {
    if (by_slot[s] == nullptr) continue;
    for (const LoraPart& p : by_slot[s]->parts) {
      most_rank = p.rank > most_rank ? p.rank : most_rank;
      most_cols = p.cols > most_cols ? p.cols : most_cols;
    }
  }
  for (int64_t t = 0; t < m; ++t) {
    CORELLM_CHECK_ARG(slots[t] < num_slots, "lora_add: token ", t, " names LoRA slot ", slots[t], " of ", num_slots);
  }
#pragma omp parallel if (m > 1 && !omp_in_parallel())
  {
    std::vector<float> u(static_cast<size_t>(most_rank)), d(static_cast<size_t>(most_cols));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < m; ++t) {
      const int32_t s = slots[t];
      if (s < 0 || by_slot[s] == nullptr) continue;
      add_token(y + t * y_stride, x + t * x_stride, *by_slot[s], u.data(), d.data());
    }
  }
}

}  // namespace

void lora_add(void* y, int64_t y_stride, const void* x, int64_t x_stride, int64_t m, const int32_t* slots,
              const LoraLinear* const* by_slot, int64_t num_slots, DType dtype) {
  if (dtype == DType::BF16) {
    add_all(static_cast<uint16_t*>(y), y_stride, static_cast<const uint16_t*>(x), x_stride, m, slots, by_slot,
            num_slots);
  } else {
    add_all(static_cast<float*>(y), y_stride, static_cast<const float*>(x), x_stride, m, slots, by_slot, num_slots);
  }
}

}  // namespace corellm
