// Speculative decoding's rejection sampler: which of a request's draft tokens the target model
// accepts, given the token the sampler drew from each of the request's logits rows.
#pragma once

#include <cstdint>

namespace corellm {

// Drafts are proposed greedily (the n-gram proposer copies tokens; a draft model takes its
// argmax), so the draft distribution q is one-hot on the draft token d. The standard rule accepts
// d with probability min(1, p(d) / q(d)) = p(d), and on rejection draws from the residual
// max(p - q, 0) renormalized, which is p with d removed. Drawing x ~ p (the request's usual
// sampler: processed logits, temperature, top-k/p, min-p, its seeded stream at that output
// position) and accepting d iff x == d realizes exactly that rule: P(accept) = p(d), and x given
// x != d is distributed as the residual. So row j's token, drawn from the target's logits after
// the newest token and drafts 1..j, decides draft j + 1, and the first row whose token differs
// from its draft gives the request's last new token (after all d drafts: the bonus token, from
// row d). Greedy requests compare argmaxes. The output is the target's distribution exactly, and
// a seeded request's tokens are the ones it would draw without speculation.
//
//   row      0        1        ...  d
//   draft    d_1      d_2           (none)
//   token    x_0      x_1           x_d
//   output   x_0, x_1, ... up to and including the first j with x_j != d_{j+1} (or j = d)
struct RejectionBatch {
  int64_t num_reqs = 0;
  const int32_t* num_draft_tokens = nullptr;  // [num_reqs]: d_i
  const int32_t* draft_token_ids = nullptr;   // [sum d_i]: request i's drafts after those of 0..i-1
  const int32_t* target_token_ids = nullptr;  // [sum (d_i + 1)]: the sampler's token per logits row
                                              // (-1 where the row's logits were NaN)
  int64_t width = 1;                          // output columns (>= 1 + max d_i)
  int32_t* output_token_ids = nullptr;        // [num_reqs, width]: new tokens, -1 after the last
};

#if defined(__CUDACC__)
#define CORELLM_HOST_DEVICE __host__ __device__
#else
#define CORELLM_HOST_DEVICE
#endif

// The rule for one request (shared by the CPU and CUDA kernels): its d + 1 row tokens and d
// drafts -> its new tokens in out[0, width), -1 after the last.
CORELLM_HOST_DEVICE inline void accept_drafts(const int32_t* row_tokens, const int32_t* drafts, int32_t d,
                                              int32_t* out, int64_t width) {
  int64_t n = 0;
  for (int32_t j = 0; j <= d; ++j) {
    const int32_t token = row_tokens[j];
    if (token < 0) break;
    out[n++] = token;
    if (j == d || token != drafts[j]) break;
  }
  for (int64_t j = n; j < width; ++j) out[j] = -1;
}

// Validates the batch (InvalidArgument naming the field) and fills output_token_ids. A row
// token of -1 ends the request's tokens before it (the engine reports a request whose first
// token is -1 as failed).
void rejection_sample(const RejectionBatch& batch);

}  // namespace corellm
