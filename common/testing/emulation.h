// Test helper: whether this process runs under qemu user mode. There /proc/self describes
// qemu (its executable, its mappings), so tests that inspect their own process through /proc
// skip with a printed reason.
#ifndef STRATA_COMMON_TESTING_EMULATION_H_
#define STRATA_COMMON_TESTING_EMULATION_H_

#include <fcntl.h>
#include <unistd.h>

#include <string>

namespace strata::testing {

inline bool RunningUnderQemuUser() {
  // qemu answers for /proc/<self>/exe itself (with the guest binary), but not for comm,
  // which names the qemu process.
  char buf[64] = {};
  const int fd = open("/proc/self/comm", O_RDONLY);
  if (fd < 0) return false;
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  return n >= 5 && std::string(buf, 5) == "qemu-";
}

}  // namespace strata::testing

// Skips the current test when /proc/self is qemu's, not the test's.
#define STRATA_SKIP_UNDER_QEMU_USER()                                                   \
  do {                                                                                   \
    if (::strata::testing::RunningUnderQemuUser()) {                                     \
      GTEST_SKIP() << "runs under qemu user mode: /proc/self describes qemu, not the test"; \
    }                                                                                    \
  } while (0)

#endif  // STRATA_COMMON_TESTING_EMULATION_H_
