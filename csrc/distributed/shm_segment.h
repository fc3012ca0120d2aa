// A named POSIX shared-memory segment, mapped into this process.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace nrt::dist {

class SharedSegment {
 public:
  // Creates `name` (which must not exist) with owner-only permissions (0600).
  static SharedSegment create(const std::string& name, size_t bytes);
  // Opens `name`, waiting until its creator has sized it or `deadline` passes.
  static SharedSegment open(const std::string& name, size_t bytes,
                            std::chrono::steady_clock::time_point deadline);

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();  // unmaps; the name stays until unlink()

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  const std::string& name() const { return name_; }
  // Removes the name (the memory lives on while mapped). Safe to call more than once.
  void unlink();

 private:
  SharedSegment(std::string name, void* data, size_t bytes)
      : name_(std::move(name)), data_(data), bytes_(bytes) {}

  std::string name_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool unlinked_ = false;
};

}  // namespace nrt::dist
