// Tests of fork detection: a child of an initialised runtime is a bad fork; before
// initialisation or after a reset it is not.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "runtime_test_support.h"

namespace {

using ForkTest = RuntimeTest;

// Runs `child` in a forked process and returns its exit code (or -1 if it did not exit).
template <typename F>
int run_in_child(F child) {
  const pid_t pid = fork();
  if (pid == 0) _exit(child());
  if (pid < 0) return -2;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return -3;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool mentions(const char* text, const char* word) { return std::strstr(text, word) != nullptr; }

TEST_F(ForkTest, ChildOfAnInitialisedParentIsABadFork) {
  ASSERT_NRT_OK(nrt_init());
  void* held = nullptr;
  ASSERT_NRT_OK(nrt_mem_alloc(0, 4096, &held));
  const int code = run_in_child([] {
    if (nrt_in_bad_fork() != 1) return 10;
    if (nrt_is_initialized() != 0) return 11;
    void* ptr = nullptr;
    if (nrt_mem_alloc(0, 64, &ptr) != NRT_FORKED_CHILD) return 12;
    if (!mentions(nrt_last_error(), "spawn")) return 13;
    if (!mentions(nrt_last_error(), "multiprocessing.set_start_method('spawn')")) return 14;
    if (!mentions(nrt_last_error(), "before fork()")) return 15;
    if (nrt_init() != NRT_FORKED_CHILD) return 16;
    int count = 0;
    if (nrt_device_count(&count) != NRT_FORKED_CHILD) return 17;
    if (nrt_stream_launch(0, 0, [](void*) {}, nullptr) != NRT_FORKED_CHILD) return 18;
    if (nrt_reset_for_testing() != NRT_FORKED_CHILD) return 19;
    return 0;
  });
  EXPECT_EQ(code, 0);
  // The parent is unaffected.
  EXPECT_EQ(nrt_in_bad_fork(), 0);
  EXPECT_NRT_OK(nrt_mem_free(0, held));
  int count = 0;
  EXPECT_NRT_OK(nrt_device_count(&count));
  EXPECT_EQ(count, 4);
}

TEST_F(ForkTest, ForkBeforeInitIsFine) {
  ASSERT_EQ(nrt_is_initialized(), 0);
  const int code = run_in_child([] {
    if (nrt_in_bad_fork() != 0) return 20;
    if (nrt_init() != NRT_SUCCESS) return 21;
    void* ptr = nullptr;
    if (nrt_mem_alloc(0, 1 << 20, &ptr) != NRT_SUCCESS || ptr == nullptr) return 22;
    std::memset(ptr, 1, 1 << 20);
    if (nrt_mem_free(0, ptr) != NRT_SUCCESS) return 23;
    return 0;
  });
  EXPECT_EQ(code, 0);
  EXPECT_EQ(nrt_is_initialized(), 0);
}

TEST_F(ForkTest, ForkAfterResetIsFine) {
  ASSERT_NRT_OK(nrt_init());
  ASSERT_NRT_OK(nrt_reset_for_testing());
  const int code = run_in_child([] {
    if (nrt_in_bad_fork() != 0) return 30;
    int count = 0;
    if (nrt_device_count(&count) != NRT_SUCCESS || count != 4) return 31;
    return 0;
  });
  EXPECT_EQ(code, 0);
}

}  // namespace
