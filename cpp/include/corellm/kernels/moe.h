// The two steps of a mixture-of-experts MLP (Mixtral, Qwen3-MoE) around its experts' GEMMs: the
// router's choice per token, and the chosen experts' outputs summed by their weights. Between the
// two, each expert runs its gated MLP on the rows of the tokens that chose it (model/decoder_stack.cpp
// and python/corellm/model/layers.py's SparseMoe do that part with their GEMMs).
//
// Both are row by row, in a fixed order, so a token's result does not depend on the other tokens
// of the step (the engine's batch invariance): a token's experts and weights come from its own
// logits, and its sum runs over its top_k experts in the router's order.
#pragma once

#include <cstdint>

#include "corellm/kernels/dtype.h"

namespace corellm {

// For each of m rows of router logits (fp32, [m, num_experts], row stride logits_stride):
//   p = softmax(logits) in fp32 (the row's max subtracted first),
//   the top_k experts by p, highest first (of equal p, the lower expert index first),
//   their p divided by the sum of the top_k when `renormalize` (Mixtral; Qwen3-MoE's norm_topk_prob),
//   by renormalize_min where the sum is below it (ERNIE 4.5's moe_norm_min).
// With selection_bias ([num_experts] fp32; ERNIE 4.5's e_score_correction_bias) the top_k are those of
// p + bias (of equal scores, the lower index first), their weights still their p.
// expert_ids [m, top_k] int32 and expert_weights [m, top_k] fp32 receive them.
// InvalidArgument unless 1 <= top_k <= num_experts.
void moe_route(const float* logits, int64_t logits_stride, int64_t m, int64_t num_experts, int64_t top_k,
               bool renormalize, int32_t* expert_ids, float* expert_weights, const float* selection_bias = nullptr,
               float renormalize_min = 0.0f);

// A shared expert (Qwen2-MoE, ERNIE 4.5): every token's output of an expert all tokens run, and its
// gate's logit per token, which moe_combine adds as sigmoid(gate[t]) * rows[t] — or, without a gate
// (ERNIE 4.5's shared experts), as rows[t].
struct MoeSharedExpert {
  const void* rows = nullptr;  // [m, hidden], row stride `stride`; null: no shared expert
  int64_t stride = 0;
  const float* gate = nullptr;  // [m] fp32 logits; null: ungated
};

// out[t, :] = sum over j < top_k, in order, of weights[t, j] * rows[t * top_k + j, :], then (with a
// shared expert) + sigmoid(shared.gate[t]) * shared.rows[t, :] (ungated: 1 *), in fp32, rounded once
// to the dtype.
// rows: [m * top_k, hidden] (row stride rows_stride), the output of expert expert_ids[t, j] for
// token t; weights [m, top_k] fp32. out may not overlap rows.
void moe_combine(void* out, int64_t out_stride, const void* rows, int64_t rows_stride, const float* weights,
                 int64_t m, int64_t top_k, int64_t hidden, DType dtype, const MoeSharedExpert& shared = {});

}  // namespace corellm
