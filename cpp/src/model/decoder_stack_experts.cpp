// The decoder stack's mixture-of-experts MLP (MoeWeights' steps, decoder_stack.h): the shared
// expert, the routing, the chosen experts' rows run expert by expert, and their weighted sum.
#include <omp.h>

#include <cstring>
#include <exception>
#include <vector>

#include "corellm/kernels/dtype.h"
#include "corellm/kernels/moe.h"
#include "corellm/model/decoder_stack.h"

namespace corellm {

namespace {
// The most tokens in a step whose sparse layers share their chosen experts out between the threads
// (sparse_mlp); more, and the experts run one after another on the whole team.
constexpr int64_t kExpertsSharedMaxTokens = 32;
}  // namespace

void DecoderStack::sparse_mlp(const MoeWeights& moe, uint16_t* h, int64_t n, Scratch& s) const {
  const int64_t hidden = dims_.hidden, experts = moe.router.n, top_k = moe.top_k;
  const auto choices = static_cast<size_t>(n * top_k);
  MoeSharedExpert shared;
  if (moe.has_shared()) {  // on every row of h, before h is overwritten
    const int64_t si = moe.shared_intermediate;
    const auto rows = static_cast<size_t>(n);
    s.shared_gate_up.resize(rows * 2 * si);
    s.shared_act.resize(rows * si);
    s.shared_out.resize(rows * hidden);
    gated(moe.shared_gate_up, h, hidden, s.shared_act.data(), si, n, s.shared_gate_up.data());
    moe.shared_down.forward(s.shared_act.data(), si, s.shared_out.data(), hidden, n);
    shared = MoeSharedExpert{s.shared_out.data(), hidden, nullptr};
    if (moe.shared_gated()) {
      s.shared_logits.resize(rows);
      moe.shared_gate.forward_f32(h, hidden, s.shared_logits.data(), 1, n);
      shared.gate = s.shared_logits.data();
    }
  }
  s.router_logits.resize(static_cast<size_t>(n * experts));
  s.expert_ids.resize(choices);
  s.expert_weights.resize(choices);
  moe.router.forward_f32(h, hidden, s.router_logits.data(), experts, n);
  moe_route(s.router_logits.data(), experts, n, experts, top_k, moe.renormalize, s.expert_ids.data(),
            s.expert_weights.data(), moe.selection_bias.empty() ? nullptr : moe.selection_bias.data(),
            moe.renormalize_min);
  // The choices (t * top_k + j) sorted by expert, by counting: each expert's in ascending order.
  std::vector<int64_t>& first = s.expert_first;  // expert e's choices: [first[e], first[e + 1])
  first.assign(static_cast<size_t>(experts) + 1, 0);
  for (int32_t e : s.expert_ids) ++first[static_cast<size_t>(e) + 1];
  for (int64_t e = 0; e < experts; ++e) first[e + 1] += first[e];
  s.choices_by_expert.resize(choices);
  s.expert_next.assign(first.begin(), first.end() - 1);
  for (size_t c = 0; c < choices; ++c) s.choices_by_expert[s.expert_next[s.expert_ids[c]]++] = static_cast<int32_t>(c);
  s.choice_rows.resize(choices * hidden);
  s.chosen_experts.clear();
  for (int64_t e = 0; e < experts; ++e) {
    if (first[e + 1] > first[e]) s.chosen_experts.push_back(static_cast<int32_t>(e));
  }
  // A step of a few tokens (decode) shares the chosen experts out between the threads, each expert
  // run by one thread with its kernels to itself: no fork and join in each of the experts' small
  // GEMMs. A larger step runs them one after another, each GEMM split over the team (per expert a
  // few hundred rows, which one thread alone ran no faster). A row's result is the same either way
  // (every kernel computes a row from its own inputs). Intel Xeon Ice Lake VM, 2 threads, 64
  // fine-grained experts, 8 per token (bench/moe.py's), Q4_K_M, alternating, three rounds: one
  // sequence 92.5-101.0 -> 106.6-107.8 tok/s, four 136.9-167.9 -> 144.2-181.8; prefill 4 x 512
  // 829-939 against 807-927 (so not there). Steps of 16 tokens or more over several sequences are
  // cut into groups of sequences, a thread each, before they get here (groups_for).
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  const auto chosen = static_cast<int64_t>(s.chosen_experts.size());
  if (threads < 2 || chosen < threads || n > kExpertsSharedMaxTokens) {
    if (s.expert_rows.empty()) s.expert_rows.resize(1);
    for (int32_t e : s.chosen_experts) run_expert(moe, e, h, s, s.expert_rows[0]);
  } else {
    if (s.expert_rows.size() < static_cast<size_t>(threads)) s.expert_rows.resize(static_cast<size_t>(threads));
    std::exception_ptr failed;
#pragma omp parallel num_threads(static_cast<int>(threads))
    {
      omp_set_num_threads(1);
      Scratch::ExpertRows& rows = s.expert_rows[static_cast<size_t>(omp_get_thread_num())];
#pragma omp for schedule(dynamic, 1) nowait
      for (int64_t i = 0; i < chosen; ++i) {
        try {
          run_expert(moe, s.chosen_experts[i], h, s, rows);
        } catch (...) {
#pragma omp critical(corellm_sparse_mlp_failed)
          if (!failed) failed = std::current_exception();
        }
      }
    }
    if (failed) std::rethrow_exception(failed);
  }
  moe_combine(h, hidden, s.choice_rows.data(), hidden, s.expert_weights.data(), n, top_k, hidden, DType::BF16, shared);
}

void DecoderStack::run_expert(const MoeWeights& moe, int64_t e, const uint16_t* h, Scratch& s,
                              Scratch::ExpertRows& rows) const {
  const int64_t hidden = dims_.hidden, inter = moe.intermediate;
  const int64_t count = s.expert_first[e + 1] - s.expert_first[e];
  const auto capacity = static_cast<size_t>(count);
  if (rows.in.size() < capacity * hidden) {
    rows.in.resize(capacity * hidden);
    rows.gate_up.resize(capacity * 2 * inter);
    rows.act.resize(capacity * inter);
    rows.out.resize(capacity * hidden);
  }
  const int32_t* picked = s.choices_by_expert.data() + s.expert_first[e];
  const size_t row_bytes = static_cast<size_t>(hidden) * sizeof(uint16_t);
  for (int64_t i = 0; i < count; ++i) std::memcpy(&rows.in[i * hidden], h + (picked[i] / moe.top_k) * hidden, row_bytes);
  gated(moe.gate_up[e], rows.in.data(), hidden, rows.act.data(), inter, count, rows.gate_up.data());
  moe.down[e].forward(rows.act.data(), inter, rows.out.data(), hidden, count);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(&s.choice_rows[static_cast<size_t>(picked[i]) * hidden], &rows.out[i * hidden], row_bytes);
  }
}

}  // namespace corellm
