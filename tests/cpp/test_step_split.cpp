// Tests of StepSplit (a step's sequences cut into contiguous groups for DecoderStack's threads):
// the groups cover the step's sequences and tokens in order, each group's buffers point at its
// own part of the step's and its query_start_loc starts at 0; the cuts fall nearest the even
// shares; every group keeps at least one sequence.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "corellm/model/step_split.h"

using namespace corellm;

namespace {

// A step over sequences of the given query lengths (hidden = 4), its buffers owned here.
struct Step {
  std::vector<int32_t> ids, positions, slots, block_table, seq_lens, starts{0};
  std::vector<uint16_t> out;
  DecoderStepArgs args;

  explicit Step(const std::vector<int32_t>& lengths, int64_t stride = 3) {
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int32_t t = 0; t < lengths[s]; ++t) {
        ids.push_back(static_cast<int32_t>(ids.size()));
        positions.push_back(t);
        slots.push_back(static_cast<int32_t>(slots.size()) + 100);
      }
      starts.push_back(starts.back() + lengths[s]);
      seq_lens.push_back(lengths[s] + 7);
      for (int64_t b = 0; b < stride; ++b) block_table.push_back(static_cast<int32_t>(s * 10 + b));
    }
    out.resize(ids.size() * 4);
    args.input_ids = ids.data();
    args.positions = positions.data();
    args.num_tokens = static_cast<int64_t>(ids.size());
    args.slot_mapping = slots.data();
    args.block_table = block_table.data();
    args.block_table_stride = stride;
    args.seq_lens = seq_lens.data();
    args.query_start_loc = starts.data();
    args.num_seqs = static_cast<int64_t>(lengths.size());
    args.out = out.data();
  }
};

}  // namespace

TEST(StepSplit, GroupsCoverTheStepInOrderWithTheirOwnBuffers) {
  Step step({1, 1, 5, 1, 3, 1, 1, 2});
  StepSplit split;
  split.cut(step.args, /*hidden=*/4, /*groups=*/3);
  ASSERT_EQ(split.size(), 3);
  int64_t seq = 0, token = 0;
  for (int64_t g = 0; g < split.size(); ++g) {
    const DecoderStepArgs& p = split.group(g);
    ASSERT_GE(p.num_seqs, 1);
    EXPECT_EQ(p.input_ids, step.ids.data() + token);
    EXPECT_EQ(p.positions, step.positions.data() + token);
    EXPECT_EQ(p.slot_mapping, step.slots.data() + token);
    EXPECT_EQ(p.out, step.out.data() + token * 4);
    EXPECT_EQ(p.block_table, step.block_table.data() + seq * 3);
    EXPECT_EQ(p.seq_lens, step.seq_lens.data() + seq);
    EXPECT_EQ(p.block_table_stride, 3);
    EXPECT_EQ(p.query_start_loc[0], 0);
    for (int64_t s = 0; s <= p.num_seqs; ++s) {
      EXPECT_EQ(p.query_start_loc[s], step.starts[static_cast<size_t>(seq + s)] - token);
    }
    EXPECT_EQ(p.num_tokens, p.query_start_loc[p.num_seqs]);
    seq += p.num_seqs;
    token += p.num_tokens;
  }
  EXPECT_EQ(seq, step.args.num_seqs);
  EXPECT_EQ(token, step.args.num_tokens);
}

TEST(StepSplit, CutsFallNearestTheEvenShares) {
  Step decodes(std::vector<int32_t>(64, 1));
  StepSplit split;
  split.cut(decodes.args, 4, 4);
  for (int64_t g = 0; g < 4; ++g) EXPECT_EQ(split.group(g).num_tokens, 16);
  EXPECT_DOUBLE_EQ(split.imbalance(), 1.0);
  // 63 decodes and a chunk of 1985: the chunk cannot be cut, so one group holds it.
  std::vector<int32_t> mixed(63, 1);
  mixed.push_back(1985);
  Step uneven(mixed);
  split.cut(uneven.args, 4, 2);
  EXPECT_EQ(split.group(0).num_tokens, 63);
  EXPECT_EQ(split.group(1).num_tokens, 1985);
  EXPECT_NEAR(split.imbalance(), 1985.0 * 2 / 2048, 1e-12);
}

TEST(StepSplit, EveryGroupKeepsASequence) {
  Step step({100, 1, 1});  // the even share's cut would put all three in the first group
  StepSplit split;
  split.cut(step.args, 4, 3);
  ASSERT_EQ(split.size(), 3);
  for (int64_t g = 0; g < 3; ++g) EXPECT_EQ(split.group(g).num_seqs, 1);
  split.cut(step.args, 4, 5);  // more groups than sequences: one a sequence
  EXPECT_EQ(split.size(), 3);
  EXPECT_THROW(split.cut(step.args, 4, 0), std::invalid_argument);
}
