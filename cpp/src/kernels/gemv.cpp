// bf16 matrix-vector products for decode. Each thread takes a contiguous range of W's rows; per
// group of four rows it streams the rows once, multiplying each 32-element chunk by the same chunk
// of every x row (dpbf16: pairs of bf16 products summed into fp32 lanes), then reduces the lanes.
#include "corellm/kernels/gemv.h"

#include <algorithm>

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CORELLM_HAVE_BF16_GEMV 1
#endif

#include "corellm/check.h"
#include "corellm/kernels/dtype.h"

namespace corellm {

#if defined(CORELLM_HAVE_BF16_GEMV)

namespace {

constexpr int64_t kRowsPerGroup = 4;

template <int M>
void gemv_rows(const uint16_t* x, int64_t x_stride, const uint16_t* w, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, int64_t row_begin, int64_t row_end, int64_t k) {
  const int64_t full = k / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((1ull << (k - full)) - 1);
  for (int64_t r0 = row_begin; r0 < row_end; r0 += kRowsPerGroup) {
    const int64_t rows = std::min<int64_t>(kRowsPerGroup, row_end - r0);
    __m512 acc[M][kRowsPerGroup];
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < kRowsPerGroup; ++r) acc[i][r] = _mm512_setzero_ps();
    const uint16_t* wr[kRowsPerGroup];
    for (int r = 0; r < kRowsPerGroup; ++r) wr[r] = w + (r0 + std::min<int64_t>(r, rows - 1)) * k;
    for (int64_t c = 0; c <= full; c += 32) {
      const bool last = c == full;
      if (last && tail == 0) break;
      __m512bh xv[M];
      for (int i = 0; i < M; ++i) {
        xv[i] = (__m512bh)(last ? _mm512_maskz_loadu_epi16(tail, x + i * x_stride + c)
                                : _mm512_loadu_si512(x + i * x_stride + c));
      }
      for (int r = 0; r < kRowsPerGroup; ++r) {
        const __m512bh wv = (__m512bh)(last ? _mm512_maskz_loadu_epi16(tail, wr[r] + c) : _mm512_loadu_si512(wr[r] + c));
        for (int i = 0; i < M; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv[i], wv);
      }
    }
    for (int i = 0; i < M; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        float v = _mm512_reduce_add_ps(acc[i][r]);
        if (bias) v += bf16_to_f32(bias[r0 + r]);
        y[i * y_stride + r0 + r] = f32_to_bf16(v);
      }
    }
  }
}

}  // namespace

bool bf16_gemv_available() { return true; }

void bf16_gemv(const uint16_t* x, int64_t x_stride, const uint16_t* w, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k) {
  CORELLM_CHECK_ARG(m >= 1 && m <= kGemvMaxRows, "bf16_gemv takes 1 to ", kGemvMaxRows, " rows, got ", m);
  CORELLM_CHECK_ARG(n >= 1 && k >= 1, "bf16_gemv: bad shape n=", n, " k=", k);
  // Split W's rows in groups of 16 across the threads; small matrices stay on one thread.
  const int64_t chunks = (n + 15) / 16;
#pragma omp parallel for schedule(static) if (n * k >= (1 << 16))
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t b = ch * 16, e = std::min<int64_t>(n, b + 16);
    switch (m) {
      case 1: gemv_rows<1>(x, x_stride, w, bias, y, y_stride, b, e, k); break;
      case 2: gemv_rows<2>(x, x_stride, w, bias, y, y_stride, b, e, k); break;
      case 3: gemv_rows<3>(x, x_stride, w, bias, y, y_stride, b, e, k); break;
      default: gemv_rows<4>(x, x_stride, w, bias, y, y_stride, b, e, k); break;
    }
  }
}

#else

bool bf16_gemv_available() { return false; }

void bf16_gemv(const uint16_t*, int64_t, const uint16_t*, const uint16_t*, uint16_t*, int64_t, int64_t, int64_t,
               int64_t) {
  throw InvalidArgument("bf16_gemv needs a CPU with AVX512-BF16");
}

#endif

}  // namespace corellm
