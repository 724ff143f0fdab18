// y = x W^T (+ b) in bf16 over a weight packed once, after loading: corellm's CPU linear layer,
// on the process's instruction-set path (cpu_isa.h):
//   - amx: AMX-BF16 tiles. Per thread, 2 x 2 tiles of fp32 sums (32 rows x 32 columns: one
//     panel) stay in the tile registers over the whole of k, fed per 32 input columns by two
//     tiles of x rows (read in place, or copied into tile order where x's rows are not aligned)
//     and the panel's two 16-column halves, loaded straight from the packed layout (a row stride
//     of 128 bytes); a block's sums are rounded and stored while the next block's products run.
//     One configuration of the tiles per thread and call.
//   - avx512bf16: per panel and block of up to 8 rows of x it walks the k pairs, accumulating 32
//     columns x the rows in fp32 registers (no horizontal reductions), and re-reads the panel
//     from its caches for the next block of rows.
//   - avx512, avx2: the same loops with each k pair widened to fp32 and two fused multiply-adds
//     (blocks of 8 rows on 16-lane registers, of 4 on 8-lane ones).
// On every path, beyond 128 rows x is taken 128 rows at a time, so that those rows stay in the core's
// L2, and each thread streams a contiguous range of panels. bench/kernels.py ("linear (whole
// model)") compares each path with oneDNN.
//
// Packing: panels of 32 output columns; in a panel, for each pair of input columns (k, k+1), the
// 32 columns' two values side by side (128 bytes: two AVX-512 registers of (W[n][k], W[n][k+1])
// pairs, the operand order of the dpbf16 instruction, and two rows of AMX's B tiles, whose
// 16 rows are 16 consecutive pairs). A panel is one contiguous run of memory, k padded with zeros
// to a multiple of 32.
#pragma once

#include <cstdint>

#include "corellm/kernels/cpu_isa.h"
#include "corellm/kernels/dtype.h"
#include "corellm/kernels/elementwise.h"

namespace corellm {

constexpr int64_t kGemmPanelCols = 32;

// True when this CPU can run bf16_gemm (some path of cpu_isa.h).
bool bf16_gemm_available();

// Elements of the packed form of an [n, k] weight: n rounded up to 32, k to 32.
int64_t bf16_gemm_packed_size(int64_t n, int64_t k);

// w [n, k] row-major -> packed (bf16_gemm_packed_size(n, k) elements, zero padding):
// packed[((p * k_pairs + kp) * 32 + c) * 2 + j] = w[p * 32 + c][2 * kp + j], k_pairs = k / 2
// rounded up to 16.
void bf16_gemm_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k);

// Where x's rows were written, for how the threads share a GEMM: kAnywhere, or kByThread — by this
// OpenMP team, each thread a contiguous range of rows in order (a row-parallel op: the norms, or a
// GEMM that split its rows). With kByThread and many rows the amx path splits the rows the same way
// (each thread computing every panel for its own rows, which its core wrote), else the panels (each
// thread reads every row, but a panel serves all of them).
enum class XRows { kAnywhere, kByThread };

// x [m, k] (row stride x_stride), packed W of an [n, k] weight, bias [n] or null: bf16; fp32
// accumulation. y [m, n] (row stride y_stride, in elements): bf16 (rounded to nearest even) or,
// y_dtype F32, the fp32 sums themselves (logits, without a separate conversion pass). Each row's
// result does not depend on m (every row is computed alike on one path). m = 0: nothing.
// isa: the process's path unless a test or benchmark asks for another this CPU runs.
void bf16_gemm(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, void* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k, DType y_dtype = DType::BF16,
               CpuIsa isa = cpu_isa(), XRows x_rows = XRows::kAnywhere);

// A gated MLP's first projection and its activation in one pass, where the path has it
// (bf16_gemm_gated_fused): W [n, k] packed is gate_up, its first n / 2 rows the gate's and the
// others up's (bias likewise); out [m, n / 2] (row stride out_stride) = act(g) * u, g and u the
// two halves of bf16_gemm's y, each rounded to bf16 as y is, the product in fp32 rounded once —
// bf16_gemm then gated_activation_and_mul (elementwise.h) bit for bit (kGeluErf, which has no
// unfused kernel: packed_gemm_store.h's gelu_erf16 on the rounded gate), without y's m x n values
// written and read back: on amx, avx512bf16 and avx512 the up panel's sums are combined with the
// gate's while they are still in the first level, the work shared in pairs of panels.
bool bf16_gemm_gated_fused(CpuIsa isa, int64_t n);
void bf16_gemm_gated(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* out,
                     int64_t out_stride, int64_t m, int64_t n, int64_t k, GatedActivation act, CpuIsa isa = cpu_isa(),
                     XRows x_rows = XRows::kAnywhere);

// y = gelu(bf16_gemm's y) in one pass where the path has it (bf16_gemm_gelu_fused: amx): y bf16,
// each value rounded as bf16_gemm rounds it, then GELU in its erf form (BERT's MLP activation; erf
// within 1.5e-7: packed_gemm_store.h's gelu_erf16) in fp32, rounded again — as it is stored, on the
// vector unit while the tiles compute the next block, instead of a pass over y written and read
// back. Each row's result does not depend on m.
bool bf16_gemm_gelu_fused(CpuIsa isa);
void bf16_gemm_gelu(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* y,
                    int64_t y_stride, int64_t m, int64_t n, int64_t k, CpuIsa isa = cpu_isa(),
                    XRows x_rows = XRows::kAnywhere);

// The path's bf16 dot-product peak, for benchmarks: `iterations` rounds of independent dot
// products on operands already in registers (tiles) on every thread of the OpenMP team; returns
// the flops done (time it to get the peak).
double bf16_dot_peak(CpuIsa isa, int64_t iterations);

}  // namespace corellm
