// Tests of speculative decoding in the core: the n-gram proposer, drafts in the scheduler's budget
// and lookahead slots, rollback of rejected drafts, stops inside accepted drafts, the back-off,
// preemption with drafts, and the batch builder's draft rows.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "corellm/batch_builder.h"
#include "corellm/check.h"
#include "corellm/ngram_proposer.h"
#include "corellm/scheduler.h"

using namespace corellm;

namespace {

std::vector<int32_t> ngram(const std::vector<int32_t>& tokens, int32_t min_n, int32_t max_n, int32_t k) {
  std::vector<int32_t> drafts(static_cast<size_t>(k)), z;
  const int32_t n = propose_ngram_drafts(tokens.data(), static_cast<int32_t>(tokens.size()), {min_n, max_n}, k,
                                         drafts.data(), z);
  drafts.resize(static_cast<size_t>(n));
  return drafts;
}

SchedulerConfig spec_config(int32_t k, int32_t num_blocks = 64, int32_t budget = 64, int32_t max_model_len = 64) {
  SchedulerConfig c;
  c.num_blocks = num_blocks;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 8;
  c.block_size = 4;
  c.max_model_len = max_model_len;
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = 2;
  c.prompt_lookup_max = 3;
  return c;
}

EngineCoreRequest make_request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  EngineCoreRequest r;
  r.request_id = id;
  r.prompt_token_ids = std::move(prompt);
  r.max_tokens = max_tokens;
  r.eos_token_id = 1000;
  return r;
}

// Closes the step `plan` with one row of tokens per request (padded with -1 to a common width).
SchedulerUpdate close(Scheduler& s, const SchedulerOutput& plan, const std::vector<std::vector<int32_t>>& rows) {
  size_t width = 1;
  for (const auto& r : rows) width = std::max(width, r.size());
  std::vector<int32_t> flat(rows.size() * width, -1);
  for (size_t i = 0; i < rows.size(); ++i) std::copy(rows[i].begin(), rows[i].end(), flat.begin() + i * width);
  auto out = s.update_from_output(plan, flat.data(), rows.size(), width);
  s.check_integrity();
  return out;
}

// A prompt whose last 3 tokens (5 6 7) appeared before, followed by 8 9 10 11.
const std::vector<int32_t> kCopyPrompt = {1, 5, 6, 7, 8, 9, 10, 11, 2, 3, 5, 6, 7};

}  // namespace

TEST(NgramProposer, ProposesWhatFollowedTheLongestEarlierMatch) {
  EXPECT_EQ(ngram(kCopyPrompt, 2, 3, 3), (std::vector<int32_t>{8, 9, 10}));
  EXPECT_EQ(ngram(kCopyPrompt, 2, 3, 10), (std::vector<int32_t>{8, 9, 10, 11, 2, 3, 5, 6, 7}));
  // Longest match wins over a more recent shorter one: "6 7" also follows "4" later, "5 6 7" only once.
  EXPECT_EQ(ngram({5, 6, 7, 20, 4, 6, 7, 30, 5, 6, 7}, 2, 3, 1), std::vector<int32_t>{20});
  // Ties go to the most recent occurrence.
  EXPECT_EQ(ngram({1, 2, 40, 1, 2, 50, 1, 2}, 2, 2, 1), std::vector<int32_t>{50});
  // No match of min_n tokens: nothing.
  EXPECT_TRUE(ngram({1, 2, 3, 4, 5}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram({1, 2, 9, 1, 3}, 2, 3, 4).empty());
  EXPECT_EQ(ngram({1, 2, 9, 3, 1}, 1, 3, 2), (std::vector<int32_t>{2, 9}));
  EXPECT_TRUE(ngram({}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram(kCopyPrompt, 2, 3, 0).empty());
}

TEST(NgramProposer, MatchesABruteForceSearch) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> tokens(1 + rng() % 40);
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % 4);
    const int32_t min_n = 1 + static_cast<int32_t>(rng() % 3), max_n = min_n + static_cast<int32_t>(rng() % 3);
    const int32_t k = static_cast<int32_t>(rng() % 6);
    // Reference: for each earlier end e (most recent first), the match length capped at max_n.
    const int32_t n = static_cast<int32_t>(tokens.size());
    int32_t best_len = 0, best_end = -1;
    for (int32_t e = n - 2; e >= 0; --e) {
      int32_t len = 0;
      while (len < max_n && e - len >= 0 && tokens[static_cast<size_t>(e - len)] == tokens[static_cast<size_t>(n - 1 - len)]) ++len;
      if (len > best_len) best_len = len, best_end = e;
    }
    std::vector<int32_t> expected;
    if (best_len >= min_n && k > 0) {
      for (int32_t j = best_end + 1; j < n && static_cast<int32_t>(expected.size()) < k; ++j) {
        expected.push_back(tokens[static_cast<size_t>(j)]);
      }
    }
    ASSERT_EQ(ngram(tokens, min_n, max_n, k), expected) << "trial " << trial;
  }
}

