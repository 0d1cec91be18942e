// Live tests: a forked child spins on the CPU while the sampler samples it with real perf
// events; the samples are checked against the child's own /proc view.

#include "agent/sampler/perf_sampler.h"

#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "agent/bpf/bpf.h"
#include "agent/procfs/procfs.h"
#include "agent/procfs/process_tracker.h"
#include "agent/sampler/cpu_filter.h"
#include "common/testing/cpu_clock.h"
#include "common/unwind/host_arch.h"
#include "gtest/gtest.h"

namespace strata::agent::sampler {
namespace {

using ::strata::testing::CpuClock;

// ---- The child workload. ----

volatile sig_atomic_t g_start_thread = 0;

void OnStartThread(int) { g_start_thread = 1; }

void Spin() {
  static volatile uint64_t counter = 0;
  for (int i = 0; i < 100000; ++i) counter = counter + 1;
}

void* SpinForever(void*) {
  for (;;) Spin();
}

// Spins in the main thread; on SIGUSR1 starts a second spinning thread. Reports readiness by
// writing one byte to `ready_fd`.
[[noreturn]] void ChildMain(int ready_fd) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  signal(SIGUSR1, OnStartThread);
  char byte = 'r';
  if (write(ready_fd, &byte, 1) != 1) _exit(1);
  close(ready_fd);
  bool started = false;
  for (;;) {
    Spin();
    if (g_start_thread && !started) {
      started = true;
      pthread_t thread;
      pthread_create(&thread, nullptr, SpinForever, nullptr);
    }
  }
}

class SpinningChild {
 public:
  SpinningChild() {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(fds[0]);
      ChildMain(fds[1]);
    }
    close(fds[1]);
    char byte;
    if (pid_ < 0 || read(fds[0], &byte, 1) != 1) pid_ = -1;
    close(fds[0]);
  }
  ~SpinningChild() { Kill(); }

  pid_t pid() const { return pid_; }
  // Starts the second thread and returns its tid once /proc lists it (-1 after 10 s).
  pid_t StartSecondThread() {
    kill(pid_, SIGUSR1);
    for (int i = 0; i < 10000; ++i) {
      std::vector<pid_t> threads = procfs::ListThreads(pid_).value_or(std::vector<pid_t>{});
      if (threads.size() == 2) return threads[0] == pid_ ? threads[1] : threads[0];
      usleep(1000);
    }
    return -1;
  }
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

// ---- Helpers. ----

// CPU time the thread has run, from the scheduler's own accounting: how long to sample, not
// how many samples to expect (that is CpuClock's).
uint64_t RuntimeNs(pid_t pid, pid_t tid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(tid) +
                   "/schedstat");
  uint64_t runtime = 0;
  in >> runtime;
  return runtime;
}

struct CopiedSample {
  RawSample regs;  // stack and chain pointers cleared: the bytes live in the fields below
  uint64_t first_bytes = 0;
  std::vector<uint64_t> user_chain;  // the kernel's frame-pointer walk (user_frame_chain)
};

// Waits and drains for `duration`, copying every sample.
void SampleFor(PerfSampler& sampler, absl::Duration duration, std::vector<CopiedSample>* out) {
  const absl::Time deadline = absl::Now() + duration;
  auto keep = [out](const RawSample& s) {
    CopiedSample copy{s, 0, {}};
    if (s.stack_size >= 8) std::memcpy(&copy.first_bytes, s.stack, 8);
    copy.regs.stack = nullptr;
    if (s.user_pcs != nullptr) copy.user_chain.assign(s.user_pcs, s.user_pcs + s.user_depth);
    copy.regs.user_pcs = nullptr;
    copy.regs.kernel_pcs = nullptr;
    out->push_back(copy);
  };
  for (absl::Time now = absl::Now(); now < deadline; now = absl::Now()) {
    ASSERT_TRUE(sampler.Wait(std::min(deadline - now, absl::Milliseconds(50))).ok());
    sampler.Drain(keep);
  }
  sampler.Drain(keep);
}

// Samples until `pid`'s thread `tid` (0: its main thread) has run `cpu` or 30 s passed: on a
// loaded machine a second of wall time can be a fifth of a second of the child's CPU.
void SampleForChildCpu(PerfSampler& sampler, pid_t pid, absl::Duration cpu,
                       std::vector<CopiedSample>* out, pid_t tid = 0) {
  if (tid == 0) tid = pid;
  const uint64_t before = RuntimeNs(pid, tid);
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (RuntimeNs(pid, tid) - before < static_cast<uint64_t>(absl::ToInt64Nanoseconds(cpu)) &&
         absl::Now() < deadline) {
    SampleFor(sampler, absl::Milliseconds(100), out);
  }
}

