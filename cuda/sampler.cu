// Token sampling on CUDA: the CPU sampler's algorithm (cpp/src/kernels/sampler.cpp), one thread
// block per request row, without sorting the vocabulary.
//
// Per row, every step a block-wide pass over the row:
//   1. the raw argmax (largest logit, lowest id on ties) and whether any logit is NaN;
//   2. logprobs (if asked): log-sum-exp, and the top n by radix selection (below) and a rank sort
//      of those n; the raw row is copied aside for the sampled token's logprob and rank;
//   3. processing: the grammar's bitmask (every thread its tokens), banned -> -inf and logit_bias
//      (serially: short lists), repetition penalty once
//      per distinct prompt-or-output token and presence / frequency once per distinct output
//      token with its count (a per-row scratch of marks, claimed by atomic exchange: whichever
//      thread claims a token applies its penalty, once, with the same arithmetic as the CPU);
//   4. temperature 0: the argmax (the raw one when nothing was processed). Otherwise logits / T;
//      kept = logits >= max(min_p threshold, the k-th largest); weights exp(x - max) held as
//      fixed-point integers (2^-40 units: sums are exact, so the result does not depend on the
//      order threads add in, nor on the batch); top_p: the smallest prefix in descending weight
//      (ties: lower id first) reaching top_p of the mass; one draw u from the request's Philox
//      stream (the CPU's, bit for bit) picks the token by inverse CDF in vocabulary order.
//
// The selections and the inverse CDF use the block-wide row primitives of row_select.cuh.
#include <climits>
#include <cstdint>
#include <string>

#include "common.cuh"
#include "corellm/kernels/sampler.h"
#include "row_select.cuh"

namespace corellm::cuda {
namespace {

using namespace row;  // kThreads, u64, the keys, the reductions, select_from_top, find_crossing

constexpr int kMaxLogprobs = 1024;
constexpr float kFixedOne = 1099511627776.0f;  // 2^40: a weight of 1 in fixed point

// A row's shared memory: the primitives' scratch, and the top-n logprobs' candidates.
struct Shared {
  RowScratch row;
  float cand_value[kMaxLogprobs];
  int cand_id[kMaxLogprobs];
  int num_cand;
};

__device__ __forceinline__ u64 fixed(float w) { return __float2ull_rn(w * kFixedOne); }

// Philox4x32-10, the CPU's philox_uniform bit for bit.
__device__ float philox_uniform(uint64_t seed, uint64_t counter) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32), c2 = 0u, c3 = 0u;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kM1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kW0;
    k1 += kW1;
  }
  return static_cast<float>(c0 >> 8) * (1.0f / 16777216.0f);
}

// ---- the row's steps -------------------------------------------------------------------------------

// Top n (n <= kMaxLogprobs) of the raw row x by logit (ties: lower id), as logprobs (logit - log_z).
__device__ void top_logprobs(const float* x, int v, int n, float log_z, int32_t* top_ids, float* top_lp, Shared& s) {
  u64 above;
  const uint32_t kth = select_from_top(
      v, [&](int t) { return order_key(x[t]); }, [](int) { return u64{1}; }, static_cast<u64>(n), &above, s.row);
  if (threadIdx.x == 0) s.num_cand = 0;
  __syncthreads();
  for (int t = threadIdx.x; t < v; t += kThreads) {  // the (fewer than n) larger ones, in any order
    if (order_key(x[t]) > kth) {
      const int slot = atomicAdd(&s.num_cand, 1);
      s.cand_value[slot] = x[t];
      s.cand_id[slot] = t;
    }
  }
  __syncthreads();
  const int larger = s.num_cand;
  __syncthreads();
  for (int j = larger; j < n; ++j) {  // ties at the k-th: the lowest ids
    u64 total;
    const int t = find_crossing(
        v, [&](int t) { return u64{order_key(x[t]) == kth}; }, static_cast<u64>(j - larger), &total, s.row);
    if (threadIdx.x == 0) {
      s.cand_value[j] = key_value(kth);
      s.cand_id[j] = t;
    }
  }
  __syncthreads();
  // Rank sort: candidate c goes where the number of better candidates says.
  for (int c = threadIdx.x; c < n; c += kThreads) {
    const float cv = s.cand_value[c];
    const int ci = s.cand_id[c];
    int rank = 0;
    for (int d = 0; d < n; ++d) {
      const float dv = s.cand_value[d];
      rank += (dv > cv || (dv == cv && s.cand_id[d] < ci)) ? 1 : 0;
    }
    top_ids[rank] = ci;
    top_lp[rank] = cv - log_z;
  }
  __syncthreads();
}

