// The recorder's steady state allocates nothing: real perf samples of a live child (with its
// kernel chains where the kernel allows them), recorded once to warm the caches (threads, pcs,
// kernel pcs, graph edges, contexts), then recorded again under a counting allocator; the
// same samples replayed as an off-CPU session's switch-outs, each followed by its switch-in,
// count exactly their off-CPU time, also without allocating. A CPython child's samples get
// its Python frames in place of the eval loop's, also without allocating once warm.

#include "agent/core/stack_recorder.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "absl/time/clock.h"
#include "agent/core/context_graph.h"
#include "agent/core/targets.h"
#include "agent/sampler/perf_sampler.h"
#include "agent/sources/perf_source.h"
#include "common/testing/counting_allocator.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

volatile uint64_t g_counter = 0;

[[gnu::noinline]] void Leaf() {
  for (int i = 0; i < 1000; ++i) g_counter = g_counter + 1;
}
[[gnu::noinline]] void Middle() {
  for (int i = 0; i < 100; ++i) {
    Leaf();
    syscall(SYS_getppid);  // some samples in the kernel, for kernel chains
  }
}
[[noreturn, gnu::noinline]] void Outer(int ready_fd) {
  char byte = 'r';
  if (write(ready_fd, &byte, 1) != 1) _exit(1);
  for (;;) Middle();
}

struct CopiedSample {
  sampler::RawSample sample;
  std::vector<uint8_t> stack;
  std::vector<uint64_t> kernel_pcs;
};

