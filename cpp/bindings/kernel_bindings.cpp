// Glue: binds the CPU kernels into corellm._core. Kernels take raw addresses (torch's
// tensor.data_ptr()), sizes, strides and a dtype tag; python/corellm/ops checks the tensors first.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <vector>

#include "corellm/check.h"
#include "corellm/kernels/decoder_stack.h"
#include "corellm/kernels/elementwise.h"
#include "corellm/kernels/packed_gemm.h"
#include "corellm/kernels/paged_attention.h"
#include "corellm/kernels/sampler.h"
#include "corellm/kernels/sampling_batch_args.h"

namespace py = pybind11;
using namespace corellm;

namespace {

template <class T>
T* ptr(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

DType dtype_of(int32_t tag) {
  if (tag != static_cast<int32_t>(DType::F32) && tag != static_cast<int32_t>(DType::BF16)) {
    throw InvalidArgument(concat("unknown dtype tag ", tag));
  }
  return static_cast<DType>(tag);
}

// One layer's addresses, in DecoderLayerWeights' order (0: absent).
using LayerAddresses = std::array<uintptr_t, 11>;

void bind_decoder_stack(py::module_& k) {
  using py::arg;
  py::class_<DecoderStack>(k, "DecoderStack", "A decoder stack run for a few tokens in one call (decoder_stack.h)")
      .def(py::init([](int64_t vocab_size, int64_t hidden, int64_t num_heads, int64_t num_kv_heads,
                       int64_t head_size, int64_t intermediate, float eps, float scale, int64_t sliding_window,
                       uintptr_t cos_sin_cache, int64_t max_position, int64_t rot_dim, uintptr_t embed,
                       const std::vector<LayerAddresses>& layers, uintptr_t final_norm, int64_t num_blocks,
                       int64_t block_size) {
             std::vector<DecoderLayerWeights> weights;
             for (const LayerAddresses& a : layers) {
               weights.push_back({ptr<const uint16_t>(a[0]), ptr<const uint16_t>(a[1]), ptr<const uint16_t>(a[2]),
                                  ptr<const uint16_t>(a[3]), ptr<const uint16_t>(a[4]), ptr<const uint16_t>(a[5]),
                                  ptr<const uint16_t>(a[6]), ptr<const uint16_t>(a[7]), ptr<const uint16_t>(a[8]),
                                  ptr<void>(a[9]), ptr<void>(a[10])});
             }
             DecoderDims dims{vocab_size, hidden, num_heads, num_kv_heads, head_size, intermediate, eps, scale,
                              sliding_window, ptr<const float>(cos_sin_cache), max_position, rot_dim};
             return new DecoderStack(dims, ptr<const uint16_t>(embed), std::move(weights),
                                     ptr<const uint16_t>(final_norm), {num_blocks, num_kv_heads, head_size, block_size});
           }),
           arg("vocab_size"), arg("hidden"), arg("num_heads"), arg("num_kv_heads"), arg("head_size"),
           arg("intermediate"), arg("eps"), arg("scale"), arg("sliding_window"), arg("cos_sin_cache"),
           arg("max_position"), arg("rot_dim"), arg("embed"), arg("layers"), arg("final_norm"), arg("num_blocks"),
           arg("block_size"))
      .def("forward",
           [](DecoderStack& s, uintptr_t input_ids, uintptr_t positions, int64_t num_tokens, uintptr_t slot_mapping,
              uintptr_t block_table, int64_t block_table_stride, uintptr_t seq_lens, uintptr_t query_start_loc,
              int64_t num_seqs, uintptr_t out) {
             s.forward({ptr<const int32_t>(input_ids), ptr<const int32_t>(positions), num_tokens,
                        ptr<const int32_t>(slot_mapping), ptr<const int32_t>(block_table), block_table_stride,
                        ptr<const int32_t>(seq_lens), ptr<const int32_t>(query_start_loc), num_seqs,
                        ptr<uint16_t>(out)});
           },
           py::call_guard<py::gil_scoped_release>());
}

}  // namespace

void bind_kernels(py::module_& m) {
  using py::arg;
  auto k = m.def_submodule("kernels", "CPU kernels on raw tensor addresses (use corellm.ops instead)");
  k.attr("DTYPE_F32") = static_cast<int32_t>(DType::F32);
  k.attr("DTYPE_BF16") = static_cast<int32_t>(DType::BF16);

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
  k.def("silu_and_mul",
        [](uintptr_t out, int64_t out_stride, uintptr_t x, int64_t x_stride, int64_t n, int64_t d,
           int32_t dtype) {
          silu_and_mul(ptr<void>(out), out_stride, ptr<const void>(x), x_stride, n, d, dtype_of(dtype));
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
           int64_t head_size, int64_t block_size, int32_t dtype) {
          reshape_and_cache(ptr<const void>(key), key_stride, ptr<const void>(value), value_stride,
                            ptr<void>(key_cache), ptr<void>(value_cache), ptr<const int32_t>(slot_mapping), n,
                            {num_blocks, num_kv_heads, head_size, block_size}, dtype_of(dtype));
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("paged_attention",
        [](uintptr_t out, uintptr_t q, int64_t q_stride, uintptr_t key_cache, uintptr_t value_cache,
           int64_t num_blocks, int64_t num_kv_heads, int64_t head_size, int64_t block_size,
           uintptr_t block_table, int64_t block_table_stride, uintptr_t seq_lens, uintptr_t query_start_loc,
           int64_t num_seqs, int64_t num_heads, float scale, int64_t sliding_window, int32_t dtype) {
          PagedAttentionArgs a{ptr<void>(out), ptr<const void>(q), q_stride, ptr<const void>(key_cache),
                               ptr<const void>(value_cache), {num_blocks, num_kv_heads, head_size, block_size},
                               ptr<const int32_t>(block_table), block_table_stride, ptr<const int32_t>(seq_lens),
                               ptr<const int32_t>(query_start_loc), num_seqs, num_heads, scale, sliding_window,
                               dtype_of(dtype)};
          paged_attention(a);
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("sample",
        [](int64_t num_reqs, int64_t vocab_size, uintptr_t logits, uintptr_t temperature, uintptr_t top_k,
           uintptr_t top_p, uintptr_t min_p, uintptr_t seeds, uintptr_t steps, uintptr_t presence_penalty,
           uintptr_t frequency_penalty, uintptr_t repetition_penalty, uintptr_t output_offsets,
           uintptr_t output_ids, uintptr_t prompt_offsets, uintptr_t prompt_ids, uintptr_t bias_offsets,
           uintptr_t bias_ids, uintptr_t bias_values, uintptr_t banned_offsets, uintptr_t banned_ids,
           int64_t num_logprobs, uintptr_t sampled, uintptr_t sampled_logprob, uintptr_t sampled_rank,
           uintptr_t top_ids, uintptr_t top_logprobs) {
          sample(sampling_batch_from_addresses(
              num_reqs, vocab_size, logits, temperature, top_k, top_p, min_p, seeds, steps, presence_penalty,
              frequency_penalty, repetition_penalty, output_offsets, output_ids, prompt_offsets, prompt_ids,
              bias_offsets, bias_ids, bias_values, banned_offsets, banned_ids, num_logprobs, sampled, sampled_logprob,
              sampled_rank, top_ids, top_logprobs));
        },
        py::call_guard<py::gil_scoped_release>());
  bind_decoder_stack(k);
  k.def("philox_uniform", &philox_uniform, arg("seed"), arg("counter"));
  k.def("bf16_gemm_available", &bf16_gemm_available);
  k.def("bf16_gemm_packed_size", &bf16_gemm_packed_size, arg("n"), arg("k"));
  k.def("bf16_gemm_pack",
        [](uintptr_t w, uintptr_t packed, int64_t n, int64_t kk) {
          bf16_gemm_pack(ptr<const uint16_t>(w), ptr<uint16_t>(packed), n, kk);
        },
        py::call_guard<py::gil_scoped_release>());
  k.def("bf16_gemm",
        [](uintptr_t x, int64_t x_stride, uintptr_t packed, uintptr_t bias, uintptr_t y, int64_t y_stride, int64_t m,
           int64_t n, int64_t kk, int32_t y_dtype) {
          bf16_gemm(ptr<const uint16_t>(x), x_stride, ptr<const uint16_t>(packed), ptr<const uint16_t>(bias),
                    ptr<void>(y), y_stride, m, n, kk, dtype_of(y_dtype));
        },
        arg("x"), arg("x_stride"), arg("packed"), arg("bias"), arg("y"), arg("y_stride"), arg("m"), arg("n"), arg("k"),
        arg("y_dtype") = static_cast<int32_t>(DType::BF16), py::call_guard<py::gil_scoped_release>());
}
