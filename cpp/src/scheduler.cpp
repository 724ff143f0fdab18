// Scheduler: unified token-budget scheduling with chunked prefill and recompute preemption. A
// step's outcome is applied in scheduler_update.cpp, speculative decoding's part in
// scheduler_drafts.cpp.
#include "corellm/scheduler.h"

#include <algorithm>
#include <unordered_set>

#include "corellm/check.h"
#include "corellm/ngram_proposer.h"

namespace corellm {

void SchedulerConfig::validate() const {
  CORELLM_CHECK_ARG(max_num_seqs > 0, "max_num_seqs must be > 0, got ", max_num_seqs);
  CORELLM_CHECK_ARG(max_num_batched_tokens > 0, "max_num_batched_tokens must be > 0, got ",
                    max_num_batched_tokens);
  CORELLM_CHECK_ARG(max_model_len > 1, "max_model_len must be > 1, got ", max_model_len);
  CORELLM_CHECK_ARG(block_size > 0, "block_size must be > 0, got ", block_size);
  CORELLM_CHECK_ARG(num_blocks > 0, "num_blocks must be > 0, got ", num_blocks);
  CORELLM_CHECK_ARG(long_prefill_token_threshold >= 0,
                    "long_prefill_token_threshold must be >= 0, got ", long_prefill_token_threshold);
  const int64_t capacity = static_cast<int64_t>(num_blocks) * block_size;
  CORELLM_CHECK_ARG(max_model_len <= capacity, "max_model_len (", max_model_len,
                    ") exceeds the KV cache capacity of ", capacity, " tokens (", num_blocks,
                    " blocks x ", block_size, "): one request could never fit");
  CORELLM_CHECK_ARG(num_speculative_tokens >= 0, "num_speculative_tokens must be >= 0, got ",
                    num_speculative_tokens);
  CORELLM_CHECK_ARG(num_lookahead_tokens >= 0, "num_lookahead_tokens must be >= 0, got ", num_lookahead_tokens);
  if (prompt_lookup_max > 0) {
    CORELLM_CHECK_ARG(num_speculative_tokens > 0, "prompt_lookup_max needs num_speculative_tokens > 0");
    NgramParams{prompt_lookup_min, prompt_lookup_max}.validate();
  }
  CORELLM_CHECK_ARG(max_num_encoder_input_tokens >= 0 && encoder_cache_size >= 0,
                    "max_num_encoder_input_tokens and encoder_cache_size must be >= 0, got ",
                    max_num_encoder_input_tokens, " and ", encoder_cache_size);
  CORELLM_CHECK_ARG(enable_chunked_prefill || max_num_batched_tokens >= max_model_len,
                    "without chunked prefill max_num_batched_tokens (", max_num_batched_tokens,
                    ") must be >= max_model_len (", max_model_len, ")");
}

static const SchedulerConfig& validated(const SchedulerConfig& config) {
  config.validate();
  return config;
}

Scheduler::Scheduler(const SchedulerConfig& config, std::shared_ptr<const PrefixHasher> hasher)
    : config_(validated(config)),
      kv_(config.num_blocks, config.block_size, config.enable_prefix_caching, std::move(hasher)),
      encoder_cache_(config.encoder_cache_size),
      waiting_(config.scheduling_policy) {
  free_batch_rows_.reserve(static_cast<size_t>(config_.max_num_seqs));
  for (int32_t row = config_.max_num_seqs - 1; row >= 0; --row) free_batch_rows_.push_back(row);
  running_.reserve(static_cast<size_t>(config_.max_num_seqs));
}

void Scheduler::add_request(EngineCoreRequest new_request) {
  const auto num_prompt = static_cast<int64_t>(new_request.prompt_token_ids.size());
  CORELLM_CHECK_ARG(!new_request.request_id.empty(), "request_id must not be empty");
  CORELLM_CHECK_ARG(requests_.count(new_request.request_id) == 0, "request_id '", new_request.request_id,
                    "' is already in use");
  CORELLM_CHECK_ARG(num_prompt > 0, "request '", new_request.request_id, "': the prompt is empty");
  CORELLM_CHECK_ARG(num_prompt < config_.max_model_len, "request '", new_request.request_id,
                    "': the prompt has ", num_prompt,
                    " tokens, but the model's context length (max_model_len) is ",
                    config_.max_model_len, " tokens and at least one token must be generated");
  for (int32_t t : new_request.prompt_token_ids) {
    CORELLM_CHECK_ARG(t >= 0, "request '", new_request.request_id, "': negative prompt token id ", t);
  }
  CORELLM_CHECK_ARG(new_request.max_tokens >= 1, "request '", new_request.request_id,
                    "': max_tokens must be >= 1, got ", new_request.max_tokens);
  CORELLM_CHECK_ARG(new_request.min_tokens >= 0 && new_request.min_tokens <= new_request.max_tokens, "request '",
                    new_request.request_id, "': min_tokens must be in [0, max_tokens=", new_request.max_tokens,
                    "], got ", new_request.min_tokens);
  new_request.repetition_detection.validate(new_request.request_id);
  int64_t previous_end = 0;
  for (const MultiModalRange& range : new_request.mm_ranges) {
    CORELLM_CHECK_ARG(range.length > 0 && range.offset >= previous_end &&
                          static_cast<int64_t>(range.offset) + range.length <= num_prompt,
                      "request '", new_request.request_id, "': image placeholders [", range.offset, ", ",
                      static_cast<int64_t>(range.offset) + range.length, ") must be non-empty, in order, ",
                      "apart and within the ", num_prompt, "-token prompt");
    CORELLM_CHECK_ARG(!range.hash.empty(), "request '", new_request.request_id, "': an image without a hash");
    const int32_t limit = std::min(config_.max_num_encoder_input_tokens, config_.encoder_cache_size);
    CORELLM_CHECK_ARG(range.length <= limit, "request '", new_request.request_id, "': an image of ", range.length,
                      " placeholder tokens exceeds what the encoder may take in one step (",
                      config_.max_num_encoder_input_tokens, " tokens) or hold (", config_.encoder_cache_size,
                      limit == 0 ? " tokens: this model takes no images)" : " tokens)");
    previous_end = static_cast<int64_t>(range.offset) + range.length;
  }

  auto request = std::make_unique<Request>();
  request->request_id = std::make_shared<const std::string>(std::move(new_request.request_id));
  request->token_ids = std::move(new_request.prompt_token_ids);
  request->num_prompt_tokens = static_cast<int32_t>(num_prompt);
  request->max_tokens = new_request.max_tokens;
  request->min_tokens = new_request.min_tokens;
  request->ignore_eos = new_request.ignore_eos;
  request->eos_token_id = new_request.eos_token_id;
  request->stop_token_ids = std::move(new_request.stop_token_ids);
  request->repetition_detection = new_request.repetition_detection;
  request->priority = new_request.priority;
  request->arrival_time = new_request.arrival_time;
  request->arrival_seq = next_arrival_seq_++;
  request->cache_salt = std::move(new_request.cache_salt);
  request->mm_ranges = std::move(new_request.mm_ranges);
  request->use_structured_output = new_request.use_structured_output;
  request->prediction_token_ids = std::move(new_request.prediction_token_ids);
  request->payload = std::move(new_request.payload);
  request->token_ids.reserve(static_cast<size_t>(
      std::min<int64_t>(config_.max_model_len, num_prompt + request->max_tokens)));
  Request* raw = request.get();
  requests_.emplace(*raw->request_id, std::move(request));
  waiting_.add(raw);
}

// ---------------------------------------------------------------------------------------------
// The scheduling algorithm.
//
// There is no prefill phase and no decode phase. Each request has num_computed_tokens (tokens
// whose KV is in the cache) and num_tokens (prompt + outputs so far); a step computes some of
// the difference. A prompt is "prefilled" by steps that compute many tokens (a chunk when the
// budget is short); a running request "decodes" by computing its one newest token. Each step:
//
//   token_budget = max_num_batched_tokens
//   1. RUNNING requests, in order: want = num_tokens - num_computed_tokens, plus the request's
//      draft tokens when it is decoding (speculative decoding: want = 1 + drafts, the drafts'
//      KV in lookahead slots; only the drafts worth verifying — draft j when the request's
//      acceptance rate^j beats what a token costs the step, see set_step_cost — and no more than
//      its max_tokens can still use), capped by long_prefill_token_threshold and the budget
//      (drafts go first). Allocate KV slots for them; when the pool
//      is short, preempt the lowest-priority running request (FCFS: the most recently
//      started; PRIORITY: the largest (priority, arrival)): free its blocks, reset its progress
//      to 0 and put it at the front of WAITING, then retry. If the victim is the request
//      itself, go on with the next running request.
//   2. WAITING requests, in queue order, only if nothing was preempted this step and while
//      budget remains and fewer than max_num_seqs run: look up the longest cached prefix, want
//      = num_tokens - cached (capped as above; without chunked prefill a prompt that does not
//      fit the remaining budget waits), allocate; stop at the first request the pool cannot
//      serve (strict queue order: no overtaking).
//   With images, 1 and 2 also stop a request's tokens short of an image the encoder cannot take
//      this step (its budget, max_num_encoder_input_tokens, or the encoder cache's room), and
//      plan the images the step encodes (scheduler_encoder.cpp).
//   3. Advance num_computed_tokens by what was scheduled, so that the next schedule() sees the
//      step as done, and record which requests reach their last token (they sample); requests
//      whose tokens passed an image drop their hold on its encoder output.
//
// update_from_output() then rolls num_computed_tokens back past the drafts the step rejected,
// appends each sampling request's tokens (accepted drafts, then the one sampled after them),
// checking the stop conditions after each, and registers the full blocks of accepted tokens in
// the prefix cache (only now, once their KV is written: a failed step leaves nothing findable,
// and a block holding a rejected draft's KV is never registered: its slots are rewritten when
// the request computes them again). Finished requests release their blocks and batch rows; the
// others get their next drafts (n-gram proposer).
// ---------------------------------------------------------------------------------------------

std::shared_ptr<SchedulerOutput> Scheduler::schedule() {
  CORELLM_CHECK_ARG(pending_step_id_ == 0, "schedule() called again before update_from_output() for step ",
                    pending_step_id_);
  retired_.clear();  // requests finished during the previous step are no longer referenced

  auto out = std::make_shared<SchedulerOutput>();
  out->step_id = next_step_id_++;
  out->reserve(running_.size() + std::min(waiting_.size(), static_cast<size_t>(config_.max_num_seqs)));
  pending_requests_.reserve(running_.size() + waiting_.size());
  out->finished_req_ids.swap(finished_since_last_step_);

  int32_t token_budget = config_.max_num_batched_tokens;
  encoder_budget_ = config_.max_num_encoder_input_tokens;
  bool preempted_any = false;
  schedule_running(*out, token_budget, preempted_any);
  if (!preempted_any) schedule_waiting(*out, token_budget);
  encoder_cache_.end_step();  // the planned encodings will run: from here on their outputs are held

  // 3. The step is planned: advance progress and note which requests sample.
  const size_t n = out->req_ids.size();
  out->samples_token.resize(n);
  out->uses_grammar.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Request* request = pending_requests_[i];
    request->num_computed_tokens += out->num_scheduled_tokens[i];
    const int32_t end = request->num_tokens() + out->num_draft_tokens[i];
    CORELLM_DCHECK(request->num_computed_tokens <= end, "over-scheduled ", *request->request_id);
    out->samples_token[i] = request->num_computed_tokens == end ? 1 : 0;
    out->uses_grammar[i] = out->samples_token[i] && request->use_structured_output ? 1 : 0;
    if (!request->mm_ranges.empty()) release_passed_images(*request);
  }
  out->freed_encoder_hashes = encoder_cache_.take_freed();
  CORELLM_CHECK(out->total_num_scheduled_tokens <= config_.max_num_batched_tokens,
                "scheduled ", out->total_num_scheduled_tokens, " tokens over the budget");
  CORELLM_CHECK(running_.size() <= static_cast<size_t>(config_.max_num_seqs), "running ",
                running_.size(), " requests over max_num_seqs");
  pending_step_id_ = n > 0 ? out->step_id : 0;
  if (n == 0) pending_requests_.clear();
  return out;
}

