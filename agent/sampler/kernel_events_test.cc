// Live tests of kernel-mode events: kernel call chains on cpu-clock samples of a thread that
// spends its time in system calls, and context-switch sessions (switch-out samples with the
// thread's stack, then a switch-in when it runs again) on a thread that sleeps. Real perf
// events on forked children; skipped with the kernel's reason where kernel-mode events are
// refused (perf_event_paranoid > 1 without CAP_PERFMON).

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <map>
#include <vector>

#include "absl/time/clock.h"
#include "agent/sampler/perf_sampler.h"
#include "gtest/gtest.h"

namespace strata::agent::sampler {
namespace {

// A forked child running `body` forever; killed with the object.
class Child {
 public:
  template <typename Body>
  explicit Child(Body body) {
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      for (;;) body();
    }
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
};

void ReadZeros() {
  static char buffer[1 << 16];
  static int fd = open("/dev/zero", O_RDONLY);
  for (int i = 0; i < 64; ++i) {
    if (read(fd, buffer, sizeof(buffer)) < 0) _exit(1);
  }
}

void Nap() { usleep(2000); }

// Drains `sampler` until `done` says so or 20 s pass (a loaded machine runs the child late).
template <typename Fn, typename Done>
void DrainUntil(PerfSampler& sampler, Fn fn, Done done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (!done() && absl::Now() < deadline) {
    ASSERT_TRUE(sampler.Wait(absl::Milliseconds(50)).ok());
    sampler.Drain(fn);
  }
}

class KernelEventsTest : public ::testing::TestWithParam<SamplingScope> {
 protected:
  void SetUp() override {
    for (SessionEvent event : {SessionEvent::kCpuClock, SessionEvent::kContextSwitches}) {
      absl::Status probe = ProbeKernelEvents(GetParam(), event);
      if (absl::IsUnavailable(probe) || absl::IsPermissionDenied(probe)) {
        GTEST_SKIP() << "kernel-mode perf events not usable here: " << probe;
      }
      ASSERT_TRUE(probe.ok()) << probe;
    }
    sampler_ = PerfSampler::Create().value();
  }

  SessionOptions Options(SessionEvent event) const {
    SessionOptions options;
    options.session_id = 1;
    options.scope = GetParam();
    options.frequency_hz = 499;
    options.stack_bytes = 4096;
    options.ring_pages = 64;
    options.wakeup_samples = 1;
    options.event = event;
    options.kernel_stacks = true;
    return options;
  }

  std::unique_ptr<PerfSampler> sampler_;
};

TEST_P(KernelEventsTest, SystemCallSamplesCarryKernelChainsAndUserRegisters) {
  Child child(ReadZeros);
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(sampler_->AddSession(Options(SessionEvent::kCpuClock)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(1, child.pid(), {child.pid()}).ok());
  size_t samples = 0;
  size_t with_chain = 0;
  size_t kernel_addresses = 0;
  size_t user_pc = 0;
  DrainUntil(
      *sampler_,
      [&](const RawSample& s) {
        if (s.pid != static_cast<uint32_t>(child.pid())) return;
        ++samples;
        if (s.kernel_depth > 0) {
          ++with_chain;
          // Kernel text is in the upper half of the address space on x86-64 and MIPS64.
          kernel_addresses += (s.kernel_pcs[0] >> 63) != 0;
        }
        // A sample taken in the kernel still has the user registers of the system call.
        user_pc += s.pc != 0 && (s.pc >> 63) == 0;
      },
      [&] { return samples >= 200; });
  ASSERT_GE(samples, 200u);
  // Copying 4 MiB of zeros a call: most CPU time is in the kernel.
  EXPECT_GT(with_chain, samples / 2);
  EXPECT_EQ(kernel_addresses, with_chain);
  EXPECT_EQ(user_pc, samples);
}

TEST_P(KernelEventsTest, ContextSwitchesPairSwitchOutWithSwitchIn) {
  Child child(Nap);
  ASSERT_GT(child.pid(), 0);
  ASSERT_TRUE(sampler_->AddSession(Options(SessionEvent::kContextSwitches)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(1, child.pid(), {child.pid()}).ok());
  std::map<uint32_t, uint64_t> out_at;  // tid -> switch-out time
  std::vector<uint64_t> intervals;
  size_t outs = 0;
  size_t outs_with_stack = 0;
  DrainUntil(
      *sampler_,
      [&](const RawSample& s) {
        if (s.pid != static_cast<uint32_t>(child.pid())) return;
        if (s.kind == RawEventKind::kSample) {
          ++outs;
          outs_with_stack += s.stack_size > 0 && s.pc != 0 && s.kernel_depth > 0;
          out_at[s.tid] = s.time_ns;
        } else if (auto it = out_at.find(s.tid); it != out_at.end()) {
          if (s.time_ns >= it->second) intervals.push_back(s.time_ns - it->second);
          out_at.erase(it);
        }
      },
      [&] { return intervals.size() >= 200; });
  ASSERT_GE(intervals.size(), 200u) << outs << " switch-outs";
  EXPECT_EQ(outs_with_stack, outs);
  // usleep(2000): many intervals are the sleep (at least 2 ms), the others preemptions and
  // migrations, which a loaded machine makes frequent: a quarter of them with four busy threads
  // per core, 57 % while deploy/test.sh compiled beside the tests at nice 19.
  size_t sleeps = 0;
  for (uint64_t ns : intervals) sleeps += ns >= 2'000'000 && ns < 200'000'000;
  EXPECT_GE(sleeps, intervals.size() / 4);
  EXPECT_GE(sampler_->stats().switches_in, intervals.size());
}

INSTANTIATE_TEST_SUITE_P(Scopes, KernelEventsTest,
                         ::testing::Values(SamplingScope::kPerThread, SamplingScope::kPerCpu),
                         [](const auto& info) {
                           return info.param == SamplingScope::kPerCpu ? "PerCpu" : "PerThread";
                         });

}  // namespace
}  // namespace strata::agent::sampler
