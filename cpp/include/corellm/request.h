// Request: the scheduler's state of one generation request (tokens, progress, KV blocks, limits).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "corellm/prediction_proposer.h"
#include "corellm/prefix_hash.h"
#include "corellm/repetition_detection.h"

namespace corellm {

enum class RequestStatus : uint8_t {
  WAITING,
  RUNNING,
  PREEMPTED,  // KV freed, back in the waiting queue; recomputed when scheduled again
  FINISHED_STOPPED,
  FINISHED_LENGTH_CAPPED,
  FINISHED_ABORTED,
  FINISHED_ERROR,
  FINISHED_REPETITION,  // its output ended in a loop (RepetitionDetection)
};

inline bool is_finished(RequestStatus s) { return s >= RequestStatus::FINISHED_STOPPED; }

// Why a request finished, as reported to the caller (OpenAI's finish_reason).
enum class FinishReason : uint8_t { NONE, STOP, LENGTH, ABORT, ERROR, REPETITION };

FinishReason finish_reason_of(RequestStatus status);
const char* to_string(RequestStatus status);
const char* to_string(FinishReason reason);

// Data the core carries for its caller without looking at it (the Python binding stores the
// request's sampling parameters here, so that the model runner receives them with the request).
struct RequestPayload {
  virtual ~RequestPayload() = default;
};

enum class SchedulingPolicy : uint8_t { FCFS, PRIORITY };

// An image (or another encoder input) in the prompt: the placeholder tokens [offset, offset +
// length) stand for it, and `hash` (its content's blake3, hex) enters the prefix-cache keys of the
// blocks that cover them, so that two images never share KV however alike their prompts.
struct MultiModalRange {
  int32_t offset = 0;
  int32_t length = 0;
  std::string hash;
};

// The C++ side of the first boundary structure, EngineCoreRequest (its Python type in
// python/corellm/engine_core_request.py): the fields the scheduler reads, and the Python object
// itself as the payload. The scheduler validates it in add_request().
struct EngineCoreRequest {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  bool ignore_eos = false;
  int32_t eos_token_id = -1;  // -1: the model has none
  std::vector<int32_t> stop_token_ids;
  RepetitionDetection repetition_detection;  // ends an output that loops (off by default)
  int32_t priority = 0;  // lower runs first (PRIORITY policy)
  double arrival_time = 0.0;
  std::string cache_salt;  // isolates prefix-cache sharing between tenants
  std::vector<MultiModalRange> mm_ranges;  // its images' placeholders, in prompt order
  bool use_structured_output = false;  // a grammar constrains its tokens (SchedulerOutput.uses_grammar)
  std::vector<int32_t> prediction_token_ids;  // text the output should largely repeat: drafts (prediction_proposer.h)
  std::shared_ptr<RequestPayload> payload;
};

// Request ids travel in every step's outputs: shared immutable strings, so that a step with
// thousands of requests copies pointers, not strings.
using RequestId = std::shared_ptr<const std::string>;

// How often a request's drafts are accepted (speculative decoding), as decayed counts: each
// verification of d drafts that accepted a adds a acceptances and, when a < d, one rejection
// (draft a + 1 was refused); older evidence fades, and fades on its own while the request
// verifies nothing, so a request whose drafts stopped being worth it is tried again later.
// acceptance_rate() estimates the chance that a draft is accepted given the one before it was.
struct DraftAcceptance {
  static constexpr float kPriorAccepted = 1.4f, kPriorRejected = 0.6f;  // a fresh request: 0.7
  static constexpr float kDecay = 0.8f;       // per verification
  static constexpr float kIdleDecay = 0.97f;  // per step without drafts
  float accepted = 0.0f;
  float rejected = 0.0f;
  float acceptance_rate() const {
    return (accepted + kPriorAccepted) / (accepted + rejected + kPriorAccepted + kPriorRejected);
  }
};

struct Request {
  // Token range of a request, as the scheduler sees it:
  //   | prompt tokens ............ | output tokens .... | draft tokens (proposed) |
  //   | num_computed_tokens (KV written) | to compute  | lookahead               |
  // num_tokens() = prompt + output; a new token is sampled when num_computed_tokens reaches it.
  // Draft tokens are not part of token_ids: a step that verifies them computes past num_tokens()
  // (their KV goes into lookahead slots), and update_from_output rolls num_computed_tokens back
  // to the last accepted one.
  RequestId request_id;
  std::vector<int32_t> token_ids;  // prompt then outputs
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;
  int32_t num_cached_tokens = -1;  // prefix-cache hit at first scheduling (-1: not yet scheduled)
  RequestStatus status = RequestStatus::WAITING;
  int32_t stop_reason = -1;  // the stop token id that finished it, or -1

  int32_t max_tokens = 16;
  int32_t min_tokens = 0;
  bool ignore_eos = false;
  int32_t eos_token_id = -1;
  std::vector<int32_t> stop_token_ids;
  RepetitionDetection repetition_detection;
  int32_t priority = 0;
  double arrival_time = 0.0;
  uint64_t arrival_seq = 0;  // tie-breaker: order of add_request calls
  std::string cache_salt;
  std::vector<MultiModalRange> mm_ranges;
  bool use_structured_output = false;
  std::shared_ptr<RequestPayload> payload;

  // KV state, owned by the KVCacheManager.
  std::vector<int32_t> block_ids;          // block table: logical block i -> physical block
  std::vector<BlockHash> block_hashes;     // hashes of the full blocks of token_ids
  int32_t num_cached_blocks = 0;           // leading blocks already registered in the cache

  // Speculative decoding: the tokens proposed to follow token_ids, verified by the next step that
  // schedules them (cleared by every update and by preemption), and how often its drafts pass.
  std::vector<int32_t> draft_token_ids;
  DraftAcceptance draft_acceptance;
  std::vector<int32_t> prediction_token_ids;  // a prediction's tokens: drafts from there first
  PredictionCursor prediction_cursor;

  int32_t batch_row = -1;  // row in the persistent input batch while RUNNING, else -1
  int32_t num_preemptions = 0;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_output_tokens() const { return num_tokens() - num_prompt_tokens; }
};

}  // namespace corellm