// SampleForChildCpu, with `other` (no target) running beside the child: it must have run
// 100 ms, and every sample must be the child's. Call through ASSERT_NO_FATAL_FAILURE.
void SampleChildBesideOther(PerfSampler& sampler, pid_t pid, pid_t other, absl::Duration cpu,
                            std::vector<CopiedSample>* out) {
  const uint64_t other_before = RuntimeNs(other, other);
  SampleForChildCpu(sampler, pid, cpu, out);
  ASSERT_GT(RuntimeNs(other, other) - other_before, 100'000'000u) << "the other child barely ran";
  ASSERT_GT(out->size(), 50u);
  for (const CopiedSample& s : *out) ASSERT_EQ(s.regs.pid, static_cast<uint32_t>(pid));
}

size_t CountSession(const std::vector<CopiedSample>& samples, uint32_t session_id) {
  size_t n = 0;
  for (const CopiedSample& s : samples) n += s.regs.session_id == session_id;
  return n;
}

class PerfSamplerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::Status probe = ProbePerfEvents();
    if (absl::IsUnavailable(probe) || absl::IsPermissionDenied(probe)) {
      GTEST_SKIP() << "perf events not usable here: " << probe;
    }
    ASSERT_TRUE(probe.ok()) << probe;
    sampler_ = PerfSampler::Create().value();
    ASSERT_GT(child_.pid(), 0);
  }

  SessionOptions Session(uint32_t id, uint32_t hz) {
    SessionOptions options;
    options.session_id = id;
    options.frequency_hz = hz;
    return options;
  }
  // A per-CPU session at 499 Hz whose rings wake the reader every 16 samples.
  SessionOptions PerCpuSession(uint32_t id) {
    SessionOptions options = Session(id, 499);
    options.scope = SamplingScope::kPerCpu;
    options.ring_pages = RingPagesFor(options.stack_bytes, 64);
    options.wakeup_samples = 16;
    return options;
  }

  SpinningChild child_;
  std::unique_ptr<PerfSampler> sampler_;
};

TEST_F(PerfSamplerTest, SamplesChildAtRateWithRegistersInsideItsMappings) {
  constexpr uint32_t kHz = 499;
  const pid_t pid = child_.pid();
  ASSERT_TRUE(sampler_->AddSession(Session(1, kHz)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(1, pid, {pid}).ok());
  const CpuClock clock(pid);
  std::vector<CopiedSample> samples;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(600), &samples);
  const uint64_t runtime_ns = clock.ns();
  sampler_->DetachProcess(pid);
  EXPECT_EQ(sampler_->attached_events(), 0u);

  // cpu-clock counts the child's CPU time, which on a shared machine may be < 1 s.
  const double expected = static_cast<double>(runtime_ns) * kHz / 1e9;
  ASSERT_GT(expected, 100) << "child barely ran: " << runtime_ns << " ns";
  EXPECT_GT(samples.size(), expected * 0.6);
  EXPECT_LT(samples.size(), expected * 1.25 + 10);

  std::vector<procfs::Mapping> maps = procfs::ReadMappings(pid).value();
  uint64_t previous_time = 0;
  for (const CopiedSample& s : samples) {
    ASSERT_EQ(s.regs.pid, static_cast<uint32_t>(pid));
    ASSERT_EQ(s.regs.tid, static_cast<uint32_t>(pid));
    ASSERT_EQ(s.regs.session_id, 1u);
    ASSERT_GE(s.regs.time_ns, previous_time);
    previous_time = s.regs.time_ns;
    const procfs::Mapping* code = procfs::FindMapping(maps, s.regs.pc);
    ASSERT_NE(code, nullptr) << std::hex << s.regs.pc;
    EXPECT_TRUE(code->exec) << code->path;
    const procfs::Mapping* stack = procfs::FindMapping(maps, s.regs.sp);
    ASSERT_NE(stack, nullptr) << std::hex << s.regs.sp;
    EXPECT_EQ(stack->path, "[stack]");
    // The copy starts at sp and never claims bytes beyond the stack's end.
    EXPECT_GE(s.regs.stack_size, 8u);
    EXPECT_LE(s.regs.stack_size, 16u * 1024);
    EXPECT_LE(s.regs.sp + s.regs.stack_size, stack->end);
  }
  SamplerStats stats = sampler_->stats();
  EXPECT_EQ(stats.samples, samples.size());
  EXPECT_EQ(stats.malformed, 0u);
  EXPECT_GE(stats.bytes, samples.size() * 16u * 1024);
  EXPECT_EQ(stats.threads_attached, 1u);
}

// With user_frame_chain, each sample also carries the kernel's frame-pointer walk of the user
// stack: it starts at the sample's pc, and no kernel part comes with it.
TEST_F(PerfSamplerTest, UserFrameChainStartsAtTheSamplesPc) {
  if (unwind::kHostArch != unwind::Arch::kX86_64) GTEST_SKIP() << "x86-64 only";
  const pid_t pid = child_.pid();
  SessionOptions options = Session(1, 499);
  options.user_frame_chain = true;
  ASSERT_TRUE(sampler_->AddSession(options).ok());
  ASSERT_TRUE(sampler_->AttachProcess(1, pid, {pid}).ok());
  std::vector<CopiedSample> samples;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(200), &samples);
  sampler_->DetachProcess(pid);
  ASSERT_GT(samples.size(), 20u);
  for (const CopiedSample& s : samples) {
    ASSERT_FALSE(s.user_chain.empty());
    EXPECT_EQ(s.user_chain[0], s.regs.pc);
    EXPECT_EQ(s.regs.kernel_depth, 0u);
  }
  EXPECT_EQ(sampler_->stats().malformed, 0u);
}

