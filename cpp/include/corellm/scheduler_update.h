// SchedulerUpdate: what Scheduler::update_from_output decided for one step — per request that
// sampled, its new token, finish reason, stop token and prefix-cache hit — and the scheduler's
// statistics. EngineCore (python/corellm/engine/engine_core.py) joins it with the model runner's
// logprobs into the EngineCoreOutputs boundary structure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "corellm/request.h"

namespace corellm {

struct SchedulerStats {
  int32_t num_running = 0;
  int32_t num_waiting = 0;
  double kv_cache_usage = 0.0;       // fraction of KV blocks in use
  int64_t prefix_cache_queries = 0;  // cumulative tokens looked up
  int64_t prefix_cache_hits = 0;     // cumulative tokens found
  int64_t num_preemptions = 0;       // cumulative
  int32_t num_free_blocks = 0;
};

// Speculative decoding's counts for one step: drafts verified and accepted, in all and by
// position (index j: the j-th draft of a request).
struct SpecDecodingStats {
  int64_t num_drafts = 0;           // requests that verified drafts
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> num_draft_tokens_per_pos;     // [num_speculative_tokens]
  std::vector<int64_t> num_accepted_tokens_per_pos;  // [num_speculative_tokens]
};

// Stored column-wise (one entry per request that produced tokens this step), so that a step
// with thousands of requests costs no allocation per request and Python reads the columns as
// NumPy arrays. A request's new tokens are num_new_tokens[i] consecutive entries of
// new_token_ids (one without speculative decoding).
struct SchedulerUpdate {
  uint64_t step_id = 0;
  std::vector<RequestId> req_ids;
  std::vector<int32_t> num_new_tokens;
  std::vector<int32_t> new_token_ids;  // flat
  std::vector<uint8_t> finish_reasons;  // FinishReason values
  std::vector<int32_t> stop_reasons;    // the stop token id that finished the request, or -1
  std::vector<int32_t> num_cached_tokens;  // prompt tokens served from the prefix cache
  SchedulerStats scheduler_stats;
  SpecDecodingStats spec_decoding_stats;

  // One request's entry, gathered from the columns (for tests and debugging).
  struct Row {
    std::string req_id;
    std::vector<int32_t> new_token_ids;
    FinishReason finish_reason = FinishReason::NONE;
    int32_t stop_reason = -1;
    int32_t num_cached_tokens = 0;
    bool finished() const { return finish_reason != FinishReason::NONE; }
  };

  size_t size() const { return req_ids.size(); }
  void reserve(size_t n) {
    req_ids.reserve(n);
    num_new_tokens.reserve(n);
    new_token_ids.reserve(n);
    finish_reasons.reserve(n);
    stop_reasons.reserve(n);
    num_cached_tokens.reserve(n);
  }
  Row at(size_t i) const {
    size_t start = 0;
    for (size_t j = 0; j < i; ++j) start += static_cast<size_t>(num_new_tokens.at(j));
    const auto first = new_token_ids.begin() + static_cast<std::ptrdiff_t>(start);
    return {*req_ids.at(i), std::vector<int32_t>(first, first + num_new_tokens.at(i)),
            static_cast<FinishReason>(finish_reasons.at(i)), stop_reasons.at(i), num_cached_tokens.at(i)};
  }
};

}  // namespace corellm
