// Benchmark of the native core: scheduler steps (decode, mixed prefill/decode) at 64..4096
// running requests, batch building, block allocate/free churn, prefix hashing throughput.
// Prints a table and one machine-readable `BENCH key=value ...` line per case.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "corellm/batch_builder.h"
#include "corellm/block_pool.h"
#include "corellm/prefix_hash.h"
#include "corellm/scheduler.h"

using namespace corellm;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

struct StepTimes {
  double schedule_update_us = 0;  // schedule() + update_from_output(), per step
  double batch_us = 0;            // update_states() + prepare_inputs() + record_sampled(), per step
  double tokens_per_step = 0;
};

constexpr int32_t kBlockSize = 16;
constexpr int32_t kMaxModelLen = 4096;

SchedulerConfig make_config(int32_t running, int32_t budget) {
  SchedulerConfig c;
  c.max_num_seqs = running;
  c.max_num_batched_tokens = budget;
  c.max_model_len = kMaxModelLen;
  c.block_size = kBlockSize;
  c.num_blocks = running * (kMaxModelLen / kBlockSize) + 1024;
  return c;
}

EngineCoreRequest make_request(uint64_t id, int32_t prompt_len, int32_t max_tokens, std::mt19937& rng) {
  EngineCoreRequest s;
  char id_text[64];
  std::snprintf(id_text, sizeof(id_text), "cmpl-%032llx-0-%08x", static_cast<unsigned long long>(id),
                static_cast<unsigned>(id * 2654435761u));
  s.request_id = id_text;  // as long as a real OpenAI-style id (heap-allocated string)
  s.prompt_token_ids.resize(static_cast<size_t>(prompt_len));
  std::uniform_int_distribution<int32_t> tok(0, 49151);
  for (auto& t : s.prompt_token_ids) t = tok(rng);
  s.max_tokens = max_tokens;
  s.ignore_eos = true;
  return s;
}

// One engine step without a model: the sampled token is arbitrary.
void run_step(Scheduler& s, BatchBuilder& b, std::vector<int32_t>& sampled, StepTimes& acc) {
  auto t0 = Clock::now();
  auto plan = s.schedule();
  auto t1 = Clock::now();
  b.update_states(*plan);
  b.prepare_inputs(*plan);
  sampled.assign(plan->num_reqs(), 11);
  b.record_sampled(*plan, sampled.data(), sampled.size());
  auto t2 = Clock::now();
  s.update_from_output(*plan, sampled.data(), sampled.size());
  auto t3 = Clock::now();
  acc.schedule_update_us += std::chrono::duration<double, std::micro>((t1 - t0) + (t3 - t2)).count();
  acc.batch_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
  acc.tokens_per_step += plan->total_num_scheduled_tokens;
}

// Steady-state decode: `running` requests, each computing one token per step.
StepTimes bench_decode(int32_t running, int steps) {
  std::mt19937 rng(1);
  Scheduler s(make_config(running, std::max(8192, running)));
  BatchBuilder b({running, kMaxModelLen, kBlockSize, std::max(8192, running)});
  for (int32_t i = 0; i < running; ++i) s.add_request(make_request(static_cast<uint64_t>(i), 128, 1 << 20, rng));
  std::vector<int32_t> sampled;
  StepTimes warm;
  while (s.num_waiting() > 0) run_step(s, b, sampled, warm);  // prefill everything
  for (int i = 0; i < 20; ++i) run_step(s, b, sampled, warm);
  StepTimes acc;
  for (int i = 0; i < steps; ++i) run_step(s, b, sampled, acc);
  acc.schedule_update_us /= steps;
  acc.batch_us /= steps;
  acc.tokens_per_step /= steps;
  return acc;
}

// Mixed: `running` requests with short random output lengths; finished ones are replaced by new
// arrivals whose 256-token prompts are prefilled in chunks alongside the decodes.
StepTimes bench_mixed(int32_t running, int steps) {
  std::mt19937 rng(2);
  const int32_t budget = running + 512;
  Scheduler s(make_config(running, budget));
  BatchBuilder b({running, kMaxModelLen, kBlockSize, budget});
  std::uniform_int_distribution<int32_t> out_len(16, 128);
  uint64_t next_id = 0;
  auto top_up = [&] {
    while (s.num_unfinished_requests() < running) s.add_request(make_request(next_id++, 256, out_len(rng), rng));
  };
  std::vector<int32_t> sampled;
  StepTimes warm;
  for (int i = 0; i < 200; ++i) {
    top_up();
    run_step(s, b, sampled, warm);
  }
  StepTimes acc;
  for (int i = 0; i < steps; ++i) {
    top_up();
    run_step(s, b, sampled, acc);
  }
  acc.schedule_update_us /= steps;
  acc.batch_us /= steps;
  acc.tokens_per_step /= steps;
  return acc;
}

