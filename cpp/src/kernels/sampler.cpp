// Token sampling on the CPU, one request per row, rows in parallel.
//
// Per row:
//   1. raw logprobs (if asked): log-sum-exp of the raw logits, the top-n tokens;
//   2. processing: the grammar's bitmask and banned tokens -> -inf, logit bias, repetition /
//      frequency / presence penalties;
//   3. temperature 0: argmax. Otherwise logits / T, then the kept set: tokens whose probability
//      is >= min_p x the largest, among the top_k largest; then the smallest prefix of those, by
//      descending probability, whose mass reaches top_p of the kept mass; then one draw u from
//      the request's Philox stream (seed, step) picks the token by inverse CDF over the kept set.
// Neither top-k nor top-p sorts the vocabulary: top-k keeps a heap of the k largest, which few
// logits enter (kth_largest); top-p sorts only the tokens that can hold its prefix (sample_top_p).
#include "corellm/kernels/sampler.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <utility>
#include <vector>

#include "corellm/check.h"
#include "fast_math.h"
#include "logit_rows.h"

namespace corellm {

namespace {

using logit_rows::keep_largest;
using logit_rows::kNegInf;
using logit_rows::rank_in_row;
using logit_rows::ranks_before;
using logit_rows::raw_log_z_and_top;
using logit_rows::row_max;
using logit_rows::scan_above;

// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3").
void philox4x32(uint32_t ctr[4], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u, kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr[2];
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ key0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ key1;
    ctr[1] = static_cast<uint32_t>(p1);
    ctr[3] = static_cast<uint32_t>(p0);
    ctr[0] = n0;
    ctr[2] = n2;
    key0 += kW0;
    key1 += kW1;
  }
}

// The lowest id holding the largest logit mx (8 lanes compared at a time: AVX2, the baseline).
int32_t argmax(const float* x, int64_t v, float mx) {
  int64_t t = 0;
  const __m256 m = _mm256_set1_ps(mx);
  for (; t + 8 <= v; t += 8) {
    const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + t), m, _CMP_EQ_OQ));
    if (hit) return static_cast<int32_t>(t + __builtin_ctz(static_cast<unsigned>(hit)));
  }
  for (; t < v; ++t) {
    if (x[t] == mx) return static_cast<int32_t>(t);
  }
  return 0;
}

// Tokens the row's grammar does not allow -> -inf, 32 at a time (a word of all ones allows all).
void apply_bitmask(const int32_t* words, int64_t num_words, float* x, int64_t v) {
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (int64_t w = 0; w * 32 < v; ++w) {
    const uint32_t bits = w < num_words ? static_cast<uint32_t>(words[w]) : 0u;
    if (bits == 0xFFFFFFFFu) continue;
    const int64_t end = std::min<int64_t>(32, v - w * 32);
    float* chunk = x + w * 32;
    for (int64_t j = 0; j < end; ++j) chunk[j] = (bits >> j) & 1u ? chunk[j] : kMasked;
  }
}