__device__ __forceinline__ bool valid_id(int32_t id, int v) { return id >= 0 && id < v; }

// Step 3; returns whether any logit may have changed (the same in every thread).
__device__ bool apply_processors(const SamplingBatch& b, int i, float* x, int v, int32_t* marks) {
  bool changed = false;
  if (b.bitmask_rows && b.bitmask_rows[i] >= 0) {  // the grammar's allowed tokens (sampler.h's layout)
    const int32_t* words = b.bitmask + static_cast<int64_t>(b.bitmask_rows[i]) * b.bitmask_words;
    const int64_t num_words = b.bitmask_words;
    for (int t = threadIdx.x; t < v; t += kThreads) {
      const int64_t w = t >> 5;
      const uint32_t bits = w < num_words ? static_cast<uint32_t>(words[w]) : 0u;
      if (!((bits >> (t & 31)) & 1u)) x[t] = -INFINITY;
    }
    __syncthreads();  // before thread 0's bias adds read these logits
    changed = true;
  }
  if (b.banned_offsets) {
    const int lo = b.banned_offsets[i], hi = b.banned_offsets[i + 1];
    if (threadIdx.x == 0) {
      for (int k = lo; k < hi; ++k) {
        if (valid_id(b.banned_ids[k], v)) x[b.banned_ids[k]] = -INFINITY;
      }
    }
    changed |= hi > lo;
  }
  if (b.bias_offsets) {
    const int lo = b.bias_offsets[i], hi = b.bias_offsets[i + 1];
    if (threadIdx.x == 0) {  // in list order, as the CPU (a repeated id adds twice)
      for (int k = lo; k < hi; ++k) {
        if (valid_id(b.bias_ids[k], v)) x[b.bias_ids[k]] += b.bias_values[k];
      }
    }
    changed |= hi > lo;
  }
  __syncthreads();
  if (marks == nullptr) return changed;
  int32_t* mark = marks + static_cast<int64_t>(i) * v;
  const int out_lo = b.output_offsets ? b.output_offsets[i] : 0;
  const int num_out = b.output_offsets ? b.output_offsets[i + 1] - out_lo : 0;
  const float rep = b.repetition_penalty ? b.repetition_penalty[i] : 1.0f;
  if (rep != 1.0f) {
    const int p_lo = b.prompt_offsets ? b.prompt_offsets[i] : 0;
    const int num_prompt = b.prompt_offsets ? b.prompt_offsets[i + 1] - p_lo : 0;
    auto id_at = [&](int j) { return j < num_prompt ? b.prompt_ids[p_lo + j] : b.output_ids[out_lo + j - num_prompt]; };
    for (int j = threadIdx.x; j < num_prompt + num_out; j += kThreads) {
      const int32_t id = id_at(j);
      if (valid_id(id, v) && atomicExch(mark + id, 1) == 0) x[id] = x[id] > 0.0f ? x[id] / rep : x[id] * rep;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < num_prompt + num_out; j += kThreads) {  // marks back to 0
      const int32_t id = id_at(j);
      if (valid_id(id, v)) mark[id] = 0;
    }
    __syncthreads();
    changed |= num_prompt + num_out > 0;
  }
  const float pres = b.presence_penalty ? b.presence_penalty[i] : 0.0f;
  const float freq = b.frequency_penalty ? b.frequency_penalty[i] : 0.0f;
  if (pres != 0.0f || freq != 0.0f) {
    for (int j = threadIdx.x; j < num_out; j += kThreads) {
      const int32_t id = b.output_ids[out_lo + j];
      if (valid_id(id, v)) atomicAdd(mark + id, 1);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < num_out; j += kThreads) {  // one claim per distinct token, marks back to 0
      const int32_t id = b.output_ids[out_lo + j];
      if (!valid_id(id, v)) continue;
      const int count = atomicExch(mark + id, 0);
      if (count > 0) x[id] -= fmaf(freq, static_cast<float>(count), pres);  // the CPU's explicit fma
    }
    __syncthreads();
    changed |= num_out > 0;
  }
  return changed;
}

