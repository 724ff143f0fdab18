// y = x W^T (+ b) over a weight kept in a GGUF quantized type (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K,
// Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4): corellm's CPU linear layer for quantized models,
// llama.cpp's scheme.
//
// Activations are quantized per row, in blocks of 32 values, to int8: d = max|x| / 127,
// q = nearest_even(x * 127 / max|x|), with the block's integer sums (per 16 values). A weight
// block is integers u (unsigned, 4 to 8 bits) and scales; a block's dot product with a row is an
// exact integer sum of u * q, done with VNNI dot products (or any other way: integers add
// exactly), then turned into fp32 by the type's epilogue, the same float operations in the same
// order on every path:
//   Q4_0, Q5_0, Q8_0 (w = d_w (u - o), o = 8, 16, 128): acc = fma(float(S - o Sx), d_w d_x, acc)
//   Q4_1, Q5_1       (w = d_w u + m_w):                  acc = fma(float(S), d_w d_x, acc);
//                                                        acc = fma(m_w, s_x, acc)
//   Q4_K, Q5_K per sub-block j of 32 (w = d sc_j u - dmin mn_j):
//                     acc = fma(float(S_j), (d sc_j) d_x, acc); acc = fma(-(dmin mn_j), s_x, acc)
//   Q6_K, Q3_K per 32 values, two sub-blocks a, b of 16 (w = d sc (u - o), o = 32, 4):
//                     acc = fma(float(sc_a (S_a - o Sx_a) + sc_b (S_b - o Sx_b)), d d_x, acc)
//   IQ4_NL (w = d kv[q], kv llama.cpp's 16 non-linear int8 levels; u = kv[q] + 128, as Q8_0's):
//                     acc = fma(float(S - 128 Sx), d_w d_x, acc)
//   MXFP4 as IQ4_NL, its levels E2M1's doubled (0, 1, 2, 3, 4, 6, 8, 12 and their negatives) and
//                     d_w = 2^(e - 128) from its E8M0 byte e (kept as bf16, which holds every one)
//   IQ4_XS per sub-block j of 32 (w = d sc_j kv[q], sc_j a 6-bit scale minus 32):
//                     acc = fma(float(sc_j (S_j - 128 Sx_j)), d d_x, acc)
//   Q2_K per 32 values, two sub-blocks a, b of 16 (w = d sc u - dmin mn, 4-bit sc and mn):
//                     acc = fma(float(sc_a S_a + sc_b S_b), d d_x, acc);
//                     acc = fma(-float(mn_a Sx_a + mn_b Sx_b), dmin d_x, acc)
// with S the block's integer dot product, Sx the row block's integer sum (per 16 values for
// Q6_K), s_x = d_x float(Sx), blocks in order along k. Then the bias is added and the result
// rounded once (bf16) or kept (fp32). A row's result therefore depends on its own values alone:
// not on the batch, nor on which path (quant_gemm_paths) computed it.
//
// Packed layout (made once at load from the file's blocks, the same bits rearranged): panels of
// 16 output rows of W (one 32-bit lane each in a 512-bit register), each panel its blocks along
// k, each panel-block the 16 rows' block side by side:
//   scales    fp16 d[16] (MXFP4: bf16) (and m[16] or dmin[16]); K types: sc[j][16], mn[j][16] as bytes
//             (Q6_K, Q3_K: sc[16][16] as int8; Q2_K: sc | mn << 4 [16][16], the file's bytes)
//   nibbles   per run of R values (R = 32, or 64 for the K types), R / 8 vectors of 64 bytes;
//             in vector g, row c's bytes 4c .. 4c + 3 hold values 4g + i (low nibble) and
//             R / 2 + 4g + i (high nibble), i = 0..3: one VNNI operand each, for 16 rows
//   Q8_0      the 8-bit values u = q + 128, 8 vectors of 64 bytes, same order (4 per lane)
//   Q2_K      per run of 128 values, 8 vectors of 64 bytes: in vector g, row c's byte 4c + i holds
//             values 32j + 4g + i (j = 0..3) in its bits 2j, 2j + 1
//   Q3_K      its two low bits as Q2_K's, then a 3rd-bit plane (quant_formats.h)
//   IQ4_*, MXFP4  the levels' 4-bit indices q as nibbles (runs of 32), looked up in registers
//   high bits Q5_*: a 5th-bit plane, one bit per value; Q6_K: a 2-bit plane (quant_formats.h)
// Rows past n are zero blocks.
#pragma once