TEST(StackRecorderTest, SteadyStateSampleAllocatesNothing) {
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) {
    GTEST_SKIP() << "perf events not usable here: " << probe;
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[0]);
    Outer(fds[1]);
  }
  close(fds[1]);
  char byte;
  ASSERT_EQ(read(fds[0], &byte, 1), 1);
  close(fds[0]);
  struct KillChild {
    pid_t pid;
    ~KillChild() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } kill_child{child};

  // Real samples of the child, copied out of the ring.
  auto perf = sampler::PerfSampler::Create();
  ASSERT_TRUE(perf.ok()) << perf.status();
  sampler::SessionOptions session;
  session.frequency_hz = 999;
  const bool kernel_stacks =
      sampler::ProbeKernelEvents(session.scope, sampler::SessionEvent::kCpuClock).ok();
  session.kernel_stacks = kernel_stacks;
  std::unique_ptr<kernel::KernelSymbols> kernel_symbols;
  if (kernel_stacks) kernel_symbols = kernel::KernelSymbols::Load().value_or(nullptr);
  ASSERT_TRUE((*perf)->AddSession(session).ok());
  ASSERT_TRUE((*perf)->AttachProcess(0, child, {child}).ok());
  std::vector<CopiedSample> samples;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (samples.size() < 300 && absl::Now() < deadline) {
    ASSERT_TRUE((*perf)->Wait(absl::Milliseconds(100)).ok());
    (*perf)->Drain([&](const sampler::RawSample& s) {
      CopiedSample copy{s, std::vector<uint8_t>(s.stack, s.stack + s.stack_size),
                        std::vector<uint64_t>(s.kernel_pcs, s.kernel_pcs + s.kernel_depth)};
      samples.push_back(std::move(copy));
    });
  }
  ASSERT_GE(samples.size(), 300u) << "the child got too little CPU";
  for (CopiedSample& s : samples) {
    s.sample.stack = s.stack.data();
    s.sample.kernel_pcs = s.kernel_pcs.data();
  }

  DiscoveryOptions options;
  options.pids = {child};
  auto discovery = TargetDiscovery::Create(options);
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  auto changes = (*discovery)->Scan();
  ASSERT_TRUE(changes.ok());
  ASSERT_EQ(changes->added.size(), 1u);
  (*discovery)->Insert((*discovery)->NewTarget(changes->added[0], nullptr));

  ContextGraph graph(1);
  StackRecorder recorder({.kernel_symbols = kernel_symbols.get()}, &graph, discovery->get());
  for (const CopiedSample& s : samples) recorder.OnSample(s.sample);  // warms every cache
  const StackRecorderStats warm = recorder.stats();
  ASSERT_EQ(warm.samples, samples.size());
  ASSERT_EQ(warm.dropped, 0u);
  // Stacks reach the child's Outer through Middle (not cut short at the leaf).
  ASSERT_GT(warm.unwound_frames, 3 * samples.size());
  // Leaf()'s loop is sampled at several addresses: all but the first are resolved without
  // symbolizing (as inside any function resolved before).
  EXPECT_LT(warm.pcs_symbolized, warm.pcs_resolved)
      << warm.pcs_resolved << " pcs, " << warm.pcs_symbolized << " symbolized";
  const uint64_t edges = graph.num_edges();

  const uint64_t before = strata::testing::AllocationCount();
  for (int round = 0; round < 3; ++round) {
    for (const CopiedSample& s : samples) recorder.OnSample(s.sample);
  }
  const uint64_t after = strata::testing::AllocationCount();
  EXPECT_EQ(after - before, 0u) << "allocations in " << 3 * samples.size() << " samples";
  EXPECT_EQ(graph.num_edges(), edges);
  EXPECT_EQ(recorder.stats().samples, 4 * samples.size());
  EXPECT_EQ(recorder.stats().unwind_verify_failures, 0u);
  EXPECT_EQ(recorder.continuous().samples(), 4 * samples.size());

  // The same stacks as switch-outs, each ended by a switch-in 1 ms later.
  auto replay_off_cpu = [&samples](StackRecorder& to) {
    for (const CopiedSample& s : samples) {
      sampler::RawSample out = s.sample;
      out.session_id = sources::kOffCpuSession;
      to.OnSample(out);
      sampler::RawSample in;
      in.kind = sampler::RawEventKind::kSwitchIn;
      in.session_id = sources::kOffCpuSession;
      in.pid = s.sample.pid;
      in.tid = s.sample.tid;
      in.time_ns = s.sample.time_ns + 1'000'000;
      to.OnSample(in);
    }
  };
  replay_off_cpu(recorder);  // warms the off-CPU unwinders
  const uint64_t off_before = strata::testing::AllocationCount();
  replay_off_cpu(recorder);
  EXPECT_EQ(strata::testing::AllocationCount() - off_before, 0u);
  EXPECT_EQ(recorder.off_cpu().samples(), 2 * samples.size() * 1'000'000);
  EXPECT_EQ(recorder.stats().off_cpu_counted, 2 * samples.size());
  EXPECT_EQ(recorder.stats().off_cpu_unpaired, 0u);
  EXPECT_EQ(recorder.stats().samples, 4 * samples.size());  // switch-outs are not CPU samples
  // The unwinding counters shipped with CPU batches count the CPU stacks only.
  const std::vector<v1::UnwindCounters> counts = recorder.TakeUnwindCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].stacks(), 4 * samples.size());
  // Under the threshold an interval is neither counted nor unwound.
  StackRecorder strict({.kernel_symbols = kernel_symbols.get(),
                        .off_cpu_threshold_ns = 2'000'000},
                       &graph, discovery->get());
  replay_off_cpu(strict);
  EXPECT_EQ(strict.stats().off_cpu_short, samples.size());
  EXPECT_EQ(strict.stats().unwound_frames, 0u);
  EXPECT_TRUE(strict.off_cpu().empty());

  if (kernel_stacks) {
    size_t with_chain = 0;
    for (const CopiedSample& s : samples) with_chain += !s.kernel_pcs.empty();
    EXPECT_GT(recorder.stats().kernel_frames, 0u) << with_chain << " samples had a kernel chain";
  }
}

