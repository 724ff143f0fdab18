// Logprobs of given tokens under raw logits (token_logprobs.h): each row scanned three times — its
// log-normaliser, its top n, the token's rank — by the sampler's own row scans (logit_rows.h), so
// that a token scored here has the logprob and rank the sampler gives it when sampled.
#include "corellm/kernels/token_logprobs.h"

#include <cstdint>
#include <utility>
#include <vector>

#include "corellm/check.h"
#include "logit_rows.h"

namespace corellm {

void token_logprobs(const TokenLogprobsBatch& b) {
  CORELLM_CHECK_ARG(b.num_rows >= 0 && b.vocab_size > 0, "token_logprobs: bad shape [", b.num_rows, ", ",
                    b.vocab_size, "]");
  CORELLM_CHECK_ARG(b.num_top >= 0 && b.num_top <= b.vocab_size, "token_logprobs: num_top ", b.num_top,
                    " is outside [0, ", b.vocab_size, "]");
  for (int64_t i = 0; i < b.num_rows; ++i) {
    CORELLM_CHECK_ARG(b.token_ids[i] >= 0 && b.token_ids[i] < b.vocab_size, "token_logprobs: row ", i, "'s token id ",
                      b.token_ids[i], " is outside the vocabulary [0, ", b.vocab_size, ")");
  }
#pragma omp parallel if (b.num_rows > 1)
  {
    std::vector<std::pair<float, int32_t>> best;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < b.num_rows; ++i) {
      const float* x = b.logits + i * b.vocab_size;
      const float log_z = logit_rows::raw_log_z_and_top(x, b.vocab_size, b.num_top, b.top_ids + i * b.num_top,
                                                        b.top_logprobs + i * b.num_top, best);
      const float logit = x[b.token_ids[i]];
      b.logprobs[i] = logit - log_z;
      b.ranks[i] = logit_rows::rank_in_row(x, b.vocab_size, logit);
    }
  }
}

}  // namespace corellm
