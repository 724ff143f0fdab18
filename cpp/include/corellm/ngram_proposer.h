// N-gram proposer (prompt lookup): draft tokens for speculative decoding, read from earlier in the
// request's own tokens (prompt and outputs) where its newest tokens appeared before.
#pragma once

#include <cstdint>
#include <vector>

namespace corellm {

struct NgramParams {
  int32_t min_n = 1;  // shortest suffix that counts as a match
  int32_t max_n = 4;  // longest suffix compared
  void validate() const;
};

// Finds the earlier occurrence of the longest suffix of tokens (between min_n and max_n tokens;
// the most recent occurrence on ties) and proposes the tokens that followed it, at most
// max_drafts. Returns how many it wrote to drafts (0: no match). O(num_tokens * max_n) time at
// worst, O(num_tokens) typically.
//
// Algorithm: with r = tokens reversed, the Z-function z[i] is the length of the longest common
// prefix of r and r[i..]: the longest suffix of tokens that also ends at tokens[n - 1 - i]. The
// continuation of the best i starts at tokens[n - i]. `z` is scratch space, reused between calls.
int32_t propose_ngram_drafts(const int32_t* tokens, int32_t num_tokens, const NgramParams& params,
                             int32_t max_drafts, int32_t* drafts, std::vector<int32_t>& z);

}  // namespace corellm
