// A linear layer's weight as the native models take it: parts along the output rows (q, k and v
// of a fused qkv may be stored in different types), each packed for one of the CPU GEMMs —
// bf16 (packed_gemm.h) or a GGUF quantized type (quant_gemm.h) — and an optional bf16 bias.
// python/corellm/model/layers.py's Linear holds the same parts; model/native_stack.py fills this
// from it.
#pragma once

#include <cstdint>
#include <vector>

#include "corellm/kernels/elementwise.h"
#include "corellm/kernels/packed_gemm.h"

namespace corellm {

constexpr int32_t kBf16Packed = -1;  // LinearPart::ggml_type of a part packed by bf16_gemm_pack

struct LinearPart {
  int32_t ggml_type = kBf16Packed;  // or a QuantType (GGUF's ggml_type number)
  const void* data = nullptr;       // the packed part; must outlive the weight's users
  int64_t row_offset = 0;           // its first output row
  int64_t rows = 0;
};

struct LinearWeight {
  std::vector<LinearPart> parts;    // in row order, covering [0, n)
  const uint16_t* bias = nullptr;   // [n] bf16, or null
  int64_t n = 0, k = 0;

  // InvalidArgument naming `what` unless the parts cover rows [0, n) in order with known types.
  void check(const char* what) const;

  // y [m, n] (row stride y_stride) = x [m, k] (row stride x_stride) W^T (+ b), bf16; each part
  // by its GEMM, into its columns of y.
  // x_rows: where x's rows were written (packed_gemm.h's XRows), for the bf16 GEMM's split.
  void forward(const uint16_t* x, int64_t x_stride, uint16_t* y, int64_t y_stride, int64_t m,
               XRows x_rows = XRows::kAnywhere) const;
  // As forward, but y [m, n] fp32: each part's sums (plus the bias) as its GEMM makes them, not
  // rounded to bf16 (a router's logits). Python's Linear(..., out_dtype=float32) computes the same.
  void forward_f32(const uint16_t* x, int64_t x_stride, float* y, int64_t y_stride, int64_t m) const;

  // A gated MLP's gate_up (n = 2d: the gate's rows, then up's): out [m, d] (row stride
  // out_stride) = act(gate) * up, as forward into y then gated_activation_and_mul — in one pass
  // where the GEMM has it (gated_in_one_pass), else through `scratch` [m, n].
  void forward_gated(const uint16_t* x, int64_t x_stride, uint16_t* out, int64_t out_stride, int64_t m,
                     GatedActivation act, uint16_t* scratch, XRows x_rows = XRows::kAnywhere) const;
  // Whether forward_gated runs as one pass here: one bf16 part and a path with bf16_gemm_gated.
  bool gated_in_one_pass() const;

 private:
  // forward's body, y in y_dtype (BF16 or F32).
  void forward_into(const uint16_t* x, int64_t x_stride, void* y, DType y_dtype, int64_t y_stride, int64_t m,
                    XRows x_rows) const;
};

// The token embedding table [vocab, hidden]: bf16 row-major (kBf16Packed here meaning plain
// rows), or a quantized type packed by quant_gemm_pack whose rows are dequantized on lookup.
struct EmbeddingWeight {
  int32_t ggml_type = kBf16Packed;
  const void* data = nullptr;

  // Rows ids[0 .. count) into out [count, hidden] bf16 (InvalidArgument for an id outside the vocabulary).
  void lookup(const int32_t* ids, int64_t count, int64_t vocab_size, int64_t hidden, uint16_t* out) const;
};

}  // namespace corellm
