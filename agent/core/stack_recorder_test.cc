// The recorder's steady state allocates nothing: real perf samples of a live child (with its
// kernel chains where the kernel allows them), recorded once to warm the caches (threads, pcs,
// kernel pcs, graph edges, contexts), then recorded again under a counting allocator; the
// same samples replayed as an off-CPU session's switch-outs, each followed by its switch-in,
// count exactly their off-CPU time, also without allocating. A CPython child's samples get
// its Python frames in place of the eval loop's, also without allocating once warm, and keep
// them when taken while a generator's native eval call starts or ends (a ptrace-stopped child).

#include "agent/core/stack_recorder.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/core/context_graph.h"
#include "agent/core/targets.h"
#include "agent/python/interpreter.h"
#include "agent/sampler/perf_sampler.h"
#include "agent/sources/perf_source.h"
#include "common/testing/counting_allocator.h"
#include "gtest/gtest.h"

namespace strata::agent {
namespace {

volatile uint64_t g_counter = 0;

// Kills and reaps a test's child when the test ends, however it ends.
struct KillChild {
  pid_t pid;
  ~KillChild() { Kill(); }
  void Kill() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    pid = 0;
  }
};

// A child running body(ready_fd), which writes a byte to ready_fd once it runs the code to
// sample; returns its pid once the byte came, -1 if the fork failed or the child never got
// there.
template <typename Body>
pid_t ForkWhenReady(Body body) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t child = fork();
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    close(fds[0]);
    body(fds[1]);
    _exit(0);
  }
  close(fds[1]);
  char byte;
  const bool ready = child > 0 && read(fds[0], &byte, 1) == 1;
  close(fds[0]);
  if (!ready && child > 0) {
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  }
  return ready ? child : -1;
}

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

// Reads one byte in every 512 from here up to `top`. The kernel copies a sample's stack
// without faulting pages in and stops at the first page not resident, so a stack deep enough
// to span pages is kept in use while its samples are taken.
[[gnu::noinline, gnu::no_sanitize_address]] void ReadStackUpTo(uintptr_t top) {
  volatile char here = 0;
  for (uintptr_t p = reinterpret_cast<uintptr_t>(&here); p < top; p += 512) {
    (void)*reinterpret_cast<const volatile char*>(p);
  }
}

// kRecursionDepth frames of Recurse, then Leaf() for good: stacks of over 300 frames, of 32
// bytes each optimized (64 in the sanitizers' build; not instrumented by AddressSanitizer,
// whose redzones would make them 250). Sampled with kDeepStackBytes.
[[gnu::noinline, gnu::no_sanitize_address]] int Recurse(int depth, int ready_fd) {
  volatile int kept = depth;  // used after the call: no tail call, no loop
  static uintptr_t outermost = 0;
  if (outermost == 0) outermost = reinterpret_cast<uintptr_t>(&kept);
  if (depth == 0) {
    char byte = 'r';
    if (write(ready_fd, &byte, 1) != 1) _exit(1);
    do {
      Leaf();
      ReadStackUpTo(outermost);
    } while (g_counter != 0);  // for good, as Leaf counts up
    return 0;
  }
  const int below = Recurse(depth - 1, ready_fd);
  return below + kept;
}
constexpr int kRecursionDepth = 300;
constexpr uint32_t kDeepStackBytes = 32 * 1024;

struct CopiedSample {
  sampler::RawSample sample;
  std::vector<uint8_t> stack;
  std::vector<uint64_t> kernel_pcs;
};

// Target discovery that has found `pid` and nothing else; null (a test failure) otherwise.
std::unique_ptr<TargetDiscovery> DiscoverOnly(pid_t pid) {
  DiscoveryOptions options;
  options.pids = {pid};
  absl::StatusOr<std::unique_ptr<TargetDiscovery>> discovery = TargetDiscovery::Create(options);
  if (!discovery.ok()) {
    ADD_FAILURE() << discovery.status();
    return nullptr;
  }
  auto changes = (*discovery)->Scan();
  if (!changes.ok() || changes->added.size() != 1) {
    ADD_FAILURE() << "the scan did not find process " << pid << " alone";
    return nullptr;
  }
  (*discovery)->Insert((*discovery)->NewTarget(changes->added[0], nullptr));
  return *std::move(discovery);
}

