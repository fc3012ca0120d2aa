// Shareable host memory as sealed memory files (shared_file.h): created, sized, mapped and
// checked when another process maps them.
#include "shared_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "bytes.h"
#include "error.h"

namespace nrt {
namespace {

constexpr int kSizeSeals = F_SEAL_SHRINK | F_SEAL_GROW;

std::string os_error(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

}  // namespace

nrt_status shared_file_create(const std::string& name, size_t nbytes, int* out_fd) {
  *out_fd = -1;
  if (nbytes == 0) return fail(NRT_INVALID_ARGUMENT, "shared memory of 0 bytes cannot be mapped");
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    const bool out_of_fds = errno == EMFILE || errno == ENFILE;
    return fail(out_of_fds ? NRT_OUT_OF_MEMORY : NRT_INVALID_ARGUMENT,
                os_error("memfd_create") +
                    (out_of_fds ? " (each shared neuron storage holds one file descriptor in "
                                  "every process that maps it; raise `ulimit -n`)"
                                : ""));
  }
  if (ftruncate(fd, static_cast<off_t>(nbytes)) != 0 ||
      fcntl(fd, F_ADD_SEALS, kSizeSeals | F_SEAL_SEAL) != 0) {
    const std::string message = os_error("sizing the shared memory file");
    close(fd);
    return fail(NRT_OUT_OF_MEMORY, message + " (" + format_bytes(nbytes) + ")");
  }
  *out_fd = fd;
  return NRT_SUCCESS;
}

nrt_status shared_file_check(int fd, size_t nbytes) {
  struct stat info{};
  if (fstat(fd, &info) != 0) return fail(NRT_INVALID_HANDLE, os_error("fstat of shared memory"));
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & kSizeSeals) != kSizeSeals) {
    return fail(NRT_INVALID_HANDLE, "file descriptor " + std::to_string(fd) +
                                        " is not neuron shared memory (a size-sealed memory file)");
  }
  if (static_cast<uint64_t>(info.st_size) != nbytes) {
    return fail(NRT_INVALID_HANDLE, "shared memory file holds " +
                                        format_bytes(static_cast<uint64_t>(info.st_size)) +
                                        ", not the expected " + format_bytes(nbytes));
  }
  return NRT_SUCCESS;
}

nrt_status shared_file_map(int fd, size_t nbytes, void** out_ptr) {
  void* ptr = mmap(nullptr, nbytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (ptr == MAP_FAILED) {
    *out_ptr = nullptr;
    return fail(NRT_OUT_OF_MEMORY, os_error("mmap of shared memory"));
  }
  *out_ptr = ptr;
  return NRT_SUCCESS;
}

}  // namespace nrt
