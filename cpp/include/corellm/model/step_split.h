// A step's sequences cut into contiguous groups of near-equal token counts, each group a step of
// its own (DecoderStepArgs over the same buffers: its sequences' tokens, block-table rows and
// lengths, and its own query_start_loc from 0). DecoderStack::forward runs the groups side by
// side, each on one thread, when the step is big enough (decoder_stack.h).
//
// Cut points: walking the sequences in order, group g ends after the sequence whose end is
// nearest to (g + 1) * num_tokens / groups (each group keeps at least one sequence). A token's
// result does not depend on the group it lands in: every kernel computes a token's rows from that
// token's inputs and its own sequence's KV alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "corellm/model/decoder_step.h"

namespace corellm {

class StepSplit {
 public:
  // The step cut into at most `groups` groups (fewer when it has fewer sequences). The groups
  // read the step's buffers, which must outlive them.
  void cut(const DecoderStepArgs& step, int64_t hidden, int64_t groups);

  int64_t size() const { return static_cast<int64_t>(groups_.size()); }
  const DecoderStepArgs& group(int64_t g) const { return groups_[static_cast<size_t>(g)]; }
  // The most tokens in one group, over the mean tokens per group (1: even).
  double imbalance() const;

 private:
  std::vector<DecoderStepArgs> groups_;
  std::vector<std::vector<int32_t>> query_starts_;  // each group's query_start_loc, from 0
};

}  // namespace corellm
