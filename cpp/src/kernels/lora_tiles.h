// The LoRA update's block kernel (lora.h), written once over a Lanes policy — the avx2 path's
// 8-lane registers (lora.cpp) or the avx512 path's 16 lanes (lora_avx512.cpp):
//   Lanes::V, kWidth            a register of fp32 lanes and how many
//   zero(), load(p), load_partial(p, n), broadcast(p), fma(a, b, c), mul(a, b)
//                               (load and load_partial of fp32, or of bf16 widened to fp32)
//   store(p, v), store_partial(p, v, n)     (partial: the first n lanes; the others zero / untouched)
//   add_into(out, v)            out[0 .. kWidth) = round(out + v) for fp32 or bf16 out
//
// Tokens of one adapter are taken together, up to kTokenBlock: each matrix row is read once per
// block rather than once per token (a step's 32 decodes over one adapter read its ~20 MB of fp32
// matrices once per 4 tokens, not 32 times), and the block's sums stay in registers, a tile of
// kTokens tokens x two registers (8 sums, 2 matrix registers and a broadcast fit AVX2's 16). Each
// lane holds one sum, and a lane does the same fused multiply-adds in the same order whatever the
// block, the register width or the lane's place in it (the last, partial register too): a token's
// result is the same alone or batched, on either path.
//
// Include it inside the path's target region, after every system header: its templates are compiled
// for that path's instructions, in each source its own copy.
#pragma once

