// Named POSIX shared-memory segments (shm_segment.h): created or opened, mapped, unlinked.
#include "shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <utility>

namespace nrt::dist {
namespace {

std::runtime_error os_error(const std::string& what, const std::string& name) {
  return std::runtime_error(what + " shared memory segment " + name + ": " + std::strerror(errno));
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) throw os_error("cannot map", name);
  return data;
}

}  // namespace

SharedSegment SharedSegment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, S_IRUSR | S_IWUSR);
  if (fd < 0) throw os_error("cannot create", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const auto error = os_error("cannot size", name);
    close(fd);
    shm_unlink(name.c_str());
    throw error;
  }
  void* data = nullptr;
  try {
    data = map(fd, bytes, name);
  } catch (...) {
    close(fd);
    shm_unlink(name.c_str());
    throw;
  }
  close(fd);
  return SharedSegment(name, data, bytes);
}

SharedSegment SharedSegment::open(const std::string& name, size_t bytes,
                                  std::chrono::steady_clock::time_point deadline) {
  while (true) {
    const int fd = shm_open(name.c_str(), O_RDWR, 0);
    if (fd >= 0) {
      struct stat st{};
      if (fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) >= bytes) {
        void* data = nullptr;
        try {
          data = map(fd, bytes, name);
        } catch (...) {
          close(fd);
          throw;
        }
        close(fd);
        return SharedSegment(name, data, bytes);
      }
      close(fd);  // created but not sized yet
    } else if (errno != ENOENT) {
      throw os_error("cannot open", name);
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throw std::runtime_error("timed out waiting for shared memory segment " + name +
                               " (the rank that creates it did not start or failed)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

SharedSegment::SharedSegment(SharedSegment&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      unlinked_(std::exchange(other.unlinked_, true)) {}

SharedSegment& SharedSegment::operator=(SharedSegment&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) munmap(data_, bytes_);
    name_ = std::move(other.name_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    unlinked_ = std::exchange(other.unlinked_, true);
  }
  return *this;
}

SharedSegment::~SharedSegment() {
  if (data_ != nullptr) munmap(data_, bytes_);
}

void SharedSegment::unlink() {
  if (!unlinked_ && !name_.empty()) shm_unlink(name_.c_str());
  unlinked_ = true;
}

}  // namespace nrt::dist
