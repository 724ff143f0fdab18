// SharedMemorySegment: a named POSIX shared-memory segment mapped into this process (shm_open +
// mmap), for the structures that tensor-parallel ranks on one machine share (ShmBroadcast,
// ShmAllReduce). The creator owns the name: it unlinks it when asked (once every other process has
// opened it) or when destroyed; the mapping lives as long as the object.
#pragma once

#include <cstddef>
#include <string>

namespace corellm {

class SharedMemorySegment {
 public:
  // A new zero-filled segment of `bytes`; InvalidArgument if `name` is not "/file-name" or is
  // taken, std::system_error if the system refuses the memory.
  static SharedMemorySegment create(const std::string& name, size_t bytes);
  // The existing segment `name`, all of it; InvalidArgument if there is none.
  static SharedMemorySegment open(const std::string& name);

  SharedMemorySegment(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment& operator=(SharedMemorySegment&& other) noexcept;
  SharedMemorySegment(const SharedMemorySegment&) = delete;
  SharedMemorySegment& operator=(const SharedMemorySegment&) = delete;
  ~SharedMemorySegment();

  void* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  // Removes the name (the creator's; idempotent). Mappings stay valid.
  void unlink_name();

 private:
  SharedMemorySegment(std::string name, void* data, size_t size, bool owns_name);
  void release();

  std::string name_;
  void* data_ = nullptr;
  size_t size_ = 0;
  bool owns_name_ = false;
};

}  // namespace corellm