TEST(StackRecorderTest, SteadyStateSampleAllocatesNothing) {
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) {
    GTEST_SKIP() << "perf events not usable here: " << probe;
  }
  const pid_t child = ForkWhenReady([](int ready_fd) { Outer(ready_fd); });
  ASSERT_GT(child, 0);
  KillChild kill_child{child};

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

  const std::unique_ptr<TargetDiscovery> discovery = DiscoverOnly(child);
  ASSERT_NE(discovery, nullptr);

  ContextGraph graph(1);
  StackRecorder recorder({.kernel_symbols = kernel_symbols.get()}, &graph, discovery.get());
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
                       &graph, discovery.get());
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
std::vector<CopiedSample> SampleProcess(pid_t pid, size_t wanted,
                                        uint32_t stack_bytes = 16 * 1024) {
  std::vector<CopiedSample> samples;
  auto perf = sampler::PerfSampler::Create();
  EXPECT_TRUE(perf.ok()) << perf.status();
  if (!perf.ok()) return samples;
  sampler::SessionOptions session;
  session.frequency_hz = 999;
  session.stack_bytes = stack_bytes;
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

constexpr char kPython[] = "/usr/bin/python3.11";

// `kPython -S -c script` as a child process, waited for until the script writes its first
// byte to stdout; killed when this goes.
class PythonChild {
 public:
  explicit PythonChild(const char* script) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      dup2(fds[1], 1);
      close(fds[0]);
      execl(kPython, kPython, "-S", "-c", script, nullptr);
      _exit(127);
    }
    close(fds[1]);
    char byte;
    ready_ = pid_ > 0 && read(fds[0], &byte, 1) == 1;
    close(fds[0]);
  }
  ~PythonChild() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  PythonChild(const PythonChild&) = delete;
  PythonChild& operator=(const PythonChild&) = delete;
  pid_t pid() const { return pid_; }
  bool ready() const { return ready_; }

 private:
  pid_t pid_ = -1;
  bool ready_ = false;
};

TEST(StackRecorderTest, PythonFramesSplicedWithoutAllocating) {
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) {
    GTEST_SKIP() << "perf events not usable here: " << probe;
  }
  // Spins in leaf() for good: the frames read later are still those of every sample.
  PythonChild python("import sys\n"
                     "def leaf():\n"
                     "    while True: pass\n"
                     "def middle(): leaf()\n"
                     "sys.stdout.write('r'); sys.stdout.flush()\n"
                     "middle()\n");
  ASSERT_TRUE(python.ready());
  const pid_t child = python.pid();
  const std::vector<CopiedSample> samples = SampleProcess(child, 200);
  ASSERT_GE(samples.size(), 200u) << "the child got too little CPU";

  const std::unique_ptr<TargetDiscovery> discovery = DiscoverOnly(child);
  ASSERT_NE(discovery, nullptr);

  ContextGraph graph(1);
  StackRecorder recorder({}, &graph, discovery.get());
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

