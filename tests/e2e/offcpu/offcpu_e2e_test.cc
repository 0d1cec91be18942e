// Beyond on-CPU user stacks, end to end: kernel frames of a syscall-heavy workload under its
// user frames, and the off-CPU and wall-clock profiles of a thread that sleeps half of the
// time in a known function, checked against the workload's own accounting. Real
// strata-server, strata-agent (kernel-mode perf events) and tests/workloads/blocking_service.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"
#include "tests/e2e/harness.h"

namespace strata::e2e {
namespace {

// Kernel-mode events: root or CAP_PERFMON, or perf_event_paranoid <= 1.
bool KernelEventsAllowed(std::string* why) {
  if (geteuid() == 0) return true;
  std::ifstream in("/proc/sys/kernel/perf_event_paranoid");
  int paranoid = 2;
  in >> paranoid;
  *why = absl::StrCat("not root and kernel.perf_event_paranoid = ", paranoid);
  return paranoid <= 1;
}

grpc::Status TryHotPaths(const std::string& address, const std::string& service,
                         v1::ProfileType type, v1::HotPathsResponse* response) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  v1::HotPathsRequest request;
  request.mutable_filter()->set_service(service);
  request.mutable_filter()->set_type(type);
  request.set_limit(100000);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  return stub->HotPaths(&context, request, response);
}

v1::HotPathsResponse HotPaths(const std::string& address, const std::string& service,
                              v1::ProfileType type) {
  v1::HotPathsResponse response;
  grpc::Status status = TryHotPaths(address, service, type, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response;
}

// Waits until the profile of `type` holds at least `samples` (false after `timeout`); the
// service is unknown until its first batch.
bool WaitForProfile(const std::string& address, const std::string& service,
                    v1::ProfileType type, uint64_t samples, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    v1::HotPathsResponse response;
    if (TryHotPaths(address, service, type, &response).ok() &&
        response.total_samples() >= samples) {
      return true;
    }
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(250));
  }
}

bool Contains(const v1::HotPath& path, const std::string& function) {
  return std::any_of(path.frames().begin(), path.frames().end(),
                     [&](const v1::Frame& f) { return f.function() == function; });
}

class OffCpuE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!KernelEventsAllowed(&why)) GTEST_SKIP() << "kernel-mode perf events refused: " << why;
  }
  strata::testing::TempDir dir_{"strata_offcpu_e2e"};
};

// read(2) of /dev/zero: the kernel's frames come below read_zeros, marked as kernel frames,
// never above a user frame.
TEST_F(OffCpuE2eTest, SyscallsShowKernelFramesUnderTheirUserFrames) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess workload({BinPath("blocking_service"), "--mode", "syscalls"},
                        dir_.File("workload.log"), {{"STRATA_SERVICE", "syscalls"}});
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(workload.pid()), "--kernel-stacks", "on", "--interval", "1",
                      "--spool-dir", "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", workload.pid()), 30))
      << agent.Output();
  EXPECT_TRUE(WaitForProfile(server.address(), "syscalls", v1::PROFILE_CPU, 300,
                             absl::Seconds(90)))
      << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();

  v1::HotPathsResponse paths = HotPaths(server.address(), "syscalls", v1::PROFILE_CPU);
  uint64_t in_read_zeros = 0;
  uint64_t with_kernel = 0;
  uint64_t with_read_syscall = 0;
  for (const v1::HotPath& path : paths.paths()) {
    auto at = std::find_if(path.frames().begin(), path.frames().end(),
                           [](const v1::Frame& f) { return f.function() == "read_zeros"; });
    if (at == path.frames().end()) continue;
    in_read_zeros += path.samples();
    bool kernel_seen = false;
    bool read_seen = false;
    for (const v1::Frame& f : path.frames()) {
      const bool kernel = f.module().rfind("[kernel", 0) == 0;
      EXPECT_EQ(kernel, f.kind() == v1::FRAME_KERNEL) << f.function() << " " << f.module();
      // Once in the kernel, a stack stays there.
      EXPECT_TRUE(kernel || !kernel_seen) << "user frame " << f.function() << " below kernel";
      kernel_seen |= kernel;
      read_seen |= kernel && f.function().find("read") != std::string::npos;
    }
    with_kernel += kernel_seen ? path.samples() : 0;
    with_read_syscall += read_seen ? path.samples() : 0;
  }
  ASSERT_GT(in_read_zeros, paths.total_samples() / 2) << agent.Output();
  // Copying 64 KiB of zeros per call keeps the thread in the kernel most of the time.
  EXPECT_GT(with_kernel, in_read_zeros / 2);
  EXPECT_GT(with_read_syscall, in_read_zeros / 4);

  // The agent's unwinding counters reached the server with its batches, and the kernel's
  // frames are all named.
  auto stub = v1::Query::NewStub(server.Channel());
  v1::QualityRequest request;
  request.mutable_filter()->set_service("syscalls");
  grpc::ClientContext context;
  v1::QualityResponse quality;
  ASSERT_TRUE(stub->Quality(&context, request, &quality).ok());
  EXPECT_EQ(quality.agent_stacks(), quality.samples());  // counters of the CPU stacks shipped
  EXPECT_GT(quality.samples(), 0u);
  for (const v1::BinaryQuality& b : quality.binaries()) {
    if (b.module() == "[kernel.kallsyms]") {
      EXPECT_EQ(b.unnamed_frames(), 0u);
    }
  }
}