double bench_block_churn(int iterations) {
  BlockPool pool(65536, true);
  std::vector<int32_t> ids;
  ids.reserve(64);
  auto t0 = Clock::now();
  for (int i = 0; i < iterations; ++i) {
    ids.clear();
    pool.get_new_blocks(64, ids);
    std::reverse(ids.begin(), ids.end());
    pool.free_blocks(ids.data(), ids.size());
  }
  return seconds_since(t0) * 1e9 / (static_cast<double>(iterations) * 64 * 2);  // ns per block op
}

double bench_hash(int32_t block_size, size_t num_tokens) {
  PrefixHasher hasher;
  std::vector<int32_t> tokens(num_tokens);
  std::iota(tokens.begin(), tokens.end(), 0);
  BlockHash parent = hasher.root();
  auto t0 = Clock::now();
  for (size_t off = 0; off + static_cast<size_t>(block_size) <= num_tokens; off += static_cast<size_t>(block_size)) {
    parent = hasher.hash_block(parent, tokens.data() + off, static_cast<size_t>(block_size));
  }
  const double s = seconds_since(t0);
  if (parent.bytes[0] == 0xFF && parent.bytes[1] == 0xFF) std::printf(" ");  // keep the result live
  return static_cast<double>(num_tokens) / s / 1e6;
}

}  // namespace

// Usage: corellm_core_bench [CASE [RUNNING]]  (CASE: decode, mixed, churn, hash; default all)
int main(int argc, char** argv) {
  const std::string only_case = argc > 1 ? argv[1] : "";
  const int32_t only_running = argc > 2 ? std::atoi(argv[2]) : 0;
  auto wanted = [&](const std::string& c) { return only_case.empty() || only_case == c; };
  std::printf("corellm native core benchmark (one thread)\n\n");
  std::printf("%-8s %8s %14s %14s %16s %12s\n", "case", "running", "sched+update", "per request",
              "batch build", "tokens/step");
  std::printf("%-8s %8s %14s %14s %16s %12s\n", "", "", "(us/step)", "(us)", "(us/step)", "");
  std::vector<std::string> lines;
  for (const char* kind : {"decode", "mixed"}) {
    if (!wanted(kind)) continue;
    for (int32_t running : {64, 256, 1024, 4096}) {
      if (only_running != 0 && running != only_running) continue;
      const int steps = running >= 4096 ? 100 : 400;
      StepTimes t = std::string(kind) == "decode" ? bench_decode(running, steps) : bench_mixed(running, steps);
      std::printf("%-8s %8d %14.1f %14.3f %16.1f %12.0f\n", kind, running, t.schedule_update_us,
                  t.schedule_update_us / running, t.batch_us, t.tokens_per_step);
      char line[256];
      std::snprintf(line, sizeof(line),
                    "BENCH case=%s running=%d us_per_step=%.1f us_per_request=%.3f batch_us_per_step=%.1f tokens_per_step=%.0f",
                    kind, running, t.schedule_update_us, t.schedule_update_us / running, t.batch_us, t.tokens_per_step);
      lines.emplace_back(line);
    }
  }
  char line[256];
  if (wanted("churn")) {
    const double churn_ns = bench_block_churn(20000);
    std::printf("\n%-30s %10.1f ns per block allocate or free\n", "block allocate/free churn", churn_ns);
    std::snprintf(line, sizeof(line), "BENCH case=block_churn ns_per_block_op=%.1f", churn_ns);
    lines.emplace_back(line);
  }
  for (int32_t bs : {16, 32}) {
    if (!wanted("hash")) break;
    const double mtok = bench_hash(bs, 32u << 20);
    std::printf("%-30s %10.1f M tokens/s (block_size %d, SHA-256)\n", "prefix hashing", mtok, bs);
    std::snprintf(line, sizeof(line), "BENCH case=hash block_size=%d mtok_per_s=%.1f", bs, mtok);
    lines.emplace_back(line);
  }
  std::printf("\n");
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}
