// ShmBroadcast (algorithm in shm_broadcast.h): a ring of message slots in POSIX shared memory, one
// writer, counters per reader, futex sleeps.
#include "corellm/shm_broadcast.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <optional>
#include <utility>
#include <thread>

#include "corellm/check.h"
#include "shared_memory_waits.h"

namespace corellm {

namespace {

constexpr uint64_t kMagic = 0x636f72656c6c6d31;  // "corellm1"
// A reader spins on the counter for kSpin, then yields the core between checks until kYield, then
// sleeps on the futex. A worker's next step follows within the engine's own work between steps
// (scheduling, sampling: ~1-10 ms), and waking a sleeping thread costs a cross-core wake-up — in
// a VM, where the idle vCPU must be scheduled back by the host, 100-300 us; yielding keeps it
// awake yet gives the core to any other runnable thread (ranks outnumbering the cores).
using shm::Clock;
using shm::Counter;
using shm::cpu_relax;
using shm::kSpin;
constexpr auto kYield = std::chrono::milliseconds(20);

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "a futex word is 32 bits");

Clock::time_point deadline_after(double timeout_s) {
  CORELLM_CHECK_ARG(timeout_s >= 0, "a timeout must be >= 0 seconds, got ", timeout_s);
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Sleeps while *word == expected, until woken or `until`; spurious returns are fine (callers loop).
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, Clock::time_point until) {
  auto left = until - Clock::now();
  if (left <= Clock::duration::zero()) return;
  auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Waits until ready() holds: spinning for kSpin, yielding the core until kYield, then calling
// sleep(until) between checks; false at the deadline.
template <class Ready, class Sleep>
bool wait_until(Ready ready, Sleep sleep, Clock::time_point until) {
  const auto start = Clock::now();
  const auto spin_end = std::min(start + kSpin, until), yield_end = std::min(start + kYield, until);
  for (int i = 0;; ++i) {
    if (ready()) return true;
    if ((i & 63) == 63 && Clock::now() >= spin_end) break;
    cpu_relax();
  }
  while (!ready()) {
    if (Clock::now() >= yield_end) break;
    std::this_thread::yield();
  }
  while (!ready()) {
    if (Clock::now() >= until) return false;
    sleep(until);
  }
  return true;
}

}  // namespace

struct ShmBroadcast::Header {
  uint64_t magic;
  uint32_t num_readers;
  uint32_t num_slots;
  uint64_t slot_bytes;
  Counter published;
  Counter consumed[kMaxReaders];
};

ShmBroadcast::ShmBroadcast(SharedMemorySegment segment, int reader)
    : segment_(std::move(segment)), header_(static_cast<Header*>(segment_.data())), reader_(reader) {
  num_readers_ = static_cast<int>(header_->num_readers);
  num_slots_ = header_->num_slots;
  slot_bytes_ = header_->slot_bytes;
}

std::unique_ptr<ShmBroadcast> ShmBroadcast::create(const std::string& name, int num_readers, int num_slots,
                                                   size_t slot_bytes) {
  CORELLM_CHECK_ARG(num_readers >= 1 && num_readers <= kMaxReaders, "ShmBroadcast: num_readers must be in 1..",
                    kMaxReaders, ", got ", num_readers);
  CORELLM_CHECK_ARG(num_slots >= 1, "ShmBroadcast: num_slots must be >= 1, got ", num_slots);
  CORELLM_CHECK_ARG(slot_bytes > sizeof(uint64_t) && slot_bytes % 64 == 0,
                    "ShmBroadcast: slot_bytes must be a multiple of 64 above 8, got ", slot_bytes);
  auto segment = SharedMemorySegment::create(name, sizeof(Header) + static_cast<size_t>(num_slots) * slot_bytes);
  auto* h = new (segment.data()) Header{};  // every counter starts at 0
  h->num_readers = static_cast<uint32_t>(num_readers);
  h->num_slots = static_cast<uint32_t>(num_slots);
  h->slot_bytes = slot_bytes;
  h->magic = kMagic;
  return std::unique_ptr<ShmBroadcast>(new ShmBroadcast(std::move(segment), -1));
}

std::unique_ptr<ShmBroadcast> ShmBroadcast::attach(const std::string& name, int reader) {
  auto segment = SharedMemorySegment::open(name);
  const auto* h = static_cast<const Header*>(segment.data());
  CORELLM_CHECK_ARG(segment.size() >= sizeof(Header) && h->magic == kMagic &&
                        segment.size() == sizeof(Header) + h->num_slots * h->slot_bytes,
                    "ShmBroadcast: '", name, "' is not a corellm broadcast segment");
  CORELLM_CHECK_ARG(reader >= 0 && reader < static_cast<int>(h->num_readers), "ShmBroadcast: reader ", reader,
                    " is outside 0..", h->num_readers - 1);
  return std::unique_ptr<ShmBroadcast>(new ShmBroadcast(std::move(segment), reader));
}

uint8_t* ShmBroadcast::slot(uint32_t message) const {
  return static_cast<uint8_t*>(segment_.data()) + sizeof(Header) + static_cast<size_t>(message % num_slots_) * slot_bytes_;
}

bool ShmBroadcast::publish(const void* data, size_t size, double timeout_s) {
  return publish(std::vector<Part>{{data, size}}, timeout_s);
}

bool ShmBroadcast::publish(const std::vector<Part>& parts, double timeout_s) {
  CORELLM_CHECK_ARG(is_writer(), "ShmBroadcast: reader ", reader_, " cannot publish");
  size_t size = 0;
  for (const Part& p : parts) {
    CORELLM_CHECK_ARG(p.rows <= 1 || p.stride >= p.row_bytes, "ShmBroadcast: a part's rows overlap (stride ",
                      p.stride, " < ", p.row_bytes, " bytes a row)");
    size += p.size();
  }
  CORELLM_CHECK_ARG(size <= slot_capacity(), "ShmBroadcast: a message of ", size, " bytes exceeds a slot's ",
                    slot_capacity());
  const auto until = deadline_after(timeout_s);
  const uint32_t m = header_->published.value.load(std::memory_order_relaxed);  // only this process writes it
  auto slot_free = [&] {
    for (int r = 0; r < num_readers_; ++r) {
      // consumed >= m + 1 - num_slots, modulo 2^32: m - consumed < num_slots
      const uint32_t behind = m - header_->consumed[r].value.load(std::memory_order_acquire);
      if (behind >= num_slots_) return false;
    }
    return true;
  };
  auto nap = [](Clock::time_point) { std::this_thread::sleep_for(std::chrono::microseconds(20)); };
  if (!wait_until(slot_free, nap, until)) return false;
  uint8_t* s = slot(m);
  const uint64_t n = size;
  std::memcpy(s, &n, sizeof(n));
  size_t at = sizeof(n);
  for (const Part& p : parts) {
    const auto* row = static_cast<const uint8_t*>(p.data);
    for (size_t i = 0; i < p.rows && p.row_bytes > 0; ++i, row += p.stride, at += p.row_bytes) {
      std::memcpy(s + at, row, p.row_bytes);
    }
  }
  header_->published.value.store(m + 1, std::memory_order_release);
  futex_wake_all(&header_->published.value);
  return true;
}

bool ShmBroadcast::receive(std::vector<uint8_t>& out, double timeout_s) {
  const std::optional<View> message = receive_in_place(timeout_s);
  if (!message) return false;
  out.assign(message->data, message->data + message->size);
  std::atomic<uint32_t>& mine = header_->consumed[reader_].value;
  mine.store(mine.load(std::memory_order_relaxed) + 1, std::memory_order_release);  // copied: the slot is free
  holding_ = false;
  return true;
}

std::optional<ShmBroadcast::View> ShmBroadcast::receive_in_place(double timeout_s) {
  CORELLM_CHECK_ARG(!is_writer(), "ShmBroadcast: the writer cannot receive");
  const auto until = deadline_after(timeout_s);
  std::atomic<uint32_t>& published = header_->published.value;
  std::atomic<uint32_t>& mine = header_->consumed[reader_].value;
  uint32_t m = mine.load(std::memory_order_relaxed);  // only this reader writes it
  if (holding_) {  // done with the message it holds: its slot goes back to the writer
    mine.store(++m, std::memory_order_release);
    holding_ = false;
  }
  auto arrived = [&] { return published.load(std::memory_order_acquire) != m; };
  auto sleep = [&](Clock::time_point deadline) { futex_wait(&published, m, deadline); };
  if (!wait_until(arrived, sleep, until)) return std::nullopt;
  const uint8_t* s = slot(m);
  uint64_t n = 0;
  std::memcpy(&n, s, sizeof(n));
  CORELLM_CHECK(n <= slot_capacity(), "a slot's size field (", n, ") exceeds its capacity");
  holding_ = true;
  return View{s + sizeof(n), static_cast<size_t>(n)};
}

}  // namespace corellm