#if defined(__x86_64__)
// A perf sample of ptrace-stopped `pid` (its only thread) in `regs`, with up to 64 KiB of its
// stack.
CopiedSample SampleStopped(pid_t pid, const user_regs_struct& regs) {
  CopiedSample s;
  s.stack.resize(64 * 1024);
  size_t got = 0;
  while (got < s.stack.size()) {  // page by page, up to the end of the stack's mapping
    const uint64_t at = regs.rsp + got;
    const size_t chunk = std::min<size_t>(4096 - at % 4096, s.stack.size() - got);
    iovec local{s.stack.data() + got, chunk};
    iovec remote{reinterpret_cast<void*>(at), chunk};
    if (process_vm_readv(pid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(chunk)) break;
    got += chunk;
  }
  s.stack.resize(got);
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  s.sample.pid = s.sample.tid = static_cast<uint32_t>(pid);
  s.sample.time_ns = static_cast<uint64_t>(now.tv_sec) * 1'000'000'000 +
                     static_cast<uint64_t>(now.tv_nsec);
  s.sample.pc = regs.rip;
  s.sample.sp = regs.rsp;
  s.sample.fp = regs.rbp;
  s.sample.g = regs.r14;
  s.sample.bcp = regs.r13;
  s.sample.stack = s.stack.data();
  s.sample.stack_size = s.stack.size();
  s.sample.session_id = sources::kContinuousSession;
  return s;
}
#endif

// 3.11 runs each step of a generator in a native eval call of its own (gen_send_ex2). At the
// call's first instruction its frame is not pushed yet, and at its `ret` it is popped already:
// the chain's innermost group is the caller's. Such samples keep the caller's Python frames
// (the eval-loop frame that runs none is not shown) rather than counting as stale.
TEST(StackRecorderTest, PythonFramesKeptWhileAGeneratorsEvalCallStartsAndEnds) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86-64 registers";
#else
  if (access(kPython, X_OK) != 0) GTEST_SKIP() << kPython << " is not installed";
  PythonChild python("import sys\n"
                     "def gen():\n"
                     "    x = 0\n"
                     "    while True:\n"
                     "        x += 1\n"
                     "        yield x\n"
                     "sys.stdout.write('r'); sys.stdout.flush()\n"
                     "for v in gen(): pass\n");
  ASSERT_TRUE(python.ready());
  const pid_t child = python.pid();

  const std::unique_ptr<TargetDiscovery> discovery = DiscoverOnly(child);
  ASSERT_NE(discovery, nullptr);
  Target* target = discovery->Find(child);
  ASSERT_NE(target, nullptr);
  ASSERT_NE(target->space, nullptr);
  elf::AddressRange eval{0, 0};
  target->space->ForEachModule([&](const symbols::Module& m, int64_t bias) {
    if (eval.end != 0 || m.elf == nullptr) return;
    absl::StatusOr<python::InterpreterModule> found =
        python::InspectModule(*m.elf, m.symbols, m.path);
    if (!found.ok()) return;
    for (const elf::AddressRange& r : found->eval_ranges) {  // the function, not a .cold part
      if (eval.end == 0 || r.end - r.start > eval.end - eval.start) {
        eval = {r.start + static_cast<uint64_t>(bias), r.end + static_cast<uint64_t>(bias)};
      }
    }
  });
  ASSERT_NE(eval.end, 0u) << "no eval loop in " << kPython;

  // Stopped at the eval loop's first instruction by a breakpoint: the next generator step.
  ASSERT_EQ(ptrace(PTRACE_ATTACH, child, nullptr, nullptr), 0) << strerror(errno);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSTOPPED(status));
  void* entry = reinterpret_cast<void*>(eval.start);
  errno = 0;
  const long word = ptrace(PTRACE_PEEKTEXT, child, entry, nullptr);
  ASSERT_EQ(errno, 0) << strerror(errno);
  ASSERT_EQ(ptrace(PTRACE_POKETEXT, child, entry,
                   reinterpret_cast<void*>((word & ~0xffL) | 0xcc)), 0);
  ASSERT_EQ(ptrace(PTRACE_CONT, child, nullptr, nullptr), 0);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSTOPPED(status) && WSTOPSIG(status) == SIGTRAP) << status;
  ASSERT_EQ(ptrace(PTRACE_POKETEXT, child, entry, reinterpret_cast<void*>(word)), 0);
  user_regs_struct regs;
  ASSERT_EQ(ptrace(PTRACE_GETREGS, child, nullptr, &regs), 0);
  ASSERT_EQ(regs.rip, eval.start + 1);
  regs.rip = eval.start;
  ASSERT_EQ(ptrace(PTRACE_SETREGS, child, nullptr, &regs), 0);

  ContextGraph graph(1);
  StackRecorder recorder({}, &graph, discovery.get());
  const CopiedSample starts = SampleStopped(child, regs);
  recorder.OnSample(starts.sample);
  // Stepped on to the same call's `ret` (the stack pointer back where it was at its entry).
  const uint64_t entry_sp = regs.rsp;
  bool at_ret = false;
  for (int step = 0; step < 1'000'000 && !at_ret; ++step) {
    ASSERT_EQ(ptrace(PTRACE_SINGLESTEP, child, nullptr, nullptr), 0);
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSTOPPED(status)) << status;
    ASSERT_EQ(ptrace(PTRACE_GETREGS, child, nullptr, &regs), 0);
    at_ret = regs.rsp == entry_sp && eval.Contains(regs.rip);
  }
  ASSERT_TRUE(at_ret);
  errno = 0;
  const long ret = ptrace(PTRACE_PEEKTEXT, child, reinterpret_cast<void*>(regs.rip), nullptr);
  ASSERT_EQ(errno, 0);
  EXPECT_EQ(ret & 0xff, 0xc3) << "not at a ret";
  const CopiedSample ends = SampleStopped(child, regs);
  recorder.OnSample(ends.sample);

  const StackRecorderStats stats = recorder.stats();
  EXPECT_EQ(stats.python_stale, 0u);
  EXPECT_EQ(stats.python_stacks, 2u);
  EXPECT_EQ(stats.python_frames, 2u);  // <module>, running the for loop
  std::vector<std::string> python_nodes;
  bool eval_node = false;
  const v1::GraphDelta delta = graph.DeltaFrom(0, 0);
  for (const v1::FunctionNode& n : delta.nodes()) {
    if (n.module() == "[python:<string>]") python_nodes.push_back(n.name());
    eval_node |= n.name() == python::kEvalLoop;
  }
  EXPECT_EQ(python_nodes, std::vector<std::string>{"<module>"});
  EXPECT_FALSE(eval_node) << "an eval-loop frame left on a stack";