TEST(SpeculativeScheduler, VerifiesDraftsAndRollsBackRejectedOnes) {
  Scheduler s(spec_config(3));
  s.add_request(make_request("a", kCopyPrompt, 20));
  auto plan = s.schedule();
  auto out = close(s, *plan, {{5}});  // ... 5 6 7 5: no earlier "7 5", so no drafts
  plan = s.schedule();
  EXPECT_EQ(plan->num_draft_tokens[0], 0);
  out = close(s, *plan, {{6}});  // ... 5 6 7 5 6: "5 6" last seen before "7 5 6"
  const Request* r = s.find_request("a");
  ASSERT_EQ(r->draft_token_ids, (std::vector<int32_t>{7, 5, 6}));
  plan = s.schedule();
  ASSERT_EQ(plan->num_draft_tokens[0], 3);
  EXPECT_EQ(plan->num_scheduled_tokens[0], 4);
  EXPECT_EQ(plan->draft_token_ids, (std::vector<int32_t>{7, 5, 6}));
  EXPECT_TRUE(plan->samples_token[0]);
  const int32_t computed_before = plan->num_computed_tokens[0];
  // Accept 7, reject 5 (the target sampled 8 there).
  out = close(s, *plan, {{7, 8}});
  EXPECT_EQ(out.at(0).new_token_ids, (std::vector<int32_t>{7, 8}));
  EXPECT_EQ(r->num_computed_tokens, computed_before + 2);  // newest token + 1 accepted draft
  EXPECT_EQ(r->num_tokens() - r->num_computed_tokens, 1);
  EXPECT_EQ(out.spec_decoding_stats.num_draft_tokens, 3);
  EXPECT_EQ(out.spec_decoding_stats.num_accepted_tokens, 1);
  EXPECT_EQ(out.spec_decoding_stats.num_accepted_tokens_per_pos, (std::vector<int64_t>{1, 0, 0}));
  EXPECT_FLOAT_EQ(r->draft_acceptance.acceptance_rate(), (1 + 1.4f) / (2 + 2.0f));  // 1 accepted, 1 refused
}

TEST(SpeculativeScheduler, DraftsCountInTheBudgetAndRespectMaxTokens) {
  Scheduler s(spec_config(4, 64, 3));  // budget 3 tokens
  s.add_request(make_request("a", {1, 2, 3}, 20));
  auto plan = s.schedule();
  close(s, *plan, {{4}});
  std::vector<int32_t> drafts{9, 9, 9, 9};
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  plan = s.schedule();
  EXPECT_EQ(plan->num_scheduled_tokens[0], 3);  // the budget cuts the drafts to 2
  EXPECT_EQ(plan->num_draft_tokens[0], 2);
  close(s, *plan, {{9, 9, 9}});  // both accepted, plus a bonus token
  EXPECT_EQ(s.find_request("a")->num_tokens(), 7);

  Scheduler t(spec_config(4));
  t.add_request(make_request("b", {1, 2, 3}, 3));
  plan = t.schedule();
  close(t, *plan, {{4}});
  t.set_draft_token_ids("b", drafts.data(), drafts.size());
  plan = t.schedule();
  EXPECT_EQ(plan->num_draft_tokens[0], 1);  // 2 outputs left: one draft and the token after it
  auto out = close(t, *plan, {{9, 9}});
  EXPECT_TRUE(out.at(0).finished());
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::LENGTH);
}

