// SharedMemorySegment: shm_open + ftruncate + mmap, and their undoing.
#include "corellm/shared_memory_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "corellm/check.h"

namespace corellm {

namespace {

void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int e = errno;
  close(fd);
  if (data == MAP_FAILED) throw std::system_error(e, std::generic_category(), "mmap " + name);
  return data;
}

}  // namespace

SharedMemorySegment::SharedMemorySegment(std::string name, void* data, size_t size, bool owns_name)
    : name_(std::move(name)), data_(data), size_(size), owns_name_(owns_name) {}

SharedMemorySegment SharedMemorySegment::create(const std::string& name, size_t bytes) {
  CORELLM_CHECK_ARG(name.size() > 1 && name[0] == '/' && name.find('/', 1) == std::string::npos,
                    "a shared-memory name is '/' and a file name, got '", name, "'");
  CORELLM_CHECK_ARG(bytes > 0, "a shared-memory segment needs at least one byte");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 && errno == EEXIST) CORELLM_CHECK_ARG(false, "the shared-memory name '", name, "' is taken");
  if (fd < 0) throw std::system_error(errno, std::generic_category(), "shm_open " + name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    throw std::system_error(e, std::generic_category(), "ftruncate " + name);
  }
  try {
    return SharedMemorySegment(name, map_fd(fd, bytes, name), bytes, true);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
}

SharedMemorySegment SharedMemorySegment::open(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDWR, 0600);
  CORELLM_CHECK_ARG(fd >= 0, "no shared memory named '", name, "' (", std::strerror(errno), ")");
  struct stat st {};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    CORELLM_CHECK_ARG(false, "the shared memory '", name, "' is empty");
  }
  const auto bytes = static_cast<size_t>(st.st_size);
  return SharedMemorySegment(name, map_fd(fd, bytes, name), bytes, false);
}

SharedMemorySegment::SharedMemorySegment(SharedMemorySegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      owns_name_(std::exchange(other.owns_name_, false)) {}

SharedMemorySegment& SharedMemorySegment::operator=(SharedMemorySegment&& other) noexcept {
  if (this != &other) {
    release();
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owns_name_ = std::exchange(other.owns_name_, false);
  }
  return *this;
}

SharedMemorySegment::~SharedMemorySegment() { release(); }

void SharedMemorySegment::unlink_name() {
  if (owns_name_) shm_unlink(name_.c_str());
  owns_name_ = false;
}

void SharedMemorySegment::release() {
  unlink_name();
  if (data_ != nullptr) munmap(data_, size_);
  data_ = nullptr;
}

}  // namespace corellm