#endif
}

// Whether libc is among the target's modules, or among the process's mappings.
bool SpaceHasLibc(const Target& target) {
  bool found = false;
  target.space->ForEachModule([&](const symbols::Module& m, int64_t) {
    found |= m.path.find("/libc.so") != std::string::npos;
  });
  return found;
}
bool ProcessHasLibc(pid_t pid) {
  auto maps = symbols::ReadExecutableMappings(pid);
  if (!maps.ok()) return false;
  return std::any_of(maps->begin(), maps->end(), [](const symbols::MappingInfo& m) {
    return m.path.find("/libc.so") != std::string::npos;
  });
}

// Process events find a process at its exec, before its dynamic loader maps its libraries:
// the mappings read then lack libc, which every stack runs through. A sample in no known module
// reads them again at once (not a second after the first read) and is unwound again; and a new
// target's mappings are read again shortly after it was found, so that the samples of a process
// that exited before they were drained are complete too (a dead process's empty maps replace
// nothing).
TEST(StackRecorderTest, ProcessFoundAtExecUnwoundThroughLibrariesMappedAfter) {
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
    ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);  // stops at the exec, before the loader runs
    execl("/bin/sh", "sh", "-c", "echo r; while :; do :; done", nullptr);
    _exit(127);
  }
  ASSERT_GT(child, 0);
  close(fds[1]);
  KillChild kill_child{child};
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSTOPPED(status) && WSTOPSIG(status) == SIGTRAP) << status;
  // Both read at the exec.
  const std::unique_ptr<TargetDiscovery> on_sample = DiscoverOnly(child);
  const std::unique_ptr<TargetDiscovery> reread = DiscoverOnly(child);
  ASSERT_NE(on_sample, nullptr);
  ASSERT_NE(reread, nullptr);
  ASSERT_FALSE(SpaceHasLibc(*on_sample->Find(child))) << "libc mapped before the loader ran";
  ASSERT_EQ(ptrace(PTRACE_DETACH, child, nullptr, nullptr), 0) << strerror(errno);
  char byte;  // sampled from its loop on (the loader's own start-up frames are another matter)
  ASSERT_EQ(read(fds[0], &byte, 1), 1);
  close(fds[0]);
  ASSERT_TRUE(ProcessHasLibc(child));
  const std::vector<CopiedSample> samples = SampleProcess(child, 100);
  ASSERT_GE(samples.size(), 100u) << "the child got too little CPU";

  ContextGraph graph(1);
  StackRecorder recorder({}, &graph, on_sample.get());
  for (const CopiedSample& s : samples) recorder.OnSample(s.sample);
  EXPECT_EQ(recorder.stats().samples, samples.size());
  EXPECT_EQ(recorder.stats().truncated, 0u) << "of " << samples.size() << " samples";
  EXPECT_EQ(recorder.stats().stacks_refilled, 0u) << "copies that ended at the stack's top";
  EXPECT_TRUE(SpaceHasLibc(*on_sample->Find(child)));

  // Read again when due, while the process lives; its samples drained after it exited.
  const absl::Time added = reread->Find(child)->added_at;
  EXPECT_EQ(reread->RereadNewTargets(added), added + TargetDiscovery::kNewTargetRereads[0]);
  EXPECT_EQ(reread->RereadNewTargets(added + TargetDiscovery::kNewTargetRereads[0]),
            added + TargetDiscovery::kNewTargetRereads[1]);
  ASSERT_TRUE(SpaceHasLibc(*reread->Find(child)));
  ASSERT_EQ(kill(child, SIGKILL), 0);
  siginfo_t info;
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);  // a zombie
  EXPECT_FALSE(reread->RefreshMappings(*reread->Find(child)));
  ASSERT_TRUE(SpaceHasLibc(*reread->Find(child)));
  StackRecorder after_exit({}, &graph, reread.get());
  for (const CopiedSample& s : samples) after_exit.OnSample(s.sample);
  EXPECT_EQ(after_exit.stats().samples, samples.size());
  EXPECT_EQ(after_exit.stats().truncated, 0u) << "of " << samples.size() << " samples";
}

