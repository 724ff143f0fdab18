// The binding of corellm._cuda: the CUDA launchers on raw device addresses (use corellm.ops, which
// checks the tensors and passes torch's current stream). Built only when nvcc is found.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <iterator>

#include "corellm/check.h"
#include "corellm/kernels/sampler.h"
#include "kernels.h"

namespace py = pybind11;
using corellm::cuda::DType;
using corellm::cuda::ScaledType;

namespace {

template <class P>
P* ptr(std::uintptr_t address) {
  return reinterpret_cast<P*>(address);
}

DType dtype_of(int32_t tag) {
  CORELLM_CHECK_ARG(tag == static_cast<int32_t>(DType::F32) || tag == static_cast<int32_t>(DType::BF16) ||
                        tag == static_cast<int32_t>(DType::F16),
                    "unknown dtype tag ", tag, " (the CUDA kernels take F32, BF16 or F16)");
  return static_cast<DType>(tag);
}

ScaledType scaled_type_of(int32_t tag) {
  CORELLM_CHECK_ARG(tag == static_cast<int32_t>(ScaledType::FP8_E4M3) || tag == static_cast<int32_t>(ScaledType::INT8),
                    "unknown scaled type tag ", tag, " (SCALED_FP8_E4M3 or SCALED_INT8)");
  return static_cast<ScaledType>(tag);
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "corellm's CUDA kernels on raw device addresses (use corellm.ops instead)";
  m.attr("DTYPE_F32") = static_cast<int32_t>(DType::F32);
  m.attr("DTYPE_BF16") = static_cast<int32_t>(DType::BF16);
  m.attr("DTYPE_F16") = static_cast<int32_t>(DType::F16);
  py::tuple head_sizes(std::size(corellm::cuda::kAttentionHeadSizes));
  for (size_t i = 0; i < std::size(corellm::cuda::kAttentionHeadSizes); ++i) {
    head_sizes[i] = corellm::cuda::kAttentionHeadSizes[i];
  }
  m.attr("ATTENTION_HEAD_SIZES") = head_sizes;  // paged_attention's (corellm.ops checks models against them)
  m.attr("SCALED_FP8_E4M3") = static_cast<int32_t>(ScaledType::FP8_E4M3);
  m.attr("SCALED_INT8") = static_cast<int32_t>(ScaledType::INT8);
  const auto release = py::call_guard<py::gil_scoped_release>();

  m.def("rms_norm", [](std::uintptr_t out, int64_t out_stride, std::uintptr_t x, int64_t x_stride, std::uintptr_t w,
                       int64_t num_tokens, int64_t hidden, float eps, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::rms_norm(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, ptr<const void>(w), num_tokens,
                            hidden, eps, dtype_of(dtype), stream);
  }, release);
  m.def("fused_add_rms_norm", [](std::uintptr_t x, int64_t x_stride, std::uintptr_t residual, int64_t residual_stride,
                                 std::uintptr_t w, int64_t num_tokens, int64_t hidden, float eps, int32_t dtype,
                                 std::uintptr_t stream) {
    corellm::cuda::fused_add_rms_norm(ptr<void>(x), x_stride, ptr<void>(residual), residual_stride, ptr<const void>(w),
                                      num_tokens, hidden, eps, dtype_of(dtype), stream);
  }, release);
  m.def("silu_and_mul", [](std::uintptr_t out, int64_t out_stride, std::uintptr_t x, int64_t x_stride,
                           int64_t num_tokens, int64_t d, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::silu_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, num_tokens, d,
                                dtype_of(dtype), stream);
  }, release);
  m.def("gelu_tanh_and_mul", [](std::uintptr_t out, int64_t out_stride, std::uintptr_t x, int64_t x_stride,
                                int64_t num_tokens, int64_t d, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::gelu_tanh_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, num_tokens, d,
                                     dtype_of(dtype), stream);
  }, release);
  m.def("rotary_embedding", [](std::uintptr_t positions, std::uintptr_t q, int64_t q_stride, std::uintptr_t k,
                               int64_t k_stride, std::uintptr_t cache, int64_t max_position, int64_t num_tokens,
                               int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t rot_dim,
                               bool is_neox, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::rotary_embedding(ptr<const int32_t>(positions), ptr<void>(q), q_stride, ptr<void>(k), k_stride,
                                    ptr<const float>(cache), max_position, num_tokens, num_heads, num_kv_heads,
                                    head_size, rot_dim, is_neox, dtype_of(dtype), stream);
  }, release);
  m.def("reshape_and_cache", [](std::uintptr_t key, int64_t key_stride, std::uintptr_t value, int64_t value_stride,
                                std::uintptr_t key_cache, std::uintptr_t value_cache, std::uintptr_t slot_mapping,
                                int64_t num_tokens, int64_t num_blocks, int64_t num_kv_heads, int64_t head_size,
                                int64_t block_size, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::reshape_and_cache(ptr<const void>(key), key_stride, ptr<const void>(value), value_stride,
                                     ptr<void>(key_cache), ptr<void>(value_cache), ptr<const int32_t>(slot_mapping),
                                     num_tokens, num_blocks, num_kv_heads, head_size, block_size, dtype_of(dtype),
                                     stream);
  }, release);
  m.def("paged_attention", [](std::uintptr_t out, std::uintptr_t q, int64_t q_stride, std::uintptr_t key_cache,
                              std::uintptr_t value_cache, int64_t num_blocks, int64_t num_kv_heads, int64_t head_size,
                              int64_t block_size, std::uintptr_t block_table, int64_t block_table_stride,
                              std::uintptr_t seq_lens, std::uintptr_t query_start_loc, int64_t num_seqs,
                              int64_t num_heads, float scale, int64_t sliding_window, int32_t dtype,
                              int64_t max_query_len, int64_t max_seq_len, std::uintptr_t workspace,
                              std::uintptr_t stream) {
    corellm::cuda::paged_attention(ptr<void>(out), ptr<const void>(q), q_stride, ptr<const void>(key_cache),
                                   ptr<const void>(value_cache), num_blocks, num_kv_heads, head_size, block_size,
                                   ptr<const int32_t>(block_table), block_table_stride, ptr<const int32_t>(seq_lens),
                                   ptr<const int32_t>(query_start_loc), num_seqs, num_heads, scale, sliding_window,
                                   max_query_len, max_seq_len, ptr<void>(workspace), dtype_of(dtype), stream);
  }, release);
  m.def("paged_attention_workspace_size", [](int64_t num_seqs, int64_t num_heads, int64_t num_kv_heads,
                                             int64_t head_size, int64_t block_size, int64_t max_query_len,
                                             int64_t max_seq_len, int32_t dtype) {
    return corellm::cuda::paged_attention_workspace_size(num_seqs, num_heads, num_kv_heads, head_size, block_size,
                                                         max_query_len, max_seq_len, dtype_of(dtype));
  });
  m.def("scaled_gemm_built", &corellm::cuda::scaled_gemm_built);
  m.def("scaled_gemm", [](int32_t type, std::uintptr_t a, std::uintptr_t b, std::uintptr_t a_scales,
                          bool a_scales_per_row, std::uintptr_t b_scales, bool b_scales_per_column, std::uintptr_t out,
                          int64_t out_stride, int64_t m, int64_t n, int64_t k, std::uintptr_t stream) {
    corellm::cuda::ScaledGemmProblem problem;
    problem.type = scaled_type_of(type);
    problem.a = ptr<const void>(a);
    problem.b = ptr<const void>(b);
    problem.a_scales = ptr<const float>(a_scales);
    problem.a_scales_per_row = a_scales_per_row;
    problem.b_scales = ptr<const float>(b_scales);
    problem.b_scales_per_column = b_scales_per_column;
    problem.out = ptr<void>(out);
    problem.out_stride = out_stride;
    problem.m = m;
    problem.n = n;
    problem.k = k;
    corellm::cuda::scaled_gemm(problem, stream);
  }, py::kw_only(), py::arg("type"), py::arg("a"), py::arg("b"), py::arg("a_scales"), py::arg("a_scales_per_row"),
     py::arg("b_scales"), py::arg("b_scales_per_column"), py::arg("out"), py::arg("out_stride"), py::arg("m"),
     py::arg("n"), py::arg("k"), py::arg("stream"), release);
  m.def("quantize_rows", [](std::uintptr_t q, std::uintptr_t scales, std::uintptr_t x, int64_t x_stride, int64_t m,
                            int64_t k, int32_t type, int32_t dtype, std::uintptr_t stream) {
    corellm::cuda::quantize_rows(ptr<void>(q), ptr<float>(scales), ptr<const void>(x), x_stride, m, k,
                                 scaled_type_of(type), dtype_of(dtype), stream);
  }, py::kw_only(), py::arg("q"), py::arg("scales"), py::arg("x"), py::arg("x_stride"), py::arg("m"), py::arg("k"),
     py::arg("type"), py::arg("dtype"), py::arg("stream"), release);
  // The batch is corellm._core.kernels.SamplingBatch itself (its fields by name: the type _core
  // registers, shared between the two modules), then the stream.
  m.def("sample", [](const corellm::SamplingBatch& batch, std::uintptr_t stream) {
    corellm::cuda::sample(batch, stream);
  }, py::arg("batch"), py::arg("stream"), release);
  // Likewise corellm._core.kernels.RejectionBatch, then the stream.
  m.def("rejection_sample", [](const corellm::RejectionBatch& batch, std::uintptr_t stream) {
    corellm::cuda::rejection_sample(batch, stream);
  }, py::arg("batch"), py::arg("stream"), release);
}