// A thread that burns 20 ms of CPU in burn_cpu, then sleeps 20 ms in nap_in_known_place: the
// wall profile splits its time as the workload measured it (about evenly on an idle machine),
// the CPU profile has almost no nap_in_known_place, and the off-CPU profile has it in the
// proportion of the naps to all the time off CPU, preemptions included.
TEST_F(OffCpuE2eTest, HalfSleepingThreadSplitsItsWallClockTime) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  ChildProcess workload({BinPath("blocking_service"), "--mode", "half-sleep", "--burn-ms", "20",
                         "--nap-ms", "20"},
                        dir_.File("workload.log"), {{"STRATA_SERVICE", "sleepy"}});
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(workload.pid()), "--off-cpu", "--interval", "1",
                      "--spool-dir", "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", workload.pid()), 30))
      << agent.Output();
  // At 99 Hz the worker takes ~50 CPU samples a second and as many off CPU.
  EXPECT_TRUE(WaitForProfile(server.address(), "sleepy", v1::PROFILE_CPU, 400,
                             absl::Seconds(120)))
      << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();
  ASSERT_EQ(workload.Stop(SIGTERM, 15), 0) << workload.Output();
  std::smatch m;
  const std::string summary = workload.Output();
  ASSERT_TRUE(std::regex_search(summary, m,
                                std::regex(R"(burn_ms=(\d+) burn_wall_ms=(\d+) nap_ms=(\d+))")))
      << summary;
  const double burn_cpu_ms = std::stod(m[1]);
  const double burn_wall_ms = std::stod(m[2]);
  const double nap_ms = std::stod(m[3]);
  // Wall: the nap's share of the worker's time. Off CPU: of the time it was not running,
  // which also holds the preemptions inside burn_cpu (many on a loaded machine).
  const double nap_truth = nap_ms / (burn_wall_ms + nap_ms);
  const double off_nap_truth = nap_ms / (nap_ms + std::max(0.0, burn_wall_ms - burn_cpu_ms));

  // Shares among the worker's stacks (the main thread only waits for it).
  auto share = [&](v1::ProfileType type, const std::string& function, uint64_t* total) {
    uint64_t worker = 0;
    uint64_t hit = 0;
    const v1::HotPathsResponse response = HotPaths(server.address(), "sleepy", type);
    for (const v1::HotPath& path : response.paths()) {
      if (!Contains(path, "run_thread")) continue;
      worker += path.samples();
      if (Contains(path, function)) hit += path.samples();
    }
    *total = worker;
    return worker == 0 ? 0.0 : static_cast<double>(hit) / static_cast<double>(worker);
  };
  uint64_t cpu_total = 0, off_total = 0, wall_total = 0;
  const double cpu_nap = share(v1::PROFILE_CPU, "nap_in_known_place", &cpu_total);
  const double off_nap = share(v1::PROFILE_OFF_CPU, "nap_in_known_place", &off_total);
  const double wall_nap = share(v1::PROFILE_WALL, "nap_in_known_place", &wall_total);
  const double wall_burn = share(v1::PROFILE_WALL, "burn_cpu", &wall_total);
  RecordProperty("nap_share_truth", absl::StrCat(nap_truth));
  RecordProperty("nap_share_wall", absl::StrCat(wall_nap));
  std::printf("nap share of wall time: workload %.3f, wall profile %.3f; of off-CPU time: "
              "workload %.3f, off-CPU profile %.3f; of CPU samples %.3f; samples cpu=%llu "
              "off-cpu=%llu wall=%llu\n",
              nap_truth, wall_nap, off_nap_truth, off_nap, cpu_nap,
              static_cast<unsigned long long>(cpu_total),
              static_cast<unsigned long long>(off_total),
              static_cast<unsigned long long>(wall_total));
  ASSERT_GT(off_total, 100u) << agent.Output();
  EXPECT_EQ(wall_total, cpu_total + off_total);
  EXPECT_LT(cpu_nap, 0.05);
  EXPECT_NEAR(off_nap, off_nap_truth, 0.10);
  // A loaded machine runs the worker late (longer naps, slower burns): compare with what the
  // workload itself measured, not with 50 %.
  EXPECT_NEAR(wall_nap, nap_truth, 0.10);
  EXPECT_NEAR(wall_burn, 1 - nap_truth, 0.10);
}

