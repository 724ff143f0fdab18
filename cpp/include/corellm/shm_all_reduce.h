// ShmAllReduce: the sum of a tensor over the processes of a tensor-parallel group on one machine,
// through POSIX shared memory, in place of gloo's all-reduce over loopback sockets (~1 ms a call in
// a VM: 60 calls a step for a 30-layer model). Used by TensorParallel.all_reduce on the CPU.
//
// The algorithm. The segment holds a header (geometry, each rank's pid, and each rank's `arrived`
// counter on its own cache line), then two buffers of `buffer_bytes` per rank. Every rank makes
// the same sequence of calls; call g, for each chunk of the tensor that fits a buffer:
//
//   1. copy my chunk into my buffer number g % 2, then arrived[me] = g + 1 (release);
//   2. wait until arrived[r] >= g + 1 for every rank r (acquire): spin, then yield the core;
//   3. out = sum over r = 0 .. size-1, in that order, of buffer g % 2 of rank r, accumulated in fp32
//      (bf16 rounded to nearest even at the end): the same bits on every rank.
//
// Two buffers per rank make a second barrier unnecessary: rank r rewrites buffer g % 2 at call
// g + 2, which it starts only after every rank arrived at call g + 1, i.e. finished reading call g.
// A wait ends with kPeerExited when a rank that has not arrived is no longer running (its pid is
// checked every few milliseconds), with kTimedOut at the deadline; never blocks forever.
//
// Lifetime as ShmBroadcast's: rank 0 creates the segment under a name, the others attach to it with
// their rank, and rank 0 unlinks the name once all have attached.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "corellm/kernels/dtype.h"
#include "corellm/shared_memory_segment.h"

namespace corellm {

enum class AllReduceStatus { kDone, kTimedOut, kPeerExited };

class ShmAllReduce {
 public:
  static constexpr int kMaxRanks = 64;

  // Rank 0's end: a new segment for `size` ranks; InvalidArgument for a taken name or bad geometry.
  static std::unique_ptr<ShmAllReduce> create(const std::string& name, int size, size_t buffer_bytes);
  // Rank `rank` (1 .. size-1) of the segment rank 0 created.
  static std::unique_ptr<ShmAllReduce> attach(const std::string& name, int rank);
  ShmAllReduce(const ShmAllReduce&) = delete;
  ShmAllReduce& operator=(const ShmAllReduce&) = delete;

  // Removes the name (rank 0's; idempotent). The mappings stay valid.
  void unlink_name() { segment_.unlink_name(); }

  // data (count elements of dtype F32 or BF16) becomes the sum of every rank's data. On kTimedOut or
  // kPeerExited the group is broken (its ranks are out of step) and `data` is unspecified.
  AllReduceStatus all_reduce(void* data, int64_t count, DType dtype, double timeout_s);
  // The same, a failed wait thrown as std::runtime_error naming the rank that exited or the timeout.
  void all_reduce_or_throw(void* data, int64_t count, DType dtype, double timeout_s);

  int rank() const { return rank_; }
  int size() const { return size_; }
  // The rank that made the last wait end with kPeerExited (-1 if none did).
  int exited_rank() const { return exited_rank_; }
  const std::string& name() const { return segment_.name(); }

 private:
  struct Header;
  ShmAllReduce(SharedMemorySegment segment, int rank);
  uint8_t* buffer(int rank, uint32_t call) const;
  AllReduceStatus wait_for_all(uint32_t call, double timeout_s);

  SharedMemorySegment segment_;
  Header* header_ = nullptr;
  int rank_ = 0;
  int size_ = 0;
  size_t buffer_bytes_ = 0;
  uint32_t calls_ = 0;  // chunks reduced so far (the same on every rank)
  int exited_rank_ = -1;
};

}  // namespace corellm
