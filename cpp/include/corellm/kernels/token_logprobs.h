// Logprobs of given tokens under raw logits on the CPU (corellm.ops.token_logprobs).
#pragma once

#include <cstdint>

namespace corellm {

// Logprobs of given tokens under raw logits (prompt logprobs: each position's next prompt token),
// with the sampler's arithmetic, so that a token scored here has the logprob and rank the sampler
// gives it when it is sampled: per row i, logprobs[i] = x[token_ids[i]] - log Z (log Z = max +
// log sum exp(x - max)), ranks[i] = 1 + the tokens with a larger logit, and the num_top most
// likely tokens (descending, ties to the lower id). Rows in parallel; the logits are only read. A
// row holding a NaN gets NaN logprobs.
struct TokenLogprobsBatch {
  int64_t num_rows = 0;
  int64_t vocab_size = 0;
  const float* logits = nullptr;     // [num_rows, vocab_size] fp32, row stride vocab_size
  const int32_t* token_ids = nullptr;  // [num_rows]
  int64_t num_top = 0;
  float* logprobs = nullptr;      // [num_rows]
  int32_t* ranks = nullptr;       // [num_rows]
  int32_t* top_ids = nullptr;     // [num_rows, num_top]
  float* top_logprobs = nullptr;  // [num_rows, num_top]
};

// Validates the batch (InvalidArgument naming what is wrong) and scores every row.
void token_logprobs(const TokenLogprobsBatch& batch);

}  // namespace corellm
