// The per-token fold (attention_block.h) on bf16 caches read in place, for the avx512 path
// (AVX-512F without AVX-512-BF16): each bf16 of a (k, k+1) pair widened to fp32 (a shift, or a
// mask, of its 32-bit lane) and two fused multiply-adds where the dpbf16 path has one dot
// product. Written as plain loops over 16 keys and the head's dims, which the compiler
// vectorizes: attention_block.h includes this file inside namespace attention::widened_avx512,
// under an AVX-512 target region.
// The probabilities stay fp32 for P V. Each row's arithmetic depends on its own query and the
// block only, in a fixed order. No include guard and no includes: the includer provides RowState,
// kNegInf, rescale, fast_exp, <cmath>, <cstring> and <algorithm> first.

inline float bf16_low(uint32_t pair) {  // the pair's first element (low 16 bits) as fp32
  const uint32_t bits = pair << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float bf16_high(uint32_t pair) {  // the pair's second element (high 16 bits) as fp32
  const uint32_t bits = pair & 0xFFFF0000u;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// R rows of one query token over keys [lo, hi) of a block:
//   kb [HD / 2, BS, 2]: for a dim pair, BS keys x (dim 2i, dim 2i+1)
//   vb [BS / 2, HD, 2]: for a key pair, HD dims x (key 2j, key 2j+1)
// 16 keys at a time: scores, the online-softmax update, then acc += p V over the key pairs of
// the visible keys; a pair half outside them is never read (it may hold a stale NaN).
template <int HD, int BS, int R>
void fold_rows(const RowState* rows, const uint16_t* kb, const uint16_t* vb, int64_t lo, int64_t hi, float scale) {
  const auto* k32 = reinterpret_cast<const uint32_t*>(kb);
  const auto* v32 = reinterpret_cast<const uint32_t*>(vb);
  float q[R][HD];
  for (int r = 0; r < R; ++r) {
#pragma omp simd
    for (int i = 0; i < HD / 2; ++i) {
      q[r][2 * i] = bf16_low(rows[r].qb[i]);
      q[r][2 * i + 1] = bf16_high(rows[r].qb[i]);
    }
  }
  for (int64_t t0 = lo - lo % 16; t0 < hi; t0 += 16) {
    float s[R][16] = {};
    for (int dp = 0; dp < HD / 2; ++dp) {
      const uint32_t* kp = k32 + dp * BS + t0;
      float even[16], odd[16];
#pragma omp simd
      for (int j = 0; j < 16; ++j) {
        even[j] = bf16_low(kp[j]);
        odd[j] = bf16_high(kp[j]);
      }
      for (int r = 0; r < R; ++r) {
        const float qe = q[r][2 * dp], qo = q[r][2 * dp + 1];
#pragma omp simd
        for (int j = 0; j < 16; ++j) s[r][j] = std::fma(qo, odd[j], std::fma(qe, even[j], s[r][j]));
      }
    }
    const int first = static_cast<int>(std::max<int64_t>(lo - t0, 0));
    const int last = static_cast<int>(std::min<int64_t>(hi - t0, 16));
    float p[R][16];
    for (int r = 0; r < R; ++r) {
      float x[16];
      float block_max = kNegInf;
#pragma omp simd reduction(max : block_max)
      for (int j = 0; j < 16; ++j) {
        x[j] = j >= first && j < last ? s[r][j] * scale : kNegInf;  // a select: a hidden NaN stays out
        block_max = std::max(block_max, x[j]);
      }
      const float m_new = std::max(*rows[r].m, block_max);
      const float correction = rescale(*rows[r].m, m_new);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int j = 0; j < 16; ++j) {
        p[r][j] = j >= first && j < last ? fast_exp(x[j] - m_new) : 0.0f;
        sum += p[r][j];
      }
      *rows[r].l = *rows[r].l * correction + sum;
      *rows[r].m = m_new;
      float* acc = rows[r].acc;
#pragma omp simd
      for (int d = 0; d < HD; ++d) acc[d] *= correction;
    }
    for (int kp = first / 2; kp < (last + 1) / 2; ++kp) {
      const uint32_t* vp = v32 + (t0 / 2 + kp) * HD;
      const bool even_visible = 2 * kp >= first, odd_visible = 2 * kp + 1 < last;
      for (int r = 0; r < R; ++r) {
        float* acc = rows[r].acc;
        const float pe = p[r][2 * kp], po = p[r][2 * kp + 1];
        if (even_visible && odd_visible) {
#pragma omp simd
          for (int d = 0; d < HD; ++d) acc[d] = std::fma(po, bf16_high(vp[d]), std::fma(pe, bf16_low(vp[d]), acc[d]));
        } else if (even_visible) {
#pragma omp simd
          for (int d = 0; d < HD; ++d) acc[d] = std::fma(pe, bf16_low(vp[d]), acc[d]);
        } else {
#pragma omp simd
          for (int d = 0; d < HD; ++d) acc[d] = std::fma(po, bf16_high(vp[d]), acc[d]);
        }
      }
    }
  }
}

template <int HD, int BS>
void fold(const RowState* rows, int num_rows, const uint16_t* kb, const uint16_t* vb, int64_t lo, int64_t hi,
          float scale) {
  switch (num_rows) {
    case 1: return fold_rows<HD, BS, 1>(rows, kb, vb, lo, hi, scale);
    case 2: return fold_rows<HD, BS, 2>(rows, kb, vb, lo, hi, scale);
    case 3: return fold_rows<HD, BS, 3>(rows, kb, vb, lo, hi, scale);
    default: return fold_rows<HD, BS, 4>(rows, kb, vb, lo, hi, scale);
  }
}
