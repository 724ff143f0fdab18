// The rejection sampler on the CPU: one pass over each request's logits rows.
#include "corellm/kernels/rejection_sampler.h"

#include "corellm/check.h"

namespace corellm {

void rejection_sample(const RejectionBatch& b) {
  CORELLM_CHECK_ARG(b.num_reqs >= 0, "rejection_sample: num_reqs must be >= 0, got ", b.num_reqs);
  if (b.num_reqs == 0) return;
  CORELLM_CHECK_ARG(b.num_draft_tokens && b.target_token_ids && b.output_token_ids,
                    "rejection_sample: num_draft_tokens, target_token_ids and output_token_ids are required");
  int64_t row = 0, draft = 0;
  for (int64_t i = 0; i < b.num_reqs; ++i) {
    const int32_t d = b.num_draft_tokens[i];
    CORELLM_CHECK_ARG(d >= 0 && d + 1 <= b.width, "rejection_sample: request ", i, " has ", d,
                      " drafts, the output has ", b.width, " columns");
    CORELLM_CHECK_ARG(d == 0 || b.draft_token_ids, "rejection_sample: draft_token_ids is required");
    accept_drafts(b.target_token_ids + row, d > 0 ? b.draft_token_ids + draft : nullptr, d,
                  b.output_token_ids + i * b.width, b.width);
    row += d + 1;
    draft += d;
  }
}

}  // namespace corellm
