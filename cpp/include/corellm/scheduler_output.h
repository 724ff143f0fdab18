// SchedulerOutput: what the scheduler decided for one step, handed to the model runner.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "corellm/request.h"

namespace corellm {

// A request the model runner has not seen yet (first scheduling, or resumed after preemption,
// in which case token_ids holds the prompt and the outputs generated before preemption).
struct NewRequestData {
  std::string req_id;
  std::vector<int32_t> token_ids;
  int32_t num_prompt_tokens = 0;
  std::vector<int32_t> block_ids;   // the whole block table
  int32_t num_computed_tokens = 0;  // prefix-cache hit: KV already present for these tokens
  int32_t batch_row = -1;
  std::shared_ptr<RequestPayload> payload;
};

// Requests the runner already holds: only what changed (column-wise, one entry per request).
struct CachedRequestData {
  std::vector<RequestId> req_ids;
  std::vector<std::vector<int32_t>> new_block_ids;  // blocks appended to the block table
  std::vector<int32_t> num_computed_tokens;
  std::vector<int32_t> batch_rows;
};

struct SchedulerOutput {
  uint64_t step_id = 0;
  std::vector<NewRequestData> scheduled_new_reqs;
  CachedRequestData scheduled_cached_reqs;

  // Every scheduled request in batch order (cached requests first, then new ones), with the
  // number of tokens it computes this step and its state before this step. The model runner
  // lays its inputs and returns its sampled tokens in this order.
  std::vector<RequestId> req_ids;
  std::vector<int32_t> num_scheduled_tokens;
  std::vector<int32_t> num_computed_tokens;  // before this step
  std::vector<int32_t> batch_rows;
  // True where this step's forward reaches the request's last token, so its sample is kept
  // (false for a prefill chunk that stops short of the end of the prompt).
  std::vector<uint8_t> samples_token;
  // True where the request samples this step under a grammar (structured output): the rows whose
  // grammar bitmask the step computes while its forward runs.
  std::vector<uint8_t> uses_grammar;
  // Speculative decoding: per request the draft tokens this step verifies (0 for most), and the
  // drafts themselves, flat in batch order. A request with d drafts is scheduled 1 + d tokens
  // (its newest token and the drafts, their KV in lookahead slots) and gets d + 1 logits rows.
  std::vector<int32_t> num_draft_tokens;
  std::vector<int32_t> draft_token_ids;
  int32_t total_num_scheduled_tokens = 0;
  // Image inputs: the images (by hash) the runner encodes this step — each reached by a scheduled
  // request's tokens and not held — and those whose outputs it drops (evicted from the
  // EncoderCacheManager), to be dropped before encoding.
  std::vector<std::string> encoder_hashes;
  std::vector<std::string> freed_encoder_hashes;

  // Requests that left the running set since the previous step (finished, aborted or
  // preempted): the runner drops their per-request state.
  std::vector<std::string> finished_req_ids;
  std::vector<std::string> preempted_req_ids;

  size_t num_reqs() const { return req_ids.size(); }
  void reserve(size_t n) {
    req_ids.reserve(n);
    num_scheduled_tokens.reserve(n);
    num_computed_tokens.reserve(n);
    batch_rows.reserve(n);
    samples_token.reserve(n);
    uses_grammar.reserve(n);
    num_draft_tokens.reserve(n);
    scheduled_cached_reqs.req_ids.reserve(n);
    scheduled_cached_reqs.new_block_ids.reserve(n);
    scheduled_cached_reqs.num_computed_tokens.reserve(n);
    scheduled_cached_reqs.batch_rows.reserve(n);
  }
  bool empty() const { return req_ids.empty(); }
};

}  // namespace corellm