// Returns whether any logit changed.
bool apply_processors(const SamplingBatch& b, int64_t i, float* x, std::vector<int32_t>& scratch) {
  bool changed = false;
  if (b.bitmask_rows && b.bitmask_rows[i] >= 0) {
    apply_bitmask(b.bitmask + b.bitmask_rows[i] * b.bitmask_words, b.bitmask_words, x, b.vocab_size);
    changed = true;
  }
  if (b.banned_offsets) {
    for (int32_t k = b.banned_offsets[i]; k < b.banned_offsets[i + 1]; ++k) x[b.banned_ids[k]] = kNegInf;
    changed |= b.banned_offsets[i + 1] > b.banned_offsets[i];
  }
  if (b.bias_offsets) {
    for (int32_t k = b.bias_offsets[i]; k < b.bias_offsets[i + 1]; ++k) x[b.bias_ids[k]] += b.bias_values[k];
    changed |= b.bias_offsets[i + 1] > b.bias_offsets[i];
  }
  const float rep = b.repetition_penalty ? b.repetition_penalty[i] : 1.0f;
  if (rep != 1.0f) {
    scratch.assign(b.prompt_ids + b.prompt_offsets[i], b.prompt_ids + b.prompt_offsets[i + 1]);
    scratch.insert(scratch.end(), b.output_ids + b.output_offsets[i], b.output_ids + b.output_offsets[i + 1]);
    std::sort(scratch.begin(), scratch.end());
    scratch.erase(std::unique(scratch.begin(), scratch.end()), scratch.end());
    for (int32_t t : scratch) x[t] = x[t] > 0.0f ? x[t] / rep : x[t] * rep;
    changed |= !scratch.empty();
  }
  const float pres = b.presence_penalty ? b.presence_penalty[i] : 0.0f;
  const float freq = b.frequency_penalty ? b.frequency_penalty[i] : 0.0f;
  if (pres != 0.0f || freq != 0.0f) {
    scratch.assign(b.output_ids + b.output_offsets[i], b.output_ids + b.output_offsets[i + 1]);
    std::sort(scratch.begin(), scratch.end());
    for (size_t k = 0; k < scratch.size();) {
      size_t end = k;
      while (end < scratch.size() && scratch[end] == scratch[k]) ++end;
      // One explicit fma (the CUDA sampler's too): no contraction left to the compiler.
      x[scratch[k]] -= std::fma(freq, static_cast<float>(end - k), pres);
      k = end;
    }
    changed |= !scratch.empty();
  }
  return changed;
}

// The top-p prefix's end among the candidates: cand sorted by ranks_before, then walked from the
// top, adding each weight to `kept` (on entry: the mass ranked above every candidate) until it
// reaches target; returns the index of the token where it does (the last candidate when rounding
// never gets there), `kept` then the prefix's mass.
size_t prefix_end(std::vector<std::pair<float, int32_t>>& cand, double target, double& kept) {
  std::sort(cand.begin(), cand.end(), ranks_before);
  size_t last = 0;
  for (; last < cand.size(); ++last) {
    kept += cand[last].first;
    if (kept >= target) break;
  }
  return std::min(last, cand.size() - 1);
}

// The k-th largest of x (0 < k < v; counted with multiplicity, as std::nth_element would place
// it; no NaN in x): a min-heap of the k largest seen, which only a value above its smallest
// enters. After the first k values the scan compares 8 at a time against that smallest, and
// few pass (about k ln(v / k) for logits in random order), where sorting or partitioning the
// whole vocabulary cost 0.4 ms a row at 49152 tokens.
float kth_largest(const float* x, int64_t v, int64_t k, std::vector<float>& heap) {
  keep_largest(x, v, k, heap, std::greater<float>(), [&](int64_t t) { return x[t]; });  // front: the smallest kept
  return heap.front();
}

// sample_top_p for a flat row, whose prefix holds many tokens. Without sorting the vocabulary:
// one pass sums the mass of buckets of the weights' float bits (order-preserving for positive
// floats, 8 buckets per power of two); walking the buckets from the top finds the one where the
// prefix crosses the target, and only its tokens are sorted. A second pass draws u by inverse
// CDF over the kept set in vocabulary order.
int32_t top_p_by_buckets(const float* x, int64_t v, float top_p, float u,
                         std::vector<std::pair<float, int32_t>>& cand, std::vector<double>& mass) {
  constexpr int kShift = 20;
  constexpr int kBuckets = (0x3F800000 >> kShift) + 1;  // up to the bits of 1.0f
  auto bucket = [](float w) {
    uint32_t bits;
    std::memcpy(&bits, &w, sizeof(bits));
    return std::min<int>(static_cast<int>(bits >> kShift), kBuckets - 1);
  };
  mass.assign(kBuckets, 0.0);
  double total = 0.0;
  for (int64_t t = 0; t < v; ++t) {
    if (x[t] > 0.0f) {
      mass[static_cast<size_t>(bucket(x[t]))] += x[t];
      total += x[t];
    }
  }
  const double target = static_cast<double>(top_p) * total;
  double above = 0.0;  // mass of the buckets above the crossing one
  int cross = 0;
  for (int b = kBuckets - 1; b >= 0; --b) {
    if (mass[static_cast<size_t>(b)] == 0.0) continue;
    cross = b;
    if (above + mass[static_cast<size_t>(b)] >= target) break;
    above += mass[static_cast<size_t>(b)];
  }
  cand.clear();
  for (int64_t t = 0; t < v; ++t) {
    if (x[t] > 0.0f && bucket(x[t]) == cross) cand.emplace_back(x[t], static_cast<int32_t>(t));
  }
  if (cand.empty()) return -1;  // no weight at all: the caller's NaN / all-banned handling
  double kept = above;
  const auto [w_last, id_last] = cand[prefix_end(cand, target, kept)];
  const double pick = static_cast<double>(u) * kept;
  double acc = 0.0;
  int32_t chosen = -1;
  for (int64_t t = 0; t < v; ++t) {
    if (!(x[t] > 0.0f)) continue;
    const int b = bucket(x[t]);
    if (b < cross || (b == cross && (x[t] < w_last || (x[t] == w_last && t > id_last)))) continue;
    acc += x[t];
    chosen = static_cast<int32_t>(t);
    if (pick < acc) return chosen;
  }
  return chosen;  // rounding: u * kept reached the end
}

