// bf16 matrix-vector products for decode over a packed weight (layout in gemv.h). Each thread
// takes a contiguous range of row groups; per group it reads the group's chunks in order,
// multiplying each 32-column chunk of the four rows by the same chunk of every x row (dpbf16:
// pairs of bf16 products summed into fp32 lanes), then reduces the lanes.
#include "corellm/kernels/gemv.h"

#include <algorithm>
#include <cstring>

#include <omp.h>

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>
#define CORELLM_HAVE_BF16_GEMV 1
#endif

#include "corellm/check.h"
#include "corellm/kernels/dtype.h"

namespace corellm {

namespace {

int64_t num_groups(int64_t n) { return (n + kGemvGroupRows - 1) / kGemvGroupRows; }
int64_t num_chunks(int64_t k) { return (k + kGemvChunk - 1) / kGemvChunk; }

}  // namespace

int64_t bf16_gemv_packed_size(int64_t n, int64_t k) {
  return num_groups(n) * num_chunks(k) * kGemvGroupRows * kGemvChunk;
}

void bf16_gemv_pack(const uint16_t* w, uint16_t* packed, int64_t n, int64_t k) {
  CORELLM_CHECK_ARG(n >= 1 && k >= 1, "bf16_gemv_pack: bad shape n=", n, " k=", k);
  const int64_t chunks = num_chunks(k);
  std::memset(packed, 0, static_cast<size_t>(bf16_gemv_packed_size(n, k)) * sizeof(uint16_t));
  for (int64_t row = 0; row < n; ++row) {
    const int64_t g = row / kGemvGroupRows, r = row % kGemvGroupRows;
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t cols = std::min(kGemvChunk, k - c * kGemvChunk);
      uint16_t* dst = packed + ((g * chunks + c) * kGemvGroupRows + r) * kGemvChunk;
      std::memcpy(dst, w + row * k + c * kGemvChunk, static_cast<size_t>(cols) * sizeof(uint16_t));
    }
  }
}

#if defined(CORELLM_HAVE_BF16_GEMV)

namespace {

template <int M>
void gemv_groups(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* y,
                 int64_t y_stride, int64_t group_begin, int64_t group_end, int64_t n, int64_t k) {
  const int64_t chunks = num_chunks(k);
  const int64_t full = k / kGemvChunk;  // chunks without a tail
  const __mmask32 tail = static_cast<__mmask32>((1ull << (k - full * kGemvChunk)) - 1);
  for (int64_t g = group_begin; g < group_end; ++g) {
    __m512 acc[M][kGemvGroupRows];
    for (int i = 0; i < M; ++i)
      for (int r = 0; r < kGemvGroupRows; ++r) acc[i][r] = _mm512_setzero_ps();
    const uint16_t* wg = packed + g * chunks * kGemvGroupRows * kGemvChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      __m512bh xv[M];
      for (int i = 0; i < M; ++i) {
        const uint16_t* xc = x + i * x_stride + c * kGemvChunk;
        // The padded columns of W are zero, but x's may hold anything (a NaN): load them as zero.
        xv[i] = (__m512bh)(c < full ? _mm512_loadu_si512(xc) : _mm512_maskz_loadu_epi16(tail, xc));
      }
      const uint16_t* wc = wg + c * kGemvGroupRows * kGemvChunk;
      for (int r = 0; r < kGemvGroupRows; ++r) {
        const __m512bh wv = (__m512bh)_mm512_loadu_si512(wc + r * kGemvChunk);
        for (int i = 0; i < M; ++i) acc[i][r] = _mm512_dpbf16_ps(acc[i][r], xv[i], wv);
      }
    }
    const int64_t rows = std::min<int64_t>(kGemvGroupRows, n - g * kGemvGroupRows);
    for (int i = 0; i < M; ++i) {
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = g * kGemvGroupRows + r;
        float v = _mm512_reduce_add_ps(acc[i][r]);
        if (bias) v += bf16_to_f32(bias[row]);
        y[i * y_stride + row] = f32_to_bf16(v);
      }
    }
  }
}

}  // namespace

bool bf16_gemv_available() { return true; }

void bf16_gemv(const uint16_t* x, int64_t x_stride, const uint16_t* packed, const uint16_t* bias, uint16_t* y,
               int64_t y_stride, int64_t m, int64_t n, int64_t k) {
  CORELLM_CHECK_ARG(m >= 1 && m <= kGemvMaxRows, "bf16_gemv takes 1 to ", kGemvMaxRows, " rows, got ", m);
  CORELLM_CHECK_ARG(n >= 1 && k >= 1, "bf16_gemv: bad shape n=", n, " k=", k);
  // Contiguous ranges of row groups per thread (one sequential stream each); small matrices stay
  // on one thread.
  const int64_t groups = num_groups(n);
#pragma omp parallel if (n * k >= (1 << 16))
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t b = groups * t / threads, e = groups * (t + 1) / threads;
    switch (m) {
      case 1: gemv_groups<1>(x, x_stride, packed, bias, y, y_stride, b, e, n, k); break;
      case 2: gemv_groups<2>(x, x_stride, packed, bias, y, y_stride, b, e, n, k); break;
      case 3: gemv_groups<3>(x, x_stride, packed, bias, y, y_stride, b, e, n, k); break;
      default: gemv_groups<4>(x, x_stride, packed, bias, y, y_stride, b, e, n, k); break;
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
