// A Llama-family model's decoder stack run in one native call: a step's whole forward
// (embedding, every layer's ops, the final norm) without returning to Python between ops, which
// would cost about ten op calls per layer (argument checks, tensor allocation, the binding).
//
// It chains the same kernels, in the same order, as the Python layers (python/corellm/model/
// layers.py), so its result is bit-identical to theirs, and each token's projections do not
// depend on how many tokens share the step (packed_gemm.h and quant_gemm.h compute every row
// alike). bf16 activations; projections packed by bf16_gemm_pack or quant_gemm_pack
// (linear_weight.h). A change to the layer math goes here and in layers.py
// alike: tests/model/test_native_stack.py holds the two bit-identical.
//
// Per layer, for x the residual stream (un-normalized, as in the Python layers):
//   h = rms_norm(x)                    (first layer; later ones: x += h, h = rms_norm(x))
//   qkv = h Wqkv^T (+ b)               [n, q + 2kv]
//   q, k = rms_norm per head           (Qwen3's and Gemma 3's q/k norms, when present; OLMoE's over
//                                      each token's whole q and k)
//   q, k = rotary(q, k, positions)     (the layer's rope table: Gemma 3's sliding layers have their own)
//   cache[slot] = k, v
//   a = paged_attention(q, cache)      [n, q] (the layer's window and sinks, if any)
//   h = a Wo^T (+ b)                   (Gemma 3: h = rms_norm(h), its post-attention norm)
//                                      (Granite: h *= residual_multiplier, here and after the MLP)
//   x += h, h = rms_norm(x)
//   h = down(act(gate(h)) * up(h))     act: silu (SwiGLU), gelu_tanh (GeGLU) or swiglu_oai; in blocks of 256
//                                      rows, each block's intermediates kept in the caches
//                                      (a mixture of experts' sparse layer: MoeWeights' steps)
//                                      (Gemma 3: h = rms_norm(h), its post-feedforward norm)
// With LoRA adapters (set_lora), a step's tokens that name one (DecoderStepArgs::lora_slots) have
// their adapter's low-rank updates added to qkv's, o's, gate_up's and down's outputs
// (kernels/lora.h), gate_up's before the activation (that MLP then runs in two passes).
// and after the last layer: x += h, out = rms_norm(x). The embedding rows are scaled first when
// the model says so (Gemma 3: times sqrt(hidden), the factor and the product rounded to bf16 as
// HF does).
//
// The step split: a step of enough tokens over enough sequences, in a stack whose projections are
// quantized, is cut into groups of whole sequences (step_split.h), and each thread of the team runs whole groups through every layer with
// its kernels to itself, rather than the team splitting each kernel. A token's result is the same
// either way (every kernel computes a token from its own inputs and its sequence's KV); when it
// pays is measured beside groups_for (decoder_stack.cpp).
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/aligned_vector.h"
#include "corellm/kernels/elementwise.h"
#include "corellm/kernels/lora.h"
#include "corellm/kernels/paged_attention.h"
#include "corellm/model/decoder_step.h"
#include "corellm/model/linear_weight.h"
#include "corellm/model/step_split.h"
#include "corellm/shm_all_reduce.h"

