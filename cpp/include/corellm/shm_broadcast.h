// ShmBroadcast: messages from one writer to a fixed set of readers on the same machine, through a
// ring of slots in POSIX shared memory. The tensor-parallel executor sends each step's inputs to
// its worker processes through it (python/corellm/distributed/broadcast_channel.py) instead of
// two broadcasts over sockets.
//
// The algorithm. The segment holds a header, then `num_slots` slots of `slot_bytes` each:
//
//   header:  geometry (magic, num_readers, num_slots, slot_bytes), then, each on its own cache line,
//            `published` (messages the writer has made visible) and `consumed[r]` (messages reader
//            r is done with); all are counters that only grow (uint32, compared modulo 2^32).
//   slot i:  a uint64 size, then the message's bytes; message m lives in slot m % num_slots.
//
//   publish(m):  wait until every reader's consumed >= m + 1 - num_slots (the slot's previous
//                message is taken), copy the bytes and size in, then published = m + 1 (release)
//                and wake the readers sleeping on `published` (futex).
//   receive():   wait until published > consumed[r] (acquire): spin briefly — a step follows the
//                previous one within microseconds — then sleep on the futex; copy message
//                consumed[r] out, then consumed[r] += 1 (release), which frees its slot.
//   receive_in_place(): first release the message this reader still holds in place (consumed[r]
//                += 1), then wait as receive() does and hand out message consumed[r] where it lies
//                in its slot, without a copy; the slot stays the reader's until its next receive.
//                The writer can then be one message ahead of a reader working on a message, as a
//                step ahead of its workers is (the next one needs their collectives).
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
#include <optional>
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
  // copy beforehand). A part is `rows` runs of `row_bytes` bytes, `stride` bytes apart: a buffer
  // (rows 1), or the first columns of a 2-D array's rows.
  struct Part {
    const void* data;
    size_t row_bytes;
    size_t rows = 1;
    size_t stride = 0;
    size_t size() const { return row_bytes * rows; }
  };
  bool publish(const std::vector<Part>& parts, double timeout_s);
  // Reader: true with the next message's bytes in `out`; false if none came within timeout_s.
  bool receive(std::vector<uint8_t>& out, double timeout_s);
  // Reader, without a copy: the next message's bytes where they lie in their slot, valid until this
  // reader's next receive or receive_in_place (which gives the slot back to the writer); nullopt if
  // none came within timeout_s.
  struct View {
    const uint8_t* data;
    size_t size;
  };
  std::optional<View> receive_in_place(double timeout_s);

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
  bool holding_ = false;  // a reader: it holds message consumed[reader_] in place (receive_in_place)
  int num_readers_ = 0;
  uint32_t num_slots_ = 0;
  size_t slot_bytes_ = 0;
};

}  // namespace corellm
