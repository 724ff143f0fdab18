// Scheduler: decides, each step, which tokens of which requests run, and applies the results.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "corellm/scheduler_update.h"
#include "corellm/kv_cache_manager.h"
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

  // Applies the tokens sampled in the step `output` planned: sampled_token_ids[i] belongs to
  // output.req_ids[i] (ignored where !output.samples_token[i], or the request finished since).
  // Registers the full blocks the step computed in the prefix cache; checks EOS (unless
  // ignore_eos), stop_token_ids, min_tokens, max_tokens and max_model_len; frees finished
  // requests' blocks. An empty plan's update returns no outputs (and needs no sampled tokens).
  SchedulerUpdate update_from_output(const SchedulerOutput& output,
                                       const int32_t* sampled_token_ids, size_t num_sampled);

  // Finishes requests wherever they are (waiting or running), e.g. on abort, freeing their
  // blocks. Unknown or already finished ids are ignored. Returns how many were finished.
  size_t finish_requests(const std::vector<std::string>& request_ids, RequestStatus status);

  bool has_unfinished_requests() const { return !requests_.empty(); }
  int32_t num_unfinished_requests() const { return static_cast<int32_t>(requests_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  SchedulerStats stats() const;
  const KVCacheManager& kv_cache_manager() const { return kv_; }
  const Request* find_request(const std::string& request_id) const;
  bool reset_prefix_cache() { return kv_.reset_prefix_cache(); }

  // Every request is in exactly one of waiting / running, with the status that says so;
  // running requests hold distinct batch rows; KV ownership matches the pool's ref counts.
  void check_integrity() const;

 private:
  void schedule_running(SchedulerOutput& out, int32_t& token_budget, bool& preempted_any);
  void schedule_waiting(SchedulerOutput& out, int32_t& token_budget);
  int32_t cap_new_tokens(const Request& request, int32_t num_new_tokens, int32_t token_budget) const;
  Request* choose_preemption_victim() const;
  void preempt(Request* request, SchedulerOutput& out);
  // Stops a finished request: frees its blocks and row, forgets it (deleted at the next step).
  void retire(Request* request, RequestStatus status);
  bool check_stop(Request& request) const;
  int32_t take_batch_row();
  void release_batch_row(Request& request);

  SchedulerConfig config_;
  KVCacheManager kv_;
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
};

}  // namespace corellm