TEST(SpeculativeScheduler, StopInsideAcceptedDraftsDropsTheRest) {
  Scheduler s(spec_config(4));
  auto req = make_request("a", {1, 2, 3}, 20);
  req.stop_token_ids = {50};
  s.add_request(req);
  auto plan = s.schedule();
  close(s, *plan, {{4}});
  std::vector<int32_t> drafts{5, 50, 6, 7};
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  plan = s.schedule();
  ASSERT_EQ(plan->num_draft_tokens[0], 4);
  auto out = close(s, *plan, {{5, 50, 6, 7, 8}});
  EXPECT_EQ(out.at(0).new_token_ids, (std::vector<int32_t>{5, 50}));
  EXPECT_EQ(out.at(0).finish_reason, FinishReason::STOP);
  EXPECT_EQ(out.at(0).stop_reason, 50);
  EXPECT_EQ(s.num_unfinished_requests(), 0);
  EXPECT_EQ(s.kv_cache_manager().num_free_blocks(), 64);
}

TEST(SpeculativeScheduler, RejectedDraftsNeverEnterThePrefixCache) {
  Scheduler s(spec_config(4));
  s.add_request(make_request("a", {1, 2, 3}, 20));  // block size 4
  auto plan = s.schedule();
  close(s, *plan, {{4}});  // tokens 1 2 3 4: block 0 full once 4's KV is computed
  std::vector<int32_t> drafts{5, 6, 7, 8};
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  plan = s.schedule();  // computes 4 and drafts 5 6 7 8: KV up to position 7 written
  close(s, *plan, {{5, 60}});  // 5 accepted, 6 rejected: blocks hold KV of rejected 6 7 8
  const Request* r = s.find_request("a");
  EXPECT_EQ(r->num_computed_tokens, 5);  // 1 2 3 4 5
  EXPECT_EQ(r->num_cached_blocks, 1);     // block 1 (tokens 5 60 ...) is not full of accepted KV
  // Another request with the same first 8 tokens but the drafts' continuation must not hit block 1.
  s.add_request(make_request("b", {1, 2, 3, 4, 5, 6, 7, 8, 9}, 4));
  plan = s.schedule();
  ASSERT_EQ(plan->scheduled_new_reqs.size(), 1u);
  EXPECT_EQ(plan->scheduled_new_reqs[0].num_computed_tokens, 4);  // only block 0
}

TEST(SpeculativeScheduler, DraftsWorthVerifyingFollowAcceptanceAndStepCost) {
  Scheduler s(spec_config(4));
  s.add_request(make_request("a", {1, 2, 3}, 60));
  auto plan = s.schedule();
  close(s, *plan, {{4}});
  const Request* r = s.find_request("a");
  std::vector<int32_t> drafts{9, 9, 9, 9};
  // Free tokens (the default cost): every draft is verified.
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  plan = s.schedule();
  EXPECT_EQ(plan->num_draft_tokens[0], 4);
  close(s, *plan, {{9, 9, 9, 9, 9}});
  // One running request and a token costing 2/3 of the step's fixed part: a draft must pass with
  // probability 0.4, and draft j is verified while rate^j >= 0.4.
  s.set_step_cost(1.0, 2.0 / 3.0);
  int32_t token = 100;
  const float rate = r->draft_acceptance.acceptance_rate();  // (4 + 1.4) / (4 + 2): 0.9
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  plan = s.schedule();
  EXPECT_EQ(plan->num_draft_tokens[0], std::min(4, static_cast<int32_t>(std::floor(std::log(0.4) / std::log(rate)))));
  close(s, *plan, {{token++}});  // all refused
  int32_t misses = 1;
  while (true) {
    s.set_draft_token_ids("a", drafts.data(), drafts.size());
    plan = s.schedule();
    if (plan->num_draft_tokens[0] == 0) break;
    close(s, *plan, {{token++}});
    ASSERT_LT(++misses, 10) << "drafts that keep missing must stop being verified";
  }
  EXPECT_LT(r->draft_acceptance.acceptance_rate(), 0.4f);
  close(s, *plan, {{token++}});
  // Idle steps let the evidence fade: drafts are tried again after a while.
  int32_t idle = 1;
  while (true) {
    s.set_draft_token_ids("a", drafts.data(), drafts.size());
    plan = s.schedule();
    if (plan->num_draft_tokens[0] > 0) break;
    close(s, *plan, {{token++}});
    ASSERT_LT(++idle, 100);
  }
  EXPECT_GT(idle, 2);
  EXPECT_THROW(s.set_step_cost(-1.0, 0.0), InvalidArgument);
}

