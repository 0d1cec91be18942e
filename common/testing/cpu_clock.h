// A thread's time on a CPU by the clock perf's cpu-clock samples are taken on, for tests that
// compare sample counts with the time sampled. Not the scheduler's run time (schedstat): with
// paravirtual steal accounting that leaves out the time the host took from a running thread,
// while cpu-clock's timer keeps firing through it, so on a busy host the samples outnumber
// run time x rate by the steal.
#ifndef STRATA_COMMON_TESTING_CPU_CLOCK_H_
#define STRATA_COMMON_TESTING_CPU_CLOCK_H_

#include <linux/perf_event.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#include "common/base/unique_fd.h"
#include "gtest/gtest.h"

namespace strata::testing {

// A counting cpu-clock event on thread `tid`: its time on a CPU from construction on. A
// failure to open or read it is a test failure (and reads 0).
class CpuClock {
 public:
  explicit CpuClock(pid_t tid) {
    perf_event_attr attr;
    std::memset(&attr, 0, sizeof attr);
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.exclude_kernel = 1;  // as the samplers' events: allowed where they are
    attr.exclude_hv = 1;
    fd_ = base::UniqueFd(static_cast<int>(
        syscall(__NR_perf_event_open, &attr, tid, -1, -1, PERF_FLAG_FD_CLOEXEC)));
    EXPECT_GE(fd_.get(), 0) << "cpu-clock counter on " << tid << ": " << std::strerror(errno);
  }

  uint64_t ns() const {
    uint64_t value = 0;
    if (fd_.get() < 0 || read(fd_.get(), &value, sizeof value) != sizeof value) {
      ADD_FAILURE() << "reading a cpu-clock counter: " << std::strerror(errno);
    }
    return value;
  }

 private:
  base::UniqueFd fd_;
};

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_CPU_CLOCK_H_
