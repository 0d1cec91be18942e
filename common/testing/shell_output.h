// Test helper: the standard output of a shell command (popen), for tests that compare with
// what a tool prints (nm, go tool objdump, a program's own report). Empty when it cannot run.
#ifndef STRATA_COMMON_TESTING_SHELL_OUTPUT_H_
#define STRATA_COMMON_TESTING_SHELL_OUTPUT_H_

#include <cstdio>
#include <string>

namespace strata::testing {

inline std::string ShellOutput(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_SHELL_OUTPUT_H_
