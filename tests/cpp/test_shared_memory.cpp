// Shared device memory (nrt_mem_alloc_shared / nrt_mem_import_shared): accounting, the
// same pages seen through every mapping, in this process and another one, and refusals.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

#include "runtime_test_support.h"

namespace {

constexpr size_t kMiB = 1024 * 1024;

using SharedMemoryTest = RuntimeTest;

uint64_t used_on(int device) {
  uint64_t used = ~uint64_t{0};
  EXPECT_NRT_OK(nrt_mem_get_info(device, &used, nullptr));
  return used;
}

uint64_t host_used() {
  uint64_t used = 0;
  nrt_host_budget(&used, nullptr);
  return used;
}

bool is_open(int fd) { return fcntl(fd, F_GETFD) != -1; }

bool all_bytes_are(const void* ptr, size_t nbytes, unsigned char value) {
  const auto* bytes = static_cast<const unsigned char*>(ptr);
  for (size_t i = 0; i < nbytes; ++i) {
    if (bytes[i] != value) return false;
  }
  return true;
}

// Sends fd and a size over a Unix socket (SCM_RIGHTS), as multiprocessing does.
bool send_fd(int socket, int fd, size_t nbytes) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{&nbytes, sizeof(nbytes)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  return sendmsg(socket, &msg, 0) == static_cast<ssize_t>(sizeof(nbytes));
}

int receive_fd(int socket, size_t* nbytes) {
  char control[CMSG_SPACE(sizeof(int))] = {};
  iovec iov{nbytes, sizeof(*nbytes)};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(socket, &msg, 0) != static_cast<ssize_t>(sizeof(*nbytes))) return -1;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (cmsg == nullptr || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd = -1;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof(int));
  return fd;
}

TEST_F(SharedMemoryTest, MappingsShareBytesAndAreChargedEach) {
  const size_t nbytes = 3 * kMiB + 5;
  void* ptr = nullptr;
  int fd = -1;
  ASSERT_NRT_OK(nrt_mem_alloc_shared(0, nbytes, &ptr, &fd));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ptr) % 64, 0u);
  EXPECT_EQ(used_on(0), nbytes);
  int found = -1;
  ASSERT_NRT_OK(nrt_mem_shared_fd(0, ptr, &found));
  EXPECT_EQ(found, fd);
  std::memset(ptr, 0x11, nbytes);

  // A second mapping (here: on device 1 of the same process) sees and changes the same pages.
  void* other = nullptr;
  int other_fd = -1;
  ASSERT_NRT_OK(nrt_mem_import_shared(1, fd, nbytes, &other, &other_fd));
  EXPECT_NE(other, ptr);
  EXPECT_NE(other_fd, fd);  // the runtime keeps a descriptor of its own
  EXPECT_TRUE(all_bytes_are(other, nbytes, 0x11));
  std::memset(other, 0x22, nbytes);
  EXPECT_TRUE(all_bytes_are(ptr, nbytes, 0x22));
  EXPECT_EQ(used_on(1), nbytes);
  EXPECT_EQ(host_used(), 2 * nbytes);

  ASSERT_NRT_OK(nrt_mem_free(0, ptr));
  EXPECT_FALSE(is_open(fd));
  EXPECT_EQ(used_on(0), 0u);
  EXPECT_TRUE(all_bytes_are(other, nbytes, 0x22));  // alive while a mapping remains
  ASSERT_NRT_OK(nrt_mem_free(1, other));
  EXPECT_FALSE(is_open(other_fd));
  EXPECT_EQ(host_used(), 0u);
  EXPECT_EQ(nrt_mem_shared_fd(0, ptr, &found), NRT_INVALID_HANDLE);
}

