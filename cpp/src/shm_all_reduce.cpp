// ShmAllReduce (algorithm in shm_all_reduce.h): per-rank double buffers and arrival counters in
// shared memory; every rank sums every rank's buffer in rank order.
#include "corellm/shm_all_reduce.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <utility>
#include <vector>

#include "corellm/check.h"
#include "shared_memory_waits.h"

namespace corellm {

namespace {

using shm::Clock;
using shm::Counter;
using shm::cpu_relax;
using shm::kSpin;

constexpr uint64_t kMagic = 0x636f72656c6c6d32;  // "corellm2"
constexpr auto kPidCheckEvery = std::chrono::milliseconds(5);

// False once the process has exited (gone, or a zombie waiting to be reaped).
bool process_running(int32_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (f == nullptr) return true;  // no /proc: kill() is all we can tell
  char buf[512] = {};
  const size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  const char* paren = static_cast<const char*>(memrchr(buf, ')', n));  // the name may hold spaces and ')'
  if (paren == nullptr || paren + 2 >= buf + n) return true;
  const char state = paren[2];
  return state != 'Z' && state != 'X';
}

}  // namespace

struct ShmAllReduce::Header {
  uint64_t magic;
  uint32_t size;
  uint64_t buffer_bytes;
  int32_t pids[kMaxRanks];
  Counter arrived[kMaxRanks];
};

ShmAllReduce::ShmAllReduce(SharedMemorySegment segment, int rank)
    : segment_(std::move(segment)), header_(static_cast<Header*>(segment_.data())), rank_(rank) {
  size_ = static_cast<int>(header_->size);
  buffer_bytes_ = header_->buffer_bytes;
  header_->pids[rank] = static_cast<int32_t>(getpid());
  // A rank joining late starts where the others are: none has reduced anything yet.
  calls_ = header_->arrived[rank].value.load(std::memory_order_relaxed);
  CORELLM_CHECK(calls_ == 0, "rank ", rank, " attached to an all-reduce segment that was already in use");
}

std::unique_ptr<ShmAllReduce> ShmAllReduce::create(const std::string& name, int size, size_t buffer_bytes) {
  CORELLM_CHECK_ARG(size >= 2 && size <= kMaxRanks, "ShmAllReduce: size must be in 2..", kMaxRanks, ", got ", size);
  CORELLM_CHECK_ARG(buffer_bytes >= 64 && buffer_bytes % 64 == 0,
                    "ShmAllReduce: buffer_bytes must be a positive multiple of 64, got ", buffer_bytes);
  auto segment = SharedMemorySegment::create(name, sizeof(Header) + 2 * static_cast<size_t>(size) * buffer_bytes);
  auto* h = new (segment.data()) Header{};
  h->size = static_cast<uint32_t>(size);
  h->buffer_bytes = buffer_bytes;
  h->magic = kMagic;
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(std::move(segment), 0));
}

std::unique_ptr<ShmAllReduce> ShmAllReduce::attach(const std::string& name, int rank) {
  auto segment = SharedMemorySegment::open(name);
  const auto* h = static_cast<const Header*>(segment.data());
  CORELLM_CHECK_ARG(segment.size() >= sizeof(Header) && h->magic == kMagic &&
                        segment.size() == sizeof(Header) + 2 * h->size * h->buffer_bytes,
                    "ShmAllReduce: '", name, "' is not a corellm all-reduce segment");
  CORELLM_CHECK_ARG(rank >= 1 && rank < static_cast<int>(h->size), "ShmAllReduce: rank ", rank,
                    " is outside 1..", h->size - 1, " (rank 0 creates the segment)");
  return std::unique_ptr<ShmAllReduce>(new ShmAllReduce(std::move(segment), rank));
}

uint8_t* ShmAllReduce::buffer(int rank, uint32_t call) const {
  const size_t index = static_cast<size_t>(rank) * 2 + (call & 1u);
  return static_cast<uint8_t*>(segment_.data()) + sizeof(Header) + index * buffer_bytes_;
}

