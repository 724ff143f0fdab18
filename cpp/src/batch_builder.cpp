// BatchBuilder: persistent rows and the flat input arrays of one forward pass.
#include "corellm/batch_builder.h"

#include <algorithm>
#include <cstring>

#include "corellm/check.h"

namespace corellm {

void BatchBuilderConfig::validate() const {
  CORELLM_CHECK_ARG(max_num_reqs > 0, "max_num_reqs must be > 0, got ", max_num_reqs);
  CORELLM_CHECK_ARG(max_model_len > 0, "max_model_len must be > 0, got ", max_model_len);
  CORELLM_CHECK_ARG(block_size > 0, "block_size must be > 0, got ", block_size);
  CORELLM_CHECK_ARG(max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ",
                    max_num_batched_tokens);
}

static const BatchBuilderConfig& validated(const BatchBuilderConfig& config) {
  config.validate();
  return config;
}

BatchBuilder::BatchBuilder(const BatchBuilderConfig& config)
    : config_(validated(config)),
      max_blocks_per_req_((config.max_model_len + config.block_size - 1) / config.block_size),
      row_token_ids_(static_cast<size_t>(config.max_num_reqs) * config.max_model_len, 0),
      row_num_tokens_(static_cast<size_t>(config.max_num_reqs), 0),
      row_block_ids_(static_cast<size_t>(config.max_num_reqs) * max_blocks_per_req_, 0),
      row_num_blocks_(static_cast<size_t>(config.max_num_reqs), 0),
      input_ids_(static_cast<size_t>(config.max_num_batched_tokens), 0),
      positions_(static_cast<size_t>(config.max_num_batched_tokens), 0),
      slot_mapping_(static_cast<size_t>(config.max_num_batched_tokens), 0),
      query_start_loc_(static_cast<size_t>(config.max_num_reqs) + 1, 0),
      seq_lens_(static_cast<size_t>(config.max_num_reqs), 0),
      block_table_(static_cast<size_t>(config.max_num_reqs) * max_blocks_per_req_, 0),
      logits_indices_(static_cast<size_t>(config.max_num_reqs) + static_cast<size_t>(config.max_num_batched_tokens),
                      0) {}

void BatchBuilder::check_row(int32_t row) const {
  CORELLM_CHECK_ARG(row >= 0 && row < config_.max_num_reqs, "batch row ", row,
                    " out of range [0, ", config_.max_num_reqs, ")");
}

void BatchBuilder::update_states(const SchedulerOutput& output) {
  for (const NewRequestData& req : output.scheduled_new_reqs) {
    check_row(req.batch_row);
    const auto num_tokens = static_cast<int32_t>(req.token_ids.size());
    const auto num_blocks = static_cast<int32_t>(req.block_ids.size());
    CORELLM_CHECK_ARG(num_tokens <= config_.max_model_len, "request '", req.req_id, "' has ",
                      num_tokens, " tokens, over max_model_len ", config_.max_model_len);
    CORELLM_CHECK_ARG(num_blocks <= max_blocks_per_req_, "request '", req.req_id, "' has ",
                      num_blocks, " blocks, over ", max_blocks_per_req_, " per request");
    std::memcpy(row_tokens(req.batch_row), req.token_ids.data(), sizeof(int32_t) * req.token_ids.size());
    std::memcpy(row_blocks(req.batch_row), req.block_ids.data(), sizeof(int32_t) * req.block_ids.size());
    row_num_tokens_[static_cast<size_t>(req.batch_row)] = num_tokens;
    row_num_blocks_[static_cast<size_t>(req.batch_row)] = num_blocks;
  }
  const CachedRequestData& cached = output.scheduled_cached_reqs;
  for (size_t i = 0; i < cached.req_ids.size(); ++i) {
    const int32_t row = cached.batch_rows[i];
    check_row(row);
    const std::vector<int32_t>& blocks = cached.new_block_ids[i];
    int32_t& num_blocks = row_num_blocks_[static_cast<size_t>(row)];
    CORELLM_CHECK_ARG(num_blocks + static_cast<int32_t>(blocks.size()) <= max_blocks_per_req_,
                      "request '", *cached.req_ids[i], "' would hold more than ",
                      max_blocks_per_req_, " blocks");
    std::copy(blocks.begin(), blocks.end(), row_blocks(row) + num_blocks);
    num_blocks += static_cast<int32_t>(blocks.size());
  }
}

void BatchBuilder::prepare_inputs(const SchedulerOutput& output) {
  const size_t n = output.req_ids.size();
  CORELLM_CHECK_ARG(n <= static_cast<size_t>(config_.max_num_reqs), n,
                    " scheduled requests over max_num_reqs ", config_.max_num_reqs);
  CORELLM_CHECK_ARG(output.total_num_scheduled_tokens <= config_.max_num_batched_tokens,
                    output.total_num_scheduled_tokens, " scheduled tokens over max_num_batched_tokens ",
                    config_.max_num_batched_tokens);
  CORELLM_CHECK_ARG(output.num_draft_tokens.size() == n, "num_draft_tokens has ", output.num_draft_tokens.size(),
                    " entries for ", n, " requests");
  const int32_t bs = config_.block_size;
  int32_t offset = 0;
  size_t draft_offset = 0;
  num_logits_ = 0;
  max_query_len_ = 0;
  max_seq_len_ = 0;
  query_start_loc_[0] = 0;
  for (size_t i = 0; i < n; ++i) {
    const int32_t row = output.batch_rows[i];
    check_row(row);
    const int32_t start = output.num_computed_tokens[i];
    const int32_t len = output.num_scheduled_tokens[i];
    const int32_t end = start + len;
    const int32_t known = row_num_tokens_[static_cast<size_t>(row)];
    const int32_t num_drafts = output.num_draft_tokens[i];
    CORELLM_CHECK_ARG(num_drafts >= 0 && num_drafts < len && known + num_drafts <= config_.max_model_len &&
                          draft_offset + static_cast<size_t>(num_drafts) <= output.draft_token_ids.size(),
                      "request '", *output.req_ids[i], "': ", num_drafts, " draft tokens for ", len,
                      " scheduled tokens");
    std::copy_n(output.draft_token_ids.begin() + static_cast<std::ptrdiff_t>(draft_offset), num_drafts,
                row_tokens(row) + known);
    draft_offset += static_cast<size_t>(num_drafts);
    CORELLM_CHECK_ARG(len > 0 && start >= 0 && end <= known + num_drafts, "request '", *output.req_ids[i],
                      "': tokens [", start, ", ", end, ") scheduled but its row knows ", known, " and ",
                      num_drafts, " drafts");
    const int32_t num_blocks = row_num_blocks_[static_cast<size_t>(row)];
    CORELLM_CHECK_ARG((end + bs - 1) / bs <= num_blocks, "request '", *output.req_ids[i],
                      "': ", end, " tokens need more than its ", num_blocks, " blocks");
    CORELLM_CHECK(offset + len <= config_.max_num_batched_tokens, "token arrays overflow");

    const int32_t* tokens = row_tokens(row);
    const int32_t* blocks = row_blocks(row);
    std::memcpy(&input_ids_[static_cast<size_t>(offset)], tokens + start, sizeof(int32_t) * static_cast<size_t>(len));
    for (int32_t p = start; p < end; ++p) {
      const size_t t = static_cast<size_t>(offset + p - start);
      positions_[t] = p;
      slot_mapping_[t] = blocks[p / bs] * bs + p % bs;
    }
    std::memcpy(&block_table_[i * static_cast<size_t>(max_blocks_per_req_)], blocks,
                sizeof(int32_t) * static_cast<size_t>(num_blocks));
    offset += len;
    query_start_loc_[i + 1] = offset;
    seq_lens_[i] = end;
    for (int32_t j = num_drafts; j >= 0; --j) logits_indices_[static_cast<size_t>(num_logits_++)] = offset - 1 - j;
    max_query_len_ = std::max(max_query_len_, len);
    max_seq_len_ = std::max(max_seq_len_, end);
  }
  num_tokens_ = offset;
  num_reqs_ = static_cast<int32_t>(n);
  CORELLM_CHECK(num_tokens_ == output.total_num_scheduled_tokens, "laid out ", num_tokens_,
                " tokens, the scheduler planned ", output.total_num_scheduled_tokens);
}

void BatchBuilder::record_sampled(const SchedulerOutput& output, const int32_t* sampled_token_ids, size_t num_reqs,
                                  size_t width) {
  CORELLM_CHECK_ARG(num_reqs == output.req_ids.size(), "got sampled tokens for ", num_reqs, " requests, ",
                    output.req_ids.size(), " were scheduled");
  for (size_t i = 0; i < num_reqs; ++i) {
    if (!output.samples_token[i]) continue;
    const int32_t row = output.batch_rows[i];
    check_row(row);
    int32_t& num_tokens = row_num_tokens_[static_cast<size_t>(row)];
    const int32_t* tokens = sampled_token_ids + i * width;
    // A request at max_model_len finishes with its last token; that one is never an input again.
    for (size_t j = 0; j < width && tokens[j] >= 0 && num_tokens < config_.max_model_len; ++j) {
      row_tokens(row)[num_tokens++] = tokens[j];
    }
  }
}

std::vector<int32_t> BatchBuilder::row_token_ids(int32_t row) const {
  check_row(row);
  const auto* begin = &row_token_ids_[static_cast<size_t>(row) * config_.max_model_len];
  return {begin, begin + row_num_tokens_[static_cast<size_t>(row)]};
}

std::vector<int32_t> BatchBuilder::row_block_ids(int32_t row) const {
  check_row(row);
  const auto* begin = &row_block_ids_[static_cast<size_t>(row) * max_blocks_per_req_];
  return {begin, begin + row_num_blocks_[static_cast<size_t>(row)]};
}

}  // namespace corellm