namespace corellm::lora_tiles {
namespace {

constexpr int64_t kTokenBlock = 4;

// The shrink: u[t][r] = scale * sum_i x[t][i] * a_t[i][r] for the block's kTokens tokens; x: their
// rows in fp32, [kTokens, k]; u: [kTokens, rank]. W: the matrices' element type.
template <class L, int kTokens, typename W>
void shrink(const float* x, const LoraPart& p, int64_t k, float* u) {
  const int64_t rank = p.rank;
  const W* a_t = static_cast<const W*>(p.a_t);
  const typename L::V scale = L::broadcast(&p.scale);
  constexpr int64_t w = L::kWidth;
  int64_t r0 = 0;
  for (; r0 + 2 * w <= rank; r0 += 2 * w) {
    typename L::V acc[kTokens][2];
    for (int t = 0; t < kTokens; ++t) acc[t][0] = acc[t][1] = L::zero();
    for (int64_t i = 0; i < k; ++i) {
      const W* a = a_t + i * rank + r0;
      const typename L::V a0 = L::load(a), a1 = L::load(a + w);
      for (int t = 0; t < kTokens; ++t) {
        const typename L::V xi = L::broadcast(x + t * k + i);
        acc[t][0] = L::fma(xi, a0, acc[t][0]);
        acc[t][1] = L::fma(xi, a1, acc[t][1]);
      }
    }
    for (int t = 0; t < kTokens; ++t) {
      L::store(u + t * rank + r0, L::mul(acc[t][0], scale));
      L::store(u + t * rank + r0 + w, L::mul(acc[t][1], scale));
    }
  }
  for (; r0 < rank; r0 += w) {  // one register, the last one partial
    const int64_t lanes = rank - r0 < w ? rank - r0 : w;
    typename L::V acc[kTokens];
    for (int t = 0; t < kTokens; ++t) acc[t] = L::zero();
    for (int64_t i = 0; i < k; ++i) {
      const typename L::V a0 = L::load_partial(a_t + i * rank + r0, lanes);
      for (int t = 0; t < kTokens; ++t) acc[t] = L::fma(L::broadcast(x + t * k + i), a0, acc[t]);
    }
    for (int t = 0; t < kTokens; ++t) L::store_partial(u + t * rank + r0, L::mul(acc[t], scale), lanes);
  }
}

// out_rows[t][col_offset + j] += the expand's sum_r u[t][r] * b_t[r][j], for kVectors registers of
// columns from j0 (the last one `lanes` wide).
template <class L, int kTokens, int kVectors, typename T, typename W>
void expand_add(T* const* out_rows, const LoraPart& p, const float* u, int64_t j0, int64_t lanes) {
  const int64_t rank = p.rank, cols = p.cols;
  const W* b_t = static_cast<const W*>(p.b_t);
  constexpr int64_t w = L::kWidth;
  typename L::V acc[kTokens][kVectors];
  for (int t = 0; t < kTokens; ++t) {
    for (int v = 0; v < kVectors; ++v) acc[t][v] = L::zero();
  }
  for (int64_t r = 0; r < rank; ++r) {
    const W* b = b_t + r * cols + j0;
    typename L::V bv[kVectors];
    for (int v = 0; v < kVectors; ++v) bv[v] = v + 1 < kVectors || lanes == w ? L::load(b + w * v) : L::load_partial(b + w * v, lanes);
    for (int t = 0; t < kTokens; ++t) {
      const typename L::V ur = L::broadcast(u + t * rank + r);
      for (int v = 0; v < kVectors; ++v) acc[t][v] = L::fma(ur, bv[v], acc[t][v]);
    }
  }
  for (int t = 0; t < kTokens; ++t) {
    T* out = out_rows[t] + p.col_offset + j0;
    for (int v = 0; v < kVectors; ++v) {
      if (v + 1 < kVectors || lanes == w) {
        L::add_into(out + w * v, acc[t][v]);
      } else {  // the last register's lanes, one by one
        alignas(64) float sums[w];
        L::store(sums, acc[t][v]);
        for (int64_t j = 0; j < lanes; ++j) store_f32(out + w * v + j, load_f32(out + w * v + j) + sums[j]);
      }
    }
  }
}

// One block's kTokens tokens (rows tokens[0 .. kTokens) of x and y) updated by one adapter;
// u: [kTokens, rank] and xf: [kTokens, k] scratch.
template <class L, int kTokens, typename T, typename W>
void add_block(T* y, int64_t y_stride, const T* x, int64_t x_stride, const int64_t* tokens, const LoraLinear& lora,
               float* u, float* xf) {
  T* out_rows[kTokens];
  for (int t = 0; t < kTokens; ++t) {
    const T* row = x + tokens[t] * x_stride;
    for (int64_t i = 0; i < lora.k; ++i) xf[t * lora.k + i] = load_f32(row + i);  // once for every part
    out_rows[t] = y + tokens[t] * y_stride;
  }
  constexpr int64_t w = L::kWidth;
  for (const LoraPart& p : lora.parts) {
    shrink<L, kTokens, W>(xf, p, lora.k, u);
    int64_t j0 = 0;
    for (; j0 + 2 * w <= p.cols; j0 += 2 * w) expand_add<L, kTokens, 2, T, W>(out_rows, p, u, j0, w);
    for (; j0 < p.cols; j0 += w) {
      expand_add<L, kTokens, 1, T, W>(out_rows, p, u, j0, p.cols - j0 < w ? p.cols - j0 : w);
    }
  }
}

// The block of `count` tokens; every part of `lora` must store its matrices as W.
template <class L, typename T, typename W>
void add_block_of(int64_t count, T* y, int64_t y_stride, const T* x, int64_t x_stride, const int64_t* tokens,
                  const LoraLinear& lora, float* u, float* xf) {
  switch (count) {
    case 1: return add_block<L, 1, T, W>(y, y_stride, x, x_stride, tokens, lora, u, xf);
    case 2: return add_block<L, 2, T, W>(y, y_stride, x, x_stride, tokens, lora, u, xf);
    case 3: return add_block<L, 3, T, W>(y, y_stride, x, x_stride, tokens, lora, u, xf);
    default: return add_block<L, kTokenBlock, T, W>(y, y_stride, x, x_stride, tokens, lora, u, xf);
  }
}

// add_block_of for y's and the matrices' types.
template <class L>
void add_block_typed(const LoraRows& rows, const int64_t* tokens, int64_t count, const LoraLinear& lora, float* u,
                     float* xf) {
  const bool bf16_weights = lora.parts.front().weight_dtype == DType::BF16;
  if (rows.dtype == DType::BF16) {
    auto* y = static_cast<uint16_t*>(rows.y);
    const auto* x = static_cast<const uint16_t*>(rows.x);
    if (bf16_weights) return add_block_of<L, uint16_t, uint16_t>(count, y, rows.y_stride, x, rows.x_stride, tokens, lora, u, xf);
    return add_block_of<L, uint16_t, float>(count, y, rows.y_stride, x, rows.x_stride, tokens, lora, u, xf);
  }
  auto* y = static_cast<float*>(rows.y);
  const auto* x = static_cast<const float*>(rows.x);
  if (bf16_weights) return add_block_of<L, float, uint16_t>(count, y, rows.y_stride, x, rows.x_stride, tokens, lora, u, xf);
  return add_block_of<L, float, float>(count, y, rows.y_stride, x, rows.x_stride, tokens, lora, u, xf);
}

}  // namespace
}  // namespace corellm::lora_tiles
