// Scheduler: decides, each step, which tokens of which requests run, and applies the results.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "corellm/encoder_cache_manager.h"
#include "corellm/kv_cache_manager.h"
#include "corellm/scheduler_update.h"
#include "corellm/request.h"
#include "corellm/request_queue.h"
#include "corellm/scheduler_output.h"

namespace corellm {

struct SchedulerConfig {
  int32_t max_num_seqs = 256;             // running requests at most
  int32_t max_num_batched_tokens = 2048;  // token budget of one step
  int32_t max_model_len = 2048;           // prompt + output tokens of one request at most
  int32_t block_size = 16;                // tokens per KV block
  int32_t num_blocks = 0;                 // KV cache capacity, in blocks
  int32_t long_prefill_token_threshold = 0;  // >0: at most this many prompt tokens per request per step
  bool enable_prefix_caching = true;
  bool enable_chunked_prefill = true;
  SchedulingPolicy scheduling_policy = SchedulingPolicy::FCFS;
  // Speculative decoding: draft tokens verified per request per step at most (0: off). With
  // prompt_lookup_max > 0 the scheduler proposes them itself (n-gram prompt lookup over each
  // request's tokens, ngram_proposer.h); otherwise they come from set_draft_token_ids (a draft model).
  int32_t num_speculative_tokens = 0;
  int32_t prompt_lookup_min = 0;
  int32_t prompt_lookup_max = 0;
  // KV slots reserved past each scheduled request's tokens (within max_model_len), where a draft
  // model writes its own KV while it proposes the next step's drafts.
  int32_t num_lookahead_tokens = 0;
  // Image inputs (0 for a text model: a request with images is refused). The encoder's work per
  // step at most, in placeholder tokens (its output rows), and the encoder outputs the model
  // runner holds at once (EncoderCacheManager's capacity), in the same unit.
  int32_t max_num_encoder_input_tokens = 0;
  int32_t encoder_cache_size = 0;

  // Throws InvalidArgument naming the offending field and value.
  void validate() const;
};

class Scheduler {
 public:
  explicit Scheduler(const SchedulerConfig& config,
                     std::shared_ptr<const PrefixHasher> hasher = nullptr);

  const SchedulerConfig& config() const { return config_; }

  // Validates and queues a request (InvalidArgument on a bad one: empty or too long prompt,
  // duplicate id, max_tokens < 1, ...).
  void add_request(EngineCoreRequest new_request);

  // Plans one step. Returns the plan; the step must be closed by update_from_output(). A plan
  // may be empty (every running request preempted, nothing admissible): a normal step.
  std::shared_ptr<SchedulerOutput> schedule();

  // Applies the tokens sampled in the step `output` planned. sampled_token_ids is [num_reqs,
  // width]: row i belongs to output.req_ids[i] (ignored where !output.samples_token[i], or the
  // request finished since) and holds its new tokens, -1 after the last: the accepted draft
  // tokens, then the token sampled after them (width 1 without speculative decoding). Rolls
  // num_computed_tokens back past rejected drafts; registers the full blocks the step computed
  // (accepted tokens only) in the prefix cache; appends the tokens one by one, checking EOS
  // (unless ignore_eos), stop_token_ids, min_tokens, max_tokens, max_model_len and the request's
  // repetition_detection after each (a stop drops the tokens after it); frees finished requests'
  // blocks; proposes the next drafts (n-gram). An empty plan's update returns no outputs (and needs no sampled tokens).
  SchedulerUpdate update_from_output(const SchedulerOutput& output, const int32_t* sampled_token_ids,
                                     size_t num_reqs, size_t width = 1);

  // Draft tokens proposed for a running request (a draft model's), verified by the next step that
  // schedules it; replaces any it had. Ignored for unknown, finished or structured-output
  // requests, and when speculative decoding is off. At most num_speculative_tokens are kept.
  void set_draft_token_ids(const std::string& request_id, const int32_t* draft_token_ids, size_t n);

  // What a step costs, as measured by the caller: fixed_seconds + per_token_seconds * tokens.
  // Speculative decoding verifies a draft only where its chance of acceptance beats what one
  // more token costs the step relative to an output token; the default (0 per token) verifies
  // every draft. InvalidArgument on a negative or non-finite cost.
  void set_step_cost(double fixed_seconds, double per_token_seconds);