// Top-p over the weights x (0: not kept; at most 1, the largest's), total: their sum. The kept
// set is the smallest prefix, in descending weight (ties: lower id first), whose mass reaches
// top_p of the total. The prefix lies among the tokens of weight >= 2^-10 when their mass
// reaches the target, as it does for a peaked row: one pass gathers those (8 compared at a
// time), and when they are few only they are sorted (0.02 ms a row at 49152 tokens, where the
// buckets' pass over the whole vocabulary took 0.3 ms); otherwise top_p_by_buckets. Then u draws
// by inverse CDF over the kept set in vocabulary order (as the CUDA sampler does; any fixed order
// gives the same distribution).
int32_t sample_top_p(const float* x, int64_t v, double total, float top_p, float u,
                     std::vector<std::pair<float, int32_t>>& cand, std::vector<double>& mass) {
  constexpr size_t kMostGathered = 4096;
  const double target = static_cast<double>(top_p) * total;
  const float bound = std::nextafter(0x1p-10f, 0.0f);  // > bound: >= 2^-10
  cand.clear();
  double gathered = 0.0;
  scan_above(x, v, bound, [&](int64_t t) {
    cand.emplace_back(x[t], static_cast<int32_t>(t));
    gathered += x[t];
    return cand.size() > kMostGathered ? std::numeric_limits<float>::infinity() : bound;  // too many: stop
  });
  if (gathered < target || cand.size() > kMostGathered) return top_p_by_buckets(x, v, top_p, u, cand, mass);
  double kept = 0.0;
  cand.resize(prefix_end(cand, target, kept) + 1);
  std::sort(cand.begin(), cand.end(), [](const auto& a, const auto& c) { return a.second < c.second; });
  const double pick = static_cast<double>(u) * kept;
  double acc = 0.0;
  for (const auto& [w, id] : cand) {
    acc += w;
    if (pick < acc) return id;
  }
  return cand.back().second;  // rounding: u * kept reached the end
}

// Tokens per chunk of the kept weights' mass (kept_weights, draw_by_mass).
constexpr int64_t kMassChunk = 256;

// x[t] = e^(x[t] - mx) for the kept tokens (x[t] >= threshold, finite), 0 for the others, in
// one vectorized pass; chunk_mass[c] = the weights of tokens [c kMassChunk, (c + 1) kMassChunk)
// summed. Returns the total, the chunks' masses summed in order.
float kept_weights(float* x, int64_t v, float mx, float threshold, std::vector<float>& chunk_mass) {
  const int64_t chunks = (v + kMassChunk - 1) / kMassChunk;
  chunk_mass.resize(static_cast<size_t>(chunks));
  float total = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(v, (c + 1) * kMassChunk);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t t = c * kMassChunk; t < end; ++t) {
      const float w = x[t] >= threshold && x[t] != kNegInf ? fast_exp(x[t] - mx) : 0.0f;
      x[t] = w;
      sum += w;
    }
    chunk_mass[static_cast<size_t>(c)] = sum;
    total += sum;
  }
  return total;
}