TEST_F(PerfSamplerTest, ThreadStartedAfterAttachIsSampledAfterRescan) {
  const pid_t pid = child_.pid();
  // Only the pinned child, as the agent runs with --pid alone: not every process on the host
  // that names itself with STRATA_SERVICE.
  procfs::ProcessTracker tracker(
      procfs::ServiceMatcher::Create({}, /*use_env_var=*/false).value());
  tracker.Track(pid, "spinner");
  procfs::ProcessChanges changes = tracker.Rescan().value();
  ASSERT_EQ(changes.added.size(), 1u);
  ASSERT_TRUE(sampler_->AddSession(Session(3, 499)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(3, pid, changes.added[0].threads).ok());
  EXPECT_EQ(sampler_->AttachedThreads(3, pid), std::vector<pid_t>{pid});

  const pid_t new_tid = child_.StartSecondThread();
  ASSERT_GT(new_tid, 0) << "the child's second thread did not show up";

  changes = tracker.Rescan().value();
  ASSERT_EQ(changes.threads_added.size(), 1u);
  EXPECT_EQ(changes.threads_added[0].tid, new_tid);
  for (const procfs::ThreadRef& t : changes.threads_added) {
    ASSERT_TRUE(sampler_->AttachNewThread(t.pid, t.tid).ok());
  }
  EXPECT_EQ(sampler_->AttachedThreads(3, pid), (std::vector<pid_t>{pid, new_tid}));

  const CpuClock new_thread_clock(new_tid);
  std::vector<CopiedSample> samples;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(300), &samples, new_tid);
  const double expected = new_thread_clock.ns() * 499 / 1e9;
  std::vector<procfs::Mapping> maps = procfs::ReadMappings(pid).value();
  size_t from_new_thread = 0;
  for (const CopiedSample& s : samples) {
    if (s.regs.tid != static_cast<uint32_t>(new_tid)) continue;
    ++from_new_thread;
    const procfs::Mapping* code = procfs::FindMapping(maps, s.regs.pc);
    ASSERT_NE(code, nullptr);
    EXPECT_TRUE(code->exec);
    // A pthread stack: anonymous, writable, not [stack].
    const procfs::Mapping* stack = procfs::FindMapping(maps, s.regs.sp);
    ASSERT_NE(stack, nullptr);
    EXPECT_TRUE(stack->write);
    EXPECT_FALSE(stack->exec);
    EXPECT_NE(stack->path, "[stack]");
    EXPECT_GE(s.regs.stack_size, 8u);
  }
  ASSERT_GT(expected, 50) << "the new thread barely ran";
  EXPECT_GT(static_cast<double>(from_new_thread), expected * 0.6);
}