int32_t Scheduler::cap_new_tokens(const Request& request, int32_t num_new_tokens,
                                  int32_t token_budget) const {
  if (config_.long_prefill_token_threshold > 0 &&
      num_new_tokens > config_.long_prefill_token_threshold) {
    num_new_tokens = config_.long_prefill_token_threshold;
  }
  num_new_tokens = std::min(num_new_tokens, token_budget);
  // Positions stay below max_model_len: the token at position max_model_len - 1 is never input.
  return std::min(num_new_tokens, config_.max_model_len - 1 - request.num_computed_tokens);
}

int32_t Scheduler::num_lookahead(int32_t end) const {
  return std::max(0, std::min(config_.num_lookahead_tokens, config_.max_model_len - end));
}

static void append_scheduled(SchedulerOutput& out, std::vector<Request*>& pending,
                             Request* request, int32_t num_tokens, int32_t num_drafts = 0) {
  out.req_ids.push_back(request->request_id);
  out.num_scheduled_tokens.push_back(num_tokens);
  out.num_draft_tokens.push_back(num_drafts);
  out.draft_token_ids.insert(out.draft_token_ids.end(), request->draft_token_ids.begin(),
                             request->draft_token_ids.begin() + num_drafts);
  out.num_computed_tokens.push_back(request->num_computed_tokens);
  out.batch_rows.push_back(request->batch_row);
  out.total_num_scheduled_tokens += num_tokens;
  pending.push_back(request);
}

