// The decoder stack for a step's tokens in one call (algorithm in decoder_stack.h): the same kernels
// as the Python layers, chained over scratch buffers owned by the stack.
#include "corellm/model/decoder_stack.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <utility>

#include "corellm/check.h"
#include "corellm/kernels/cpu_isa.h"
#include "corellm/kernels/dtype.h"
#include "corellm/kernels/elementwise.h"
#include "corellm/kernels/moe.h"
#include "corellm/kernels/packed_gemm.h"

namespace corellm {

namespace {
// Rows of the MLP taken at a time: gate_up's output for a block (rows x 2 x intermediate) is read
// back by the activation and the activation by down while they are still in the caches, where a
// whole step's (2048 tokens: 12 MiB for SmolLM2) went to memory and back. Where gate_up and its
// activation are one pass (LinearWeight::gated_in_one_pass) only the activation is in between,
// and blocks of 512 rows let the GEMMs split their rows between two threads (packed_gemm_amx.cpp):
// 64 x 128-token prefill, Intel Xeon VM, 2 threads, steps of 512 / 2048 tokens: 1297-1467 ->
// 1218-1285 / 1183-1312 -> 1136-1186 ms (the quantized path's, with 512, 2895-3144 -> 3031-3244: it
// keeps 256). A row's result does not depend on the block it is in (the GEMMs and the activation
// are row by row).
constexpr int64_t kMlpBlockRows = 256;
constexpr int64_t kOnePassMlpBlockRows = 512;

// The step split (forward): the step's sequences cut into groups, and each thread of the team
// runs whole groups through the whole stack with its kernels to itself (a group claimed when the
// thread is free: one that loses its core for a while leaves the other groups to the other
// thread), instead of the whole team splitting every kernel. A thread then reads every weight
// itself (mostly from the L3, where another group read it shortly before), but no thread waits
// for the other at the end of each of a layer's ~10 kernels, and the threads' kernels overlap:
// one's attention, bound by reading the KV cache, beside the other's GEMMs. AMD EPYC Zen 4, 2
// threads, offline 64 x (128 in, 128 out), alternating runs in one process, tokens identical
// (median of 3-4 rounds; the VM drifts 10-20 % between runs):
//   the default Q4_1 file: unsplit 730 out tok/s (decode step 45.2 ms, the run's prefill 4.35 s),
//   a group per thread 810 (39.5 ms, 3.88 s), two groups per thread 832 (39.1 ms, 3.73 s); with a
//   busy loop taking 15 % of a core beside it, 529 -> 663. Q4_K_M decode 51.5 -> 41.8 ms; 16
//   sequences (8 tokens a group) Q4_1 12.0 -> 11.2 ms, Q4_K_M 14.5 -> 11.3; the avx512 and avx2
//   paths (Q4_1) at 64: 57.5 -> 43.1 and 68.1 -> 56.2 ms. Below 8 tokens a group it was slower
//   (6 and 5 per thread: 7.9 -> 8.6 and 9.4 -> 11.7 ms) or no faster (2 and 3 per thread). Since
//   the quantized GEMM shares its panels dynamically (quant_gemm.cpp) the split still leads: Q4_1,
//   three alternating rounds, unsplit 650 / 813 / 643 against split 764 / 842 / 662 out tok/s.
//   bf16 projections gain too little to tell from the VM's drift: 64 sequences, two groups per
//   thread 621 -> 620 out tok/s (HF directory; the BF16 file 643 -> 660), one group per thread
//   622 -> 642 (three rounds: 611 -> 621, 622 -> 669, and one unpaired) but served at concurrency
//   64 (from 32 tokens a group, two servers alternating) 640 / 630 / 637 against 635 / 655 / 644,
//   and 16 sequences lose (decode 14.0 -> 16.2 ms). So only a stack whose projections are all
//   quantized splits.
// Only measured on a team of 2 (with more threads each would read the weights once: until
// measured, they split every kernel as before), and not on the amx path (not measured there).
constexpr int64_t kSplitMinTokensPerGroup = 8;
constexpr int64_t kSplitGroupsPerThread = 2;
constexpr int64_t kSplitMaxThreads = 2;
// The most tokens in a group over the mean (StepSplit::imbalance) for the split to be worth it: a
// step of 63 decodes and one 1985-token prefill chunk cuts into groups of decodes and one of 1985
// tokens, which one thread would run while the other waited.
constexpr double kSplitMaxImbalance = 1.25;

// InvalidArgument unless a sparse layer's router and experts agree with each other and with hidden.
void check_experts(const MoeWeights& moe, int64_t hidden) {
  moe.router.check("DecoderStack: the MoE router");
  const int64_t experts = moe.router.n, inter = moe.intermediate;
  CORELLM_CHECK_ARG(moe.router.k == hidden, "DecoderStack: the MoE router must be [experts, ", hidden, "]");
  CORELLM_CHECK_ARG(static_cast<int64_t>(moe.gate_up.size()) == experts &&
                        static_cast<int64_t>(moe.down.size()) == experts,
                    "DecoderStack: a router of ", experts, " experts with ", moe.gate_up.size(), " gate_up and ",
                    moe.down.size(), " down weights");
  CORELLM_CHECK_ARG(moe.top_k >= 1 && moe.top_k <= experts && inter >= 1, "DecoderStack: MoE top_k ", moe.top_k,
                    " of ", experts, " experts, intermediate ", inter);
  CORELLM_CHECK_ARG(moe.selection_bias.empty() || static_cast<int64_t>(moe.selection_bias.size()) == experts,
                    "DecoderStack: a selection bias of ", moe.selection_bias.size(), " for ", experts, " experts");
  if (moe.has_shared()) {
    const int64_t si = moe.shared_intermediate;
    moe.shared_gate_up.check("DecoderStack: the shared expert's gate_up");
    moe.shared_down.check("DecoderStack: the shared expert's down");
    CORELLM_CHECK_ARG(si >= 1 && moe.shared_gate_up.n == 2 * si && moe.shared_gate_up.k == hidden &&
                          moe.shared_down.n == hidden && moe.shared_down.k == si,
                      "DecoderStack: the shared expert's shapes differ from [2 x ", si, ", ", hidden, "] and [",
                      hidden, ", ", si, "]");
    if (moe.shared_gated()) {
      moe.shared_gate.check("DecoderStack: the shared expert's gate");
      CORELLM_CHECK_ARG(moe.shared_gate.n == 1 && moe.shared_gate.k == hidden && moe.shared_gate.bias == nullptr,
                        "DecoderStack: the shared expert's gate must be [1, ", hidden, "] without a bias");
    }
  }
  for (int64_t e = 0; e < experts; ++e) {
    moe.gate_up[e].check("DecoderStack: an expert's gate_up");
    moe.down[e].check("DecoderStack: an expert's down");
    CORELLM_CHECK_ARG(moe.gate_up[e].n == 2 * inter && moe.gate_up[e].k == hidden && moe.down[e].n == hidden &&
                          moe.down[e].k == inter,
                      "DecoderStack: expert ", e, "'s shapes differ from [2 x ", inter, ", ", hidden, "] and [",
                      hidden, ", ", inter, "]");
  }
}

}  // namespace

DecoderStack::DecoderStack(const DecoderDims& dims, const EmbeddingWeight& embed, std::vector<DecoderLayerWeights> layers,
                           const uint16_t* final_norm, const KVCacheShape& cache, const DecoderTensorParallel& tp)
    : dims_(dims), embed_(embed), layers_(std::move(layers)), final_norm_(final_norm), cache_(cache), tp_(tp) {
  CORELLM_CHECK_ARG(bf16_gemm_available(), "DecoderStack needs a CPU with AVX2 and FMA");
  CORELLM_CHECK_ARG(dims.hidden > 0 && dims.num_heads > 0 && dims.num_kv_heads > 0 && dims.head_size > 0 &&
                        dims.intermediate > 0 && dims.vocab_size > 0,
                    "DecoderStack: every dimension must be positive");
  CORELLM_CHECK_ARG(dims.num_heads % dims.num_kv_heads == 0, "DecoderStack: num_heads (", dims.num_heads,
                    ") must be a multiple of num_kv_heads (", dims.num_kv_heads, ")");
  CORELLM_CHECK_ARG(cache.num_kv_heads == dims.num_kv_heads && cache.head_size == dims.head_size,
                    "DecoderStack: the KV cache's heads (", cache.num_kv_heads, " x ", cache.head_size,
                    ") differ from the model's (", dims.num_kv_heads, " x ", dims.head_size, ")");
  CORELLM_CHECK_ARG(embed.data && final_norm, "DecoderStack: null embedding or final norm");
  CORELLM_CHECK_ARG(dims.max_position > 0 && dims.rot_dim > 0 && dims.rot_dim <= dims.head_size,
                    "DecoderStack: the rope tables' extents (", dims.max_position, " x ", dims.rot_dim,
                    ") must be positive, rot_dim at most head_size (", dims.head_size, ")");
  CORELLM_CHECK_ARG(dims.activation == GatedActivation::kSilu || dims.activation == GatedActivation::kGeluTanh ||
                        dims.activation == GatedActivation::kSwigluOai,
                    "DecoderStack: unknown gated activation ", static_cast<int32_t>(dims.activation));
  CORELLM_CHECK_ARG(dims.activation != GatedActivation::kSwigluOai ||
                        (dims.swiglu_alpha > 0.0f && dims.swiglu_limit > 0.0f && std::isfinite(dims.swiglu_alpha) &&
                         std::isfinite(dims.swiglu_limit)),
                    "DecoderStack: swiglu_oai needs a positive, finite alpha and limit, got ", dims.swiglu_alpha,
                    " and ", dims.swiglu_limit);
  q_size_ = dims.num_heads * dims.head_size;
  kv_size_ = dims.num_kv_heads * dims.head_size;
  CORELLM_CHECK_ARG(tp.q_whole == 0 || (dims.qk_norm_whole && tp.all_reduce != nullptr && tp.q_start >= 0 &&
                                        tp.q_start + q_size_ <= tp.q_whole && tp.k_start >= 0 &&
                                        tp.k_start + kv_size_ <= tp.kv_whole),
                    "DecoderStack: whole q/k rows (q ", tp.q_start, " of ", tp.q_whole, ", k ", tp.k_start, " of ",
                    tp.kv_whole, ") need qk_norm_whole, an all-reduce and this rank's columns inside them");
  qkv_size_ = q_size_ + 2 * kv_size_;
  for (const DecoderLayerWeights& w : layers_) {
    CORELLM_CHECK_ARG(w.key_cache && w.value_cache && (w.input_norm == nullptr) == (w.post_attention_norm == nullptr) &&
                          (w.q_norm == nullptr) == (w.k_norm == nullptr) &&
                          (w.attention_output_norm == nullptr) == (w.mlp_output_norm == nullptr) &&
                          (w.input_norm != nullptr || w.attention_output_norm != nullptr),
                      "DecoderStack: a layer lacks a norm or its KV cache");
    w.qkv.check("DecoderStack: qkv");
    w.o.check("DecoderStack: o");
    std::vector<const LinearWeight*> projections{&w.qkv, &w.o};
    if (w.moe.sparse()) {
      check_experts(w.moe, dims.hidden);
      // The router is not among them: its few rows (one per expert) are bf16 or fp32 in quantized files too.
      for (const LinearWeight& e : w.moe.gate_up) projections.push_back(&e);
      for (const LinearWeight& e : w.moe.down) projections.push_back(&e);
      if (w.moe.has_shared()) projections.insert(projections.end(), {&w.moe.shared_gate_up, &w.moe.shared_down});
    } else {
      w.gate_up.check("DecoderStack: gate_up");
      w.down.check("DecoderStack: down");
      CORELLM_CHECK_ARG(w.gate_up.n == 2 * dims.intermediate && w.gate_up.k == dims.hidden &&
                            w.down.n == dims.hidden && w.down.k == dims.intermediate,
                        "DecoderStack: an MLP projection's shape differs from the model's dimensions");
      projections.insert(projections.end(), {&w.gate_up, &w.down});
    }
    for (const LinearWeight* linear : projections) {
      for (const LinearPart& part : linear->parts) quantized_projections_ &= part.ggml_type != kBf16Packed;
    }
    CORELLM_CHECK_ARG(w.qkv.n == qkv_size_ && w.qkv.k == dims.hidden && w.o.n == dims.hidden && w.o.k == q_size_,
                      "DecoderStack: a projection's shape differs from the model's dimensions");
  }
}

void DecoderStack::reserve(Scratch& s, int64_t num_tokens) const {
  const auto rows = static_cast<size_t>(num_tokens);
  if (s.residual.size() >= rows * dims_.hidden) return;
  s.residual.resize(rows * dims_.hidden);
  s.h.resize(rows * dims_.hidden);
  s.qkv.resize(rows * qkv_size_);
  s.attn.resize(rows * q_size_);
  s.gate_up.resize(std::min<size_t>(rows, kMlpBlockRows) * 2 * dims_.intermediate);
  s.act.resize(std::min<size_t>(rows, std::max(kMlpBlockRows, kOnePassMlpBlockRows)) * dims_.intermediate);
}

int64_t DecoderStack::groups_for(const DecoderStepArgs& step) const {
  const int64_t threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (!quantized_projections_ || threads < 2 || threads > kSplitMaxThreads || tp_.all_reduce != nullptr ||
      cpu_isa() == CpuIsa::kAmx) {
    return 1;
  }
  if (step.num_seqs < threads || step.num_tokens < threads * kSplitMinTokensPerGroup) return 1;
  // At least `threads` groups: both bounds below were just checked to allow that many.
  return std::min({threads * kSplitGroupsPerThread, step.num_seqs, step.num_tokens / kSplitMinTokensPerGroup});
}

void DecoderStack::forward(const DecoderStepArgs& step) {
  const int64_t n = step.num_tokens;
  CORELLM_CHECK_ARG(n >= 1, "DecoderStack: a step needs at least one token, got ", n);
  CORELLM_CHECK_ARG(step.num_seqs >= 1 && step.query_start_loc[0] == 0 && step.query_start_loc[step.num_seqs] == n,
                    "DecoderStack: query_start_loc must run from 0 to num_tokens (", n, ") over ", step.num_seqs,
                    " sequences");
  for (int64_t t = 0; step.lora_slots != nullptr && t < n; ++t) {  // only a slot that holds an adapter
    const int32_t slot = step.lora_slots[t];
    CORELLM_CHECK_ARG(slot < 0 || (static_cast<size_t>(slot) < lora_.size() && !lora_[slot].empty()),
                      "DecoderStack: token ", t, " names LoRA slot ", slot, ", which holds no adapter");
  }
  const int64_t groups = groups_for(step);
  if (groups > 1) split_.cut(step, dims_.hidden, groups);
  // Unsplit, or when the cut is uneven (one thread would be left waiting on the other): the whole
  // step, every kernel on the whole team.
  if (groups == 1 || split_.imbalance() > kSplitMaxImbalance) {
    last_groups_ = 1;
    run(step, scratch_[0]);
    return;
  }
  last_groups_ = split_.size();
  if (scratch_.size() < static_cast<size_t>(split_.size())) scratch_.resize(static_cast<size_t>(split_.size()));
  // Groups claimed by whichever thread is free, each thread's kernels on that thread alone; an
  // exception (a kernel's refusal) is caught in its thread and thrown here, after every group ran.
  std::vector<std::exception_ptr> failed(static_cast<size_t>(split_.size()));
#pragma omp parallel
  {
    omp_set_num_threads(1);
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t g = 0; g < split_.size(); ++g) {
      try {
        run(split_.group(g), scratch_[static_cast<size_t>(g)]);
      } catch (...) {
        failed[static_cast<size_t>(g)] = std::current_exception();
      }
    }
  }
  for (const std::exception_ptr& e : failed) {
    if (e) std::rethrow_exception(e);
  }
}