// A child in Recurse(kRecursionDepth), its samples (kDeepStackBytes of stack each) and a
// discovery of it; `skipped` says why not, where perf events are not usable.
struct DeepStack {
  void Sample() {
    if (absl::Status probe = sampler::ProbePerfEvents(); !probe.ok()) {
      skipped = absl::StrCat("perf events not usable here: ", probe.ToString());
      return;
    }
    kill_child.pid = ForkWhenReady([](int ready_fd) { Recurse(kRecursionDepth, ready_fd); });
    ASSERT_GT(kill_child.pid, 0);
    samples = SampleProcess(kill_child.pid, 100, kDeepStackBytes);
    ASSERT_GE(samples.size(), 100u) << "the child got too little CPU";
    discovery = DiscoverOnly(kill_child.pid);
    ASSERT_NE(discovery, nullptr);
  }
  std::string skipped;
  KillChild kill_child{0};
  std::vector<CopiedSample> samples;
  std::unique_ptr<TargetDiscovery> discovery;
};

// --max-frames: a stack deeper than the default 256 frames is cut there, whole under a larger
// limit, and its samples still allocate nothing once warm.
TEST(StackRecorderTest, MaxFramesBoundsTheUnwoundStack) {
  DeepStack deep;
  ASSERT_NO_FATAL_FAILURE(deep.Sample());
  if (!deep.skipped.empty()) GTEST_SKIP() << deep.skipped;
  const std::vector<CopiedSample>& samples = deep.samples;
  TargetDiscovery* discovery = deep.discovery.get();

  size_t shortest_copy = SIZE_MAX;
  for (const CopiedSample& s : samples) shortest_copy = std::min(shortest_copy, s.stack.size());
  SCOPED_TRACE(absl::StrCat("the shortest stack copied was ", shortest_copy, " bytes"));

  ContextGraph graph(1);
  StackRecorder cut({.stack_bytes = kDeepStackBytes}, &graph, discovery);
  for (const CopiedSample& s : samples) cut.OnSample(s.sample);
  EXPECT_EQ(cut.stats().truncated, samples.size());
  EXPECT_EQ(cut.stats().unwound_frames, 256 * samples.size());

  StackRecorder whole({.max_frames = 512, .stack_bytes = kDeepStackBytes}, &graph,
                      discovery);
  for (const CopiedSample& s : samples) whole.OnSample(s.sample);  // warms every cache
  EXPECT_EQ(whole.stats().truncated, 0u);
  EXPECT_GT(whole.stats().unwound_frames, (kRecursionDepth + 2) * samples.size());
  const uint64_t before = strata::testing::AllocationCount();
  for (const CopiedSample& s : samples) whole.OnSample(s.sample);
  EXPECT_EQ(strata::testing::AllocationCount() - before, 0u)
      << "allocations in " << samples.size() << " samples";
}

// The kernel copies a sample's stack without faulting pages in: at a page swapped out it
// stops, short of the size asked for and of the stack's top. The rest is read from the process.
TEST(StackRecorderTest, AStackCopiedShortIsCompletedFromTheProcess) {
  DeepStack deep;
  ASSERT_NO_FATAL_FAILURE(deep.Sample());
  if (!deep.skipped.empty()) GTEST_SKIP() << deep.skipped;
  std::vector<CopiedSample>& samples = deep.samples;
  TargetDiscovery* discovery = deep.discovery.get();
  // Each copy ended where the kernel would have at the page above the sampled one.
  for (CopiedSample& s : samples) {
    const size_t to_page_end = 4096 - s.sample.sp % 4096;
    ASSERT_LT(to_page_end, s.stack.size()) << "the stack spans a page boundary";
    s.sample.stack_size = to_page_end;
  }

  ContextGraph graph(1);
  StackRecorder recorder({.max_frames = 512, .stack_bytes = kDeepStackBytes}, &graph,
                         discovery);
  for (const CopiedSample& s : samples) recorder.OnSample(s.sample);
  EXPECT_EQ(recorder.stats().truncated, 0u);
  EXPECT_EQ(recorder.stats().stacks_refilled, samples.size());
  EXPECT_GT(recorder.stats().unwound_frames, (kRecursionDepth + 2) * samples.size());
  const uint64_t before = strata::testing::AllocationCount();
  for (const CopiedSample& s : samples) recorder.OnSample(s.sample);
  EXPECT_EQ(strata::testing::AllocationCount() - before, 0u)
      << "allocations in " << samples.size() << " samples";
  EXPECT_EQ(recorder.stats().truncated, 0u);

  // Once the process is gone, nothing more can be read: the stacks end where the copies did.
  deep.kill_child.Kill();
  StackRecorder after_exit({.max_frames = 512, .stack_bytes = kDeepStackBytes}, &graph,
                           discovery);
  for (const CopiedSample& s : samples) after_exit.OnSample(s.sample);
  EXPECT_EQ(after_exit.stats().stacks_refilled, 0u);
  EXPECT_EQ(after_exit.stats().truncated, samples.size());
}

}  // namespace
}  // namespace strata::agent