  // Finishes requests wherever they are (waiting or running), e.g. on abort, freeing their
  // blocks. Unknown or already finished ids are ignored. Returns how many were finished.
  size_t finish_requests(const std::vector<std::string>& request_ids, RequestStatus status);

  bool has_unfinished_requests() const { return !requests_.empty(); }
  int32_t num_unfinished_requests() const { return static_cast<int32_t>(requests_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  SchedulerStats stats() const;
  const KVCacheManager& kv_cache_manager() const { return kv_; }
  const EncoderCacheManager& encoder_cache_manager() const { return encoder_cache_; }
  const Request* find_request(const std::string& request_id) const;
  bool reset_prefix_cache() { return kv_.reset_prefix_cache(); }

  // Every request is in exactly one of waiting / running, with the status that says so;
  // running requests hold distinct batch rows; KV ownership matches the pool's ref counts.
  void check_integrity() const;

 private:
  void schedule_running(SchedulerOutput& out, int32_t& token_budget, bool& preempted_any);
  void schedule_waiting(SchedulerOutput& out, int32_t& token_budget);
  int32_t cap_new_tokens(const Request& request, int32_t num_new_tokens, int32_t token_budget) const;
  // Speculative decoding (scheduler_drafts.cpp).
  double draft_acceptance_threshold() const;
  int32_t num_drafts_to_schedule(const Request& request, double threshold) const;
  int32_t num_drafts_worth_verifying(const Request& request, double threshold) const;
  void record_verification(Request& request, int32_t num_drafts, int32_t num_accepted,
                           SpecDecodingStats& spec) const;
  // Image inputs (scheduler_encoder.cpp): how many of num_new_tokens a request computes this step
  // given the images its tokens reach, and the plan of those to encode; committed once its KV
  // slots are allocated; references dropped as its computed tokens pass its images.
  struct EncoderPlan {
    std::vector<const MultiModalRange*> encode;  // not held: the step encodes them
    std::vector<const MultiModalRange*> reuse;   // held (a hit), or planned by this step already
    int32_t num_tokens = 0;                      // the encoder work of `encode`
  };
  int32_t plan_encoder_inputs(const Request& request, int32_t start, int32_t num_new_tokens,
                              int32_t encoder_budget, EncoderPlan& plan) const;
  void commit_encoder_inputs(const Request& request, const EncoderPlan& plan, SchedulerOutput& out,
                             int32_t& encoder_budget);
  void release_passed_images(const Request& request);
  // Every reference the request holds (it finished or was preempted); an encoding this step
  // planned for it alone is taken back out of `out`.
  void release_images(const Request& request, SchedulerOutput* out);
  // Lookahead slots for a request whose scheduled tokens end at position `end` (exclusive).
  int32_t num_lookahead(int32_t end) const;
  // Appends the step's tokens for a request that sampled; returns whether it finished.
  bool apply_sampled(Request& request, int32_t num_drafts, const int32_t* tokens, int32_t num_tokens,
                     SchedulerUpdate& result);
  void propose_drafts(Request& request);
  Request* choose_preemption_victim() const;
  void preempt(Request* request, SchedulerOutput& out);
  // Stops a finished request: frees its blocks and row, forgets it (deleted at the next step).
  void retire(Request* request, RequestStatus status);
  bool check_stop(Request& request) const;
  int32_t take_batch_row();
  void release_batch_row(Request& request);

  SchedulerConfig config_;
  KVCacheManager kv_;
  EncoderCacheManager encoder_cache_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // all unfinished
  RequestQueue waiting_;
  std::vector<Request*> running_;
  std::vector<int32_t> free_batch_rows_;
  std::vector<std::unique_ptr<Request>> retired_;  // finished, kept alive until the next step
  std::vector<std::string> finished_since_last_step_;

  uint64_t next_step_id_ = 1;
  uint64_t next_arrival_seq_ = 0;
  uint64_t pending_step_id_ = 0;            // step awaiting update_from_output (0: none)
  std::vector<Request*> pending_requests_;  // its requests, in batch order
  int64_t num_preemptions_ = 0;
  std::vector<int32_t> ngram_scratch_;  // the n-gram proposer's work space
  double step_fixed_seconds_ = 1.0;       // set_step_cost
  double step_per_token_seconds_ = 0.0;
  int32_t encoder_budget_ = 0;  // what is left of the step's max_num_encoder_input_tokens
};

}  // namespace corellm