void DecoderStack::run(const DecoderStepArgs& step, Scratch& s) {
  const int64_t n = step.num_tokens, hidden = dims_.hidden;
  reserve(s, n);
  if (step.inputs_embeds != nullptr) {  // into the residual stream
    std::memcpy(s.residual.data(), step.inputs_embeds, static_cast<size_t>(n * hidden) * sizeof(uint16_t));
  } else {
    embed(step.input_ids, n, s.residual.data());
  }
  for (size_t i = 0; i < layers_.size(); ++i) layer(i, step, s);
  fused_add_rms_norm(s.h.data(), hidden, s.residual.data(), hidden, final_norm_, n, hidden, dims_.eps, DType::BF16);
  std::memcpy(step.out, s.h.data(), n * hidden * sizeof(uint16_t));
}

void DecoderStack::embed(const int32_t* ids, int64_t n, uint16_t* rows) {
  lookup(ids, n, rows);
  if (dims_.embedding_multiplier == 1.0f) return;
  // Gemma: the rows times sqrt(hidden), in bf16 as HF computes it (the factor rounded to bf16,
  // each product rounded).
  const float factor = bf16_to_f32(f32_to_bf16(dims_.embedding_multiplier));
  for (int64_t i = 0; i < n * dims_.hidden; ++i) rows[i] = f32_to_bf16(bf16_to_f32(rows[i]) * factor);
}

