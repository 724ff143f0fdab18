// Scheduler, speculative decoding's part: which of a request's drafts a step verifies (its
// acceptance rate against what a token costs the step), what a verification teaches, and the
// next drafts (the request's prediction, else the n-gram proposer; or a draft model's through
// set_draft_token_ids). The rest of
// the scheduling algorithm is in scheduler.cpp.
#include <algorithm>
#include <cmath>

#include "corellm/check.h"
#include "corellm/ngram_proposer.h"
#include "corellm/prediction_proposer.h"
#include "corellm/scheduler.h"

namespace corellm {

void Scheduler::set_step_cost(double fixed_seconds, double per_token_seconds) {
  CORELLM_CHECK_ARG(fixed_seconds >= 0.0 && per_token_seconds >= 0.0 && std::isfinite(fixed_seconds) &&
                        std::isfinite(per_token_seconds),
                    "step cost must be finite and >= 0, got ", fixed_seconds, " + ", per_token_seconds, " per token");
  step_fixed_seconds_ = fixed_seconds;
  step_per_token_seconds_ = per_token_seconds;
}

double Scheduler::draft_acceptance_threshold() const {
  // What one more token costs this step, in output tokens: with R requests decoding, a step
  // costs fixed + per_token * R for R tokens out, so a draft token (per_token) is worth its
  // place when the chance it is accepted beats per_token * R / (fixed + per_token * R).
  const double r = static_cast<double>(running_.size());
  const double cost = step_fixed_seconds_ + step_per_token_seconds_ * r;
  return cost > 0.0 ? step_per_token_seconds_ * r / cost : 0.0;
}

int32_t Scheduler::num_drafts_worth_verifying(const Request& request, double threshold) const {
  const int32_t k = config_.num_speculative_tokens;
  if (threshold <= 0.0) return k;
  const double rate = request.draft_acceptance.acceptance_rate();
  if (rate <= threshold) return 0;
  // rate^j >= threshold  <=>  j <= log(threshold) / log(rate)   (0 < threshold < rate < 1)
  return std::min(k, static_cast<int32_t>(std::floor(std::log(threshold) / std::log(rate) + 1e-9)));
}

int32_t Scheduler::num_drafts_to_schedule(const Request& request, double threshold) const {
  if (request.draft_token_ids.empty() || request.num_tokens() - request.num_computed_tokens != 1) return 0;
  // The step emits drafts + 1 tokens at most: drafts past what max_tokens allows are wasted.
  const int32_t usable = request.max_tokens - request.num_output_tokens() - 1;
  return std::max(0, std::min({static_cast<int32_t>(request.draft_token_ids.size()),
                               num_drafts_worth_verifying(request, threshold), usable}));
}

void Scheduler::record_verification(Request& request, int32_t num_drafts, int32_t num_accepted,
                                    SpecDecodingStats& spec) const {
  DraftAcceptance& acc = request.draft_acceptance;
  if (num_drafts == 0) {  // nothing verified: the evidence fades
    acc.accepted *= DraftAcceptance::kIdleDecay;
    acc.rejected *= DraftAcceptance::kIdleDecay;
    return;
  }
  spec.num_drafts += 1;
  spec.num_draft_tokens += num_drafts;
  spec.num_accepted_tokens += num_accepted;
  for (int32_t j = 0; j < num_drafts; ++j) spec.num_draft_tokens_per_pos[static_cast<size_t>(j)] += 1;
  for (int32_t j = 0; j < num_accepted; ++j) spec.num_accepted_tokens_per_pos[static_cast<size_t>(j)] += 1;
  acc.accepted = acc.accepted * DraftAcceptance::kDecay + static_cast<float>(num_accepted);
  acc.rejected = acc.rejected * DraftAcceptance::kDecay + (num_accepted < num_drafts ? 1.0f : 0.0f);
}

void Scheduler::propose_drafts(Request& request) {
  if (config_.prompt_lookup_max <= 0 || request.use_structured_output) {
    return;
  }
  const NgramParams params{config_.prompt_lookup_min, config_.prompt_lookup_max};
  request.draft_token_ids.resize(static_cast<size_t>(config_.num_speculative_tokens));
  int32_t n = 0;
  if (!request.prediction_token_ids.empty()) {  // where the output stands in its prediction
    n = propose_prediction_drafts(request.prediction_token_ids, request.token_ids.data() + request.num_prompt_tokens,
                                  request.num_output_tokens(), params, config_.num_speculative_tokens,
                                  request.draft_token_ids.data(), request.prediction_cursor);
  }
  if (n == 0) {  // the request's own tokens (prompt lookup)
    n = propose_ngram_drafts(request.token_ids.data(), request.num_tokens(), params, config_.num_speculative_tokens,
                             request.draft_token_ids.data(), ngram_scratch_);
  }
  request.draft_token_ids.resize(static_cast<size_t>(n));
}

void Scheduler::set_draft_token_ids(const std::string& request_id, const int32_t* draft_token_ids, size_t n) {
  auto it = requests_.find(request_id);
  if (config_.num_speculative_tokens <= 0 || it == requests_.end()) return;
  Request& request = *it->second;
  if (request.status != RequestStatus::RUNNING || request.use_structured_output) return;
  for (size_t j = 0; j < n; ++j) {
    CORELLM_CHECK_ARG(draft_token_ids[j] >= 0, "request '", request_id, "': negative draft token id ",
                      draft_token_ids[j]);
  }
  const size_t kept = std::min(n, static_cast<size_t>(config_.num_speculative_tokens));
  request.draft_token_ids.assign(draft_token_ids, draft_token_ids + kept);
}

}  // namespace corellm