namespace corellm {

// Every pointer below must outlive the stack; the model (python/corellm/model/llama.py) owns them.
struct DecoderDims {
  int64_t vocab_size = 0;
  int64_t hidden = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_size = 0;
  int64_t intermediate = 0;
  float eps = 0.0f;                        // RMSNorm epsilon
  float scale = 0.0f;                      // attention softmax scale
  float attn_softcap = 0.0f;               // > 0: the scaled scores soft-capped (PagedAttentionArgs::softcap)
  int64_t max_position = 0;                // the layers' rope tables: [max_position, rot_dim]
  int64_t rot_dim = 0;
  GatedActivation activation = GatedActivation::kSilu;
  float swiglu_alpha = 0.0f, swiglu_limit = 0.0f;  // kSwigluOai's (swigluoai_and_mul's alpha and limit)
  float embedding_multiplier = 1.0f;       // 1: the embedding rows as they are
  float residual_multiplier = 1.0f;        // the attention's and the MLP's outputs times this (Granite)
  bool qk_norm_whole = false;              // the q/k norms over each token's whole q and k (OLMoE), not per head
  bool rope_interleaved = false;           // rotary on pairs (2i, 2i + 1) (GPT-J's, ERNIE 4.5's), not NeoX's halves
};

// Tensor parallelism (python/corellm/model/tensor_parallel.py): the dims and weights are this rank's
// share (its heads, its intermediate rows, vocab_size vocabulary rows from vocab_start), and the
// partial sums — the embedding lookup (zeros for the ids of other ranks' rows), o's and down's
// outputs, a sparse layer's weighted sum of its experts (each rank holds a slice of every expert's
// intermediate rows and the whole router) — are all-reduced over the group's ranks on this machine,
// as the Python layers do.
struct DecoderTensorParallel {
  ShmAllReduce* all_reduce = nullptr;  // null: one process, no collectives
  int64_t vocab_start = 0;
  double timeout_s = 60.0;  // a rank that does not arrive in this time: std::runtime_error
  // OLMoE's whole-row q/k norms (DecoderDims::qk_norm_whole) over the group: where this rank's q
  // and k columns sit in a token's whole q (q_whole wide) and whole k (kv_whole wide) rows, and
  // whether it puts its k there (one of the ranks that hold the same KV heads). q_whole 0: not used.
  // (tensor_parallel.WholeRowColumns; the layer's q_norm and k_norm are then the whole rows'.)
  int64_t q_start = 0, q_whole = 0, k_start = 0, kv_whole = 0;
  bool writes_k = true;
};

// A mixture-of-experts MLP (Mixtral, Qwen3-MoE) in place of a layer's gated MLP, in steps
// (python/corellm/model/layers.py's SparseMoe runs the same, bit for bit):
//   logits = router(h) fp32;  each token's top_k experts and weights (kernels/moe.h's moe_route)
//   for each chosen expert: its tokens' rows of h gathered, its gated MLP on them (gate_up and the
//     activation, then down), each output row put in the token's place (the experts one after
//     another, or in a step of a few tokens shared out between the threads)
//   h = the token's expert outputs summed by their weights, fp32, rounded once (moe_combine)
// With a shared expert (Qwen2-MoE, ERNIE 4.5), every token runs it too, before the routing, and the
// sum adds its output times sigmoid(shared_gate's logit) (ERNIE 4.5's, ungated: times 1). ERNIE 4.5
// chooses its experts by p + selection_bias and divides the weights by at least renormalize_min.
struct MoeWeights {
  LinearWeight router;                // [num_experts, hidden]; no parts: the layer's MLP is dense
  std::vector<LinearWeight> gate_up;  // per expert [2 * intermediate, hidden], gate rows first
  std::vector<LinearWeight> down;     // per expert [hidden, intermediate]
  int64_t top_k = 0;
  bool renormalize = true;            // the chosen experts' weights divided by their sum
  float renormalize_min = 0.0f;       // ... or by this where the sum is smaller (moe.h's moe_route)
  std::vector<float> selection_bias;  // [num_experts] fp32, or empty: the choice ranks p alone
  int64_t intermediate = 0;           // an expert's
  // The shared expert, or no parts: [2 * shared_intermediate, hidden], [hidden, shared_intermediate], and its
  // gate [1, hidden] (no parts: ungated).
  LinearWeight shared_gate_up, shared_down, shared_gate;
  int64_t shared_intermediate = 0;
  bool sparse() const { return !router.parts.empty(); }
  bool has_shared() const { return !shared_gate_up.parts.empty(); }
  bool shared_gated() const { return !shared_gate.parts.empty(); }
};

// One layer's weights (norms bf16, projections as linear_weight.h), its attention's rope table
// and window, and its KV cache.
struct DecoderLayerWeights {
  // [hidden] each, or both null: no pre-norms (OLMo 2, whose sandwich norms below are its only ones)
  const uint16_t* input_norm = nullptr;
  const uint16_t* post_attention_norm = nullptr;  // before the MLP
  // Gemma 3's sandwich norms, on the attention's and the MLP's outputs: [hidden] each, or both null.
  const uint16_t* attention_output_norm = nullptr;
  const uint16_t* mlp_output_norm = nullptr;
  LinearWeight qkv;                               // [q + 2kv, hidden] (with the qkv bias, if any)
  const uint16_t* q_norm = nullptr;               // [head_size] (qk_norm_whole: [q]) or null (no q/k norms)
  const uint16_t* k_norm = nullptr;               // [head_size] (qk_norm_whole: [kv]) or null
  LinearWeight o;                                 // [hidden, q]
  LinearWeight gate_up;                           // [2 * intermediate, hidden], gate rows first
  LinearWeight down;                              // [hidden, intermediate]
  MoeWeights moe;                                 // sparse(): gate_up and down unused (no parts)
  // [max_position, rot_dim] fp32, cos then sin (ops.rotary_embedding); null: the layer turns no
  // rotary embedding (a NoPE layer: SmolLM3's every fourth)
  const float* cos_sin_cache = nullptr;
  int64_t sliding_window = 0;            // <= 0: none
  const float* sinks = nullptr;          // [num_heads] fp32, the attention's sinks (gpt-oss), or null
  void* key_cache = nullptr;                      // layout of paged_attention.h
  void* value_cache = nullptr;
};

// One LoRA adapter's updates of one layer's projections (columns as the fused projections': q, k
// and v parts of qkv; gate and up parts of gate_up). Its matrices must outlive the stack's use of it.
struct LoraLayer {
  LoraLinear qkv, o, gate_up, down;
};

class DecoderStack {
 public:
  // embed [vocab_size, hidden], final_norm [hidden]; every pointer must outlive the stack.
  DecoderStack(const DecoderDims& dims, const EmbeddingWeight& embed, std::vector<DecoderLayerWeights> layers,
               const uint16_t* final_norm, const KVCacheShape& cache, const DecoderTensorParallel& tp = {});

