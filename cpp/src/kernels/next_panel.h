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
//
// In a single-stream decode (one row) each panel line is used once, so on AMD CPUs the panels are
// fetched with the non-temporal hint there (ReadOnce::kYes). Our reading of why it pays: lines so
// fetched are not kept in the last-level cache, which then keeps what the step does reuse (the KV
// cache, the activations, the interpreter's state between steps) and would not have held the
// weights anyway (even the default model's 92 MiB are three times that cache). AMD EPYC Zen 4,
// 2 threads, tg128, eight alternating pairs of builds: the default Q4_1 file 293 -> 320 tok/s
// (median; 7 of 8 pairs faster), the BF16 file 109 -> 115 (7 of 8); the quantized GEMM alone at one
// row on 150 MB of weights Q4_1 28 -> 30 GB/s, Q8_0 31.5 -> 33.3, Q4_0 and IQ4_NL level. Kept on
// the L2 hint: the types whose blocks take more work to unpack (Q5_0 -12 %, Q5_1, the K types
// -14 to -18 %, IQ4_XS: quant_gemm_kernel.h), more rows (4 decodes: 1-5 % slower, the lines wait
// longer before use; more blocks of rows reuse each panel from L2: up to 25 % slower), the avx2
// paths (forced on the same Zen 4, nine pairs: no gain) and the avx512 one (not measured): each
// path's Lanes::kNonTemporalOneRow; and every panel on other vendors' CPUs (not measured).
#pragma once

#include <algorithm>
#include <cstdint>

#include "corellm/kernels/cpu_isa.h"

namespace corellm {

// Whether the panel's lines are fetched with the non-temporal hint (read once) or into L2.
enum class ReadOnce : bool { kNo = false, kYes = true };

// The hint for a panel that `rows` rows read, on a path (and weight type) where the non-temporal
// one measured faster or not (see above). Constant over a GEMM's chunk of rows: taken once for it.
inline ReadOnce read_once_panel(bool measured_faster, int64_t rows) {
  return measured_faster && rows == 1 && cpu_is_amd() ? ReadOnce::kYes : ReadOnce::kNo;
}

class NextPanel {
 public:
  NextPanel() = default;  // nothing to fetch
  // `bytes` from `next` over `steps` calls of step() (every call or every few calls).
  NextPanel(const void* next, int64_t bytes, int64_t steps, ReadOnce read_once = ReadOnce::kNo)
      : line_(static_cast<const char*>(next)), end_(line_ + bytes), read_once_(read_once == ReadOnce::kYes) {
    const int64_t lines = (bytes + kLine - 1) / kLine;
    steps = std::max<int64_t>(steps, 1);
    every_ = lines >= steps ? 1 : steps / lines;
    per_step_ = lines >= steps ? (lines + steps - 1) / steps : 1;
    countdown_ = every_;
  }

  void step() {
    if (--countdown_ != 0) return;
    countdown_ = every_;
    if (read_once_) return fetch<0>();
    fetch<2>();
  }

 private:
  static constexpr int64_t kLine = 64;
  // The cursor in a local for the step's lines, stored back once: as a member it went through
  // memory at each line (a store and a reload per prefetch, as in attention_tile.h's NextSpanLines).
  // One row, weights read from L3 and memory (30 copies of each projection, three alternating pairs,
  // AMD EPYC Zen 4, avx512bf16): qkv 22.2-22.6 -> 19.7-20.4 us, o 13.9-14.2 -> 12.9-14.1, gate_up
  // 83.8-86.4 -> 79.7-81.0; 16 and 64 rows level; tg128 level within the VM's noise.
  template <int kLocality>  // __builtin_prefetch's: 0 non-temporal, 2 into L2
  void fetch() {
    const char* line = line_;
    for (int64_t i = 0; i < per_step_ && line < end_; ++i, line += kLine) __builtin_prefetch(line, 0, kLocality);
    line_ = line;
  }
  const char* line_ = nullptr;
  const char* end_ = nullptr;
  bool read_once_ = false;
  int64_t every_ = 1, per_step_ = 0, countdown_ = 1;
};

}  // namespace corellm
