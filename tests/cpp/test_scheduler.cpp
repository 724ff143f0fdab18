// Tests of the Scheduler: budget, chunked prefill, prefix hits, preemption, stops, aborts.
#include <gtest/gtest.h>

#include <numeric>

#include "corellm/check.h"
#include "corellm/scheduler.h"

using namespace corellm;

namespace {

SchedulerConfig config(int32_t num_blocks, int32_t budget = 64, int32_t max_seqs = 8,
                       int32_t block_size = 4, int32_t max_model_len = 64) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = max_seqs;
  c.block_size = block_size;
  c.max_model_len = max_model_len;
  return c;
}

EngineCoreRequest make_request(const std::string& id, int32_t prompt_len, int32_t max_tokens, int32_t first = 0) {
  EngineCoreRequest s;
  s.request_id = id;
  s.prompt_token_ids.resize(static_cast<size_t>(prompt_len));
  std::iota(s.prompt_token_ids.begin(), s.prompt_token_ids.end(), first);
  s.max_tokens = max_tokens;
  s.eos_token_id = 1000;
  return s;
}

// Runs one step with every sampling request receiving `token`.
SchedulerUpdate step(Scheduler& s, int32_t token = 7, std::shared_ptr<SchedulerOutput>* plan = nullptr) {
  auto out = s.schedule();
  s.check_integrity();
  std::vector<int32_t> sampled(out->num_reqs(), token);
  auto result = s.update_from_output(*out, sampled.data(), sampled.size());
  s.check_integrity();
  if (plan) *plan = out;
  return result;
}

}  // namespace

TEST(SchedulerConfig, RejectsInvalidValues) {
  EXPECT_THROW(Scheduler(config(0)), InvalidArgument);
  auto c = config(16);
  c.block_size = 0;
  EXPECT_THROW(Scheduler{c}, InvalidArgument);
  c = config(16);
  c.max_num_seqs = 0;
  EXPECT_THROW(Scheduler{c}, InvalidArgument);
  c = config(4);  // 4 blocks x 4 tokens = 16 < max_model_len 64
  try {
    Scheduler s(c);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("max_model_len (64)"), std::string::npos) << e.what();
  }
}

TEST(Scheduler, RejectsBadRequests) {
  Scheduler s(config(32));
  EXPECT_THROW(s.add_request(make_request("a", 0, 4)), InvalidArgument);
  EXPECT_THROW(s.add_request(make_request("a", 64, 4)), InvalidArgument);  // prompt == max_model_len
  EXPECT_THROW(s.add_request(make_request("a", 4, 0)), InvalidArgument);
  s.add_request(make_request("a", 4, 4));
  EXPECT_THROW(s.add_request(make_request("a", 4, 4)), InvalidArgument);  // duplicate id
  try {
    s.add_request(make_request("long", 100, 4));
    FAIL();
  } catch (const InvalidArgument& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("100"), std::string::npos);
    EXPECT_NE(msg.find("64"), std::string::npos);
  }
}

TEST(Scheduler, PrefillThenDecodeUntilMaxTokens) {
  Scheduler s(config(32));
  s.add_request(make_request("a", 10, 3));
  std::shared_ptr<SchedulerOutput> plan;
  auto out = step(s, 7, &plan);
  EXPECT_EQ(plan->scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 10);
  EXPECT_EQ(out.size(), 1u);
  EXPECT_EQ(out.at(0).new_token_ids, std::vector<int32_t>{7});
  out = step(s, 8, &plan);
  EXPECT_EQ(plan->scheduled_cached_reqs.req_ids.size(), 1u);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 1);
  EXPECT_EQ(plan->num_computed_tokens[0], 10);
  EXPECT_FALSE(out.at(0).finished());
  out = step(s, 9);
  ASSERT_TRUE(out.at(0).finished());
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::LENGTH);
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.kv_cache_manager().num_free_blocks(), 32);
  auto next = s.schedule();
  EXPECT_EQ(next->finished_req_ids, std::vector<std::string>{"a"});
  EXPECT_TRUE(next->empty());
}