TEST_F(PerfSamplerTest, ExitedTargetIsCleanedUp) {
  const pid_t pid = child_.pid();
  ASSERT_TRUE(sampler_->AddSession(Session(4, 499)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(4, pid, {pid}).ok());
  std::vector<CopiedSample> samples;
  SampleFor(*sampler_, absl::Milliseconds(200), &samples);
  EXPECT_GT(samples.size(), 0u);

  child_.Kill();
  // The kernel hangs up the exited thread's event: Wait reports it, Drain closes it.
  for (int i = 0; i < 40 && sampler_->attached_events() > 0; ++i) {
    ASSERT_TRUE(sampler_->Wait(absl::Milliseconds(50)).ok());
    sampler_->Drain([&](const RawSample&) {});
  }
  EXPECT_EQ(sampler_->attached_events(), 0u);
  SamplerStats stats = sampler_->stats();
  EXPECT_EQ(stats.threads_exited, 1u);
  EXPECT_EQ(stats.malformed, 0u);
  // The tracker's removal arriving afterwards is harmless; the pid is no longer a target.
  sampler_->DetachProcess(pid);
  EXPECT_TRUE(sampler_->AttachNewThread(pid, pid).ok());
  EXPECT_EQ(sampler_->attached_events(), 0u);
  EXPECT_TRUE(absl::IsNotFound(sampler_->AttachThread(4, pid, pid)));
}

TEST_F(PerfSamplerTest, ConcurrentSessionsSampleAtTheirOwnRates) {
  const pid_t pid = child_.pid();
  ASSERT_TRUE(sampler_->AddSession(Session(10, 99)).ok());
  ASSERT_TRUE(sampler_->AddSession(Session(20, 499)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(10, pid, {pid}).ok());
  ASSERT_TRUE(sampler_->AttachProcess(20, pid, {pid}).ok());
  std::vector<CopiedSample> samples;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(600), &samples);
  const size_t slow = CountSession(samples, 10);
  const size_t fast = CountSession(samples, 20);
  ASSERT_GT(slow, 20u);
  const double ratio = static_cast<double>(fast) / slow;
  EXPECT_GT(ratio, 499.0 / 99 * 0.7) << fast << " / " << slow;
  EXPECT_LT(ratio, 499.0 / 99 * 1.3) << fast << " / " << slow;
  EXPECT_EQ(sampler_->session_stats(10).value().samples, slow);
  EXPECT_EQ(sampler_->session_stats(20).value().samples, fast);
  EXPECT_EQ(slow + fast, samples.size());

  // Ending the fast session leaves the slow one running.
  ASSERT_TRUE(sampler_->RemoveSession(20).ok());
  EXPECT_EQ(sampler_->attached_events(), 1u);
  samples.clear();
  SampleFor(*sampler_, absl::Milliseconds(200), &samples);
  EXPECT_GT(samples.size(), 0u);
  EXPECT_EQ(CountSession(samples, 10), samples.size());
  EXPECT_EQ(sampler_->stats().samples, slow + fast + samples.size());
}

TEST_F(PerfSamplerTest, SetFrequencyChangesRateOfRunningSession) {
  const pid_t pid = child_.pid();
  ASSERT_TRUE(sampler_->AddSession(Session(5, 99)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(5, pid, {pid}).ok());
  const CpuClock clock(pid);
  auto rate = [&](absl::Duration duration) {
    std::vector<CopiedSample> samples;
    const uint64_t before = clock.ns();
    SampleFor(*sampler_, duration, &samples);
    const double cpu_seconds = (clock.ns() - before) / 1e9;
    return cpu_seconds > 0 ? samples.size() / cpu_seconds : 0.0;
  };
  const double slow = rate(absl::Milliseconds(600));
  ASSERT_TRUE(sampler_->SetFrequency(5, 499).ok());
  const double fast = rate(absl::Milliseconds(600));
  EXPECT_NEAR(slow, 99, 40);
  EXPECT_NEAR(fast, 499, 150);
  EXPECT_EQ(sampler_->attached_events(), 1u);
}

// A program that counts its runs in an array map's one slot (for SetSampleProgram).
struct CountingProgram {
  base::UniqueFd map, program;
  uint64_t runs() const {
    const uint32_t key = 0;
    uint64_t value = 0;
    EXPECT_TRUE(bpf::LookupElement(map.get(), &key, &value).ok());
    return value;
  }
};
absl::StatusOr<CountingProgram> LoadCountingProgram() {
  using namespace bpf;  // NOLINT: the instruction builders
  absl::StatusOr<base::UniqueFd> map = CreateMap(BPF_MAP_TYPE_ARRAY, 4, 8, 1, "runs");
  if (!map.ok()) return map.status();
  ProgramBuilder b;
  const auto out = b.NewLabel();
  b.Add(StoreImm(BPF_W, kFp, -4, 0));
  b.AddMap(kR1, map->get());
  b.Add(MovReg(kR2, kFp));
  b.Add(AluImm(BPF_ADD, kR2, -4));
  b.Add(Call(BPF_FUNC_map_lookup_elem));
  b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), out);
  b.Add(MovImm(kR1, 1));
  b.Add({BPF_STX | BPF_DW | BPF_ATOMIC, kR0, kR1, 0, BPF_ADD});  // lock *(u64 *)r0 += r1
  b.Bind(out);
  b.Add(MovImm(kR0, 1));
  b.Add(Exit());
  std::vector<Insn> program = std::move(b).Build();
  absl::StatusOr<base::UniqueFd> loaded =
      LoadProgram(BPF_PROG_TYPE_PERF_EVENT, program, "count_runs");
  if (!loaded.ok()) return loaded.status();
  return CountingProgram{std::move(*map), std::move(*loaded)};
}