TEST(SpeculativeScheduler, PreemptionDropsDrafts) {
  Scheduler s(spec_config(4, 5, 64, 20));  // 5 blocks of 4 tokens
  s.add_request(make_request("a", {1, 2, 3, 4, 5, 6, 7}, 20));
  s.add_request(make_request("b", {1, 2, 3, 4, 9, 9, 9}, 20));
  auto plan = s.schedule();
  close(s, *plan, {{8}, {8}});  // each holds 2 blocks (8 tokens known, 7 computed)
  std::vector<int32_t> drafts{1, 2, 3, 4};
  s.set_draft_token_ids("a", drafts.data(), drafts.size());
  s.set_draft_token_ids("b", drafts.data(), drafts.size());
  plan = s.schedule();  // a needs a third block for its drafts: b (newest) is preempted
  ASSERT_EQ(plan->preempted_req_ids, std::vector<std::string>{"b"});
  EXPECT_TRUE(s.find_request("b")->draft_token_ids.empty());
  EXPECT_EQ(plan->num_draft_tokens, std::vector<int32_t>{4});
  close(s, *plan, {{1, 2, 70}});
  EXPECT_EQ(s.find_request("a")->num_computed_tokens, 10);
}

TEST(SpeculativeBatchBuilder, WritesDraftsAndOneLogitsRowPerDraftPlusOne) {
  BatchBuilderConfig c;
  c.max_num_reqs = 4;
  c.max_model_len = 32;
  c.block_size = 4;
  c.max_num_batched_tokens = 32;
  BatchBuilder b(c);
  SchedulerOutput so;
  NewRequestData a;
  a.req_id = "a";
  a.token_ids = {1, 2, 3, 4, 5};
  a.num_prompt_tokens = 5;
  a.block_ids = {0, 1, 2};
  a.num_computed_tokens = 4;
  a.batch_row = 0;
  so.scheduled_new_reqs.push_back(a);
  NewRequestData bb = a;
  bb.req_id = "b";
  bb.block_ids = {3, 4};
  bb.batch_row = 1;
  so.scheduled_new_reqs.push_back(bb);
  so.req_ids = {std::make_shared<const std::string>("a"), std::make_shared<const std::string>("b")};
  so.num_scheduled_tokens = {4, 1};
  so.num_computed_tokens = {4, 4};
  so.batch_rows = {0, 1};
  so.samples_token = {1, 1};
  so.uses_grammar = {0, 0};
  so.num_draft_tokens = {3, 0};
  so.draft_token_ids = {6, 7, 8};
  so.total_num_scheduled_tokens = 5;
  b.update_states(so);
  b.prepare_inputs(so);
  EXPECT_EQ(std::vector<int32_t>(b.input_ids(), b.input_ids() + 5), (std::vector<int32_t>{5, 6, 7, 8, 5}));
  EXPECT_EQ(std::vector<int32_t>(b.positions(), b.positions() + 5), (std::vector<int32_t>{4, 5, 6, 7, 4}));
  EXPECT_EQ(b.num_logits(), 5);
  EXPECT_EQ(std::vector<int32_t>(b.logits_indices(), b.logits_indices() + 5), (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(b.row_token_ids(0), (std::vector<int32_t>{1, 2, 3, 4, 5}));  // drafts are not known tokens
  // a accepted 6 then got 9; b got 6.
  std::vector<int32_t> sampled{6, 9, -1, 6, -1, -1};
  b.record_sampled(so, sampled.data(), 2, 3);
  EXPECT_EQ(b.row_token_ids(0), (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 9}));
  EXPECT_EQ(b.row_token_ids(1), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
}

// ---- drafts from a prediction (prediction_proposer.h) ----

namespace {

// The drafts proposed after the output `output`, with the cursor carried across calls.
struct Follower {
  std::vector<int32_t> prediction;
  NgramParams params{2, 3};
  PredictionCursor cursor;
  std::vector<int32_t> propose(const std::vector<int32_t>& output, int32_t k) {
    std::vector<int32_t> drafts(static_cast<size_t>(std::max(k, 0)));
    const int32_t n = propose_prediction_drafts(prediction, output.data(), static_cast<int32_t>(output.size()), params,
                                                k, drafts.data(), cursor);
    drafts.resize(static_cast<size_t>(n));
    return drafts;
  }
};

}  // namespace

TEST(PredictionProposer, FollowsTheOutputThroughThePrediction) {
  Follower f{{10, 11, 12, 13, 14, 15}};
  EXPECT_EQ(f.propose({10}, 3), (std::vector<int32_t>{11, 12, 13}));
  EXPECT_EQ(f.propose({10, 11, 12}, 3), (std::vector<int32_t>{13, 14, 15}));  // two accepted at once
  EXPECT_EQ(f.propose({10, 11, 12, 13, 14}, 3), (std::vector<int32_t>{15}));   // near its end
  EXPECT_TRUE(f.propose({10, 11, 12, 13, 14, 15}, 3).empty());                // at its end
  EXPECT_EQ(f.cursor.position, 6);
}

TEST(PredictionProposer, FindsItsPlaceAgainAfterTheOutputLeavesIt) {
  // The output writes its own tokens (7, 8), then comes back to the prediction.
  Follower inserted{{1, 2, 3, 4, 5, 6, 7, 8, 9}};
  EXPECT_EQ(inserted.propose({1, 2}, 2), (std::vector<int32_t>{3, 4}));
  EXPECT_TRUE(inserted.propose({1, 2, 70, 80}, 2).empty());  // lost: no 2-token suffix of the output in it
  EXPECT_EQ(inserted.cursor.position, -1);
  EXPECT_EQ(inserted.propose({1, 2, 70, 80, 3, 4}, 2), (std::vector<int32_t>{5, 6}));
  // The output skips part of the prediction (a deletion): found ahead.
  Follower skipped{{1, 2, 3, 4, 5, 6, 7, 8, 9}};
  EXPECT_EQ(skipped.propose({1, 2}, 2), (std::vector<int32_t>{3, 4}));
  EXPECT_EQ(skipped.propose({1, 2, 6, 7}, 2), (std::vector<int32_t>{8, 9}));
}

TEST(PredictionProposer, ARepeatedSuffixIsFoundAheadOfWhereTheOutputWas) {
  // 5 6 occurs twice; the output, past the first, changes a token then writes 5 6: the second one.
  Follower f{{5, 6, 1, 2, 5, 6, 3, 4}};
  EXPECT_EQ(f.propose({5, 6, 1}, 1), (std::vector<int32_t>{2}));
  EXPECT_EQ(f.propose({5, 6, 1, 9, 5, 6}, 2), (std::vector<int32_t>{3, 4}));
  // Nothing ahead: the first occurrence anywhere (the output went back).
  Follower back{{5, 6, 1, 2, 3}};
  EXPECT_EQ(back.propose({5, 6, 1, 2, 3}, 2), (std::vector<int32_t>{}));
  EXPECT_EQ(back.propose({5, 6, 1, 2, 3, 5, 6}, 2), (std::vector<int32_t>{1, 2}));
}

TEST(PredictionProposer, TheSchedulerDraftsFromThePredictionFirst) {
  Scheduler s(spec_config(3));
  EngineCoreRequest r = make_request("p", {40, 41, 42, 40, 41}, 12);  // its prompt alone would draft 42
  r.prediction_token_ids = {7, 8, 9, 10, 11};
  s.add_request(std::move(r));
  auto plan = s.schedule();
  close(s, *plan, {{7}});
  plan = s.schedule();  // the decode step verifies the prediction's next tokens
  EXPECT_EQ(plan->draft_token_ids, (std::vector<int32_t>{8, 9, 10}));
  close(s, *plan, {{8, 9, 30}});  // 10 refused: the output leaves the prediction, no suffix found in it
  EXPECT_TRUE(s.find_request("p")->draft_token_ids.empty());
}
