// Scheduler: image inputs — which of a request's images a step's tokens reach, what the encoder
// must compute for them within its budget and the EncoderCacheManager's room, and the references
// requests hold on encoder outputs (seed 000's encoder budget; vLLM's _try_schedule_encoder_inputs).
//
// A request's tokens [start, start + n) reach each image whose placeholders [offset, offset +
// length) they overlap. In prompt order, an image reached:
//   - passed already (offset + length <= start): nothing;
//   - held by the encoder cache, or planned by this step for another request: reused (a hit);
//   - else it must be encoded this step: if its length fits what is left of the step's encoder
//     budget and the cache has room, it is planned; otherwise the request's tokens stop short of
//     it (n = offset - start; 0 when start is inside it, and the request waits for a later step).
// So a step may split an image's placeholders across chunks only because its encoder output is
// held from the step that first reaches it until the request's computed tokens pass it.
#include <algorithm>

#include "corellm/check.h"
#include "corellm/scheduler.h"

namespace corellm {

int32_t Scheduler::plan_encoder_inputs(const Request& request, int32_t start, int32_t num_new_tokens,
                                       int32_t encoder_budget, EncoderPlan& plan) const {
  const int32_t end = start + num_new_tokens;
  for (const MultiModalRange& range : request.mm_ranges) {
    if (range.offset >= end) break;
    if (range.offset + range.length <= start) continue;
    const bool planned = std::any_of(plan.encode.begin(), plan.encode.end(),
                                     [&](const MultiModalRange* r) { return r->hash == range.hash; });
    if (planned || encoder_cache_.has(range.hash)) {
      plan.reuse.push_back(&range);
      continue;
    }
    const int32_t tokens = plan.num_tokens + range.length;
    if (tokens > encoder_budget || !encoder_cache_.can_allocate(tokens)) {
      return std::max(0, range.offset - start);
    }
    plan.encode.push_back(&range);
    plan.num_tokens = tokens;
  }
  return num_new_tokens;
}

void Scheduler::commit_encoder_inputs(const Request& request, const EncoderPlan& plan, SchedulerOutput& out,
                                      int32_t& encoder_budget) {
  for (const MultiModalRange* range : plan.encode) {
    encoder_cache_.allocate(range->hash, range->length, *request.request_id);
    out.encoder_hashes.push_back(range->hash);
  }
  for (const MultiModalRange* range : plan.reuse) {
    const bool held = encoder_cache_.acquire(range->hash, *request.request_id);
    CORELLM_CHECK(held, "image ", range->hash, " of request ", *request.request_id, " was planned as held");
  }
  encoder_budget -= plan.num_tokens;
  CORELLM_DCHECK(encoder_budget >= 0, "encoder budget overspent");
}

void Scheduler::release_passed_images(const Request& request) {
  for (const MultiModalRange& range : request.mm_ranges) {
    if (range.offset + range.length > request.num_computed_tokens) break;
    encoder_cache_.release(range.hash, *request.request_id);
  }
}

void Scheduler::release_images(const Request& request, SchedulerOutput* out) {
  for (const MultiModalRange& range : request.mm_ranges) {
    const bool forgotten = encoder_cache_.release(range.hash, *request.request_id);
    if (forgotten && out != nullptr) {  // planned for this step, for this request alone
      auto& hashes = out->encoder_hashes;
      hashes.erase(std::remove(hashes.begin(), hashes.end(), range.hash), hashes.end());
      encoder_budget_ += range.length;
    }
  }
}

}  // namespace corellm
