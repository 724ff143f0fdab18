// N-gram proposer: the Z-function over the reversed tokens finds the longest earlier match of the
// newest tokens.
#include "corellm/ngram_proposer.h"

#include <algorithm>

#include "corellm/check.h"

namespace corellm {

void NgramParams::validate() const {
  CORELLM_CHECK_ARG(min_n >= 1, "prompt_lookup_min must be >= 1, got ", min_n);
  CORELLM_CHECK_ARG(max_n >= min_n, "prompt_lookup_max (", max_n, ") must be >= prompt_lookup_min (", min_n, ")");
}

int32_t propose_ngram_drafts(const int32_t* tokens, int32_t num_tokens, const NgramParams& params,
                             int32_t max_drafts, int32_t* drafts, std::vector<int32_t>& z) {
  const int32_t n = num_tokens;
  if (max_drafts <= 0 || n < params.min_n + 1) return 0;
  // r[k] = tokens[n - 1 - k]; z[i] = |lcp(r, r[i..])|, capped at max_n (longer matches rank equal).
  auto r = [&](int32_t k) { return tokens[n - 1 - k]; };
  z.assign(static_cast<size_t>(n), 0);
  int32_t best_len = 0, best_i = 0;
  int32_t left = 0, right = 0;  // [left, right): the rightmost window known to match a prefix of r
  for (int32_t i = 1; i < n; ++i) {
    int32_t len = i < right ? std::min(right - i, z[static_cast<size_t>(i - left)]) : 0;
    while (i + len < n && len < params.max_n && r(len) == r(i + len)) ++len;
    z[static_cast<size_t>(i)] = len;
    if (i + len > right) {
      left = i;
      right = i + len;
    }
    if (len > best_len) {  // strictly longer: ties keep the smallest i, the most recent occurrence
      best_len = len;
      best_i = i;
    }
    if (best_len == params.max_n) break;  // nothing can beat it, and this is the most recent such
  }
  if (best_len < params.min_n) return 0;
  // The match ends at tokens[n - 1 - best_i]; what followed it starts at tokens[n - best_i].
  const int32_t start = n - best_i;
  const int32_t count = std::min(max_drafts, n - start);
  std::copy(tokens + start, tokens + start + count, drafts);
  return count;
}

}  // namespace corellm