TEST(Scheduler, ChunkedPrefillSplitsLongPrompt) {
  Scheduler s(config(64, /*budget=*/16));
  s.add_request(make_request("a", 40, 2));
  std::shared_ptr<SchedulerOutput> plan;
  auto out = step(s, 7, &plan);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 16);
  EXPECT_FALSE(plan->samples_token[0]);
  EXPECT_TRUE((out.size() == 0));  // partial prefill samples nothing
  step(s, 7, &plan);
  EXPECT_EQ(plan->num_computed_tokens[0], 16);
  out = step(s, 7, &plan);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 8);
  EXPECT_TRUE(plan->samples_token[0]);
  ASSERT_EQ(out.size(), 1u);
}

TEST(Scheduler, LongPrefillThresholdCapsPerRequestChunk) {
  auto c = config(64);
  c.long_prefill_token_threshold = 8;
  Scheduler s(c);
  s.add_request(make_request("a", 20, 2));
  s.add_request(make_request("b", 20, 2, 100));
  std::shared_ptr<SchedulerOutput> plan;
  step(s, 7, &plan);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 8);
  EXPECT_EQ(plan->num_scheduled_tokens[1], 8);
}

TEST(Scheduler, BudgetAndMaxNumSeqsAreRespected) {
  Scheduler s(config(64, /*budget=*/20, /*max_seqs=*/2));
  for (int i = 0; i < 4; ++i) s.add_request(make_request("r" + std::to_string(i), 8, 4, i * 100));
  std::shared_ptr<SchedulerOutput> plan;
  step(s, 7, &plan);
  EXPECT_EQ(plan->num_reqs(), 2u);  // max_num_seqs
  EXPECT_EQ(s.num_running(), 2);
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_LE(plan->total_num_scheduled_tokens, 20);
}

TEST(Scheduler, PrefixHitComputesOnlyTheTail) {
  Scheduler s(config(64));
  s.add_request(make_request("a", 13, 1));
  step(s);
  s.add_request(make_request("b", 13, 1));
  std::shared_ptr<SchedulerOutput> plan;
  auto out = step(s, 7, &plan);
  ASSERT_EQ(plan->scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(plan->scheduled_new_reqs[0].num_computed_tokens, 12);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 1);
  EXPECT_EQ(out.at(0).num_cached_tokens, 12);
  // Exactly block-aligned prompt: the last block is recomputed, never the whole prompt cached.
  s.add_request(make_request("c", 12, 1));
  step(s, 7, &plan);
  EXPECT_EQ(plan->scheduled_new_reqs[0].num_computed_tokens, 8);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 4);
}

TEST(Scheduler, PreemptsNewestAndResumesWithFullTokens) {
  // 6 blocks of 4 = 24 slots; two requests of 10 prompt tokens grow until they collide.
  Scheduler s(config(6, 64, 8, 4, 24));
  s.add_request(make_request("a", 10, 10));
  s.add_request(make_request("b", 10, 10, 50));
  std::shared_ptr<SchedulerOutput> plan;
  int preempted_steps = 0;
  std::vector<int32_t> b_tokens_before;
  for (int i = 0; i < 40 && s.has_unfinished_requests(); ++i) {
    auto out = step(s, 7 + i, &plan);
    if (!plan->preempted_req_ids.empty()) {
      ++preempted_steps;
      EXPECT_EQ(plan->preempted_req_ids[0], "b");  // FCFS: the most recent one
    }
    for (const auto& nr : plan->scheduled_new_reqs) {
      if (nr.req_id == "b" && preempted_steps > 0) {
        EXPECT_GT(nr.token_ids.size(), 10u);  // resumed with its outputs so far
        EXPECT_EQ(nr.num_prompt_tokens, 10);
      }
    }
  }
  EXPECT_GT(preempted_steps, 0);
  EXPECT_GT(s.stats().num_preemptions, 0);
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.kv_cache_manager().num_free_blocks(), 6);
}