void DecoderStack::lookup(const int32_t* ids, int64_t n, uint16_t* rows) {
  const int64_t hidden = dims_.hidden;
  if (tp_.all_reduce == nullptr) {
    embed_.lookup(ids, n, dims_.vocab_size, hidden, rows);
    return;
  }
  // Vocabulary-parallel: this rank's rows, zeros for the others' ids, summed over the group.
  local_ids_.resize(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) {
    const int64_t local = ids[t] - tp_.vocab_start;
    local_ids_[t] = local >= 0 && local < dims_.vocab_size ? static_cast<int32_t>(local) : 0;
  }
  embed_.lookup(local_ids_.data(), n, dims_.vocab_size, hidden, rows);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t local = ids[t] - tp_.vocab_start;
    if (local < 0 || local >= dims_.vocab_size) std::memset(rows + t * hidden, 0, hidden * sizeof(uint16_t));
  }
  all_reduce(rows, n);
}

void DecoderStack::all_reduce(uint16_t* rows, int64_t n) {
  if (tp_.all_reduce != nullptr) tp_.all_reduce->all_reduce_or_throw(rows, n * dims_.hidden, DType::BF16, tp_.timeout_s);
}

// Each token's whole q and k rows put together over the group: every rank writes its columns into
// a row of zeros and the rows are all-reduced (a sum with zeros, in fp32 and rounded once: exact),
// so every rank norms the rows one process would, and takes its own columns back.
void DecoderStack::gathered_qk_norm(const DecoderLayerWeights& w, uint16_t* q, uint16_t* k, int64_t n, Scratch& s) {
  const int64_t width = tp_.q_whole + tp_.kv_whole;
  s.qk_whole.assign(static_cast<size_t>(n * width), 0);
  uint16_t* rows = s.qk_whole.data();
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(rows + t * width + tp_.q_start, q + t * qkv_size_, q_size_ * sizeof(uint16_t));
    if (tp_.writes_k) {
      std::memcpy(rows + t * width + tp_.q_whole + tp_.k_start, k + t * qkv_size_, kv_size_ * sizeof(uint16_t));
    }
  }
  tp_.all_reduce->all_reduce_or_throw(rows, n * width, DType::BF16, tp_.timeout_s);
  rms_norm(rows, width, rows, width, w.q_norm, n, tp_.q_whole, dims_.eps, DType::BF16);
  rms_norm(rows + tp_.q_whole, width, rows + tp_.q_whole, width, w.k_norm, n, tp_.kv_whole, dims_.eps, DType::BF16);
  for (int64_t t = 0; t < n; ++t) {
    std::memcpy(q + t * qkv_size_, rows + t * width + tp_.q_start, q_size_ * sizeof(uint16_t));
    std::memcpy(k + t * qkv_size_, rows + t * width + tp_.q_whole + tp_.k_start, kv_size_ * sizeof(uint16_t));
  }
}

