// The token sampler on the CPU: logits processing (banned tokens, logit bias, penalties),
// greedy / temperature / top-k / top-p / min-p sampling with per-request seeded streams, and
// top-n logprobs of the raw distribution.
#pragma once

#include <cstdint>

namespace corellm {

// Per-request arrays have num_reqs entries. Token lists are CSR: request i's tokens are
// ids[offsets[i] .. offsets[i+1]). A null penalty array means no request uses that penalty.
struct SamplingBatch {
  int64_t num_reqs = 0;
  int64_t vocab_size = 0;
  float* logits = nullptr;  // [num_reqs, vocab_size] fp32, row stride vocab_size; processed in place

  const float* temperature = nullptr;  // 0: greedy (argmax, lowest id on ties)
  const int32_t* top_k = nullptr;      // <= 0: off
  const float* top_p = nullptr;        // >= 1: off
  const float* min_p = nullptr;        // <= 0: off
  const uint64_t* seeds = nullptr;     // key of each request's random stream
  const int64_t* steps = nullptr;      // counter in that stream (the output position)

  const float* presence_penalty = nullptr;    // logit -= p if the token was generated
  const float* frequency_penalty = nullptr;   // logit -= f * (times generated)
  const float* repetition_penalty = nullptr;  // tokens in prompt or output: / r if > 0, * r if < 0
  const int32_t* output_offsets = nullptr;
  const int32_t* output_ids = nullptr;
  const int32_t* prompt_offsets = nullptr;
  const int32_t* prompt_ids = nullptr;

  const int32_t* bias_offsets = nullptr;  // logit_bias: logits[id] += value
  const int32_t* bias_ids = nullptr;
  const float* bias_values = nullptr;
  const int32_t* banned_offsets = nullptr;  // tokens that may not be sampled now (min_tokens)
  const int32_t* banned_ids = nullptr;

  // Structured output: packed bitmasks of the tokens a request's grammar allows now, one row of
  // bitmask_words int32 words per constrained request (token t: bit t % 32 of word t / 32; 1 =
  // allowed; tokens past the mask's end are not allowed). bitmask_rows[i] is request i's row, or
  // -1 where the request is unconstrained. Applied with the other processors, before temperature,
  // top-k, top-p and min-p; the logprobs above stay those of the raw logits.
  const int32_t* bitmask = nullptr;
  const int32_t* bitmask_rows = nullptr;  // [num_reqs]
  int64_t bitmask_words = 0;

  // Logprobs (computed from the raw logits, before any processing), when num_logprobs >= 0:
  // the sampled token's logprob and rank (1 = most likely), and the top num_logprobs tokens.
  int64_t num_logprobs = -1;

  int32_t* sampled = nullptr;          // [num_reqs]; -1 where the row's logits hold a NaN, or nothing is allowed
  float* sampled_logprob = nullptr;    // [num_reqs]
  int32_t* sampled_rank = nullptr;     // [num_reqs]
  int32_t* top_ids = nullptr;          // [num_reqs, num_logprobs]
  float* top_logprobs = nullptr;       // [num_reqs, num_logprobs]
};

// Validates the batch (InvalidArgument naming the field) and samples every row.
void sample(const SamplingBatch& batch);

// One uniform float in [0, 1) from the stream (seed, counter): Philox4x32-10. Exposed for tests.
float philox_uniform(uint64_t seed, uint64_t counter);

}  // namespace corellm