// Inverse CDF over the weights x in vocabulary order: the token where the running mass first
// exceeds pick (= u x total). Whole chunks are passed by their mass (kept_weights); only the
// chunk where the mass crosses pick is walked token by token. Where rounding keeps that walk
// from crossing (its sum in another order than the chunk's), the chunk's last kept token; with
// no kept token at all, -1.
int32_t draw_by_mass(const float* x, int64_t v, const std::vector<float>& chunk_mass, float pick) {
  const auto chunks = static_cast<int64_t>(chunk_mass.size());
  int64_t last_kept_chunk = -1;
  for (int64_t c = 0; c < chunks; ++c) {
    if (chunk_mass[static_cast<size_t>(c)] > 0.0f) last_kept_chunk = c;
  }
  float acc = 0.0f;
  for (int64_t c = 0; c <= last_kept_chunk; ++c) {
    const float m = chunk_mass[static_cast<size_t>(c)];
    if (m <= 0.0f) continue;
    if (pick >= acc + m && c < last_kept_chunk) {
      acc += m;
      continue;
    }
    int32_t last = -1;
    for (int64_t t = c * kMassChunk; t < std::min(v, (c + 1) * kMassChunk); ++t) {
      if (x[t] <= 0.0f) continue;
      acc += x[t];
      last = static_cast<int32_t>(t);
      if (pick < acc) return last;
    }
    return last;
  }
  return -1;
}

// Samples from logits x (already divided by the temperature; mx: their largest) under top-k /
// top-p / min-p.
int32_t sample_row(const SamplingBatch& b, int64_t i, float* x, float mx, std::vector<std::pair<float, int32_t>>& cand,
                   std::vector<double>& mass, std::vector<float>& heap, std::vector<float>& chunk_mass) {
  const int64_t v = b.vocab_size;
  // Kept set, step 1: min_p (prob >= min_p * max prob <=> logit >= mx + log(min_p)).
  float threshold = kNegInf;
  const float min_p = b.min_p ? b.min_p[i] : 0.0f;
  if (min_p > 0.0f) threshold = mx + std::log(min_p);
  // Step 2: top_k: the k-th largest logit (ties at the boundary are all kept).
  const int64_t k = b.top_k ? b.top_k[i] : 0;
  if (k > 0 && k < v) threshold = std::max(threshold, kth_largest(x, v, k, heap));
  const float total = kept_weights(x, v, mx, threshold, chunk_mass);
  const float u = philox_uniform(b.seeds[i], static_cast<uint64_t>(b.steps[i]));
  const float top_p = b.top_p ? b.top_p[i] : 1.0f;
  if (top_p < 1.0f) return sample_top_p(x, v, static_cast<double>(total), top_p, u, cand, mass);
  return draw_by_mass(x, v, chunk_mass, u * total);
}

}  // namespace