  // Runs the whole stack for the step's tokens. Not reentrant (the scratch buffers, grown to the
  // largest step seen, are the stack's).
  void forward(const DecoderStepArgs& step);

  // Slot `slot`'s adapter (one LoraLayer per layer), which tokens name by their lora_slots; it
  // replaces what the slot held. Not while a forward runs.
  void set_lora(int64_t slot, std::vector<LoraLayer> layers);

  // How many groups of sequences the last forward cut its step into, each run by one thread (1:
  // the whole step, every kernel on the whole team); 0 before the first.
  int64_t last_groups() const { return last_groups_; }

 private:
  // The buffers of one run of the stack over a step's rows, each [tokens, width]: the residual
  // stream, the normed/projected activations, qkv, the attention's output; gate_up and the MLP's
  // activation for one block of the MLP's rows. On cache lines: the amx GEMM reads its x in place
  // when the rows start on lines.
  struct Scratch {
    AlignedVector<uint16_t> residual, h, qkv, attn, gate_up, act;
    AlignedVector<uint16_t> qk_whole;  // gathered_qk_norm's rows [n, q_whole + kv_whole]
    std::vector<const LoraLinear*> lora_by_slot;  // add_lora's table of one projection's adapters
    // sparse_mlp's: the router's logits and choices [tokens, experts / top_k]; the choices sorted
    // by expert; one expert's rows in, its gate_up and activation, its rows out; every choice's
    // output row [tokens * top_k, hidden].
    std::vector<float> router_logits, expert_weights;
    std::vector<int32_t> expert_ids, choices_by_expert;
    std::vector<int64_t> expert_first, expert_next;  // where each expert's choices start in choices_by_expert
    AlignedVector<uint16_t> choice_rows;
    std::vector<int32_t> chosen_experts;  // the experts some token chose, in order
    struct ExpertRows {                    // one thread's: an expert's rows in, gate_up, activation, rows out
      AlignedVector<uint16_t> in, gate_up, act, out;
    };
    std::vector<ExpertRows> expert_rows;
    AlignedVector<uint16_t> shared_gate_up, shared_act, shared_out;  // the shared expert's, [tokens, width]
    std::vector<float> shared_logits;                                // its gate's, [tokens]
  };

