// Binds the CPU kernels into corellm._core.kernels. Kernels take raw addresses (torch's
// tensor.data_ptr()), sizes, strides and a dtype tag; python/corellm/ops checks the tensors first.
#include <omp.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/cpu_isa.h"
#include "corellm/kernels/elementwise.h"
#include "corellm/kernels/lora.h"
#include "corellm/kernels/moe.h"
#include "corellm/kernels/packed_gemm.h"
#include "corellm/kernels/paged_attention.h"
#include "corellm/kernels/quant_gemm.h"
#include "corellm/kernels/rejection_sampler.h"
#include "corellm/kernels/sampler.h"
#include "corellm/kernels/token_logprobs.h"
#include "glue.h"

namespace corellm::binding {
namespace {

// packed_gemm.h's XRows by name: "anywhere" or "by_thread".
XRows x_rows_named(const std::string& name) {
  CORELLM_CHECK_ARG(name == "anywhere" || name == "by_thread", "x_rows must be 'anywhere' or 'by_thread', got '",
                    name, "'");
  return name == "by_thread" ? XRows::kByThread : XRows::kAnywhere;
}

// SamplingBatch with named fields: corellm.ops.sample sets each array's address by its name (0
// for an absent one) and hands the batch to the CPU kernel, or to corellm._cuda's (which takes
// this very type).
void bind_sampling_batch(py::module_& k) {
  py::class_<SamplingBatch> b(k, "SamplingBatch", "The sampler's batch (sampler.h): sizes, and arrays by address");
  b.def(py::init<>())
      .def_readwrite("num_reqs", &SamplingBatch::num_reqs)
      .def_readwrite("vocab_size", &SamplingBatch::vocab_size)
      .def_readwrite("num_logprobs", &SamplingBatch::num_logprobs)
      .def_readwrite("bitmask_words", &SamplingBatch::bitmask_words);
  def_address(b, "logits", &SamplingBatch::logits);
  def_address(b, "temperature", &SamplingBatch::temperature);
  def_address(b, "top_k", &SamplingBatch::top_k);
  def_address(b, "top_p", &SamplingBatch::top_p);
  def_address(b, "min_p", &SamplingBatch::min_p);
  def_address(b, "seeds", &SamplingBatch::seeds);
  def_address(b, "steps", &SamplingBatch::steps);
  def_address(b, "presence_penalty", &SamplingBatch::presence_penalty);
  def_address(b, "frequency_penalty", &SamplingBatch::frequency_penalty);
  def_address(b, "repetition_penalty", &SamplingBatch::repetition_penalty);
  def_address(b, "output_offsets", &SamplingBatch::output_offsets);
  def_address(b, "output_ids", &SamplingBatch::output_ids);
  def_address(b, "prompt_offsets", &SamplingBatch::prompt_offsets);
  def_address(b, "prompt_ids", &SamplingBatch::prompt_ids);
  def_address(b, "bias_offsets", &SamplingBatch::bias_offsets);
  def_address(b, "bias_ids", &SamplingBatch::bias_ids);
  def_address(b, "bias_values", &SamplingBatch::bias_values);
  def_address(b, "banned_offsets", &SamplingBatch::banned_offsets);
  def_address(b, "banned_ids", &SamplingBatch::banned_ids);
  def_address(b, "bitmask", &SamplingBatch::bitmask);
  def_address(b, "bitmask_rows", &SamplingBatch::bitmask_rows);
  def_address(b, "sampled", &SamplingBatch::sampled);
  def_address(b, "sampled_logprob", &SamplingBatch::sampled_logprob);
  def_address(b, "sampled_rank", &SamplingBatch::sampled_rank);
  def_address(b, "top_ids", &SamplingBatch::top_ids);
  def_address(b, "top_logprobs", &SamplingBatch::top_logprobs);
}

void bind_rejection_batch(py::module_& k) {
  py::class_<RejectionBatch> b(k, "RejectionBatch", "The rejection sampler's arrays, by name (addresses; 0: null)");
  b.def(py::init<>());
  b.def_readwrite("num_reqs", &RejectionBatch::num_reqs);
  b.def_readwrite("width", &RejectionBatch::width);
  def_address(b, "num_draft_tokens", &RejectionBatch::num_draft_tokens);
  def_address(b, "draft_token_ids", &RejectionBatch::draft_token_ids);
  def_address(b, "target_token_ids", &RejectionBatch::target_token_ids);
  def_address(b, "output_token_ids", &RejectionBatch::output_token_ids);
}

}  // namespace

void bind_kernels(py::module_& m) {
  using py::arg;
  auto k = m.def_submodule("kernels", "CPU kernels on raw tensor addresses (use corellm.ops instead)");
  k.attr("DTYPE_F32") = static_cast<int32_t>(DType::F32);
  k.attr("DTYPE_BF16") = static_cast<int32_t>(DType::BF16);
  k.attr("KV_MODEL_DTYPE") = static_cast<int32_t>(KVCacheElement::kModelDType);
  k.attr("KV_FP8_E4M3") = static_cast<int32_t>(KVCacheElement::kFp8E4M3);
  k.attr("KV_FP8_E5M2") = static_cast<int32_t>(KVCacheElement::kFp8E5M2);

  k.def("rms_norm",
        [](uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, uintptr_t w, int64_t n,
           int64_t hidden, float eps, int32_t dtype) {
          rms_norm(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, ptr<const void>(w), n, hidden,
                   eps, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("fused_add_rms_norm",
        [](uintptr_t x, int64_t x_stride, uintptr_t res, int64_t res_stride, uintptr_t w, int64_t n,
           int64_t hidden, float eps, int32_t dtype) {
          fused_add_rms_norm(ptr<void>(x), x_stride, ptr<void>(res), res_stride, ptr<const void>(w), n,
                             hidden, eps, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("scale",
        [](uintptr_t x, int64_t x_stride, int64_t n, int64_t d, float factor, int32_t dtype) {
          scale(ptr<void>(x), x_stride, n, d, factor, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("silu_and_mul",
        [](uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t n, int64_t d,
           int32_t dtype) {
          silu_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, n, d, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("swigluoai_and_mul",
        [](uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t n, int64_t d, int32_t dtype,
           float alpha, float limit) {
          swigluoai_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, n, d, alpha, limit,
                            dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("lora_add",
        [](uintptr_t y, int64_t y_stride, uintptr_t x, int64_t x_stride, int64_t m, uintptr_t slots,
           const std::vector<const LoraLinear*>& by_slot, int64_t n, int32_t dtype, const std::string& isa) {
          for (const LoraLinear* lora : by_slot) {
            if (lora != nullptr) lora->check("lora_add", n);
          }
          lora_add(ptr<void>(y), y_stride, ptr<const void>(x), x_stride, m, ptr<const int32_t>(slots), by_slot.data(),
                   static_cast<int64_t>(by_slot.size()), dtype_of(dtype), isa.empty() ? cpu_isa() : cpu_isa_named(isa));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("moe_route",
        [](uintptr_t logits, int64_t logits_stride, int64_t m, int64_t num_experts, int64_t top_k, bool renormalize,
           uintptr_t expert_ids, uintptr_t expert_weights, uintptr_t selection_bias, float renormalize_min) {
          moe_route(ptr<const float>(logits), logits_stride, m, num_experts, top_k, renormalize,
                    ptr<int32_t>(expert_ids), ptr<float>(expert_weights), ptr<const float>(selection_bias),
                    renormalize_min);
        },
        py::arg("logits"), py::arg("logits_stride"), py::arg("m"), py::arg("num_experts"), py::arg("top_k"),
        py::arg("renormalize"), py::arg("expert_ids"), py::arg("expert_weights"), py::arg("selection_bias") = 0,
        py::arg("renormalize_min") = 0.0f, py::call_guard<py::gil_scoped_release>());
  k.def("moe_combine",
        [](uintptr_t out, int64_t out_stride, uintptr_t rows, int64_t rows_stride, uintptr_t weights, int64_t m,
           int64_t top_k, int64_t hidden, int32_t dtype, uintptr_t shared_rows, int64_t shared_stride,
           uintptr_t shared_gate) {
          moe_combine(ptr<void>(out), out_stride, ptr<const void>(rows), rows_stride, ptr<const float>(weights), m,
                      top_k, hidden, dtype_of(dtype),
                      MoeSharedExpert{ptr<const void>(shared_rows), shared_stride, ptr<const float>(shared_gate)});
        },
        py::arg("out"), py::arg("out_stride"), py::arg("rows"), py::arg("rows_stride"), py::arg("weights"),
        py::arg("m"), py::arg("top_k"), py::arg("hidden"), py::arg("dtype"), py::arg("shared_rows") = 0,
        py::arg("shared_stride") = 0, py::arg("shared_gate") = 0,
        py::call_guard<py::gil_scoped_release>());
  k.def("gelu_tanh_and_mul",
        [](uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t n, int64_t d,
           int32_t dtype) {
          gelu_tanh_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, n, d, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("rotary_embedding",
        [](uintptr_t positions, uintptr_t q, int64_t q_stride, uintptr_t kk, int64_t k_stride,
           uintptr_t cache, int64_t max_position, int64_t n, int64_t num_heads, int64_t num_kv_heads,
           int64_t head_size, int64_t rot_dim, bool is_neox, int32_t dtype) {
          rotary_embedding(ptr<const int32_t>(positions), ptr<void>(q), q_stride, ptr<void>(kk), k_stride,
                           ptr<const float>(cache), max_position, n, num_heads, num_kv_heads, head_size,
                           rot_dim, is_neox, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("reshape_and_cache",
        [](uintptr_t key, int64_t key_stride, uintptr_t value, int64_t value_stride, uintptr_t key_cache,
           uintptr_t value_cache, uintptr_t slot_mapping, int64_t n, int64_t num_blocks, int64_t num_kv_heads,
           int64_t head_size, int64_t block_size, int32_t dtype, int32_t kv_element) {
          reshape_and_cache(ptr<const void>(key), key_stride, ptr<const void>(value), value_stride,
                            ptr<void>(key_cache), ptr<void>(value_cache), ptr<const int32_t>(slot_mapping), n,
                            {num_blocks, num_kv_heads, head_size, block_size, kv_element_of(kv_element)},
                            dtype_of(dtype));
        },
        arg("key"), arg("key_stride"), arg("value"), arg("value_stride"), arg("key_cache"), arg("value_cache"),
        arg("slot_mapping"), arg("n"), arg("num_blocks"), arg("num_kv_heads"), arg("head_size"), arg("block_size"),
        arg("dtype"), arg("kv_element") = static_cast<int32_t>(KVCacheElement::kModelDType),
        py::call_guard<py::gil_scoped_release>());
  k.def("paged_attention",
        [](uintptr_t out, uintptr_t q, int64_t q_stride, uintptr_t key_cache, uintptr_t value_cache,
           int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
           uintptr_t block_table, int64_t block_table_stride, uintptr_t seq_lens, uintptr_t query_start_loc,
           int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int32_t dtype,
           const std::string& isa, float softcap, uintptr_t sinks, int32_t kv_element, bool causal) {
          PagedAttentionArgs a{ptr<void>(out), ptr<const void>(q), q_stride, ptr<const void>(key_cache),
                               ptr<const void>(value_cache),
                               {num_blocks, num_kv_heads, head_size, block_size, kv_element_of(kv_element)},
                               ptr<const int32_t>(block_table), block_table_stride, ptr<const int32_t>(seq_lens),
                               ptr<const int32_t>(query_start_loc), num_seqs, num_heads, scale, sliding_window,
                               dtype_of(dtype), isa.empty() ? cpu_isa() : cpu_isa_named(isa), softcap,
                               ptr<const float>(sinks), causal};
          paged_attention(a);
        },
        arg("out"), arg("q"), arg("q_stride"), arg("key_cache"), arg("value_cache"), arg("num_blocks"),
        arg("num_kv_heads"), arg("head_size"), arg("block_size"), arg("block_table"), arg("block_table_stride"),
        arg("seq_lens"), arg("query_start_loc"), arg("num_seqs"), arg("num_heads"), arg("scale"),
        arg("sliding_window"), arg("dtype"), arg("isa") = std::string(), arg("softcap") = 0.0f,
        arg("sinks") = uintptr_t{0}, arg("kv_element") = static_cast<int32_t>(KVCacheElement::kModelDType),
        arg("causal") = true, py::call_guard<py::gil_scoped_release>());
  bind_sampling_batch(k);
  k.def("sample", &sample, arg("batch"), py::call_guard<py::gil_scoped_release>());
  k.def("philox_uniform", &philox_uniform, arg("seed"), arg("counter"));
  k.def("token_logprobs",
        [](uintptr_t logits, int64_t num_rows, int64_t vocab_size, uintptr_t token_ids, int64_t num_top,
           uintptr_t logprobs, uintptr_t ranks, uintptr_t top_ids, uintptr_t top_logprobs) {
          TokenLogprobsBatch b;
          b.num_rows = num_rows;
          b.vocab_size = vocab_size;
          b.logits = ptr<const float>(logits);
          b.token_ids = ptr<const int32_t>(token_ids);
          b.num_top = num_top;
          b.logprobs = ptr<float>(logprobs);
          b.ranks = ptr<int32_t>(ranks);
          b.top_ids = ptr<int32_t>(top_ids);
          b.top_logprobs = ptr<float>(top_logprobs);
          token_logprobs(b);
        },
        arg("logits"), arg("num_rows"), arg("vocab_size"), arg("token_ids"), arg("num_top"), arg("logprobs"),
        arg("ranks"), arg("top_ids"), arg("top_logprobs"), py::call_guard<py::gil_scoped_release>());
  bind_rejection_batch(k);
  k.def("rejection_sample", &rejection_sample, arg("batch"), py::call_guard<py::gil_scoped_release>());
  k.def("supported_cpu_isas", [] {
    std::vector<std::string> names;
    for (CpuIsa isa : supported_cpu_isas()) names.emplace_back(cpu_isa_name(isa));
    return names;
  }, "The instruction-set paths this CPU runs, best last.");
  k.def("cpu_isa", [] { return std::string(cpu_isa_name(cpu_isa())); },
        "The process's path: CORELLM_ISA if set, else the best this CPU runs (ValueError when it runs none).");
  k.def("cpu_model_name", &cpu_model_name);
  k.def("openmp_threads", [] { return omp_get_max_threads(); },
        "The OpenMP team the CPU kernels run on (OMP_NUM_THREADS, else one per core).");
  k.def("cpu_is_amd", &cpu_is_amd, "True on an AMD CPU (CPUID vendor AuthenticAMD).");
  k.def("bf16_dot_peak", [](const std::string& isa, int64_t iterations) { return bf16_dot_peak(cpu_isa_named(isa), iterations); },
        arg("isa"), arg("iterations"), py::call_guard<py::gil_scoped_release>());
  k.def("bf16_gemm_available", &bf16_gemm_available);
  k.def("bf16_gemm_packed_size", &bf16_gemm_packed_size, arg("n"), arg("k"));
  k.def("bf16_gemm_pack",
        [](uintptr_t w, uintptr_t packed, int64_t n, int64_t kk) {
          bf16_gemm_pack(ptr<const uint16_t>(w), ptr<uint16_t>(packed), n, kk);
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("quant_type_supported", &quant_type_supported, arg("ggml_type"));
  k.def("quant_type_name", [](int32_t t) { return std::string(quant_type_name(quant_type_of(t))); }, arg("ggml_type"));
  k.def("quant_block_elements", [](int32_t t) { return quant_block_elements(quant_type_of(t)); }, arg("ggml_type"));
  k.def("quant_block_bytes", [](int32_t t) { return quant_block_bytes(quant_type_of(t)); }, arg("ggml_type"));
  k.def("quant_path", [] { return std::string(quant_path_name(quant_path())); },
        "quant_gemm's path on this CPU: amx, avx512vnni or avx2 (CORELLM_ISA forces a lower one).");
  k.def("quant_gemm_packed_size", [](int32_t t, int64_t n, int64_t kk) { return quant_gemm_packed_size(quant_type_of(t), n, kk); },
        arg("ggml_type"), arg("n"), arg("k"));
  k.def("quant_gemm_pack",
        [](int32_t t, uintptr_t rows, uintptr_t packed, int64_t n, int64_t kk, uintptr_t row_order) {
          quant_gemm_pack(quant_type_of(t), ptr<const uint8_t>(rows), ptr<uint8_t>(packed), n, kk,
                          ptr<const int32_t>(row_order));
        },
        arg("ggml_type"), arg("rows"), arg("packed"), arg("n"), arg("k"), arg("row_order") = 0,
        py::call_guard<py::gil_scoped_release>());
  k.def("quant_gemm",
        [](uintptr_t x, int64_t x_stride, int32_t x_dtype, int32_t t, uintptr_t packed, uintptr_t bias, uintptr_t y,
           int64_t y_stride, int32_t y_dtype, int64_t m, int64_t n, int64_t kk, const std::string& path) {
          QuantGemmArgs a;
          a.x = ptr<const void>(x);
          a.x_stride = x_stride;
          a.x_dtype = dtype_of(x_dtype);
          a.type = quant_type_of(t);
          a.packed = ptr<const uint8_t>(packed);
          a.bias = ptr<const uint16_t>(bias);
          a.y = ptr<void>(y);
          a.y_stride = y_stride;
          a.y_dtype = dtype_of(y_dtype);
          a.m = m;
          a.n = n;
          a.k = kk;
          quant_gemm(a, path.empty() ? quant_path() : quant_path_named(path));
        },
        arg("x"), arg("x_stride"), arg("x_dtype"), arg("ggml_type"), arg("packed"), arg("bias"), arg("y"),
        arg("y_stride"), arg("y_dtype"), arg("m"), arg("n"), arg("k"), arg("path") = std::string(),
        py::call_guard<py::gil_scoped_release>());
  k.def("quant_dequantize_rows",
        [](int32_t t, uintptr_t packed, int64_t n, int64_t kk, uintptr_t ids, int64_t count, uintptr_t out,
           int32_t out_dtype) {
          quant_dequantize_rows(quant_type_of(t), ptr<const uint8_t>(packed), n, kk, ptr<const int32_t>(ids), count,
                                ptr<void>(out), dtype_of(out_dtype));
        },
        arg("ggml_type"), arg("packed"), arg("n"), arg("k"), arg("ids"), arg("count"), arg("out"), arg("out_dtype"),
        py::call_guard<py::gil_scoped_release>());
  k.def("bf16_gemm",
        [](uintptr_t x, int64_t x_stride, uintptr_t packed, uintptr_t bias, uintptr_t y, int64_t y_stride, int64_t m,
           int64_t n, int64_t kk, int32_t y_dtype, const std::string& isa, const std::string& x_rows) {
          bf16_gemm(ptr<const uint16_t>(x), x_stride, ptr<const uint16_t>(packed), ptr<const uint16_t>(bias),
                    ptr<void>(y), y_stride, m, n, kk, dtype_of(y_dtype), isa.empty() ? cpu_isa() : cpu_isa_named(isa),
                    x_rows_named(x_rows));
        },
        arg("x"), arg("x_stride"), arg("packed"), arg("bias"), arg("y"), arg("y_stride"), arg("m"), arg("n"), arg("k"),
        arg("y_dtype") = static_cast<int32_t>(DType::BF16), arg("isa") = std::string(),
        arg("x_rows") = std::string("anywhere"), py::call_guard<py::gil_scoped_release>());
  k.def("bf16_gemm_gelu_fused", [](const std::string& isa) {
        return bf16_gemm_gelu_fused(isa.empty() ? cpu_isa() : cpu_isa_named(isa));
      }, arg("isa") = std::string());
  k.def("bf16_gemm_gelu",
        [](uintptr_t x, int64_t x_stride, uintptr_t packed, uintptr_t bias, uintptr_t y, int64_t y_stride, int64_t m,
           int64_t n, int64_t kk, const std::string& isa, const std::string& x_rows) {
          bf16_gemm_gelu(ptr<const uint16_t>(x), x_stride, ptr<const uint16_t>(packed), ptr<const uint16_t>(bias),
                         ptr<uint16_t>(y), y_stride, m, n, kk, isa.empty() ? cpu_isa() : cpu_isa_named(isa),
                         x_rows_named(x_rows));
        },
        arg("x"), arg("x_stride"), arg("packed"), arg("bias"), arg("y"), arg("y_stride"), arg("m"), arg("n"), arg("k"),
        arg("isa") = std::string(), arg("x_rows") = std::string("anywhere"), py::call_guard<py::gil_scoped_release>());
  k.def("bf16_gemm_gated_fused", [](int64_t n, const std::string& isa) {
        return bf16_gemm_gated_fused(isa.empty() ? cpu_isa() : cpu_isa_named(isa), n);
      }, arg("n"), arg("isa") = std::string());
  k.def("bf16_gemm_gated",
        [](uintptr_t x, int64_t x_stride, uintptr_t packed, uintptr_t bias, uintptr_t out, int64_t out_stride,
           int64_t m, int64_t n, int64_t kk, const std::string& activation, const std::string& isa,
           const std::string& x_rows) {
          CORELLM_CHECK_ARG(activation == "silu" || activation == "gelu_tanh" || activation == "gelu",
                            "bf16_gemm_gated: activation must be 'silu', 'gelu_tanh' or 'gelu', got '", activation,
                            "'");
          const GatedActivation act = activation == "silu"      ? GatedActivation::kSilu
                                      : activation == "gelu_tanh" ? GatedActivation::kGeluTanh
                                                                  : GatedActivation::kGeluErf;
          bf16_gemm_gated(ptr<const uint16_t>(x), x_stride, ptr<const uint16_t>(packed), ptr<const uint16_t>(bias),
                          ptr<uint16_t>(out), out_stride, m, n, kk, act, isa.empty() ? cpu_isa() : cpu_isa_named(isa),
                          x_rows_named(x_rows));
        },
        arg("x"), arg("x_stride"), arg("packed"), arg("bias"), arg("out"), arg("out_stride"), arg("m"), arg("n"),
        arg("k"), arg("activation") = std::string("silu"), arg("isa") = std::string(),
        arg("x_rows") = std::string("anywhere"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace corellm::binding