void DecoderStack::set_lora(int64_t slot, std::vector<LoraLayer> layers) {
  CORELLM_CHECK_ARG(slot >= 0, "DecoderStack: LoRA slot ", slot, " must be >= 0");
  CORELLM_CHECK_ARG(layers.size() == layers_.size(), "DecoderStack: a LoRA adapter of ", layers.size(),
                    " layers for a stack of ", layers_.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    const LoraLayer& l = layers[i];
    CORELLM_CHECK_ARG(!layers_[i].moe.sparse() || (l.gate_up.parts.empty() && l.down.parts.empty()),
                      "DecoderStack: a LoRA update of layer ", i, "'s MLP, a mixture of experts (not supported)");
    l.qkv.check("DecoderStack: LoRA qkv", qkv_size_);
    l.o.check("DecoderStack: LoRA o", dims_.hidden);
    l.gate_up.check("DecoderStack: LoRA gate_up", 2 * dims_.intermediate);
    l.down.check("DecoderStack: LoRA down", dims_.hidden);
    CORELLM_CHECK_ARG((l.qkv.parts.empty() || l.qkv.k == dims_.hidden) && (l.o.parts.empty() || l.o.k == q_size_) &&
                          (l.gate_up.parts.empty() || l.gate_up.k == dims_.hidden) &&
                          (l.down.parts.empty() || l.down.k == dims_.intermediate),
                      "DecoderStack: a LoRA update's input width differs from its projection's");
  }
  if (lora_.size() <= static_cast<size_t>(slot)) lora_.resize(static_cast<size_t>(slot) + 1);
  lora_[static_cast<size_t>(slot)] = std::move(layers);
}