void Scheduler::schedule_running(SchedulerOutput& out, int32_t& token_budget, bool& preempted_any) {
  pending_requests_.clear();
  const double draft_threshold = draft_acceptance_threshold();
  std::vector<int32_t> new_blocks;
  size_t index = 0;
  while (index < running_.size() && token_budget > 0) {
    Request* request = running_[index];
    const int32_t num_uncomputed = request->num_tokens() - request->num_computed_tokens;
    int32_t num_new_tokens =
        cap_new_tokens(*request, num_uncomputed + num_drafts_to_schedule(*request, draft_threshold), token_budget);
    EncoderPlan encoder_plan;
    if (!request->mm_ranges.empty() && num_new_tokens > 0) {
      num_new_tokens = plan_encoder_inputs(*request, request->num_computed_tokens, num_new_tokens, encoder_budget_,
                                           encoder_plan);
    }
    const int32_t num_drafts = std::max(0, num_new_tokens - num_uncomputed);
    if (num_new_tokens <= 0) {
      ++index;
      continue;
    }
    bool scheduled = false;
    while (true) {
      new_blocks.clear();
      if (kv_.allocate_slots(*request, num_new_tokens, nullptr,
                             num_lookahead(request->num_computed_tokens + num_new_tokens), &new_blocks)) {
        scheduled = true;
        break;
      }
      Request* victim = choose_preemption_victim();
      const auto victim_pos = std::find(running_.begin(), running_.end(), victim) - running_.begin();
      if (static_cast<size_t>(victim_pos) < index) {
        // Already scheduled in this step (priority policy): take its tokens back.
        auto pos = std::find(pending_requests_.begin(), pending_requests_.end(), victim) -
                   pending_requests_.begin();
        const auto p = static_cast<size_t>(pos);
        token_budget += out.num_scheduled_tokens[p];
        out.total_num_scheduled_tokens -= out.num_scheduled_tokens[p];
        int32_t drafts_before = 0;
        for (size_t j = 0; j < p; ++j) drafts_before += out.num_draft_tokens[j];
        const auto first_draft = out.draft_token_ids.begin() + drafts_before;
        out.draft_token_ids.erase(first_draft, first_draft + out.num_draft_tokens[p]);
        out.num_draft_tokens.erase(out.num_draft_tokens.begin() + pos);
        out.req_ids.erase(out.req_ids.begin() + pos);
        out.num_scheduled_tokens.erase(out.num_scheduled_tokens.begin() + pos);
        out.num_computed_tokens.erase(out.num_computed_tokens.begin() + pos);
        out.batch_rows.erase(out.batch_rows.begin() + pos);
        pending_requests_.erase(pending_requests_.begin() + pos);
        auto& cached = out.scheduled_cached_reqs;
        auto cpos = std::find(cached.req_ids.begin(), cached.req_ids.end(), victim->request_id) -
                    cached.req_ids.begin();
        cached.req_ids.erase(cached.req_ids.begin() + cpos);
        cached.new_block_ids.erase(cached.new_block_ids.begin() + cpos);
        cached.num_computed_tokens.erase(cached.num_computed_tokens.begin() + cpos);
        cached.batch_rows.erase(cached.batch_rows.begin() + cpos);
        --index;
      }
      preempt(victim, out);
      preempted_any = true;
      if (victim == request) break;
    }
    // The request was its own victim (PRIORITY: the lowest priority running): it left running_,
    // so running_[index] is already the next one, whose blocks may still suffice.
    if (!scheduled) continue;
    commit_encoder_inputs(*request, encoder_plan, out, encoder_budget_);
    append_scheduled(out, pending_requests_, request, num_new_tokens, num_drafts);
    auto& cached = out.scheduled_cached_reqs;
    cached.req_ids.push_back(request->request_id);
    cached.new_block_ids.emplace_back(new_blocks.begin(), new_blocks.end());
    cached.num_computed_tokens.push_back(request->num_computed_tokens);
    cached.batch_rows.push_back(request->batch_row);
    token_budget -= num_new_tokens;
    ++index;
  }
}