AllReduceStatus ShmAllReduce::wait_for_all(uint32_t call, double timeout_s) {
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  auto next_pid_check = start + kPidCheckEvery;
  // arrived[r] >= call + 1, modulo 2^32
  auto arrived = [&](int r) {
    return static_cast<int32_t>(header_->arrived[r].value.load(std::memory_order_acquire) - (call + 1)) >= 0;
  };
  for (int r = 0, spins = 0; r < size_; ++spins) {
    if (arrived(r)) {
      ++r;
      continue;
    }
    if (spins < 1024 || Clock::now() < start + kSpin) {
      cpu_relax();
      continue;
    }
    sched_yield();  // another rank may need this core (ranks outnumbering the cores)
    const auto now = Clock::now();
    if (now >= until) return AllReduceStatus::kTimedOut;
    if (now >= next_pid_check) {
      next_pid_check = now + kPidCheckEvery;
      if (!process_running(header_->pids[r])) {
        exited_rank_ = r;
        return AllReduceStatus::kPeerExited;
      }
    }
  }
  return AllReduceStatus::kDone;
}

namespace {

// out = parts[0] + parts[1] + ... in that order, in fp32, a block at a time (the partial sums stay
// in a small local array: no allocation per call).
template <class T>
void sum_buffers(T* out, const std::vector<const T*>& parts, int64_t count) {
  constexpr int64_t kBlock = 512;
  float acc[kBlock];
  for (int64_t start = 0; start < count; start += kBlock) {
    const int64_t n = std::min(kBlock, count - start);
    for (int64_t i = 0; i < n; ++i) acc[i] = load_f32(parts[0] + start + i);
    for (size_t r = 1; r < parts.size(); ++r) {
      const T* p = parts[r] + start;
      for (int64_t i = 0; i < n; ++i) acc[i] += load_f32(p + i);
    }
    for (int64_t i = 0; i < n; ++i) store_f32(out + start + i, acc[i]);
  }
}

}  // namespace

AllReduceStatus ShmAllReduce::all_reduce(void* data, int64_t count, DType dtype, double timeout_s) {
  CORELLM_CHECK_ARG(count >= 0, "all_reduce: count must be >= 0, got ", count);
  CORELLM_CHECK_ARG(timeout_s >= 0, "all_reduce: a timeout must be >= 0 seconds, got ", timeout_s);
  const size_t item = dtype == DType::F32 ? sizeof(float) : sizeof(uint16_t);
  const auto per_call = static_cast<int64_t>(buffer_bytes_ / item);
  auto* bytes = static_cast<uint8_t*>(data);
  for (int64_t done = 0, n = 0; done < count; done += n) {  // every rank has the same count: none for 0
    n = std::min(per_call, count - done);
    const uint32_t call = calls_;
    std::memcpy(buffer(rank_, call), bytes + done * item, static_cast<size_t>(n) * item);
    header_->arrived[rank_].value.store(call + 1, std::memory_order_release);
    const AllReduceStatus status = wait_for_all(call, timeout_s);
    if (status != AllReduceStatus::kDone) return status;
    if (dtype == DType::F32) {
      std::vector<const float*> parts;
      for (int r = 0; r < size_; ++r) parts.push_back(reinterpret_cast<const float*>(buffer(r, call)));
      sum_buffers(reinterpret_cast<float*>(bytes + done * item), parts, n);
    } else {
      std::vector<const uint16_t*> parts;
      for (int r = 0; r < size_; ++r) parts.push_back(reinterpret_cast<const uint16_t*>(buffer(r, call)));
      sum_buffers(reinterpret_cast<uint16_t*>(bytes + done * item), parts, n);
    }
    ++calls_;
  }
  return AllReduceStatus::kDone;
}

void ShmAllReduce::all_reduce_or_throw(void* data, int64_t count, DType dtype, double timeout_s) {
  switch (all_reduce(data, count, dtype, timeout_s)) {
    case AllReduceStatus::kDone:
      return;
    case AllReduceStatus::kPeerExited:
      throw std::runtime_error(concat("all-reduce: rank ", exited_rank_, " of the tensor-parallel group exited"));
    case AllReduceStatus::kTimedOut:
      throw std::runtime_error(concat("all-reduce: a rank of the tensor-parallel group did not arrive in ", timeout_s,
                                      " s"));
  }
}

}  // namespace corellm