bool DecoderStack::lora_touches(LoraLinear LoraLayer::*which, size_t index) const {
  for (const std::vector<LoraLayer>& adapter : lora_) {
    if (!adapter.empty() && !(adapter[index].*which).parts.empty()) return true;
  }
  return false;
}

void DecoderStack::add_lora(LoraLinear LoraLayer::*which, size_t index, uint16_t* y, int64_t y_stride,
                            const uint16_t* x, int64_t x_stride, int64_t m, const int32_t* slots, Scratch& s) const {
  if (slots == nullptr) return;
  s.lora_by_slot.assign(lora_.size(), nullptr);
  bool any = false;
  for (size_t slot = 0; slot < lora_.size(); ++slot) {
    if (lora_[slot].empty() || (lora_[slot][index].*which).parts.empty()) continue;
    s.lora_by_slot[slot] = &(lora_[slot][index].*which);
    any = true;
  }
  if (!any) return;
  lora_add(y, y_stride, x, x_stride, m, slots, s.lora_by_slot.data(), static_cast<int64_t>(lora_.size()),
           DType::BF16);
}

void DecoderStack::layer(size_t index, const DecoderStepArgs& step, Scratch& s) {
  const DecoderLayerWeights& w = layers_[index];
  const int64_t n = step.num_tokens, hidden = dims_.hidden, inter = dims_.intermediate;
  const DType bf16 = DType::BF16;
  const int32_t* lora = step.lora_slots;
  uint16_t *x = s.residual.data(), *h = s.h.data(), *qkv = s.qkv.data();
  if (w.input_norm == nullptr) {  // OLMo 2: the stream itself goes in
    if (index == 0) {
      std::memcpy(h, x, static_cast<size_t>(n * hidden) * sizeof(uint16_t));
    } else {
      add_to_stream(h, x, n);
    }
  } else if (index == 0) {
    rms_norm(h, hidden, x, hidden, w.input_norm, n, hidden, dims_.eps, bf16);
  } else {
    fused_add_rms_norm(h, hidden, x, hidden, w.input_norm, n, hidden, dims_.eps, bf16);
  }
  w.qkv.forward(h, hidden, qkv, qkv_size_, n, XRows::kByThread);  // h: the norm's rows
  add_lora(&LoraLayer::qkv, index, qkv, qkv_size_, h, hidden, n, lora, s);
  uint16_t *q = qkv, *k = qkv + q_size_, *v = qkv + q_size_ + kv_size_;
  if (w.q_norm != nullptr && dims_.qk_norm_whole && tp_.q_whole > 0) {
    gathered_qk_norm(w, q, k, n, s);
  } else if (w.q_norm != nullptr && dims_.qk_norm_whole) {  // in place, a token's q (and k) one row of qkv
    rms_norm(q, qkv_size_, q, qkv_size_, w.q_norm, n, q_size_, dims_.eps, bf16);
    rms_norm(k, qkv_size_, k, qkv_size_, w.k_norm, n, kv_size_, dims_.eps, bf16);
  } else if (w.q_norm != nullptr) {  // per head, in place: each token's heads are contiguous rows
    for (int64_t t = 0; t < n; ++t) {
      rms_norm(q + t * qkv_size_, dims_.head_size, q + t * qkv_size_, dims_.head_size, w.q_norm, dims_.num_heads,
               dims_.head_size, dims_.eps, bf16);
      rms_norm(k + t * qkv_size_, dims_.head_size, k + t * qkv_size_, dims_.head_size, w.k_norm,
               dims_.num_kv_heads, dims_.head_size, dims_.eps, bf16);
    }
  }
  if (w.cos_sin_cache != nullptr) {  // (none: a NoPE layer, SmolLM3's)
    rotary_embedding(step.positions, q, qkv_size_, k, qkv_size_, w.cos_sin_cache, dims_.max_position, n,
                     dims_.num_heads, dims_.num_kv_heads, dims_.head_size, dims_.rot_dim, /*is_neox=*/!dims_.rope_interleaved,
                     bf16);
  }
  reshape_and_cache(k, qkv_size_, v, qkv_size_, w.key_cache, w.value_cache, step.slot_mapping, n, cache_, bf16);
  PagedAttentionArgs a{s.attn.data(), q, qkv_size_, w.key_cache, w.value_cache, cache_, step.block_table,
                       step.block_table_stride, step.seq_lens, step.query_start_loc, step.num_seqs,
                       dims_.num_heads, dims_.scale, w.sliding_window, bf16};
  a.softcap = dims_.attn_softcap;
  a.sinks = w.sinks;
  paged_attention(a);
  w.o.forward(s.attn.data(), q_size_, h, hidden, n);
  add_lora(&LoraLayer::o, index, h, hidden, s.attn.data(), q_size_, n, lora, s);
  all_reduce(h, n);
  if (w.attention_output_norm != nullptr) {  // in place: each row is read whole before it is written
    rms_norm(h, hidden, h, hidden, w.attention_output_norm, n, hidden, dims_.eps, bf16);
  }
  if (dims_.residual_multiplier != 1.0f) scale(h, hidden, n, hidden, dims_.residual_multiplier, bf16);
  if (w.post_attention_norm == nullptr) {
    add_to_stream(h, x, n);
  } else {
    fused_add_rms_norm(h, hidden, x, hidden, w.post_attention_norm, n, hidden, dims_.eps, bf16);
  }
  if (w.moe.sparse()) {
    sparse_mlp(w.moe, h, n, s);
    all_reduce(h, n);  // each rank's share of every expert's output, weighted and summed
    finish_mlp(w, h, n);
    return;
  }
  // gate_up's LoRA update goes in before the activation: then gate_up's output, updated, is
  // activated in a pass of its own.
  const bool gate_up_lora = lora != nullptr && lora_touches(&LoraLayer::gate_up, index);
  const bool one_pass = w.gate_up.gated_in_one_pass() && dims_.activation != GatedActivation::kSwigluOai;
  const int64_t block = one_pass && !gate_up_lora ? kOnePassMlpBlockRows : kMlpBlockRows;
  for (int64_t r0 = 0; r0 < n; r0 += block) {  // down's rows overwrite h's after gate_up read them
    const int64_t rows = std::min(block, n - r0);
    uint16_t* hb = h + r0 * hidden;
    const int32_t* block_lora = lora ? lora + r0 : nullptr;
    // hb: the norm's rows; act_: gate_up's, split as down splits them
    if (gate_up_lora) {
      w.gate_up.forward(hb, hidden, s.gate_up.data(), 2 * inter, rows, XRows::kByThread);
      add_lora(&LoraLayer::gate_up, index, s.gate_up.data(), 2 * inter, hb, hidden, rows, block_lora, s);
      activate(s.gate_up.data(), 2 * inter, s.act.data(), inter, rows);
    } else {
      gated(w.gate_up, hb, hidden, s.act.data(), inter, rows, s.gate_up.data(), XRows::kByThread);
    }
    w.down.forward(s.act.data(), inter, hb, hidden, rows, XRows::kByThread);
    add_lora(&LoraLayer::down, index, hb, hidden, s.act.data(), inter, rows, block_lora, s);
  }
  all_reduce(h, n);
  finish_mlp(w, h, n);
}