void Scheduler::schedule_waiting(SchedulerOutput& out, int32_t& token_budget) {
  while (!waiting_.empty() && token_budget > 0 &&
         running_.size() < static_cast<size_t>(config_.max_num_seqs)) {
    Request* request = waiting_.peek();
    CORELLM_DCHECK(request->num_computed_tokens == 0 && request->block_ids.empty(),
                   "waiting request ", *request->request_id, " holds KV");
    ComputedBlocks computed = kv_.get_computed_blocks(*request);
    const int32_t num_new_tokens_wanted = request->num_tokens() - computed.num_computed_tokens;
    if (!config_.enable_chunked_prefill && num_new_tokens_wanted > token_budget) break;
    request->num_computed_tokens = computed.num_computed_tokens;  // for the cap below
    int32_t num_new_tokens = cap_new_tokens(*request, num_new_tokens_wanted, token_budget);
    request->num_computed_tokens = 0;
    CORELLM_CHECK(num_new_tokens > 0, "nothing to compute for waiting request ", *request->request_id);
    EncoderPlan encoder_plan;
    if (!request->mm_ranges.empty()) {
      num_new_tokens = plan_encoder_inputs(*request, computed.num_computed_tokens, num_new_tokens, encoder_budget_,
                                           encoder_plan);
      if (num_new_tokens <= 0) break;  // its next image must wait for the encoder: so does the queue
    }
    const int32_t lookahead = num_lookahead(computed.num_computed_tokens + num_new_tokens);
    if (!kv_.allocate_slots(*request, num_new_tokens, &computed, lookahead)) break;

    waiting_.pop();
    request->status = RequestStatus::RUNNING;
    request->num_computed_tokens = computed.num_computed_tokens;
    if (request->num_cached_tokens < 0) request->num_cached_tokens = computed.num_computed_tokens;
    request->batch_row = take_batch_row();
    running_.push_back(request);

    NewRequestData data;
    data.req_id = *request->request_id;
    data.token_ids = request->token_ids;
    data.num_prompt_tokens = request->num_prompt_tokens;
    data.block_ids = request->block_ids;
    data.num_computed_tokens = request->num_computed_tokens;
    data.batch_row = request->batch_row;
    data.payload = request->payload;
    out.scheduled_new_reqs.push_back(std::move(data));
    commit_encoder_inputs(*request, encoder_plan, out, encoder_budget_);
    append_scheduled(out, pending_requests_, request, num_new_tokens);
    token_budget -= num_new_tokens;
  }
}

