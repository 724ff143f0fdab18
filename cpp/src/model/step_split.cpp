// StepSplit (step_split.h): a step's sequences cut into contiguous groups of near-equal tokens.
#include "corellm/model/step_split.h"

#include <algorithm>
#include <cstdlib>

#include "corellm/check.h"

namespace corellm {

void StepSplit::cut(const DecoderStepArgs& step, int64_t hidden, int64_t groups) {
  CORELLM_CHECK_ARG(groups >= 1 && step.num_seqs >= 1, "StepSplit: ", groups, " groups of ", step.num_seqs,
                    " sequences");
  groups = std::min(groups, step.num_seqs);
  const int32_t* starts = step.query_start_loc;
  const int64_t n = step.num_tokens;
  groups_.clear();
  query_starts_.resize(static_cast<size_t>(groups));
  int64_t s0 = 0;
  for (int64_t g = 0; g < groups; ++g) {
    // The group's last sequence: the one whose end is nearest the group's share of the tokens,
    // leaving at least one sequence to each group after it.
    int64_t s1 = s0 + 1;
    const int64_t last_allowed = step.num_seqs - (groups - 1 - g);
    if (g == groups - 1) {
      s1 = step.num_seqs;
    } else {
      const int64_t target = (g + 1) * n / groups;
      while (s1 < last_allowed && std::llabs(starts[s1 + 1] - target) <= std::llabs(starts[s1] - target)) ++s1;
    }
    const int64_t t0 = starts[s0], t1 = starts[s1];
    std::vector<int32_t>& qs = query_starts_[static_cast<size_t>(g)];
    qs.resize(static_cast<size_t>(s1 - s0 + 1));
    for (int64_t s = s0; s <= s1; ++s) qs[static_cast<size_t>(s - s0)] = static_cast<int32_t>(starts[s] - t0);
    DecoderStepArgs part = step;
    part.input_ids = step.input_ids ? step.input_ids + t0 : nullptr;
    part.inputs_embeds = step.inputs_embeds ? step.inputs_embeds + t0 * hidden : nullptr;
    part.positions = step.positions + t0;
    part.num_tokens = t1 - t0;
    part.slot_mapping = step.slot_mapping + t0;
    part.block_table = step.block_table + s0 * step.block_table_stride;
    part.seq_lens = step.seq_lens + s0;
    part.query_start_loc = qs.data();
    part.num_seqs = s1 - s0;
    part.lora_slots = step.lora_slots ? step.lora_slots + t0 : nullptr;
    part.out = step.out + t0 * hidden;
    groups_.push_back(part);
    s0 = s1;
  }
}

double StepSplit::imbalance() const {
  int64_t total = 0, most = 0;
  for (const DecoderStepArgs& g : groups_) {
    total += g.num_tokens;
    most = std::max(most, g.num_tokens);
  }
  return total == 0 ? 1.0 : static_cast<double>(most) * static_cast<double>(size()) / static_cast<double>(total);
}

}  // namespace corellm