float philox_uniform(uint64_t seed, uint64_t counter) {
  uint32_t ctr[4] = {static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0u, 0u};
  philox4x32(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return static_cast<float>(ctr[0] >> 8) * (1.0f / 16777216.0f);
}

void sample(const SamplingBatch& b) {
  CORELLM_CHECK_ARG(b.num_reqs >= 0 && b.vocab_size > 0, "bad sampling batch shape [", b.num_reqs,
                    ", ", b.vocab_size, "]");
  CORELLM_CHECK_ARG(b.num_logprobs <= b.vocab_size, "num_logprobs ", b.num_logprobs, " exceeds the vocabulary");
  for (int64_t i = 0; i < b.num_reqs; ++i) {
    CORELLM_CHECK_ARG(b.temperature[i] >= 0.0f && std::isfinite(b.temperature[i]),
                      "request ", i, ": temperature must be finite and >= 0, got ", b.temperature[i]);
    if (b.top_p) CORELLM_CHECK_ARG(b.top_p[i] > 0.0f && b.top_p[i] <= 1.0f, "request ", i,
                                   ": top_p must be in (0, 1], got ", b.top_p[i]);
    if (b.min_p) CORELLM_CHECK_ARG(b.min_p[i] >= 0.0f && b.min_p[i] <= 1.0f, "request ", i,
                                   ": min_p must be in [0, 1], got ", b.min_p[i]);
    if (b.repetition_penalty) CORELLM_CHECK_ARG(b.repetition_penalty[i] > 0.0f, "request ", i,
                                                ": repetition_penalty must be > 0, got ", b.repetition_penalty[i]);
    auto check_ids = [&](const int32_t* offsets, const int32_t* ids, const char* what) {
      if (!offsets) return;
      CORELLM_CHECK_ARG(offsets[i] <= offsets[i + 1], what, " offsets decrease at request ", i);
      for (int32_t k = offsets[i]; k < offsets[i + 1]; ++k) {
        CORELLM_CHECK_ARG(ids[k] >= 0 && ids[k] < b.vocab_size, "request ", i, ": ", what, " token id ",
                          ids[k], " is outside the vocabulary [0, ", b.vocab_size, ")");
      }
    };
    check_ids(b.output_offsets, b.output_ids, "output");
    check_ids(b.prompt_offsets, b.prompt_ids, "prompt");
    check_ids(b.bias_offsets, b.bias_ids, "logit_bias");
    check_ids(b.banned_offsets, b.banned_ids, "banned");
    if (b.bitmask_rows) CORELLM_CHECK_ARG(b.bitmask_rows[i] < 0 || b.bitmask != nullptr, "request ", i,
                                          " has a bitmask row but the batch has no bitmask");
  }
  CORELLM_CHECK_ARG(!b.bitmask || b.bitmask_words > 0, "bitmask_words must be > 0 with a bitmask");
#pragma omp parallel if (b.num_reqs > 1)
  {
    std::vector<int32_t> scratch;
    std::vector<std::pair<float, int32_t>> cand;
    std::vector<float> raw;  // the raw row, kept for the sampled token's logprob and rank
    std::vector<double> mass;  // top-p's bucket masses
    std::vector<float> heap;  // top-k's k largest logits
    std::vector<float> chunk_mass;  // the kept weights' mass per chunk of tokens
    std::vector<std::pair<float, int32_t>> best;  // the top-n logprobs' tokens
#pragma omp for schedule(dynamic, 1)
    for (int64_t i = 0; i < b.num_reqs; ++i) {
      float* x = b.logits + i * b.vocab_size;
      bool has_nan = false;
      const float raw_max = row_max(x, b.vocab_size, &has_nan);
      if (has_nan) {  // reported per request; the caller fails that request only
        b.sampled[i] = -1;
        if (b.num_logprobs >= 0) {
          b.sampled_logprob[i] = std::numeric_limits<float>::quiet_NaN();
          b.sampled_rank[i] = 0;
          for (int64_t k = 0; k < b.num_logprobs; ++k) {
            b.top_ids[i * b.num_logprobs + k] = -1;
            b.top_logprobs[i * b.num_logprobs + k] = std::numeric_limits<float>::quiet_NaN();
          }
        }
        continue;
      }
      float log_z = 0.0f;
      if (b.num_logprobs >= 0) {
        log_z = raw_log_z_and_top(x, b.vocab_size, b.num_logprobs, b.top_ids + i * b.num_logprobs,
                                  b.top_logprobs + i * b.num_logprobs, best);
        raw.assign(x, x + b.vocab_size);
      }
      const bool processed = apply_processors(b, i, x, scratch);
      int32_t token;
      const float temp = b.temperature[i];
      const float mx = processed ? row_max(x, b.vocab_size) : raw_max;
      if (temp == 0.0f) {
        token = mx == kNegInf ? -1 : argmax(x, b.vocab_size, mx);  // -1: nothing allowed
      } else {
        const float inv_t = 1.0f / temp;
        if (inv_t != 1.0f) {  // (x * 1 = x)
#pragma omp simd
          for (int64_t t = 0; t < b.vocab_size; ++t) x[t] *= inv_t;
        }
        // Rounding is monotonic: the largest scaled logit is the largest logit, scaled.
        token = sample_row(b, i, x, mx * inv_t, cand, mass, heap, chunk_mass);
      }
      b.sampled[i] = token;
      if (b.num_logprobs >= 0 && token < 0) {  // nothing was allowed: the caller fails the request
        b.sampled_logprob[i] = std::numeric_limits<float>::quiet_NaN();
        b.sampled_rank[i] = 0;
      } else if (b.num_logprobs >= 0) {
        const float logit = raw[static_cast<size_t>(token)];
        b.sampled_logprob[i] = logit - log_z;
        b.sampled_rank[i] = rank_in_row(raw.data(), b.vocab_size, logit);
      }
    }
  }
}

}  // namespace corellm