Request* Scheduler::choose_preemption_victim() const {
  CORELLM_CHECK(!running_.empty(), "preemption with nothing running");
  if (config_.scheduling_policy == SchedulingPolicy::FCFS) return running_.back();
  // PRIORITY: the request that would be scheduled last.
  return *std::max_element(running_.begin(), running_.end(), PriorityOrder());
}

void Scheduler::preempt(Request* request, SchedulerOutput& out) {
  kv_.free(*request);
  if (!request->mm_ranges.empty()) release_images(*request, &out);
  release_batch_row(*request);
  running_.erase(std::find(running_.begin(), running_.end(), request));
  request->status = RequestStatus::PREEMPTED;
  request->num_computed_tokens = 0;
  request->draft_token_ids.clear();  // proposed for KV it no longer has
  request->num_preemptions += 1;
  ++num_preemptions_;
  waiting_.add_preempted(request);
  out.preempted_req_ids.push_back(*request->request_id);
}

int32_t Scheduler::take_batch_row() {
  CORELLM_CHECK(!free_batch_rows_.empty(), "no free batch row with ", running_.size(), " running");
  const int32_t row = free_batch_rows_.back();
  free_batch_rows_.pop_back();
  return row;
}

void Scheduler::release_batch_row(Request& request) {
  if (request.batch_row < 0) return;
  free_batch_rows_.push_back(request.batch_row);
  request.batch_row = -1;
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = num_running();
  s.num_waiting = num_waiting();
  s.kv_cache_usage = kv_.usage();
  s.prefix_cache_queries = kv_.prefix_cache_stats().queries;
  s.prefix_cache_hits = kv_.prefix_cache_stats().hits;
  s.num_preemptions = num_preemptions_;
  s.num_free_blocks = kv_.num_free_blocks();
  return s;
}