TEST(Scheduler, PriorityPolicyRunsLowerValueFirstAndPreemptsHighest) {
  auto c = config(64, 64, 1);
  c.scheduling_policy = SchedulingPolicy::PRIORITY;
  Scheduler s(c);
  auto lo = make_request("background", 4, 2);
  lo.priority = 5;
  auto hi = make_request("urgent", 4, 2, 10);
  hi.priority = -1;
  s.add_request(lo);
  s.add_request(hi);
  std::shared_ptr<SchedulerOutput> plan;
  step(s, 7, &plan);
  ASSERT_EQ(plan->req_ids.size(), 1u);
  EXPECT_EQ(*plan->req_ids[0], "urgent");
}

TEST(Scheduler, StopConditions) {
  Scheduler s(config(64));
  auto eos = make_request("eos", 4, 10);
  s.add_request(eos);
  auto out = step(s, 1000);
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::STOP);
  EXPECT_EQ(out.at(0).stop_reason, -1);

  auto ign = make_request("ignore", 4, 2, 10);
  ign.ignore_eos = true;
  s.add_request(ign);
  out = step(s, 1000);
  EXPECT_FALSE(out.at(0).finished());

  step(s, 5);  // finishes "ignore" by length
  auto stop = make_request("stoptok", 4, 10, 20);
  stop.stop_token_ids = {42};
  stop.min_tokens = 2;
  s.add_request(stop);
  out = step(s, 42);  // 1 output < min_tokens: keep going
  EXPECT_FALSE(out.at(0).finished());
  out = step(s, 42);
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::STOP);
  EXPECT_EQ(out.at(0).stop_reason, 42);

  // max_model_len: a 62-token prompt in a 64-token context finishes after 2 tokens.
  s.add_request(make_request("ctx", 62, 100, 300));
  step(s);
  out = step(s);
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::LENGTH);
}

// vLLM's check_sequence_repetition cases: the output (never the prompt) ends with a pattern of
// min..max tokens written min_count times in a row.
TEST(RepetitionDetection, FindsAPatternRepeatedAtTheEnd) {
  auto found = [](std::vector<int32_t> out, int32_t max_size, int32_t min_size, int32_t count) {
    return RepetitionDetection{max_size, min_size, count}.ends_in_repetition(out.data(), out.size());
  };
  EXPECT_TRUE(found({1, 2, 3, 1, 2, 3, 1, 2, 3}, 3, 2, 3));
  EXPECT_FALSE(found({1, 2, 3, 1, 2, 3}, 3, 2, 3));        // two copies, three asked
  EXPECT_TRUE(found({1, 2, 1, 2, 1, 2, 1, 2}, 5, 2, 4));
  EXPECT_FALSE(found({1, 2, 3, 4, 5, 6, 7, 8, 9}, 5, 2, 2));
  EXPECT_FALSE(found({1, 2, 3, 1, 2, 3, 1, 2, 4}, 3, 2, 3));  // the last copy differs
  EXPECT_FALSE(found({}, 3, 2, 2));
  EXPECT_FALSE(found({1, 2, 1, 2, 1, 2}, 0, 0, 2));        // max_pattern_size 0: off
  EXPECT_TRUE(found({1, 2, 3, 4, 5, 6, 5, 6, 5, 6}, 3, 2, 3));
  EXPECT_FALSE(found({10, 20, 10, 20, 10, 20}, 5, 3, 3));  // a 2-token loop, patterns of 3+ asked
  EXPECT_TRUE(found({7, 7, 7}, 4, 0, 3));                   // min_pattern_size 0 means 1
  std::vector<int32_t> long_loop;
  for (int i = 0; i < 5; ++i) long_loop.insert(long_loop.end(), {1, 2, 3, 4, 5, 6, 7, 8});
  EXPECT_TRUE(found(long_loop, 10, 2, 3));

  EXPECT_THROW(RepetitionDetection({3, 4, 2}).validate("r"), InvalidArgument);  // min > max
  EXPECT_THROW(RepetitionDetection({-1, 0, 2}).validate("r"), InvalidArgument);
  EXPECT_THROW(RepetitionDetection({3, 1, 1}).validate("r"), InvalidArgument);  // one copy is no repeat
  EXPECT_NO_THROW(RepetitionDetection({0, 0, 0}).validate("r"));
}