// Real perf samples of `pid`'s thread `pid`, copied out of the ring (at least `wanted`).
std::vector<CopiedSample> SampleProcess(pid_t pid, size_t wanted) {
  std::vector<CopiedSample> samples;
  auto perf = sampler::PerfSampler::Create();
  EXPECT_TRUE(perf.ok()) << perf.status();
  if (!perf.ok()) return samples;
  sampler::SessionOptions session;
  session.frequency_hz = 999;
  EXPECT_TRUE((*perf)->AddSession(session).ok());
  EXPECT_TRUE((*perf)->AttachProcess(0, pid, {pid}).ok());
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (samples.size() < wanted && absl::Now() < deadline) {
    if (!(*perf)->Wait(absl::Milliseconds(100)).ok()) break;
    (*perf)->Drain([&](const sampler::RawSample& s) {
      samples.push_back({s, std::vector<uint8_t>(s.stack, s.stack + s.stack_size), {}});
    });
  }
  for (CopiedSample& s : samples) {
    s.sample.stack = s.stack.data();
    s.sample.kernel_pcs = nullptr;
    s.sample.kernel_depth = 0;
  }
  return samples;
}

TEST(StackRecorderTest, PythonFramesSplicedWithoutAllocating) {
  constexpr char kPython[] = "/usr/bin/python3.11";
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) {
    GTEST_SKIP() << "perf events not usable here: " << probe;
  }
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], 1);
    close(fds[0]);
    // Spins in leaf() for good: the frames read later are still those of every sample.
    execl(kPython, kPython, "-S", "-c",
          "import sys\n"
          "def leaf():\n"
          "    while True: pass\n"
          "def middle(): leaf()\n"
          "sys.stdout.write('r'); sys.stdout.flush()\n"
          "middle()\n",
          nullptr);
    _exit(127);
  }
  close(fds[1]);
  char byte;
  ASSERT_EQ(read(fds[0], &byte, 1), 1);
  close(fds[0]);
  struct KillChild {
    pid_t pid;
    ~KillChild() {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
  } kill_child{child};
  const std::vector<CopiedSample> samples = SampleProcess(child, 200);
  ASSERT_GE(samples.size(), 200u) << "the child got too little CPU";

  DiscoveryOptions options;
  options.pids = {child};
  auto discovery = TargetDiscovery::Create(options);
  ASSERT_TRUE(discovery.ok()) << discovery.status();
  auto changes = (*discovery)->Scan();
  ASSERT_TRUE(changes.ok());
  ASSERT_EQ(changes->added.size(), 1u);
  (*discovery)->Insert((*discovery)->NewTarget(changes->added[0], nullptr));

  ContextGraph graph(1);
  StackRecorder recorder({}, &graph, discovery->get());
  for (const CopiedSample& s : samples) recorder.OnSample(s.sample);  // warms every cache
  const StackRecorderStats warm = recorder.stats();
  EXPECT_EQ(recorder.python_targets(), 1u);
  // Samples in the loop, and in the eval loop's helpers it calls, got the Python frames.
  EXPECT_GE(warm.python_stacks, samples.size() * 9 / 10) << warm.python_stale << " stale";
  EXPECT_GE(warm.python_frames, 3 * warm.python_stacks);  // leaf, middle, <module>
  std::vector<std::string> python_nodes;
  const v1::GraphDelta delta = graph.DeltaFrom(0, 0);
  for (const v1::FunctionNode& n : delta.nodes()) {
    if (n.module() == "[python:<string>]") python_nodes.push_back(n.name());
  }
  EXPECT_EQ(python_nodes.size(), 3u) << ::testing::PrintToString(python_nodes);

  const uint64_t edges = graph.num_edges();
  const uint64_t before = strata::testing::AllocationCount();
  for (int round = 0; round < 3; ++round) {
    for (const CopiedSample& s : samples) recorder.OnSample(s.sample);
  }
  EXPECT_EQ(strata::testing::AllocationCount() - before, 0u)
      << "allocations in " << 3 * samples.size() << " samples";
  EXPECT_EQ(graph.num_edges(), edges);
  EXPECT_GE(recorder.stats().python_stacks, 4 * samples.size() * 9 / 10);
  const std::vector<v1::UnwindCounters> counts = recorder.TakeUnwindCounts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].python_frames(), recorder.stats().python_frames);
  EXPECT_EQ(counts[0].python_stale(), recorder.stats().python_stale);
}

}  // namespace
}  // namespace strata::agent