#include <cstdint>
#include <string>

#include "corellm/kernels/dtype.h"

namespace corellm {

// GGUF's ggml_type numbers.
enum class QuantType : int32_t {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
  kIQ4_NL = 20, kIQ4_XS = 23, kMXFP4 = 39
};

// How the integer dot products are done. Every path gives the same bits (see above).
//   kReference: plain loops (the specification, for tests);
//   kAvx2: maddubs/madd on 8 lanes (any x86-64-v3 CPU);
//   kAvx512Vnni: vpdpbusd on 16 lanes (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4 and later);
//   kAmx: AMX-INT8 tiles for whole tiles of 16 rows, the rest as kAvx512Vnni (Sapphire Rapids+).
enum class QuantPath : int32_t { kReference = 0, kAvx2 = 1, kAvx512Vnni = 2, kAmx = 3 };

constexpr int64_t kQuantPanelRows = 16;

// True for a ggml_type number quant_gemm takes.
bool quant_type_supported(int32_t ggml_type);
QuantType quant_type_of(int32_t ggml_type);  // InvalidArgument naming the type when unsupported
const char* quant_type_name(QuantType type);
int64_t quant_block_elements(QuantType type);  // values per block: 32, or 256 (K types)
int64_t quant_block_bytes(QuantType type);     // bytes per block in the file

// The best path this CPU runs (CORELLM_ISA=avx2 forces kAvx2; a path below amx, kAvx512Vnni at
// most), its name, and the one named ("reference", "avx2", "avx512vnni", "amx"; InvalidArgument
// when unknown or not runnable here).
QuantPath quant_path();
const char* quant_path_name(QuantPath path);
QuantPath quant_path_named(const std::string& name);

// Bytes of the packed form of an [n, k] weight (k a multiple of the type's block).
int64_t quant_gemm_packed_size(QuantType type, int64_t n, int64_t k);

// rows: n rows of k / block_elements blocks each, as in the file (row r at r * row bytes).
// Packed row i is file row row_order[i] (null: i), so that a permutation of the rows (llama.cpp's
// interleaving of Q and K heads) is undone while packing.
void quant_gemm_pack(QuantType type, const uint8_t* rows, uint8_t* packed, int64_t n, int64_t k,
                     const int32_t* row_order = nullptr);

struct QuantGemmArgs {
  const void* x = nullptr;  // [m, k], row stride x_stride; x_dtype
  int64_t x_stride = 0;
  DType x_dtype = DType::BF16;
  QuantType type = QuantType::kQ8_0;
  const uint8_t* packed = nullptr;  // quant_gemm_pack's layout of an [n, k] weight
  const uint16_t* bias = nullptr;   // [n] bf16 or null
  void* y = nullptr;                // [m, n], row stride y_stride; y_dtype
  int64_t y_stride = 0;
  DType y_dtype = DType::BF16;
  int64_t m = 0, n = 0, k = 0;
};

void quant_gemm(const QuantGemmArgs& args, QuantPath path = quant_path());

// Rows `ids` of the packed weight (an embedding table), dequantized: out [count, k], out_dtype.
void quant_dequantize_rows(QuantType type, const uint8_t* packed, int64_t n, int64_t k, const int32_t* ids,
                           int64_t count, void* out, DType out_dtype);

}  // namespace corellm