TEST(Scheduler, RepetitionEndsALoopingOutput) {
  Scheduler s(config(64));
  auto bad = make_request("bad", 4, 10);
  bad.repetition_detection = {3, 5, 2};
  EXPECT_THROW(s.add_request(bad), InvalidArgument);

  // The prompt's own loop (0 1 0 1 ...) does not count; the output's does, after min_tokens.
  auto loop = make_request("loop", 6, 50);
  for (size_t i = 0; i < loop.prompt_token_ids.size(); ++i) loop.prompt_token_ids[i] = static_cast<int32_t>(i % 2);
  loop.repetition_detection = {2, 1, 3};
  loop.min_tokens = 4;
  s.add_request(loop);
  auto out = step(s, 0);
  EXPECT_FALSE(out.at(0).finished());
  for (int32_t token : {5, 6, 5, 6}) {  // 0 5 6 5 6: "5 6" twice, three copies asked
    out = step(s, token);
    EXPECT_FALSE(out.at(0).finished());
  }
  out = step(s, 5);
  EXPECT_FALSE(out.at(0).finished());
  out = step(s, 6);  // 0 5 6 5 6 5 6
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::REPETITION);
  EXPECT_EQ(out.at(0).stop_reason, -1);
  EXPECT_STREQ(to_string(FinishReason::REPETITION), "repetition");

  auto early = make_request("early", 4, 50, 100);  // a loop inside min_tokens runs on
  early.repetition_detection = {1, 1, 2};
  early.min_tokens = 3;
  s.add_request(early);
  EXPECT_FALSE(step(s, 9).at(0).finished());
  EXPECT_FALSE(step(s, 9).at(0).finished());
  EXPECT_EQ(step(s, 9).at(0).finish_reason, FinishReason::REPETITION);
}

TEST(Scheduler, AbortsMidPrefillAndMidDecodeFreeEverything) {
  Scheduler s(config(64, 8));
  s.add_request(make_request("prefill", 30, 5));
  s.add_request(make_request("decode", 4, 50, 100));
  step(s);  // 8 tokens of "prefill"
  EXPECT_EQ(s.find_request("prefill")->num_computed_tokens, 8);
  EXPECT_EQ(s.finish_requests({"prefill", "unknown"}, RequestStatus::FINISHED_ABORTED), 1u);
  s.check_integrity();
  step(s);
  step(s);
  EXPECT_EQ(s.find_request("decode")->status, RequestStatus::RUNNING);
  // Abort between schedule() and update_from_output(): its sample is dropped.
  auto plan = s.schedule();
  s.finish_requests({"decode"}, RequestStatus::FINISHED_ABORTED);
  std::vector<int32_t> sampled(plan->num_reqs(), 7);
  auto out = s.update_from_output(*plan, sampled.data(), sampled.size());
  EXPECT_TRUE((out.size() == 0));
  s.check_integrity();
  EXPECT_FALSE(s.has_unfinished_requests());
  EXPECT_EQ(s.kv_cache_manager().num_free_blocks(), 64);
}

TEST(Scheduler, StepProtocolIsEnforced) {
  Scheduler s(config(64));
  s.add_request(make_request("a", 4, 4));
  auto plan = s.schedule();
  EXPECT_THROW(s.schedule(), InvalidArgument);
  std::vector<int32_t> wrong(3, 7);
  EXPECT_THROW(s.update_from_output(*plan, wrong.data(), wrong.size()), InvalidArgument);
  std::vector<int32_t> ok(1, 7);
  s.update_from_output(*plan, ok.data(), ok.size());
  EXPECT_THROW(s.update_from_output(*plan, ok.data(), ok.size()), InvalidArgument);
}