const Request* Scheduler::find_request(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() ? nullptr : it->second.get();
}

void Scheduler::check_integrity() const {
  std::unordered_set<const Request*> seen;
  std::unordered_set<int32_t> rows;
  std::vector<const Request*> owners;
  for (const Request* r : running_) {
    CORELLM_CHECK(r->status == RequestStatus::RUNNING, "running request ", *r->request_id, " is ",
                  to_string(r->status));
    CORELLM_CHECK(seen.insert(r).second, "request ", *r->request_id, " is running twice");
    CORELLM_CHECK(r->batch_row >= 0 && r->batch_row < config_.max_num_seqs, "request ",
                  *r->request_id, " has batch row ", r->batch_row);
    CORELLM_CHECK(rows.insert(r->batch_row).second, "batch row ", r->batch_row, " used twice");
    CORELLM_CHECK(r->num_computed_tokens <= r->num_tokens() + static_cast<int32_t>(r->draft_token_ids.size()),
                  "request ", *r->request_id, " computed past its tokens and drafts");
    owners.push_back(r);
  }
  for (const Request* r : waiting_.requests()) {
    CORELLM_CHECK(r->status == RequestStatus::WAITING || r->status == RequestStatus::PREEMPTED,
                  "waiting request ", *r->request_id, " is ", to_string(r->status));
    CORELLM_CHECK(seen.insert(r).second, "request ", *r->request_id, " is queued twice or also running");
    CORELLM_CHECK(r->block_ids.empty() && r->num_computed_tokens == 0 && r->batch_row < 0,
                  "waiting request ", *r->request_id, " holds KV or a row");
  }
  CORELLM_CHECK(seen.size() == requests_.size(), requests_.size(), " unfinished requests but ",
                seen.size(), " are running or waiting");
  CORELLM_CHECK(rows.size() + free_batch_rows_.size() == static_cast<size_t>(config_.max_num_seqs),
                "batch rows leaked: ", rows.size(), " used + ", free_batch_rows_.size(), " free");
  kv_.check_integrity(owners);
  encoder_cache_.check_integrity();
}

}  // namespace corellm
