// Scheduler, after a step: update_from_output applies what the model sampled (rolling back
// rejected drafts, appending tokens one by one with the stop checks after each, registering full
// blocks of accepted tokens in the prefix cache), and finished or aborted requests are retired.
// The scheduling itself is in scheduler.cpp (the algorithm is stated there).
#include <algorithm>

#include "corellm/check.h"
#include "corellm/scheduler.h"

namespace corellm {

bool Scheduler::check_stop(Request& request) const {
  const int32_t token = request.token_ids.back();
  // EOS and stop tokens count only once min_tokens outputs exist (the sampler suppresses them
  // before that; this is the scheduler's half of the rule).
  if (request.num_output_tokens() >= request.min_tokens) {
    if (!request.ignore_eos && request.eos_token_id >= 0 && token == request.eos_token_id) {
      request.status = RequestStatus::FINISHED_STOPPED;
      return true;
    }
    if (std::find(request.stop_token_ids.begin(), request.stop_token_ids.end(), token) !=
        request.stop_token_ids.end()) {
      request.status = RequestStatus::FINISHED_STOPPED;
      request.stop_reason = token;
      return true;
    }
  }
  if (request.num_output_tokens() >= request.max_tokens ||
      request.num_tokens() >= config_.max_model_len) {
    request.status = RequestStatus::FINISHED_LENGTH_CAPPED;
    return true;
  }
  if (request.num_output_tokens() >= request.min_tokens &&
      request.repetition_detection.ends_in_repetition(request.token_ids.data() + request.num_prompt_tokens,
                                                      static_cast<size_t>(request.num_output_tokens()))) {
    request.status = RequestStatus::FINISHED_REPETITION;
    return true;
  }
  return false;
}

SchedulerUpdate Scheduler::update_from_output(const SchedulerOutput& output, const int32_t* sampled_token_ids,
                                              size_t num_reqs, size_t width) {
  CORELLM_CHECK_ARG(num_reqs == output.req_ids.size(), "got sampled tokens for ", num_reqs, " requests, ",
                    output.req_ids.size(), " were scheduled");
  CORELLM_CHECK_ARG(width >= 1 || num_reqs == 0, "sampled_token_ids needs at least one column");
  SchedulerUpdate result;
  result.step_id = output.step_id;
  if (output.req_ids.empty() && pending_step_id_ == 0) {  // an empty plan is a step with nothing to apply
    result.scheduler_stats = stats();
    return result;
  }
  CORELLM_CHECK_ARG(pending_step_id_ != 0 && output.step_id == pending_step_id_,
                    "update_from_output() for step ", output.step_id,
                    " but the step awaiting its results is ", pending_step_id_);
  result.reserve(pending_requests_.size());
  SpecDecodingStats& spec = result.spec_decoding_stats;
  if (config_.num_speculative_tokens > 0) {
    spec.num_draft_tokens_per_pos.assign(static_cast<size_t>(config_.num_speculative_tokens), 0);
    spec.num_accepted_tokens_per_pos.assign(static_cast<size_t>(config_.num_speculative_tokens), 0);
  }
  bool any_finished = false;
  for (size_t i = 0; i < pending_requests_.size(); ++i) {
    Request* request = pending_requests_[i];
    if (is_finished(request->status)) continue;  // aborted or failed since schedule(): nothing cached
    if (!output.samples_token[i]) {  // a prompt chunk: its KV is written, its full blocks findable
      kv_.cache_full_blocks(*request, request->num_computed_tokens);
      continue;
    }
    CORELLM_CHECK(request->status == RequestStatus::RUNNING, "request ", *request->request_id, " is ",
                  to_string(request->status), " at update_from_output");
    const int32_t* row = sampled_token_ids + i * width;
    int32_t num_tokens = 0;
    while (static_cast<size_t>(num_tokens) < width && row[num_tokens] >= 0) ++num_tokens;
    CORELLM_CHECK_ARG(num_tokens >= 1, "request '", *request->request_id, "': invalid sampled token id ", row[0]);
    const int32_t num_drafts = output.num_draft_tokens[i];
    CORELLM_CHECK_ARG(num_tokens <= num_drafts + 1, "request '", *request->request_id, "': ", num_tokens,
                      " tokens for a step that verified ", num_drafts, " drafts");
    if (apply_sampled(*request, num_drafts, row, num_tokens, result)) {
      retire(request, request->status);
      any_finished = true;
    }
  }
  if (any_finished) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Request* r) { return is_finished(r->status); }),
                   running_.end());
  }
  pending_step_id_ = 0;
  pending_requests_.clear();
  result.scheduler_stats = stats();
  return result;
}

bool Scheduler::apply_sampled(Request& request, int32_t num_drafts, const int32_t* tokens, int32_t num_tokens,
                              SchedulerUpdate& result) {
  // Tokens [0, num_tokens - 1) are accepted drafts (their KV was written by this step); the last
  // one was sampled after them. The rejected drafts' KV is left behind: roll back past it.
  const int32_t num_accepted = num_tokens - 1;
  request.num_computed_tokens -= num_drafts - num_accepted;
  request.draft_token_ids.clear();
  record_verification(request, num_drafts, num_accepted, result.spec_decoding_stats);
  bool stopped = false;
  int32_t num_appended = 0;
  while (num_appended < num_tokens && !stopped) {
    request.token_ids.push_back(tokens[num_appended++]);
    stopped = check_stop(request);  // a stop drops the tokens after it
  }
  // The step's KV is written for the accepted tokens: their full blocks become findable.
  kv_.cache_full_blocks(request, std::min(request.num_computed_tokens, request.num_tokens()));
  result.req_ids.push_back(request.request_id);
  result.num_new_tokens.push_back(num_appended);
  result.new_token_ids.insert(result.new_token_ids.end(), tokens, tokens + num_appended);
  result.finish_reasons.push_back(static_cast<uint8_t>(finish_reason_of(request.status)));
  result.stop_reasons.push_back(request.stop_reason);
  result.num_cached_tokens.push_back(std::max(request.num_cached_tokens, 0));
  if (!stopped) propose_drafts(request);
  return stopped;
}

void Scheduler::retire(Request* request, RequestStatus status) {
  request->status = status;
  kv_.free(*request);
  if (!request->mm_ranges.empty()) release_images(*request, nullptr);
  release_batch_row(*request);
  finished_since_last_step_.push_back(*request->request_id);
  auto it = requests_.find(*request->request_id);
  CORELLM_CHECK(it != requests_.end(), "retiring unknown request ", *request->request_id);
  retired_.push_back(std::move(it->second));
  requests_.erase(it);
}

size_t Scheduler::finish_requests(const std::vector<std::string>& request_ids, RequestStatus status) {
  CORELLM_CHECK_ARG(is_finished(status), "finish_requests() needs a FINISHED_* status, got ",
                    to_string(status));
  size_t count = 0;
  bool any_running = false;
  for (const std::string& id : request_ids) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    Request* request = it->second.get();
    if (request->status == RequestStatus::RUNNING) {
      any_running = true;
    } else {
      CORELLM_CHECK(waiting_.remove(request), "request ", id, " is neither running nor waiting");
    }
    retire(request, status);
    ++count;
  }
  if (any_running) {
    running_.erase(std::remove_if(running_.begin(), running_.end(),
                                  [](const Request* r) { return is_finished(r->status); }),
                   running_.end());
  }
  return count;
}

}  // namespace corellm
