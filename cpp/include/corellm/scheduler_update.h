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

// Stored column-wise (one entry per request that produced a token this step: each computes at
// most one new token per step), so that a step with thousands of requests costs no allocation
// per request and Python reads the columns as NumPy arrays.
struct SchedulerUpdate {
  uint64_t step_id = 0;
  std::vector<RequestId> req_ids;
  std::vector<int32_t> new_token_ids;
  std::vector<uint8_t> finish_reasons;  // FinishReason values
  std::vector<int32_t> stop_reasons;    // the stop token id that finished the request, or -1
  std::vector<int32_t> num_cached_tokens;  // prompt tokens served from the prefix cache
  SchedulerStats scheduler_stats;

  // One request's entry, gathered from the columns (for tests and debugging).
  struct Row {
    std::string req_id;
    int32_t new_token_id = -1;
    FinishReason finish_reason = FinishReason::NONE;
    int32_t stop_reason = -1;
    int32_t num_cached_tokens = 0;
    bool finished() const { return finish_reason != FinishReason::NONE; }
  };

  size_t size() const { return req_ids.size(); }
  void reserve(size_t n) {
    req_ids.reserve(n);
    new_token_ids.reserve(n);
    finish_reasons.reserve(n);
    stop_reasons.reserve(n);
    num_cached_tokens.reserve(n);
  }
  Row at(size_t i) const {
    return {*req_ids.at(i), new_token_ids.at(i), static_cast<FinishReason>(finish_reasons.at(i)), stop_reasons.at(i),
            num_cached_tokens.at(i)};
  }
};

}  // namespace corellm
