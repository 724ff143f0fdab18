// Work shared by the threads of a team as one contiguous range per thread, with stealing: each
// thread takes its own range's items from the front, in order; once it is empty, it takes items
// from the back of the others' ranges, one at a time. A thread that loses its core for a while
// (on a 2-core machine, to the server's event loop or a benchmark's client) then no longer holds
// the other at the end of a statically split loop: the other finishes the work instead of
// waiting. Which thread computes an item never changes what is computed.
//
// Measured with the amx GEMM (whole model's projections, Intel Xeon VM, 2 threads, best of each
// run) beside a process taking ~30 % of one core in 3 ms bursts, static ranges -> shared, six
// alternating runs each: 64 rows 18.7-21.8 -> 18.2-20.1 ms, 512 rows 81.6-87.8 -> 74.3-81.0 ms
// (faster in 10 of 12 pairs); alone, within the VM's noise (64 rows 14.5-16.3 against 14.4-16.5 ms).
// The vector paths' GEMM (packed_gemm_vector.h; avx512bf16 forced on the same VM, three runs each):
// 16 / 64 / 512 rows 29.7-31.5 / 104-108 / 796-817 -> 27.3-28.8 / 95.8-103 / 698-722 ms beside
// the same process; alone 22.2-25.6 / 79.9-85.0 / 632-633 -> 22.1-24.1 / 79.6-82.5 / 613-628.
//
// Each range is one 64-bit atomic (front in the low half, end in the high half), claimed by
// compare-and-swap from either side: an item is taken exactly once.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "corellm/check.h"

namespace corellm {

class SharedRanges {
 public:
  // items [0, num_items) cut into `threads` ranges as a static schedule would cut them.
  SharedRanges(int64_t num_items, int threads) : threads_(threads) {
    CORELLM_CHECK_ARG(threads >= 1 && num_items >= 0 && num_items < (int64_t{1} << 32),
                      "SharedRanges: ", num_items, " items over ", threads, " threads");
    ranges_.reset(new Range[static_cast<size_t>(threads)]);
    for (int t = 0; t < threads; ++t) {
      const uint64_t begin = static_cast<uint64_t>(num_items * t / threads);
      const uint64_t end = static_cast<uint64_t>(num_items * (t + 1) / threads);
      ranges_[t].packed.store(begin | (end << 32), std::memory_order_relaxed);
    }
  }

  // The next item for `thread` (0 .. threads - 1): its own range's front, else the back of another
  // range (the next thread's, then the one after), or -1 when every item has been taken. A range
  // whose thread never calls (a team smaller than planned) is taken from its back by the others.
  int64_t next(int thread) {
    CORELLM_DCHECK(thread >= 0 && thread < threads_, "SharedRanges: thread ", thread, " of ", threads_);
    const int64_t own = take(thread, /*from_front=*/true);
    if (own >= 0) return own;
    for (int i = 1; i < threads_; ++i) {
      const int64_t stolen = take((thread + i) % threads_, /*from_front=*/false);
      if (stolen >= 0) return stolen;
    }
    return -1;
  }

  // The item `thread`'s next call would take from its own range, -1 once that range is empty: a
  // hint for fetching its operands early (another thread may still take it first).
  int64_t own_front(int thread) const {
    CORELLM_DCHECK(thread >= 0 && thread < threads_, "SharedRanges: thread ", thread, " of ", threads_);
    const uint64_t v = ranges_[thread].packed.load(std::memory_order_relaxed);
    const uint64_t front = v & 0xFFFFFFFFu, end = v >> 32;
    return front < end ? static_cast<int64_t>(front) : -1;
  }

 private:
  struct alignas(64) Range {
    std::atomic<uint64_t> packed{0};
  };

  int64_t take(int t, bool from_front) {
    std::atomic<uint64_t>& packed = ranges_[t].packed;
    uint64_t v = packed.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = v & 0xFFFFFFFFu, end = v >> 32;
      if (front >= end) return -1;
      const uint64_t taken = v + (from_front ? 1 : -(uint64_t{1} << 32));
      if (packed.compare_exchange_weak(v, taken, std::memory_order_relaxed)) {
        return static_cast<int64_t>(from_front ? front : end - 1);
      }
    }
  }

  int threads_;
  std::unique_ptr<Range[]> ranges_;
};

}  // namespace corellm
