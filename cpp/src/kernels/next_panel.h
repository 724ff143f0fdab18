// The panel a GEMM thread computes next (the bf16 and the quantized GEMMs), fetched into L2 a few
// cache lines at a time while the current panel's blocks of rows are computed. Private to the
// kernels library; plain code, include it before any target region.
//
// Why: a panel is read from memory by its first block of rows and from the caches by the others,
// so without this the memory traffic comes in bursts (the first block stalls on it) and idles
// while the other blocks run; spread over the whole panel, the next panel's lines arrive in time.
// Measured on an AMD EPYC Zen 4 (2 threads, SmolLM2's projections, avx512bf16, interleaved runs):
// the bf16 GEMM 1.08-1.13x at 1 row, 1.33x at 16, 1.16x at 64, 1.05-1.08x at 512; the quantized
// one (avx512vnni) 1.11-1.34x at 16 rows, 1.02-1.10x at 64, unchanged at 1 and 512; a decode step of
// 16 / 64 requests with bf16 weights 1.23x / 1.07x faster.
#pragma once

#include <algorithm>
#include <cstdint>

namespace corellm {

class NextPanel {
 public:
  NextPanel() = default;  // nothing to fetch
  // `bytes` from `next` over `steps` calls of step() (every call or every few calls).
  NextPanel(const void* next, int64_t bytes, int64_t steps)
      : line_(static_cast<const char*>(next)), end_(line_ + bytes) {
    const int64_t lines = (bytes + kLine - 1) / kLine;
    steps = std::max<int64_t>(steps, 1);
    every_ = lines >= steps ? 1 : steps / lines;
    per_step_ = lines >= steps ? (lines + steps - 1) / steps : 1;
    countdown_ = every_;
  }

  void step() {
    if (--countdown_ != 0) return;
    countdown_ = every_;
    for (int64_t i = 0; i < per_step_ && line_ < end_; ++i, line_ += kLine) __builtin_prefetch(line_, 0, 2);
  }

 private:
  static constexpr int64_t kLine = 64;
  const char* line_ = nullptr;
  const char* end_ = nullptr;
  int64_t every_ = 1, per_step_ = 0, countdown_ = 1;
};

}  // namespace corellm