// Step 4 for temperature > 0; -1 if no token has weight.
__device__ int sample_row(const SamplingBatch& b, int i, float* x, int v, Shared& s) {
  const float inv_t = 1.0f / b.temperature[i];
  float local = -INFINITY;
  for (int t = threadIdx.x; t < v; t += kThreads) {
    x[t] *= inv_t;
    local = fmaxf(local, x[t]);
  }
  const float mx = block_max(local, s.row);
  float threshold = -INFINITY;
  const float min_p = b.min_p ? b.min_p[i] : 0.0f;
  if (min_p > 0.0f) threshold = mx + logf(min_p);
  const int k = b.top_k ? b.top_k[i] : 0;
  if (k > 0 && k < v) {
    u64 above;
    const uint32_t kth = select_from_top(
        v, [&](int t) { return order_key(x[t]); }, [](int) { return u64{1}; }, static_cast<u64>(k), &above, s.row);
    threshold = fmaxf(threshold, key_value(kth));
  }
  u64 local_total = 0;
  for (int t = threadIdx.x; t < v; t += kThreads) {
    const float y = x[t];
    const float w = (y >= threshold && y != -INFINITY) ? __expf(y - mx) : 0.0f;
    x[t] = w;
    local_total += fixed(w);
  }
  const u64 total = block_sum_u64(local_total, s.row);  // >= 2^40: the largest weighs exp(0)
  if (total == 0) return -1;
  const float u = philox_uniform(b.seeds[i], static_cast<uint64_t>(b.steps[i]));
  auto pick_in = [&](u64 mass) { return min(static_cast<u64>(static_cast<double>(u) * static_cast<double>(mass)), mass - 1); };
  const float top_p = b.top_p ? b.top_p[i] : 1.0f;
  u64 unused;
  if (!(top_p < 1.0f)) return find_crossing(v, [&](int t) { return fixed(x[t]); }, pick_in(total), &unused, s.row);
  // Top-p: the boundary weight K, the mass above it, then how many of the ties at K (lowest ids
  // first) complete the prefix.
  const u64 target = max(u64{1}, static_cast<u64>(static_cast<double>(top_p) * static_cast<double>(total)));
  u64 above;
  const uint32_t boundary = select_from_top(
      v, [&](int t) { return order_key(x[t]); }, [&](int t) { return fixed(x[t]); }, target, &above, s.row);
  const u64 w_boundary = fixed(key_value(boundary));
  const u64 needed = w_boundary == 0 ? 1 : (target - min(target, above) + w_boundary - 1) / w_boundary;
  u64 ties;
  const int last_tie = find_crossing(
      v, [&](int t) { return u64{order_key(x[t]) == boundary}; }, max(u64{1}, needed) - 1, &ties, s.row);
  const u64 kept = above + min(max(u64{1}, needed), ties) * w_boundary;
  auto kept_weight = [&](int t) {
    const uint32_t key = order_key(x[t]);
    return (key > boundary || (key == boundary && t <= last_tie)) ? fixed(x[t]) : u64{0};
  };
  return find_crossing(v, kept_weight, pick_in(kept), &unused, s.row);
}

