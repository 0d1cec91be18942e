// Test helper: whether this process runs under qemu user mode. There /proc/self describes
// qemu (its executable, its mappings), so tests that inspect their own process through /proc
// skip with a printed reason.
#ifndef STRATA_COMMON_TESTING_EMULATION_H_
#define STRATA_COMMON_TESTING_EMULATION_H_

#include <unistd.h>

#include <string>

namespace strata::testing {

inline bool RunningUnderQemuUser() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  const std::string exe(buf, static_cast<size_t>(n));
  const size_t slash = exe.rfind('/');
  return exe.compare(slash == std::string::npos ? 0 : slash + 1, 5, "qemu-") == 0;
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
