// A SamplingBatch from the flat argument list both bindings take (corellm._core's CPU sampler and
// corellm._cuda's), in corellm.ops.sample's order: addresses as integers, 0 for an absent array.
#pragma once

#include <cstdint>

#include "corellm/kernels/sampler.h"

namespace corellm {

inline SamplingBatch sampling_batch_from_addresses(
    int64_t num_reqs, int64_t vocab_size, uintptr_t logits, uintptr_t temperature, uintptr_t top_k, uintptr_t top_p,
    uintptr_t min_p, uintptr_t seeds, uintptr_t steps, uintptr_t presence_penalty, uintptr_t frequency_penalty,
    uintptr_t repetition_penalty, uintptr_t output_offsets, uintptr_t output_ids, uintptr_t prompt_offsets,
    uintptr_t prompt_ids, uintptr_t bias_offsets, uintptr_t bias_ids, uintptr_t bias_values, uintptr_t banned_offsets,
    uintptr_t banned_ids, int64_t num_logprobs, uintptr_t sampled, uintptr_t sampled_logprob, uintptr_t sampled_rank,
    uintptr_t top_ids, uintptr_t top_logprobs) {
  auto as = [](uintptr_t address, auto* typed) { return reinterpret_cast<decltype(typed)>(address); };
  SamplingBatch b;
  b.num_reqs = num_reqs;
  b.vocab_size = vocab_size;
  b.logits = as(logits, b.logits);
  b.temperature = as(temperature, b.temperature);
  b.top_k = as(top_k, b.top_k);
  b.top_p = as(top_p, b.top_p);
  b.min_p = as(min_p, b.min_p);
  b.seeds = as(seeds, b.seeds);
  b.steps = as(steps, b.steps);
  b.presence_penalty = as(presence_penalty, b.presence_penalty);
  b.frequency_penalty = as(frequency_penalty, b.frequency_penalty);
  b.repetition_penalty = as(repetition_penalty, b.repetition_penalty);
  b.output_offsets = as(output_offsets, b.output_offsets);
  b.output_ids = as(output_ids, b.output_ids);
  b.prompt_offsets = as(prompt_offsets, b.prompt_offsets);
  b.prompt_ids = as(prompt_ids, b.prompt_ids);
  b.bias_offsets = as(bias_offsets, b.bias_offsets);
  b.bias_ids = as(bias_ids, b.bias_ids);
  b.bias_values = as(bias_values, b.bias_values);
  b.banned_offsets = as(banned_offsets, b.banned_offsets);
  b.banned_ids = as(banned_ids, b.banned_ids);
  b.num_logprobs = num_logprobs;
  b.sampled = as(sampled, b.sampled);
  b.sampled_logprob = as(sampled_logprob, b.sampled_logprob);
  b.sampled_rank = as(sampled_rank, b.sampled_rank);
  b.top_ids = as(top_ids, b.top_ids);
  b.top_logprobs = as(top_logprobs, b.top_logprobs);
  return b;
}

}  // namespace corellm