__global__ void __launch_bounds__(kThreads) sample_kernel(SamplingBatch b, float* raw, int32_t* marks) {
  __shared__ Shared s;
  const int i = blockIdx.x;
  const int v = static_cast<int>(b.vocab_size);
  float* x = b.logits + static_cast<int64_t>(i) * v;
  const int n = static_cast<int>(b.num_logprobs);

  // 1. raw argmax and NaN, in one pass.
  int nan = 0;
  ArgMax best{-INFINITY, INT_MAX};
  for (int t = threadIdx.x; t < v; t += kThreads) {
    const float y = x[t];
    nan |= y != y;
    if (y > best.value || (y == best.value && t < best.id)) best = {y, t};
  }
  const bool has_nan = block_sum_i32(nan, s.row) > 0;
  if (has_nan) {  // reported per request: the caller fails that request only
    if (threadIdx.x == 0) {
      b.sampled[i] = -1;
      if (n >= 0) {
        b.sampled_logprob[i] = NAN;
        b.sampled_rank[i] = 0;
      }
    }
    for (int k = threadIdx.x; k < n; k += kThreads) {
      b.top_ids[static_cast<int64_t>(i) * n + k] = -1;
      b.top_logprobs[static_cast<int64_t>(i) * n + k] = NAN;
    }
    return;
  }
  const ArgMax raw_best = block_argmax(best, s.row);

  // 2. logprobs of the raw row.
  float log_z = 0.0f;
  float* raw_row = raw ? raw + static_cast<int64_t>(i) * v : nullptr;
  if (n >= 0) {
    float local = 0.0f;
    for (int t = threadIdx.x; t < v; t += kThreads) {
      raw_row[t] = x[t];
      local += __expf(x[t] - raw_best.value);
    }
    log_z = raw_best.value + logf(block_sum_f32(local, s.row));
    if (n > 0) {
      top_logprobs(x, v, n, log_z, b.top_ids + static_cast<int64_t>(i) * n, b.top_logprobs + static_cast<int64_t>(i) * n,
                   s);
    }
  }

  // 3-4.
  const bool changed = apply_processors(b, i, x, v, marks);
  int token;
  if (b.temperature[i] == 0.0f) {
    const ArgMax best_now = changed ? row_argmax(x, v, s.row) : raw_best;
    token = best_now.value == -INFINITY ? -1 : best_now.id;  // -1: nothing allowed
  } else {
    token = sample_row(b, i, x, v, s);
  }
  if (threadIdx.x == 0) b.sampled[i] = token;

  // 5. the sampled token's raw logprob and rank (1 + how many raw logits are larger).
  if (n >= 0) {
    const float logit = token >= 0 ? raw_row[token] : NAN;
    int larger = 0;
    for (int t = threadIdx.x; t < v; t += kThreads) larger += raw_row[t] > logit ? 1 : 0;
    larger = block_sum_i32(larger, s.row);
    if (threadIdx.x == 0) {
      b.sampled_logprob[i] = logit - log_z;
      b.sampled_rank[i] = token >= 0 ? larger + 1 : 0;
    }
  }
}

void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw std::runtime_error(std::string("sample: ") + what + ": " + cudaGetErrorString(err));
}

}  // namespace

void sample(const SamplingBatch& b, std::uintptr_t stream) {
  CORELLM_CHECK_ARG(b.num_reqs >= 0 && b.vocab_size > 0 && b.vocab_size <= INT_MAX / 2,
                    "sample: bad sampling batch shape [", b.num_reqs, ", ", b.vocab_size, "]");
  CORELLM_CHECK_ARG(b.num_logprobs <= kMaxLogprobs && b.num_logprobs <= b.vocab_size, "sample: num_logprobs ",
                    b.num_logprobs, " exceeds the CUDA sampler's limit of ", kMaxLogprobs, " (or the vocabulary)");
  if (b.num_reqs == 0) return;
  const cudaStream_t st = as_stream(stream);
  const size_t row_bytes = static_cast<size_t>(b.num_reqs) * static_cast<size_t>(b.vocab_size) * 4;
  float* raw = nullptr;
  int32_t* marks = nullptr;
  if (b.num_logprobs >= 0) check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&raw), row_bytes, st), "scratch");
  if (b.presence_penalty || b.frequency_penalty || b.repetition_penalty) {
    check_cuda(cudaMallocAsync(reinterpret_cast<void**>(&marks), row_bytes, st), "scratch");
    check_cuda(cudaMemsetAsync(marks, 0, row_bytes, st), "scratch");
  }
  sample_kernel<<<static_cast<unsigned>(b.num_reqs), kThreads, 0, st>>>(b, raw, marks);
  check_launch("sample");
  if (raw) check_cuda(cudaFreeAsync(raw, st), "scratch");
  if (marks) check_cuda(cudaFreeAsync(marks, st), "scratch");
}

}  // namespace corellm::cuda
