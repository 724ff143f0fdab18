// How a GEMM's team shares W's panels (the bf16 GEMM's and the quantized one's): per chunk of the
// rows, the panels in a SharedRanges (shared_ranges.h), each thread taking its own contiguous range
// from the front and then the others' from their backs, and fetching meanwhile the panel it will
// most likely take next. Private to the kernels library.
#pragma once

#include <omp.h>

#include <cstdint>
#include <vector>

#include "corellm/shared_ranges.h"

namespace corellm {

// The team a GEMM of m x n x k runs on: the whole OpenMP team where the product is worth waking
// it, else one thread (waking the others costs more than the products). Inside a step split's
// group the OpenMP team is that group's one thread.
inline int gemm_team(int64_t m, int64_t n, int64_t k) { return m * n * k >= (1 << 16) ? omp_get_max_threads() : 1; }

// Per chunk of `chunk` of the m rows, `units` (W's panels, or pairs of them) shared by a team of
// `threads` (the team the GEMM's parallel region asks for; a thread that never comes has its range
// taken by the others). Every unit is computed the same whichever thread takes it.
inline std::vector<SharedRanges> gemm_shared_panels(int64_t m, int64_t chunk, int64_t units, int threads) {
  std::vector<SharedRanges> per_chunk;
  per_chunk.reserve(static_cast<size_t>((m + chunk - 1) / chunk));
  for (int64_t r0 = 0; r0 < m; r0 += chunk) per_chunk.emplace_back(units, threads);
  return per_chunk;
}

// The panel `thread` computes after its current one in chunk c (gemm_shared_panels), to fetch
// meanwhile: the next of its own range, or after its range's last its first of chunk c + 1; -1:
// none. A hint: the other thread may take it first.
inline int64_t gemm_next_own_panel(const std::vector<SharedRanges>& chunk_panels, size_t c, int thread) {
  const int64_t after = chunk_panels[c].own_front(thread);
  if (after >= 0 || c + 1 >= chunk_panels.size()) return after;
  return chunk_panels[c + 1].own_front(thread);
}

}  // namespace corellm
