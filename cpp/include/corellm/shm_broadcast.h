// ShmBroadcast: messages from one writer to a fixed set of readers on the same machine, through a
// ring of slots in POSIX shared memory. The tensor-parallel executor sends each step's inputs to
// its worker processes through it (python/corellm/distributed/broadcast_channel.py) instead of
// two broadcasts over sockets.
//
// The algorithm. The segment holds a header, then `num_slots` slots of `slot_bytes` each:
//
//   header:  geometry (magic, num_readers, num_slots, slot_bytes), then, each on its own cache line,
//            `published` (messages the writer has made visible) and `consumed[r]` (messages reader
//            r has copied out); all are counters that only grow (uint32, compared modulo 2^32).
//   slot i:  a uint64 size, then the message's bytes; message m lives in slot m % num_slots.
//
//   publish(m):  wait until every reader's consumed >= m + 1 - num_slots (the slot's previous
//                message is taken), copy the bytes and size in, then published = m + 1 (release)
//                and wake the readers sleeping on `published` (futex).
//   receive():   wait until published > consumed[r] (acquire): spin briefly — a step follows the
//                previous one within microseconds — then sleep on the futex; copy message
//                consumed[r] out, then consumed[r] += 1 (release), which frees its slot.
//
// Each counter has one writer, so no read-modify-write is needed; acquire/release pairs order the
// slot's bytes with the counters. Waits are bounded: both calls take a timeout and report it as a
// return value (a peer that died or hangs), never block forever.
//
// Lifetime: the writer creates the segment under a name, the readers attach to it by name and
// their index, and the writer unlinks the name once every reader has attached (the mappings stay),
// so nothing is left in /dev/shm even if a process is killed later.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "corellm/shared_memory_segment.h"

namespace corellm {

class ShmBroadcast {
 public:
  static constexpr int kMaxReaders = 64;

  // The writer's end: a new segment under `name` ("/corellm-..."); InvalidArgument if the name is
  // taken or the geometry is out of range, std::system_error if the system refuses the memory.
  static std::unique_ptr<ShmBroadcast> create(const std::string& name, int num_readers, int num_slots,
                                              size_t slot_bytes);
  // Reader `reader` (0 .. num_readers-1) of the segment `name` created by a writer.
  static std::unique_ptr<ShmBroadcast> attach(const std::string& name, int reader);
  ShmBroadcast(const ShmBroadcast&) = delete;
  ShmBroadcast& operator=(const ShmBroadcast&) = delete;

  // Removes the name (idempotent; the writer's destruction does it too). The mappings stay valid.
  void unlink_name() { segment_.unlink_name(); }

  // Writer: true once the message is visible to the readers; false if some reader has not taken
  // the message that occupied the slot within timeout_s. InvalidArgument if size > slot_capacity().
  bool publish(const void* data, size_t size, double timeout_s);
  // The same for a message made of parts, copied one after the other into the slot (no gathering
  // copy beforehand).
  struct Part {
    const void* data;
    size_t size;
  };
  bool publish(const std::vector<Part>& parts, double timeout_s);
  // Reader: true with the next message's bytes in `out`; false if none came within timeout_s.
  bool receive(std::vector<uint8_t>& out, double timeout_s);

  size_t slot_capacity() const { return slot_bytes_ - sizeof(uint64_t); }
  int num_readers() const { return num_readers_; }
  bool is_writer() const { return reader_ < 0; }
  const std::string& name() const { return segment_.name(); }

 private:
  struct Header;
  ShmBroadcast(SharedMemorySegment segment, int reader);
  uint8_t* slot(uint32_t message) const;

  SharedMemorySegment segment_;
  Header* header_ = nullptr;
  int reader_ = -1;  // -1: the writer
  int num_readers_ = 0;
  uint32_t num_slots_ = 0;
  size_t slot_bytes_ = 0;
};

}  // namespace corellm
