// Binds the native models into corellm._core.model: the decoder stack, built from its dimensions,
// its KV cache's shape and one struct of named weight addresses per layer
// (python/corellm/model/native_stack.py fills them from a loaded model).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <vector>

#include "corellm/kernels/lora.h"
#include "corellm/kernels/paged_attention.h"
#include "corellm/model/decoder_stack.h"
#include "glue.h"

namespace corellm::binding {

void bind_model(py::module_& m) {
  using py::arg;
  auto model = m.def_submodule("model", "Native models over the CPU kernels (use corellm.model instead)");

  py::class_<DecoderDims> dims(model, "DecoderDims", "A decoder's dimensions and attention constants");
  dims.def(py::init<>())
      .def_readwrite("vocab_size", &DecoderDims::vocab_size)
      .def_readwrite("hidden", &DecoderDims::hidden)
      .def_readwrite("num_heads", &DecoderDims::num_heads)
      .def_readwrite("num_kv_heads", &DecoderDims::num_kv_heads)
      .def_readwrite("head_size", &DecoderDims::head_size)
      .def_readwrite("intermediate", &DecoderDims::intermediate)
      .def_readwrite("eps", &DecoderDims::eps)
      .def_readwrite("scale", &DecoderDims::scale)
      .def_readwrite("attn_softcap", &DecoderDims::attn_softcap)
      .def_readwrite("swiglu_alpha", &DecoderDims::swiglu_alpha)
      .def_readwrite("swiglu_limit", &DecoderDims::swiglu_limit)
      .def_readwrite("max_position", &DecoderDims::max_position)
      .def_readwrite("rot_dim", &DecoderDims::rot_dim)
      .def_readwrite("activation", &DecoderDims::activation)
      .def_readwrite("embedding_multiplier", &DecoderDims::embedding_multiplier)
      .def_readwrite("residual_multiplier", &DecoderDims::residual_multiplier)
      .def_readwrite("qk_norm_whole", &DecoderDims::qk_norm_whole)
      .def_readwrite("rope_interleaved", &DecoderDims::rope_interleaved);
  py::enum_<GatedActivation>(model, "GatedActivation", "The MLP's gated activation")
      .value("SILU", GatedActivation::kSilu)
      .value("GELU_TANH", GatedActivation::kGeluTanh)
      .value("SWIGLU_OAI", GatedActivation::kSwigluOai);

  model.attr("BF16_PACKED") = kBf16Packed;
  py::class_<LinearPart> part(model, "LinearPart", "Rows of a linear weight, packed for one GEMM (linear_weight.h)");
  part.def(py::init<>())
      .def_readwrite("ggml_type", &LinearPart::ggml_type)
      .def_readwrite("row_offset", &LinearPart::row_offset)
      .def_readwrite("rows", &LinearPart::rows);
  def_address(part, "data", &LinearPart::data);
  py::class_<LinearWeight> linear(model, "LinearWeight", "A linear layer's packed parts and bias (linear_weight.h)");
  linear.def(py::init<>())
      .def_readwrite("parts", &LinearWeight::parts)
      .def_readwrite("n", &LinearWeight::n)
      .def_readwrite("k", &LinearWeight::k);
  def_address(linear, "bias", &LinearWeight::bias);
  py::class_<EmbeddingWeight> embedding(model, "EmbeddingWeight", "The embedding table: bf16 rows or quantized");
  embedding.def(py::init<>()).def_readwrite("ggml_type", &EmbeddingWeight::ggml_type);
  def_address(embedding, "data", &EmbeddingWeight::data);

  py::class_<MoeWeights>(model, "MoeWeights", "A layer's mixture of experts: router and experts (decoder_stack.h)")
      .def(py::init<>())
      .def_readwrite("router", &MoeWeights::router)
      .def_readwrite("gate_up", &MoeWeights::gate_up)
      .def_readwrite("down", &MoeWeights::down)
      .def_readwrite("top_k", &MoeWeights::top_k)
      .def_readwrite("renormalize", &MoeWeights::renormalize)
      .def_readwrite("renormalize_min", &MoeWeights::renormalize_min)
      .def_readwrite("selection_bias", &MoeWeights::selection_bias)
      .def_readwrite("intermediate", &MoeWeights::intermediate)
      .def_readwrite("shared_gate_up", &MoeWeights::shared_gate_up)
      .def_readwrite("shared_down", &MoeWeights::shared_down)
      .def_readwrite("shared_gate", &MoeWeights::shared_gate)
      .def_readwrite("shared_intermediate", &MoeWeights::shared_intermediate);
  py::class_<DecoderLayerWeights> layer(model, "DecoderLayerWeights",
                                        "One layer's weights and KV cache, by address (0: absent)");
  layer.def(py::init<>())
      .def_readwrite("qkv", &DecoderLayerWeights::qkv)
      .def_readwrite("o", &DecoderLayerWeights::o)
      .def_readwrite("gate_up", &DecoderLayerWeights::gate_up)
      .def_readwrite("down", &DecoderLayerWeights::down)
      .def_readwrite("moe", &DecoderLayerWeights::moe)
      .def_readwrite("sliding_window", &DecoderLayerWeights::sliding_window);
  def_address(layer, "input_norm", &DecoderLayerWeights::input_norm);
  def_address(layer, "post_attention_norm", &DecoderLayerWeights::post_attention_norm);
  def_address(layer, "attention_output_norm", &DecoderLayerWeights::attention_output_norm);
  def_address(layer, "mlp_output_norm", &DecoderLayerWeights::mlp_output_norm);
  def_address(layer, "cos_sin_cache", &DecoderLayerWeights::cos_sin_cache);
  def_address(layer, "sinks", &DecoderLayerWeights::sinks);
  def_address(layer, "q_norm", &DecoderLayerWeights::q_norm);
  def_address(layer, "k_norm", &DecoderLayerWeights::k_norm);
  def_address(layer, "key_cache", &DecoderLayerWeights::key_cache);
  def_address(layer, "value_cache", &DecoderLayerWeights::value_cache);

  py::class_<LoraPart> lora_part(model, "LoraPart", "One LoRA adapter's update of some output columns (kernels/lora.h)");
  lora_part.def(py::init<>())
      .def_readwrite("rank", &LoraPart::rank)
      .def_readwrite("scale", &LoraPart::scale)
      .def_property("weight_dtype", [](const LoraPart& p) { return static_cast<int32_t>(p.weight_dtype); },
                    [](LoraPart& p, int32_t tag) { p.weight_dtype = dtype_of(tag); },
                    "a_t's and b_t's dtype tag (corellm._core.kernels.DTYPE_F32 or DTYPE_BF16)")
      .def_readwrite("col_offset", &LoraPart::col_offset)
      .def_readwrite("cols", &LoraPart::cols);
  def_address(lora_part, "a_t", &LoraPart::a_t);
  def_address(lora_part, "b_t", &LoraPart::b_t);
  py::class_<LoraLinear>(model, "LoraLinear", "One LoRA adapter's update of one projection (kernels/lora.h)")
      .def(py::init<>())
      .def_readwrite("parts", &LoraLinear::parts)
      .def_readwrite("k", &LoraLinear::k);
  py::class_<LoraLayer>(model, "LoraLayer", "One LoRA adapter's updates of one layer (decoder_stack.h)")
      .def(py::init<>())
      .def_readwrite("qkv", &LoraLayer::qkv)
      .def_readwrite("o", &LoraLayer::o)
      .def_readwrite("gate_up", &LoraLayer::gate_up)
      .def_readwrite("down", &LoraLayer::down);

  py::class_<KVCacheShape>(model, "KVCacheShape", "The paged KV cache's extents and element (paged_attention.h)")
      .def(py::init([](int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
                       int32_t element) {
             return KVCacheShape{num_blocks, num_kv_heads, head_size, block_size, kv_element_of(element)};
           }),
           py::kw_only(), arg("num_blocks"), arg("num_kv_heads"), arg("head_size"), arg("block_size"),
           arg("element") = static_cast<int32_t>(KVCacheElement::kModelDType))
      .def_property_readonly("element", [](const KVCacheShape& c) { return static_cast<int32_t>(c.element); })
      .def_readonly("num_blocks", &KVCacheShape::num_blocks)
      .def_readonly("num_kv_heads", &KVCacheShape::num_kv_heads)
      .def_readonly("head_size", &KVCacheShape::head_size)
      .def_readonly("block_size", &KVCacheShape::block_size);

  py::class_<DecoderStack>(model, "DecoderStack", "A decoder stack run for a step's tokens in one call (decoder_stack.h)")
      .def(py::init([](const DecoderDims& dims, const EmbeddingWeight& embed, std::vector<DecoderLayerWeights> layers,
                       uintptr_t final_norm, const KVCacheShape& cache, ShmAllReduce* all_reduce, int64_t vocab_start,
                       double timeout_s, std::optional<std::tuple<int64_t, int64_t, int64_t, int64_t, bool>> qk_whole) {
             DecoderTensorParallel tp{all_reduce, vocab_start, timeout_s};
             if (qk_whole) std::tie(tp.q_start, tp.q_whole, tp.k_start, tp.kv_whole, tp.writes_k) = *qk_whole;
             return new DecoderStack(dims, embed, std::move(layers), ptr<const uint16_t>(final_norm), cache, tp);
           }),
           py::kw_only(), arg("dims"), arg("embed"), arg("layers"), arg("final_norm"), arg("cache"),
           arg("all_reduce") = nullptr, arg("vocab_start") = 0, arg("timeout_s") = 60.0,
           arg("qk_whole") = py::none(),
           py::keep_alive<1, 7>())
      .def("forward",
           [](DecoderStack& s, uintptr_t input_ids, uintptr_t positions, int64_t num_tokens, uintptr_t slot_mapping,
              uintptr_t block_table, int64_t block_table_stride, uintptr_t seq_lens, uintptr_t query_start_loc,
              int64_t num_seqs, uintptr_t out, uintptr_t inputs_embeds, uintptr_t lora_slots) {
             DecoderStepArgs step;
             step.input_ids = ptr<const int32_t>(input_ids);
             step.inputs_embeds = ptr<const uint16_t>(inputs_embeds);
             step.positions = ptr<const int32_t>(positions);
             step.num_tokens = num_tokens;
             step.slot_mapping = ptr<const int32_t>(slot_mapping);
             step.block_table = ptr<const int32_t>(block_table);
             step.block_table_stride = block_table_stride;
             step.seq_lens = ptr<const int32_t>(seq_lens);
             step.query_start_loc = ptr<const int32_t>(query_start_loc);
             step.num_seqs = num_seqs;
             step.lora_slots = ptr<const int32_t>(lora_slots);
             step.out = ptr<uint16_t>(out);
             s.forward(step);
           },
           py::kw_only(), arg("input_ids"), arg("positions"), arg("num_tokens"), arg("slot_mapping"),
           arg("block_table"), arg("block_table_stride"), arg("seq_lens"), arg("query_start_loc"), arg("num_seqs"),
           arg("out"), arg("inputs_embeds") = 0, arg("lora_slots") = 0, py::call_guard<py::gil_scoped_release>())
      .def("set_lora", &DecoderStack::set_lora, py::kw_only(), arg("slot"), arg("layers"),
           "Slot `slot`'s LoRA adapter, one LoraLayer per layer (its matrices must outlive its use)")
      .def_property_readonly("last_groups", &DecoderStack::last_groups,
                             "How many groups of sequences the last forward cut its step into, each run by one "
                             "thread (1: the whole step on the whole team; 0 before the first)");
}

}  // namespace corellm::binding
