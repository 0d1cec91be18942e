// Test helpers: a process's thread by name and how often it gave up its CPU to wait, from
// /proc (the process itself with "self", or another one by pid). Tests that count wake-ups
// use them; under qemu user mode /proc/self describes qemu (emulation.h).
#ifndef STRATA_COMMON_TESTING_THREAD_STATS_H_
#define STRATA_COMMON_TESTING_THREAD_STATS_H_

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace strata::testing {

// The thread of process `process` ("self" or a pid) named `name`, or 0.
inline pid_t ThreadNamed(const std::string& process, const std::string& name) {
  std::error_code ec;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + process + "/task", ec)) {
    std::ifstream comm(task.path() / "comm");
    std::string line;
    if (std::getline(comm, line) && line == name) {
      return static_cast<pid_t>(std::stol(task.path().filename().string()));
    }
  }
  return 0;
}

// Times thread `tid` of process `process` gave up its CPU to wait (0 if it is gone).
inline uint64_t VoluntarySwitches(const std::string& process, pid_t tid) {
  std::ifstream status("/proc/" + process + "/task/" + std::to_string(tid) + "/status");
  const std::string key = "voluntary_ctxt_switches:";
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(key.size()));
  }
  return 0;
}

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_THREAD_STATS_H_