// The agent's targets as Query.ListAgents lists them ("service/pid"); empty if unreachable.
std::vector<std::string> ListedTargets(const std::string& address) {
  auto stub = v1::Query::NewStub(grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ListAgentsResponse agents;
  std::vector<std::string> targets;
  if (!stub->ListAgents(&context, v1::ListAgentsRequest(), &agents).ok()) return targets;
  for (const v1::AgentInfo& agent : agents.agents()) {
    targets.insert(targets.end(), agent.targets().begin(), agent.targets().end());
  }
  return targets;
}

bool WaitForTargets(const std::string& address, const std::vector<std::string>& expected,
                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ListedTargets(address) != expected) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return true;
}

// A process that exits while it is profiled off CPU: the batches of its last window, its
// off-CPU time and the other process's in one, still name it, so the server takes them
// rather than refusing them for a target it does not know. The agent's listed targets follow
// the processes, down to none.
TEST_F(OffCpuE2eTest, AProcessThatExitsKeepsItsLastWindow) {
  ServerProcess server(dir_.File("data"), dir_.File("server.log"));
  ASSERT_GT(server.port(), 0) << server.process().Output();
  const std::vector<std::string> half_sleep = {BinPath("blocking_service"), "--mode",
                                               "half-sleep", "--burn-ms", "5", "--nap-ms", "20"};
  ChildProcess leaving(half_sleep, dir_.File("leaving.log"), {{"STRATA_SERVICE", "leaving"}});
  ChildProcess staying(half_sleep, dir_.File("staying.log"), {{"STRATA_SERVICE", "staying"}});
  ChildProcess agent({BinPath("strata-agent"), "--server", server.address(), "--pid",
                      std::to_string(leaving.pid()), "--pid", std::to_string(staying.pid()),
                      "--off-cpu", "--interval", "1", "--spool-dir", "none"},
                     dir_.File("agent.log"));
  ASSERT_TRUE(agent.WaitForOutput(absl::StrCat("profiling pid ", staying.pid()), 30))
      << agent.Output();
  ASSERT_TRUE(WaitForProfile(server.address(), "leaving", v1::PROFILE_OFF_CPU, 10,
                             absl::Seconds(60)))
      << agent.Output();
  EXPECT_EQ(leaving.Stop(SIGTERM, 15), 0) << leaving.Output();
  const std::string staying_target = absl::StrCat("staying/", staying.pid());
  EXPECT_TRUE(WaitForTargets(server.address(), {staying_target}, absl::Seconds(30)))
      << agent.Output();
  // A window after the exit has gone out once the staying process's off-CPU time grows.
  v1::HotPathsResponse before = HotPaths(server.address(), "staying", v1::PROFILE_OFF_CPU);
  EXPECT_TRUE(WaitForProfile(server.address(), "staying", v1::PROFILE_OFF_CPU,
                             before.total_samples() + 20, absl::Seconds(60)));
  EXPECT_EQ(staying.Stop(SIGTERM, 15), 0);
  EXPECT_TRUE(WaitForTargets(server.address(), {}, absl::Seconds(30))) << agent.Output();
  EXPECT_EQ(agent.Stop(SIGTERM, 15), 0) << agent.Output();

  EXPECT_EQ(agent.Output().find("rejected"), std::string::npos) << agent.Output();
  EXPECT_EQ(server.process().Output().find("rejected"), std::string::npos)
      << server.process().Output();
  EXPECT_GT(HotPaths(server.address(), "leaving", v1::PROFILE_OFF_CPU).total_samples(), 0u);
  EXPECT_GT(HotPaths(server.address(), "leaving", v1::PROFILE_CPU).total_samples(), 0u);
}

}  // namespace
}  // namespace strata::e2e