  // The groups of sequences the step's tokens are cut into, each run by one thread; 1: the whole
  // step on the whole team.
  int64_t groups_for(const DecoderStepArgs& step) const;
  void run(const DecoderStepArgs& step, Scratch& s);  // embedding, layers and final norm into step.out
  void reserve(Scratch& s, int64_t num_tokens) const;
  void layer(size_t index, const DecoderStepArgs& step, Scratch& s);
  // out [m, d] = act(gate) * up of w's output (w: a gate_up, n = 2d), by the model's activation:
  // w.forward_gated, or for kSwigluOai w.forward into scratch [m, n], then swigluoai_and_mul.
  void gated(const LinearWeight& w, const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride, int64_t m,
             uint16_t* scratch, XRows x_rows = XRows::kAnywhere) const;
  // out [m, d] = act(gate) * up of gate_up's rows [m, 2d] (row stride gate_up_stride = 2d), by the
  // model's activation.
  void activate(const uint16_t* gate_up, int64_t gate_up_stride, uint16_t* out, int64_t out_stride, int64_t m) const;
  // h [n, hidden] (in place) = the mixture of experts `moe` of h's rows (MoeWeights' steps).
  void sparse_mlp(const MoeWeights& moe, uint16_t* h, int64_t n, Scratch& s) const;
  // The MLP's output h [n, hidden] made ready to join the residual stream: Gemma 3's
  // post-feedforward norm, Granite's residual_multiplier.
  void finish_mlp(const DecoderLayerWeights& w, uint16_t* h, int64_t n) const;
  void add_to_stream(uint16_t* h, uint16_t* x, int64_t n) const;  // x += h, then h = x
  // Expert e of `moe` on its chosen rows of h (s.expert_first's range), into s.choice_rows.
  void run_expert(const MoeWeights& moe, int64_t e, const uint16_t* h, Scratch& s, Scratch::ExpertRows& rows) const;
  // y [m, width] += the LoRA updates of x's rows by layer `index`'s `which` projection, for the
  // step's tokens that name an adapter (none: nothing to do).
  void add_lora(LoraLinear LoraLayer::*which, size_t index, uint16_t* y, int64_t y_stride, const uint16_t* x,
                int64_t x_stride, int64_t m, const int32_t* slots, Scratch& s) const;
  bool lora_touches(LoraLinear LoraLayer::*which, size_t index) const;  // some slot's adapter updates it
  void embed(const int32_t* ids, int64_t n, uint16_t* rows);   // scaled by embedding_multiplier
  void lookup(const int32_t* ids, int64_t n, uint16_t* rows);  // the rows (tensor parallelism: summed over the group)
  void all_reduce(uint16_t* rows, int64_t n);  // n rows of hidden, summed over the group (no-op alone)
  // q and k (rows qkv_size_ apart, in place) normed over each token's whole q and k rows, which are
  // gathered from the group's ranks (DecoderTensorParallel::q_whole).
  void gathered_qk_norm(const DecoderLayerWeights& w, uint16_t* q, uint16_t* k, int64_t n, Scratch& s);

  DecoderDims dims_;
  EmbeddingWeight embed_;
  std::vector<DecoderLayerWeights> layers_;
  const uint16_t* final_norm_;
  KVCacheShape cache_;
  DecoderTensorParallel tp_;
  std::vector<int32_t> local_ids_;  // tensor parallelism: the step's ids in this rank's rows
  int64_t q_size_, kv_size_, qkv_size_;
  std::vector<Scratch> scratch_ = std::vector<Scratch>(1);  // one per group of the step (groups_for); each run grows its own
  StepSplit split_;
  int64_t last_groups_ = 0;
  bool quantized_projections_ = true;
  std::vector<std::vector<LoraLayer>> lora_;  // by slot: an adapter's layers, or empty  // every layer's projections in a quantized GGUF type (groups_for)
};

}  // namespace corellm