// The program runs at every sample from SetSampleProgram on: on the events open then, and on
// those of sessions and threads added later.
TEST_F(PerfSamplerTest, SampleProgramRunsAtEverySampleFromWhenItIsSet) {
  absl::StatusOr<CountingProgram> counter = LoadCountingProgram();
  if (absl::IsUnavailable(counter.status()) || absl::IsPermissionDenied(counter.status())) {
    GTEST_SKIP() << "no BPF here: " << counter.status();
  }
  ASSERT_TRUE(counter.ok()) << counter.status();
  const pid_t pid = child_.pid();
  ASSERT_TRUE(sampler_->AddSession(Session(1, 499)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(1, pid, {pid}).ok());
  std::vector<CopiedSample> before;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(100), &before);
  ASSERT_GT(before.size(), 0u);
  EXPECT_EQ(counter->runs(), 0u);

  sampler_->SetSampleProgram(counter->program.get());
  // Samples are stamped with CLOCK_MONOTONIC: those of session 1 taken after this had a run;
  // those taken before it and not yet drained (a loaded host delays the drain) had none.
  timespec set_at;
  clock_gettime(CLOCK_MONOTONIC, &set_at);
  const uint64_t set_ns = uint64_t(set_at.tv_sec) * 1'000'000'000 + uint64_t(set_at.tv_nsec);
  ASSERT_TRUE(sampler_->AddSession(Session(2, 99)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(2, pid, {pid}).ok());
  std::vector<CopiedSample> after;
  SampleForChildCpu(*sampler_, pid, absl::Milliseconds(400), &after);
  ASSERT_GT(CountSession(after, 2), 0u);
  size_t taken_after_set = 0;
  for (const CopiedSample& s : after) taken_after_set += s.regs.time_ns > set_ns;
  // Each sample taken since was preceded by a run; a run's sample may still be in the ring.
  const uint64_t runs = counter->runs();
  EXPECT_GE(runs, taken_after_set);
  EXPECT_LE(runs, after.size() + 4);
  EXPECT_EQ(sampler_->stats().programs_not_attached, 0u);
}

// Per CPU, the kernel filter runs the sample program at the targets' samples only, and drops
// the others before they are written.
TEST_F(PerfSamplerTest, PerCpuSampleProgramRunsAtTheTargetsSamplesOnly) {
  if (absl::Status probe = ProbePerCpuEvents(); !probe.ok()) {
    GTEST_SKIP() << "system-wide perf events not allowed here: " << probe;
  }
  absl::StatusOr<CountingProgram> counter = LoadCountingProgram();
  if (absl::IsUnavailable(counter.status()) || absl::IsPermissionDenied(counter.status())) {
    GTEST_SKIP() << "no BPF here: " << counter.status();
  }
  ASSERT_TRUE(counter.ok()) << counter.status();
  const pid_t pid = child_.pid();
  SpinningChild other;  // runs as much, but is no target
  ASSERT_GT(other.pid(), 0);
  ASSERT_TRUE(sampler_->AddSession(PerCpuSession(8)).ok());
  // Chained after the filter before the target is: a sample the filter kept before then would
  // have no run.
  sampler_->SetSampleProgram(counter->program.get());
  ASSERT_TRUE(sampler_->AttachProcess(8, pid, {}).ok());
  ASSERT_TRUE(sampler_->CpuFilterStatus(8).ok()) << sampler_->CpuFilterStatus(8);
  std::vector<CopiedSample> samples;
  ASSERT_NO_FATAL_FAILURE(
      SampleChildBesideOther(*sampler_, pid, other.pid(), absl::Milliseconds(400), &samples));
  // A run per sample of the target (a run's sample may still be in a ring), none per sample
  // of the other child.
  const uint64_t runs = counter->runs();
  EXPECT_GE(runs, samples.size());
  EXPECT_LE(runs, samples.size() + 8);
  SamplerStats stats = sampler_->session_stats(8).value();
  EXPECT_GT(stats.filtered_in_kernel, 50u);
  EXPECT_EQ(stats.filtered, 0u);
  EXPECT_EQ(stats.programs_not_attached, 0u);
}

// A session with more targets than the filter's map holds has the filter pass every sample:
// the sampler drops other processes' samples itself and loses none of its targets'.
TEST_F(PerfSamplerTest, PerCpuFilterWhoseMapIsFullPassesEverySample) {
  if (absl::Status probe = ProbePerCpuEvents(); !probe.ok()) {
    GTEST_SKIP() << "system-wide perf events not allowed here: " << probe;
  }
  if (absl::Status filter = ProbeCpuFilter(); !filter.ok()) {
    GTEST_SKIP() << "no in-kernel filter here: " << filter;
  }
  const pid_t pid = child_.pid();
  SpinningChild other;  // no target
  ASSERT_GT(other.pid(), 0);
  ASSERT_TRUE(sampler_->AddSession(PerCpuSession(10)).ok());
  ASSERT_TRUE(sampler_->AttachProcess(10, pid, {}).ok());
  ASSERT_TRUE(sampler_->CpuFilterStatus(10).ok()) << sampler_->CpuFilterStatus(10);
  // Pids above the kernel's largest (4,194,304): targets no process is.
  for (uint32_t i = 0; i < CpuSampleFilter::kMaxTargets; ++i) {
    ASSERT_TRUE(sampler_->AttachProcess(10, static_cast<pid_t>(5'000'000 + i), {}).ok());
  }
  EXPECT_TRUE(absl::IsResourceExhausted(sampler_->CpuFilterStatus(10)))
      << sampler_->CpuFilterStatus(10);
  const SamplerStats before = sampler_->session_stats(10).value();
  std::vector<CopiedSample> samples;
  ASSERT_NO_FATAL_FAILURE(
      SampleChildBesideOther(*sampler_, pid, other.pid(), absl::Milliseconds(300), &samples));
  const SamplerStats after = sampler_->session_stats(10).value();
  EXPECT_GT(after.filtered - before.filtered, 25u) << "the other child's samples were read";
}

TEST_F(PerfSamplerTest, FullRingCountsLostSamples) {
  const pid_t pid = child_.pid();
  SessionOptions options = Session(6, 499);
  options.stack_bytes = 4096;
  options.ring_pages = 4;  // 16 KiB: three samples fit
  ASSERT_TRUE(sampler_->AddSession(options).ok());
  ASSERT_TRUE(sampler_->AttachProcess(6, pid, {pid}).ok());
  const CpuClock clock(pid);
  // Not draining while the child runs: the ring fills up. Waits for CPU time, not wall time,
  // so a loaded machine that gives the child little of it still fills the ring.
  for (int i = 0; i < 100 && clock.ns() < 300'000'000; ++i) usleep(100 * 1000);
  size_t delivered = sampler_->Drain([](const RawSample&) {});
  const double expected = clock.ns() / 1e9 * 499;
  EXPECT_LE(delivered, 4u);
  // The kernel reports the loss with the first record it can write after the drain.
  std::vector<CopiedSample> samples;
  SampleFor(*sampler_, absl::Milliseconds(100), &samples);
  SamplerStats stats = sampler_->session_stats(6).value();
  ASSERT_GT(expected, 50);
  EXPECT_GT(static_cast<double>(stats.lost), expected * 0.5);
  EXPECT_LT(static_cast<double>(stats.lost), expected * 1.25);
  EXPECT_EQ(stats.samples, delivered + samples.size());
}

// Per CPU: one event per online CPU samples whatever runs there; only the session's targets
// reach the callback, every thread of them without attaching threads.
TEST_F(PerfSamplerTest, PerCpuSessionSamplesEveryThreadOfItsTargetsOnly) {
  if (absl::Status probe = ProbePerCpuEvents(); !probe.ok()) {
    GTEST_SKIP() << "system-wide perf events not allowed here: " << probe;
  }
  const pid_t pid = child_.pid();
  SpinningChild other;  // runs too, but is no target
  ASSERT_GT(other.pid(), 0);
  ASSERT_TRUE(sampler_->AddSession(PerCpuSession(7)).ok());
  EXPECT_EQ(sampler_->attached_events(), 0u) << "no target yet: nothing to sample";
  ASSERT_TRUE(sampler_->AttachProcess(7, pid, {}).ok());
  const size_t cpus = OnlineCpus().value().size();
  EXPECT_EQ(sampler_->attached_events(), cpus);
  // Threads are hints in this scope: nothing to open.
  ASSERT_TRUE(sampler_->AttachNewThread(pid, pid).ok());
  EXPECT_EQ(sampler_->attached_events(), cpus);

  const pid_t new_tid = child_.StartSecondThread();
  ASSERT_GT(new_tid, 0) << "the child's second thread did not show up";
  const CpuClock main_clock(pid), new_thread_clock(new_tid);
  std::vector<CopiedSample> samples;
  SampleFor(*sampler_, absl::Seconds(1), &samples);
  const uint64_t runtime_ns = main_clock.ns() + new_thread_clock.ns();

  size_t from_new_thread = 0;
  for (const CopiedSample& s : samples) {
    ASSERT_EQ(s.regs.pid, static_cast<uint32_t>(pid));
    ASSERT_EQ(s.regs.session_id, 7u);
    from_new_thread += s.regs.tid == static_cast<uint32_t>(new_tid);
  }
  const double expected = static_cast<double>(runtime_ns) * 499 / 1e9;
  ASSERT_GT(expected, 100) << "child barely ran: " << runtime_ns << " ns";
  EXPECT_GT(samples.size(), expected * 0.6);
  EXPECT_LT(samples.size(), expected * 1.25 + 10);
  EXPECT_GT(from_new_thread, samples.size() / 5);
  SamplerStats stats = sampler_->session_stats(7).value();
  if (absl::Status filter = sampler_->CpuFilterStatus(7); filter.ok()) {
    EXPECT_GT(stats.filtered_in_kernel, 0u) << "the other spinning child was dropped";
    EXPECT_EQ(stats.filtered, 0u) << "no other process's sample was written";
  } else {
    std::printf("no kernel filter here (%s): filtered in user space\n",
                filter.ToString().c_str());
    EXPECT_GT(stats.filtered, 0u) << "the other spinning child was sampled and dropped";
  }
  EXPECT_EQ(stats.samples, samples.size());
  EXPECT_EQ(stats.threads_attached, 0u);

  // Detaching the target stops its samples; the CPUs' events stay for the next target.
  sampler_->DetachProcess(7, pid);
  sampler_->Drain([](const RawSample&) {});
  samples.clear();
  SampleFor(*sampler_, absl::Milliseconds(200), &samples);
  EXPECT_TRUE(samples.empty());
  EXPECT_EQ(sampler_->attached_events(), cpus);
  ASSERT_TRUE(sampler_->SetFrequency(7, 99).ok());
  ASSERT_TRUE(sampler_->RemoveSession(7).ok());
  EXPECT_EQ(sampler_->attached_events(), 0u);
}

// A target attached with Wake::kEachSample has an event per thread in either scope, each
// sample waking the reader; in a per-CPU session its samples come from that event only (the
// CPUs' events, opened for another target, drop theirs).
TEST_F(PerfSamplerTest, EachSampleTargetWakesTheReaderAtEverySample) {
  const pid_t pid = child_.pid();
  for (SamplingScope scope : {SamplingScope::kPerThread, SamplingScope::kPerCpu}) {
    if (scope == SamplingScope::kPerCpu && !ProbePerCpuEvents().ok()) continue;
    SCOPED_TRACE(scope == SamplingScope::kPerCpu ? "per CPU" : "per thread");
    SessionOptions options = Session(11, 499);
    options.scope = scope;
    if (scope == SamplingScope::kPerCpu) {
      options.ring_pages = RingPagesFor(options.stack_bytes, 64);
      options.wakeup_samples = 16;
    }
    ASSERT_TRUE(sampler_->AddSession(options).ok());
    ASSERT_TRUE(sampler_->AttachProcess(11, pid, {pid}, PerfSampler::Wake::kEachSample).ok());
    EXPECT_EQ(sampler_->attached_events(), 1u) << "its thread's event only";
    SpinningChild other;
    ASSERT_GT(other.pid(), 0);
    ASSERT_TRUE(sampler_->AttachProcess(11, other.pid(), {other.pid()}).ok());
    const size_t other_events =
        scope == SamplingScope::kPerCpu ? OnlineCpus().value().size() : 1;
    EXPECT_EQ(sampler_->attached_events(), 1 + other_events);

    size_t samples = 0, wakeups = 0;
    const CpuClock clock(pid);
    const absl::Time deadline = absl::Now() + absl::Milliseconds(500);
    while (absl::Now() < deadline) {
      absl::StatusOr<int> ready = sampler_->Wait(absl::Milliseconds(100));
      ASSERT_TRUE(ready.ok());
      size_t mine = 0;
      sampler_->Drain([&](const RawSample& s) { mine += s.pid == static_cast<uint32_t>(pid); });
      samples += mine;
      wakeups += *ready > 0 && mine > 0;
    }
    const double expected = static_cast<double>(clock.ns()) * 499 / 1e9;
    ASSERT_GT(samples, 10u) << "the spinning child was barely sampled";
    // One wake-up per sample, but for a reader the host ran late; no sample twice.
    EXPECT_GT(wakeups * 3, samples);
    EXPECT_LT(static_cast<double>(samples), expected * 1.25 + 10);
    ASSERT_TRUE(sampler_->RemoveSession(11).ok());
  }
}

// A per-CPU session with a drain period: once its rings have samples they leave the epoll
// set (no wake-ups: Wait() times out) and max_wait() is the period, while Drain() still
// delivers every sample; a rate whose period no longer fits the rings ends the pacing.
TEST_F(PerfSamplerTest, PerCpuSessionWithSamplesIsDrainedOnItsPeriod) {
  if (absl::Status probe = ProbePerCpuEvents(); !probe.ok()) {
    GTEST_SKIP() << "system-wide perf events not allowed here: " << probe;
  }
  SessionOptions options = Session(9, 499);
  options.scope = SamplingScope::kPerCpu;
  options.stack_bytes = 1024;
  options.ring_pages = RingPagesFor(options.stack_bytes, 512);  // two 200 ms periods fit
  options.wakeup_samples = 8;
  options.drain_every_ms = 200;
  ASSERT_TRUE(sampler_->AddSession(options).ok());
  ASSERT_TRUE(sampler_->AttachProcess(9, child_.pid(), {}).ok());
  EXPECT_EQ(sampler_->max_wait(), absl::InfiniteDuration()) << "no samples yet";

  // The first samples wake the reader as usual.
  size_t delivered = 0;
  auto count = [&delivered](const RawSample&) { ++delivered; };
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (delivered == 0 && absl::Now() < deadline) {
    ASSERT_TRUE(sampler_->Wait(absl::Seconds(1)).ok());
    sampler_->Drain(count);
  }
  ASSERT_GT(delivered, 0u) << "the spinning child was not sampled";
  EXPECT_EQ(sampler_->max_wait(), absl::Milliseconds(200));

  // Paced: the child keeps the rings filling, yet nothing wakes the reader.
  const uint64_t runtime_before = RuntimeNs(child_.pid(), child_.pid());
  absl::SleepFor(absl::Milliseconds(300));
  const uint64_t ran_ns = RuntimeNs(child_.pid(), child_.pid()) - runtime_before;
  absl::StatusOr<int> ready = sampler_->Wait(absl::Milliseconds(100));
  ASSERT_TRUE(ready.ok());
  EXPECT_EQ(*ready, 0) << "a paced ring woke the reader";
  delivered = 0;
  sampler_->Drain(count);
  // More than the wake-up threshold came in without a wake-up; none was lost.
  EXPECT_GT(static_cast<double>(delivered), 8.0) << ran_ns << " ns run";
  EXPECT_EQ(sampler_->session_stats(9)->lost, 0u);
  EXPECT_EQ(sampler_->max_wait(), absl::Milliseconds(200));

  // At 9,999 Hz two periods no longer fit: the rings wake the reader again.
  ASSERT_TRUE(sampler_->SetFrequency(9, 9'999).ok());
  EXPECT_EQ(sampler_->max_wait(), absl::InfiniteDuration());
  bool woke = false;
  for (int i = 0; i < 50 && !woke; ++i) {
    absl::StatusOr<int> n = sampler_->Wait(absl::Milliseconds(100));
    ASSERT_TRUE(n.ok());
    woke = *n > 0;
  }
  EXPECT_TRUE(woke) << "the rings did not go back to waking the reader";
  sampler_->Drain(count);
  ASSERT_TRUE(sampler_->RemoveSession(9).ok());
}

TEST(PerfSamplerOptionsTest, CpuListsAndRingSizes) {
  EXPECT_EQ(ParseCpuList("0-3,5,7-8\n").value(), (std::vector<int>{0, 1, 2, 3, 5, 7, 8}));
  EXPECT_EQ(ParseCpuList("0").value(), std::vector<int>{0});
  EXPECT_TRUE(ParseCpuList("").value().empty());
  EXPECT_TRUE(absl::IsInvalidArgument(ParseCpuList("3-1").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseCpuList("a").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(ParseCpuList("1,").status()));
  EXPECT_FALSE(OnlineCpus().value().empty());

  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (uint32_t samples : {1u, 8u, 32u, 100u}) {
    const uint32_t pages = RingPagesFor(16 * 1024, samples);
    EXPECT_TRUE(std::has_single_bit(pages));
    // The ring holds the samples asked for, and at most twice that.
    EXPECT_GE(pages * page, std::max(samples, 2u) * 16u * 1024) << samples;
    EXPECT_LT(pages * page, 2 * std::max(samples, 2u) * (16u * 1024 + 512)) << samples;
  }
  EXPECT_EQ(RingPagesFor(8, 1, 8), 8u);

  // Wake-ups: a second of a busy CPU's samples while as many stay free behind the watermark,
  // else a quarter of the ring (a 4 MiB ring holds about 250 samples of 16 KiB stacks).
  const uint32_t four_mib = static_cast<uint32_t>((4u << 20) / page);
  const uint32_t quarter = PerCpuWakeupSamples(four_mib, 16 * 1024, 10'000);
  EXPECT_GE(quarter, 60u);
  EXPECT_LE(quarter, 64u);
  EXPECT_EQ(PerCpuWakeupSamples(four_mib, 16 * 1024, 99), 99u);
  EXPECT_GE(4 * quarter - 99, 99u) << "less than a second of headroom at 99 Hz";
  EXPECT_EQ(PerCpuWakeupSamples(four_mib, 16 * 1024, 499), quarter);
  EXPECT_EQ(PerCpuWakeupSamples(four_mib, 16 * 1024, 999), quarter);
  EXPECT_EQ(PerCpuWakeupSamples(four_mib, 16 * 1024, 19), 19u);
  const uint32_t tiny = static_cast<uint32_t>(std::max<size_t>(1, (64u << 10) / page));
  EXPECT_EQ(PerCpuWakeupSamples(tiny, 16 * 1024, 99), 1u);  // 64 KiB: three samples
  EXPECT_EQ(PerCpuWakeupSamples(four_mib, 16 * 1024, 0), 1u);
}

TEST(PerfSamplerOptionsTest, RejectsBadSessions) {
  auto sampler = PerfSampler::Create();
  ASSERT_TRUE(sampler.ok());
  SessionOptions options;
  options.session_id = 1;
  ASSERT_TRUE((*sampler)->AddSession(options).ok());
  EXPECT_TRUE(absl::IsAlreadyExists((*sampler)->AddSession(options)));
  options.session_id = 2;
  options.stack_bytes = 1001;
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->AddSession(options)));
  options.stack_bytes = kMaxStackBytes + 8;
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->AddSession(options)));
  options.stack_bytes = 16 * 1024;
  options.ring_pages = 3;
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->AddSession(options)));
  options.ring_pages = 4;  // 16 KiB: not two 16 KiB samples
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->AddSession(options)));
  options.ring_pages = 32;
  options.frequency_hz = 0;
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->AddSession(options)));
  EXPECT_TRUE(absl::IsNotFound((*sampler)->AttachThread(99, getpid(), gettid())));
  EXPECT_TRUE(absl::IsNotFound((*sampler)->SetFrequency(99, 10)));
  EXPECT_TRUE(absl::IsNotFound((*sampler)->RemoveSession(99)));
  EXPECT_TRUE(absl::IsInvalidArgument((*sampler)->SetFrequency(1, 0)));
}

}  // namespace
}  // namespace strata::agent::sampler
