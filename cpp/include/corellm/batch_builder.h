// BatchBuilder: the persistent input batch (one row per running request) and the flat arrays a
// forward pass reads.
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/scheduler_output.h"

namespace corellm {

struct BatchBuilderConfig {
  int32_t max_num_reqs = 256;  // rows (the scheduler's max_num_seqs)
  int32_t max_model_len = 2048;
  int32_t block_size = 16;
  int32_t max_num_batched_tokens = 2048;
  void validate() const;
};

// Rows persist across steps: a request's token ids and block table are written once when it
// is scheduled as new, then only appended to (new blocks from the scheduler, sampled tokens
// from the runner). Each step, prepare_inputs() writes, in the scheduler output's order:
//
//   input_ids[t], positions[t], slot_mapping[t]      t < num_tokens (this step's query tokens)
//   query_start_loc[i] .. query_start_loc[i+1]       request i's query tokens, i < num_reqs
//   seq_lens[i]                                      tokens in request i's KV after this step
//   block_table[i, :]                                request i's block table
//   logits_indices[l]                                l < num_logits: the query tokens whose
//                                                    logits the step computes
//
// A request's logits rows: its last query token, or, when it verifies d draft tokens
// (speculative decoding), its last d + 1 query tokens — its newest token and each draft:
//
//   query tokens  | ... newest | draft 1 | ... | draft d |
//   logits rows               | row 0   | row 1 | ... | row d |   (row j decides draft j + 1)
//
// The drafts are written into the row's token buffer past its known tokens (scratch space: they
// become known tokens only when record_sampled() appends them as accepted).
//
// The arrays are buffers owned by the builder, overwritten by the next prepare_inputs().
class BatchBuilder {
 public:
  explicit BatchBuilder(const BatchBuilderConfig& config);

  const BatchBuilderConfig& config() const { return config_; }
  int32_t max_num_blocks_per_req() const { return max_blocks_per_req_; }

  void update_states(const SchedulerOutput& output);
  void prepare_inputs(const SchedulerOutput& output);
  // sampled_token_ids: [num_reqs, width], row i the new tokens of output.req_ids[i], -1 after the
  // last (Scheduler::update_from_output's layout).
  void record_sampled(const SchedulerOutput& output, const int32_t* sampled_token_ids, size_t num_reqs,
                      size_t width = 1);

  int32_t num_tokens() const { return num_tokens_; }
  int32_t num_reqs() const { return num_reqs_; }
  int32_t max_query_len() const { return max_query_len_; }
  int32_t max_seq_len() const { return max_seq_len_; }
  int32_t num_logits() const { return num_logits_; }

  int32_t* input_ids() { return input_ids_.data(); }
  int32_t* positions() { return positions_.data(); }
  int32_t* slot_mapping() { return slot_mapping_.data(); }
  int32_t* query_start_loc() { return query_start_loc_.data(); }
  int32_t* seq_lens() { return seq_lens_.data(); }
  int32_t* block_table() { return block_table_.data(); }
  int32_t* logits_indices() { return logits_indices_.data(); }

  // Persistent row state (tests, debugging).
  std::vector<int32_t> row_token_ids(int32_t row) const;
  std::vector<int32_t> row_block_ids(int32_t row) const;

 private:
  int32_t* row_tokens(int32_t row) { return &row_token_ids_[static_cast<size_t>(row) * config_.max_model_len]; }
  int32_t* row_blocks(int32_t row) { return &row_block_ids_[static_cast<size_t>(row) * max_blocks_per_req_]; }
  void check_row(int32_t row) const;

  BatchBuilderConfig config_;
  int32_t max_blocks_per_req_;

  // Persistent rows.
  std::vector<int32_t> row_token_ids_;   // [max_num_reqs, max_model_len]
  std::vector<int32_t> row_num_tokens_;  // [max_num_reqs]
  std::vector<int32_t> row_block_ids_;   // [max_num_reqs, max_blocks_per_req]
  std::vector<int32_t> row_num_blocks_;  // [max_num_reqs]

  // This step's flat arrays.
  int32_t num_tokens_ = 0;
  int32_t num_reqs_ = 0;
  int32_t max_query_len_ = 0;
  int32_t max_seq_len_ = 0;
  int32_t num_logits_ = 0;
  std::vector<int32_t> input_ids_;        // [max_num_batched_tokens]
  std::vector<int32_t> positions_;        // [max_num_batched_tokens]
  std::vector<int32_t> slot_mapping_;     // [max_num_batched_tokens]
  std::vector<int32_t> query_start_loc_;  // [max_num_reqs + 1]
  std::vector<int32_t> seq_lens_;         // [max_num_reqs]
  std::vector<int32_t> block_table_;      // [max_num_reqs, max_blocks_per_req]
  std::vector<int32_t> logits_indices_;   // [max_num_reqs + max_num_batched_tokens]
};

}  // namespace corellm
