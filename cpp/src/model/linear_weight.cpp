// LinearWeight and EmbeddingWeight (linear_weight.h): each part by the GEMM of its storage type.
#include "corellm/model/linear_weight.h"

#include <cstring>

#include "corellm/check.h"
#include "corellm/kernels/packed_gemm.h"
#include "corellm/kernels/quant_gemm.h"

namespace corellm {

void LinearWeight::check(const char* what) const {
  CORELLM_CHECK_ARG(n >= 1 && k >= 1 && !parts.empty(), what, ": an empty linear weight (n=", n, ", k=", k, ")");
  int64_t covered = 0;
  for (const LinearPart& p : parts) {
    CORELLM_CHECK_ARG(p.data != nullptr && p.row_offset == covered && p.rows >= 1, what,
                      ": the weight's parts must cover its rows in order (a part at row ", p.row_offset,
                      " with ", p.rows, " rows after ", covered, ")");
    CORELLM_CHECK_ARG(p.ggml_type == kBf16Packed || quant_type_supported(p.ggml_type), what,
                      ": a part of unknown type ", p.ggml_type);
    covered += p.rows;
  }
  CORELLM_CHECK_ARG(covered == n, what, ": the parts cover ", covered, " of ", n, " rows");
}

void LinearWeight::forward(const uint16_t* x, int64_t x_stride, uint16_t* y, int64_t y_stride, int64_t m,
                           XRows x_rows) const {
  forward_into(x, x_stride, y, DType::BF16, y_stride, m, x_rows);
}

void LinearWeight::forward_f32(const uint16_t* x, int64_t x_stride, float* y, int64_t y_stride, int64_t m) const {
  forward_into(x, x_stride, y, DType::F32, y_stride, m, XRows::kAnywhere);
}

void LinearWeight::forward_into(const uint16_t* x, int64_t x_stride, void* y_out, DType y_dtype, int64_t y_stride,
                                int64_t m, XRows x_rows) const {
  const size_t y_element = y_dtype == DType::F32 ? sizeof(float) : sizeof(uint16_t);
  for (const LinearPart& p : parts) {
    const uint16_t* part_bias = bias ? bias + p.row_offset : nullptr;
    void* y = static_cast<char*>(y_out) + static_cast<size_t>(p.row_offset) * y_element;
    if (p.ggml_type == kBf16Packed) {
      bf16_gemm(x, x_stride, static_cast<const uint16_t*>(p.data), part_bias, y, y_stride, m, p.rows, k, y_dtype,
                cpu_isa(), x_rows);
      continue;
    }
    QuantGemmArgs a;
    a.x = x;
    a.x_stride = x_stride;
    a.x_dtype = DType::BF16;
    a.type = static_cast<QuantType>(p.ggml_type);
    a.packed = static_cast<const uint8_t*>(p.data);
    a.bias = part_bias;
    a.y = y;
    a.y_stride = y_stride;
    a.y_dtype = y_dtype;
    a.m = m;
    a.n = p.rows;
    a.k = k;
    quant_gemm(a);
  }
}

void LinearWeight::forward_gated(const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride, int64_t m,
                                 GatedActivation act, uint16_t* scratch, XRows x_rows) const {
  CORELLM_CHECK_ARG(n % 2 == 0, "a gated MLP's gate_up needs an even number of rows, got ", n);
  if (gated_in_one_pass()) {
    bf16_gemm_gated(x, x_stride, static_cast<const uint16_t*>(parts[0].data), bias, out, out_stride, m, n, k, act,
                    cpu_isa(), x_rows);
    return;
  }
  forward(x, x_stride, scratch, n, m, x_rows);
  gated_activation_and_mul(act, out, out_stride, scratch, n, m, n / 2, DType::BF16);
}

bool LinearWeight::gated_in_one_pass() const {
  return parts.size() == 1 && parts[0].ggml_type == kBf16Packed && bf16_gemm_gated_fused(cpu_isa(), n);
}

void EmbeddingWeight::lookup(const int32_t* ids, int64_t count, int64_t vocab_size, int64_t hidden,
                             uint16_t* out) const {
  if (ggml_type != kBf16Packed) {
    quant_dequantize_rows(quant_type_of(ggml_type), static_cast<const uint8_t*>(data), vocab_size, hidden, ids,
                          count, out, DType::BF16);
    return;
  }
  const auto* table = static_cast<const uint16_t*>(data);
  for (int64_t t = 0; t < count; ++t) {
    const int32_t id = ids[t];
    CORELLM_CHECK_ARG(id >= 0 && id < vocab_size, "token id ", id, " is outside the vocabulary [0, ", vocab_size, ")");
    std::memcpy(out + t * hidden, table + static_cast<int64_t>(id) * hidden, hidden * sizeof(uint16_t));
  }
}

}  // namespace corellm
