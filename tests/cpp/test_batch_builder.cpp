// Tests of BatchBuilder: flat arrays of a step against values worked out by hand.
#include <gtest/gtest.h>

#include <numeric>

#include "corellm/batch_builder.h"
#include "corellm/check.h"
#include "corellm/scheduler.h"

using namespace corellm;

TEST(BatchBuilder, LaysOutPrefillAndDecodeInSchedulerOrder) {
  SchedulerConfig c;
  c.num_blocks = 32;
  c.block_size = 4;
  c.max_model_len = 32;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 4;
  Scheduler s(c);
  BatchBuilder b({4, 32, 4, 64});

  EngineCoreRequest a;
  a.request_id = "a";
  a.prompt_token_ids = {10, 11, 12, 13, 14};
  a.max_tokens = 8;
  s.add_request(a);
  auto plan = s.schedule();
  b.update_states(*plan);
  b.prepare_inputs(*plan);
  ASSERT_EQ(b.num_tokens(), 5);
  const auto& blocks_a = s.find_request("a")->block_ids;
  for (int t = 0; t < 5; ++t) {
    EXPECT_EQ(b.input_ids()[t], 10 + t);
    EXPECT_EQ(b.positions()[t], t);
    EXPECT_EQ(b.slot_mapping()[t], blocks_a[t / 4] * 4 + t % 4);
  }
  EXPECT_EQ(b.logits_indices()[0], 4);
  EXPECT_EQ(b.seq_lens()[0], 5);
  std::vector<int32_t> sampled{77};
  b.record_sampled(*plan, sampled.data(), 1);
  s.update_from_output(*plan, sampled.data(), 1);

  EngineCoreRequest d;
  d.request_id = "d";
  d.prompt_token_ids = {20, 21, 22};
  d.max_tokens = 8;
  s.add_request(d);
  plan = s.schedule();
  b.update_states(*plan);
  b.prepare_inputs(*plan);
  // Batch order: the running request (decoding token 77 at position 5), then the new one.
  ASSERT_EQ(b.num_reqs(), 2);
  ASSERT_EQ(b.num_tokens(), 4);
  EXPECT_EQ(b.input_ids()[0], 77);
  EXPECT_EQ(b.positions()[0], 5);
  EXPECT_EQ(b.slot_mapping()[0], blocks_a[1] * 4 + 1);
  EXPECT_EQ((std::vector<int32_t>(b.query_start_loc(), b.query_start_loc() + 3)),
            (std::vector<int32_t>{0, 1, 4}));
  EXPECT_EQ(b.seq_lens()[0], 6);
  EXPECT_EQ(b.seq_lens()[1], 3);
  EXPECT_EQ(b.logits_indices()[1], 3);
  EXPECT_EQ(b.max_query_len(), 3);
  const auto& blocks_d = s.find_request("d")->block_ids;
  EXPECT_EQ(b.block_table()[b.max_num_blocks_per_req()], blocks_d[0]);
  EXPECT_EQ(b.row_token_ids(plan->batch_rows[0]), (std::vector<int32_t>{10, 11, 12, 13, 14, 77}));
}

TEST(BatchBuilder, RejectsInconsistentPlans) {
  EXPECT_THROW(BatchBuilder({0, 32, 4, 64}), InvalidArgument);
  BatchBuilder b({2, 32, 4, 64});
  SchedulerOutput plan;
  plan.req_ids = {std::make_shared<const std::string>("ghost")};
  plan.num_scheduled_tokens = {3};
  plan.num_computed_tokens = {0};
  plan.batch_rows = {0};
  plan.samples_token = {1};
  plan.total_num_scheduled_tokens = 3;
  EXPECT_THROW(b.prepare_inputs(plan), InvalidArgument);  // the row holds no tokens
  plan.batch_rows = {9};
  EXPECT_THROW(b.prepare_inputs(plan), InvalidArgument);
}