TEST_F(SharedMemoryTest, AnotherProcessMapsTheSamePages) {
  int sockets[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sockets), 0);
  const pid_t pid = fork();  // before this process initialises the runtime
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    close(sockets[0]);
    size_t nbytes = 0;
    const int fd = receive_fd(sockets[1], &nbytes);
    void* ptr = nullptr;
    int own_fd = -1;
    if (fd < 0 || nrt_mem_import_shared(0, fd, nbytes, &ptr, &own_fd) != NRT_SUCCESS) _exit(2);
    close(fd);
    if (!all_bytes_are(ptr, nbytes, 0x11)) _exit(3);
    std::memset(ptr, 0x22, nbytes);
    char signal = 'w';
    if (write(sockets[1], &signal, 1) != 1 || read(sockets[1], &signal, 1) != 1) _exit(4);
    // The parent has freed its mapping and descriptor: the pages are still here.
    if (!all_bytes_are(ptr, nbytes, 0x22)) _exit(5);
    _exit(nrt_mem_free(0, ptr) == NRT_SUCCESS ? 0 : 6);
  }
  close(sockets[1]);
  const size_t nbytes = kMiB;
  void* ptr = nullptr;
  int fd = -1;
  ASSERT_NRT_OK(nrt_mem_alloc_shared(0, nbytes, &ptr, &fd));
  std::memset(ptr, 0x11, nbytes);
  ASSERT_TRUE(send_fd(sockets[0], fd, nbytes));
  char signal = 0;
  ASSERT_EQ(read(sockets[0], &signal, 1), 1);
  EXPECT_TRUE(all_bytes_are(ptr, nbytes, 0x22));  // the child's writes
  ASSERT_NRT_OK(nrt_mem_free(0, ptr));
  ASSERT_EQ(write(sockets[0], "f", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  close(sockets[0]);
}

TEST_F(SharedMemoryTest, ImportRefusesWhatIsNotNeuronSharedMemory) {
  std::FILE* plain = std::tmpfile();
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(ftruncate(fileno(plain), 4096), 0);
  void* ptr = nullptr;
  int own_fd = -1;
  EXPECT_EQ(nrt_mem_import_shared(0, fileno(plain), 4096, &ptr, &own_fd), NRT_INVALID_HANDLE);
  EXPECT_CONTAINS(last_error(), "not neuron shared memory");
  std::fclose(plain);

  int fd = -1;
  ASSERT_NRT_OK(nrt_mem_alloc_shared(0, 4096, &ptr, &fd));
  void* other = nullptr;
  EXPECT_EQ(nrt_mem_import_shared(0, fd, 8192, &other, &own_fd), NRT_INVALID_HANDLE);
  EXPECT_CONTAINS(last_error(), "holds 4.00 KiB, not the expected 8.00 KiB");
  EXPECT_EQ(nrt_mem_import_shared(0, fd, 0, &other, &own_fd), NRT_INVALID_ARGUMENT);
  EXPECT_EQ(nrt_mem_import_shared(4, fd, 4096, &other, &own_fd), NRT_INVALID_DEVICE);
  EXPECT_EQ(used_on(0), 4096u);  // refusals charge nothing
  // Nobody can resize it under a mapping.
  EXPECT_NE(ftruncate(fd, 1), 0);
  EXPECT_NE(ftruncate(fd, 8192), 0);
  ASSERT_NRT_OK(nrt_mem_free(0, ptr));
  EXPECT_EQ(nrt_mem_alloc_shared(0, 0, &ptr, &fd), NRT_INVALID_ARGUMENT);
}

TEST_F(SharedMemoryTest, OutOfMemoryLeavesNoTrace) {
  setenv("TORCHNEURON_HOST_MEMORY_BUDGET", "1MiB", 1);
  void* ptr = nullptr;
  int fd = -1;
  EXPECT_EQ(nrt_mem_alloc_shared(0, 2 * kMiB, &ptr, &fd), NRT_OUT_OF_MEMORY);
  EXPECT_CONTAINS(last_error(), "2.00 MiB of shared memory");
  EXPECT_EQ(fd, -1);
  ASSERT_NRT_OK(nrt_mem_alloc_shared(0, 768 * 1024, &ptr, &fd));
  void* other = nullptr;
  int other_fd = -1;
  EXPECT_EQ(nrt_mem_import_shared(1, fd, 768 * 1024, &other, &other_fd), NRT_OUT_OF_MEMORY);
  EXPECT_CONTAINS(last_error(), "to map shared memory");
  EXPECT_EQ(used_on(1), 0u);
  EXPECT_EQ(host_used(), 768u * 1024);
  EXPECT_EQ(nrt_reset_for_testing(), NRT_INVALID_ARGUMENT);  // shared memory is still held
  ASSERT_NRT_OK(nrt_mem_free(0, ptr));
}

}  // namespace