void DecoderStack::gated(const LinearWeight& w, const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride,
                         int64_t m, uint16_t* scratch, XRows x_rows) const {
  if (dims_.activation != GatedActivation::kSwigluOai) {
    w.forward_gated(x, x_stride, out, out_stride, m, dims_.activation, scratch, x_rows);
    return;
  }
  w.forward(x, x_stride, scratch, w.n, m, x_rows);
  activate(scratch, w.n, out, out_stride, m);
}

void DecoderStack::activate(const uint16_t* gate_up, int64_t gate_up_stride, uint16_t* out, int64_t out_stride,
                            int64_t m) const {
  const int64_t d = gate_up_stride / 2;
  if (dims_.activation == GatedActivation::kSwigluOai) {
    swigluoai_and_mul(out, out_stride, gate_up, gate_up_stride, m, d, dims_.swiglu_alpha, dims_.swiglu_limit,
                      DType::BF16);
  } else {
    gated_activation_and_mul(dims_.activation, out, out_stride, gate_up, gate_up_stride, m, d, DType::BF16);
  }
}

// x += h (each sum rounded to bf16 once, as torch adds bf16 tensors), then h = x: a layer without a
// pre-norm (OLMo 2) takes the stream itself.
void DecoderStack::add_to_stream(uint16_t* h, uint16_t* x, int64_t n) const {
  const int64_t count = n * dims_.hidden;
#pragma omp parallel for schedule(static) if (count >= (int64_t{1} << 16))
  for (int64_t i = 0; i < count; ++i) {
    x[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(h[i]));
    h[i] = x[i];
  }
}

void DecoderStack::finish_mlp(const DecoderLayerWeights& w, uint16_t* h, int64_t n) const {
  const int64_t hidden = dims_.hidden;
  if (w.mlp_output_norm != nullptr) {
    rms_norm(h, hidden, h, hidden, w.mlp_output_norm, n, hidden, dims_.eps, DType::BF16);
  }
  if (dims_.residual_multiplier != 1.0f) scale(h, hidden, n, hidden, dims_.residual_multiplier, DType::BF16);
}

}  // namespace corellm
