// Reads the frames of live CPython processes this test starts: Debian's /usr/bin/python3.11
// (required), and 3.8 to 3.13 where pyenv installed them (libpython3.X.so, the embedding case).
#include "agent/python/interpreter.h"

#include <linux/perf_event.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "agent/python/fake_memory_for_test.h"
#include "agent/python/frame_capture.h"
#include "agent/symbols/module_cache.h"
#include "agent/symbols/process_address_space.h"
#include "common/testing/temp_dir.h"
#include "gtest/gtest.h"

namespace strata::agent::python {
namespace {

constexpr int kSpinLine = 8;  // the busy loop's lines in kScript
constexpr int kGenLine = 15;
constexpr const char kScript[] = R"(import sys, threading
worker_id = None
ready = threading.Event()

class Spinner:
    def spin(self):
        x = 0
        while True:
            x += 1

def middle(): Spinner().spin()
def outer(): middle()
def gen():
    x = 0
    while True:
        x += 1
        if x < 0: yield x
def consume():
    global worker_id
    worker_id = threading.get_native_id()
    ready.set()
    for v in gen(): pass

threading.Thread(target=consume, daemon=True).start()
ready.wait()
print(worker_id, flush=True)
outer()
)";

struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  ~Child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out != nullptr) fclose(out);
  }
};

// Starts `argv` (a Python interpreter and its arguments, the script last); the first line of
// its output is the worker thread's tid.
bool Start(const std::vector<std::string>& argv, Child* child, pid_t* worker) {
  int fds[2];
  if (pipe(fds) != 0) return false;
  child->pid = fork();
  if (child->pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  child->out = fdopen(fds[0], "r");
  int tid = 0;
  if (child->out == nullptr || fscanf(child->out, "%d", &tid) != 1) return false;
  *worker = tid;
  return true;
}

struct Read {
  std::vector<std::string> names;
  std::vector<std::string> files;
  std::vector<int> lines;
  size_t entries = 0;
};

// A consistent read of `tid` with at least `min_frames` frames (the thread runs, and may not
// have reached its loop yet when the child reported its tid: retried, for up to 10 s).
bool ReadUntilConsistent(Interpreter& interpreter, pid_t tid, Read* read,
                         size_t min_frames = 1) {
  std::vector<PythonFrame> frames(256);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    size_t n = 0;
    if (interpreter.ReadStack(tid, frames, &n) == ReadOutcome::kOk && n >= min_frames) {
      for (size_t i = 0; i < n; ++i) {
        read->names.push_back(frames[i].code->name);
        read->files.push_back(frames[i].code->filename);
        read->lines.push_back(frames[i].line);
        read->entries += frames[i].entry;
      }
      return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// Samples thread `tid` (CPU time, 1 kHz) with FrameCapture's program attached, for up to
// `samples` samples or 5 s, and returns the names of the frames each sample's snapshot holds.
std::vector<std::vector<std::string>> CapturedNames(FrameCapture& capture,
                                                    Interpreter& interpreter, pid_t tid,
                                                    size_t samples) {
  std::vector<std::vector<std::string>> out;
  perf_event_attr attr{};
  attr.size = sizeof(attr);
  attr.type = PERF_TYPE_SOFTWARE;
  attr.config = PERF_COUNT_SW_TASK_CLOCK;
  attr.sample_period = 1'000'000;
  attr.sample_type = PERF_SAMPLE_TID | PERF_SAMPLE_TIME;
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  attr.exclude_kernel = 1;
  attr.exclude_hv = 1;
  const int fd = static_cast<int>(syscall(__NR_perf_event_open, &attr, tid, -1, -1, 0));
  if (fd < 0) {
    ADD_FAILURE() << "perf_event_open: " << strerror(errno);
    return out;
  }
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE)), data = 16 * page;
  void* ring = mmap(nullptr, page + data, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_NE(ring, MAP_FAILED);
  EXPECT_EQ(ioctl(fd, PERF_EVENT_IOC_SET_BPF, capture.program_fd()), 0) << strerror(errno);
  auto* control = static_cast<perf_event_mmap_page*>(ring);
  const uint8_t* bytes = static_cast<const uint8_t*>(ring) + page;
  std::vector<PythonFrame> frames(256);
  uint64_t tail = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (out.size() < samples && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const uint64_t head = __atomic_load_n(&control->data_head, __ATOMIC_ACQUIRE);
    // Each drain's samples are matched last first: per-CPU rings deliver a thread's samples
    // out of order.
    std::vector<uint64_t> times;
    for (; tail < head;) {
      perf_event_header header;
      std::memcpy(&header, bytes + tail % data, sizeof(header));  // (8-byte records: no wrap)
      if (header.type == PERF_RECORD_SAMPLE) {
        struct {
          uint32_t pid, tid;
          uint64_t time;
        } sample;
        for (size_t i = 0; i < sizeof(sample); ++i) {
          reinterpret_cast<uint8_t*>(&sample)[i] = bytes[(tail + sizeof(header) + i) % data];
        }
        times.push_back(sample.time);
      }
      tail += header.size;
    }
    for (auto time = times.rbegin(); time != times.rend(); ++time) {
      const FrameSnapshot* snapshot = capture.Find(tid, *time);
      size_t n = 0;
      std::vector<std::string> names;
      if (snapshot != nullptr &&
          interpreter.ReadSnapshot(*snapshot, frames, &n) == ReadOutcome::kOk) {
        for (size_t i = 0; i < n; ++i) names.push_back(frames[i].code->name);
      }
      out.push_back(std::move(names));
    }
    __atomic_store_n(&control->data_tail, tail, __ATOMIC_RELEASE);
  }
  munmap(ring, page + data);
  close(fd);
  return out;
}

// Each sample of `tid` shows `expected` (from a read of memory) from its own snapshot.
void CheckCapture(Interpreter& interpreter, pid_t tid, const std::vector<std::string>& expected) {
  absl::StatusOr<std::unique_ptr<FrameCapture>> capture = FrameCapture::Create();
  // A kernel without BPF (or an agent that may not load programs) is skipped; a program the
  // verifier refuses is a bug.
  ASSERT_FALSE(absl::IsInvalidArgument(capture.status())) << capture.status();
  if (!capture.ok()) {
    std::printf("frame capture not checked: %s\n", capture.status().ToString().c_str());
    return;
  }
  std::optional<CaptureThread> thread = interpreter.CaptureThreadOf(tid);
  ASSERT_TRUE(thread.has_value());
  ASSERT_TRUE((*capture)->Register(tid, *thread).ok());
  const uint64_t reads_before = interpreter.stats().snapshot_reads;
  const auto names = CapturedNames(**capture, interpreter, tid, 50);
  ASSERT_GE(names.size(), 20u);
  size_t same = 0;
  for (const auto& n : names) same += n == expected;
  // The thread spins in one frame: every sample shows the whole chain, or has no snapshot
  // (the agent then reads memory). A snapshot is never wrong, but the program records none
  // when it cannot read the thread state or its frame pointer at the sample
  // (bpf_probe_read_user faults no page in) or the ring has no room: on a loaded 2-core VM, 3
  // samples of 56 had none. A program that lost snapshots itself would lose far more than a
  // quarter.
  const CaptureStats stats = (*capture)->stats();
  EXPECT_GE(same * 4, names.size() * 3)
      << "snapshots " << stats.snapshots << ", found " << stats.found << ", missing "
      << stats.missing << ", unmatched " << stats.unmatched << ", inconsistent reads "
      << interpreter.stats().inconsistent << ": " << ::testing::PrintToString(names);
  for (const auto& n : names) {
    if (!n.empty()) {
      EXPECT_EQ(n, expected);
    }
  }
  EXPECT_EQ((*capture)->stats().malformed, 0u);
  EXPECT_GE(interpreter.stats().snapshot_reads - reads_before, same);
}

// Runs kScript with `command` (the interpreter and its options) and checks the frames read of
// its two threads.
void CheckFramesOf(std::vector<std::string> command) {
  strata::testing::TempDir dir;
  const std::string script = dir.path() + "/spin.py";
  std::ofstream(script) << kScript;
  const std::string python = command.back();
  command.push_back("-S");
  command.push_back(script);
  Child child;
  pid_t worker = 0;
  ASSERT_TRUE(Start(command, &child, &worker)) << python;

  symbols::ModuleCache cache;
  symbols::ProcessAddressSpace space(child.pid, &cache);
  ASSERT_TRUE(space.Refresh().ok());
  std::optional<InterpreterModule> module;
  int64_t bias = 0;
  space.ForEachModule([&](const symbols::Module& m, int64_t b) {
    if (module.has_value()) return;
    absl::StatusOr<InterpreterModule> found = InspectModule(*m.elf, m.symbols, m.path);
    if (found.ok()) {
      module = *found;
      bias = b;
    }
  });
  // qemu-user maps a guest's code readable, not executable (it runs translated code): the
  // address space (executable mappings only) has no module for it. Its file's first mapping
  // gives the load bias.
  std::unique_ptr<elf::ElfFile> guest_elf;
  elf::SymbolTable guest_symbols;
  if (!module.has_value()) {
    auto maps = symbols::ReadProcMaps(child.pid);
    ASSERT_TRUE(maps.ok()) << maps.status();
    for (const symbols::MappingInfo& m : *maps) {
      if (m.path != python || m.offset != 0) continue;
      auto opened = elf::ElfFile::Open(python);
      ASSERT_TRUE(opened.ok()) << opened.status();
      guest_elf = std::move(*opened);
      auto table = elf::SymbolTable::Build(*guest_elf);
      ASSERT_TRUE(table.ok()) << table.status();
      guest_symbols = std::move(*table);
      absl::StatusOr<InterpreterModule> found = InspectModule(*guest_elf, guest_symbols, python);
      ASSERT_TRUE(found.ok()) << found.status();
      module = *found;
      bias = static_cast<int64_t>(m.start - guest_elf->MinLoadVaddr());
      break;
    }
  }
  ASSERT_TRUE(module.has_value()) << "no interpreter found in " << python;
  auto owned_memory = std::make_unique<RemoteMemory>(child.pid);
  const RemoteMemory* memory = owned_memory.get();
  auto interpreter = Interpreter::Attach(child.pid, *module, bias, std::move(owned_memory));
  ASSERT_TRUE(interpreter.ok()) << interpreter.status();
  const bool qualified = module->minor >= 11;

  Read main;
  ASSERT_TRUE(ReadUntilConsistent(**interpreter, child.pid, &main, /*min_frames=*/4));
  ASSERT_EQ(main.names.size(), 4u) << ::testing::PrintToString(main.names);
  EXPECT_EQ(main.names[0], qualified ? "Spinner.spin" : "spin");
  EXPECT_EQ(main.names[1], "middle");
  EXPECT_EQ(main.names[2], "outer");
  EXPECT_EQ(main.names[3], "<module>");
  EXPECT_TRUE(main.lines[0] == kSpinLine || main.lines[0] == kSpinLine + 1) << main.lines[0];
  EXPECT_EQ(main.lines[1], 11);
  EXPECT_EQ(main.lines[2], 12);
  EXPECT_EQ(main.lines[3], 27);
  for (const std::string& file : main.files) EXPECT_EQ(file, script);
  // Python-to-Python calls run in one native eval call since 3.11; each frame has its own
  // before.
  EXPECT_EQ(main.entries, qualified ? 1u : 4u);
  // What a read of a known thread costs once its chain is known: the thread state with the
  // current frame of the _PyCFrame read last and the frames where the last read found them,
  // then the code objects' headers with the re-read of the current frame; before 3.11, the
  // pthread's tid and one per frame object besides the innermost four. Line tables are decoded
  // once per offset. While no code object is due for a check, the chain starting where the
  // last read's did, the re-read comes at the end of the first call: one call.
  const size_t max_reads = qualified ? 2 : 3;
  {
    std::vector<PythonFrame> frames(256);
    size_t n = 0, consistent = 0;
    const uint64_t one_call_before = (*interpreter)->stats().one_call_reads;
    for (int i = 0; i < 200 && consistent < 20; ++i) {
      const uint64_t reads = memory->reads();
      if ((*interpreter)->ReadStack(child.pid, frames, &n) != ReadOutcome::kOk) continue;
      ++consistent;
      // Through /proc/PID/mem (under qemu) each range is a call of its own.
      if (memory->reads_mem_file()) continue;
      EXPECT_LE(memory->reads() - reads, qualified || n <= 4 ? max_reads : max_reads + n - 4)
          << "read " << i;
    }
    EXPECT_GT(consistent, 0u);
    EXPECT_GT((*interpreter)->stats().one_call_reads - one_call_before, consistent / 2);
    EXPECT_LT((*interpreter)->stats().line_misses, (*interpreter)->stats().frames / 2);
  }

  Read thread;
  ASSERT_TRUE(ReadUntilConsistent(**interpreter, worker, &thread, /*min_frames=*/5));
  ASSERT_GE(thread.names.size(), 3u) << ::testing::PrintToString(thread.names);
  EXPECT_EQ(thread.names[0], "gen");
  EXPECT_GE(thread.lines[0], kGenLine);
  EXPECT_LE(thread.lines[0], kGenLine + 2);
  EXPECT_EQ(thread.names[1], "consume");
  EXPECT_EQ(thread.lines[1], 22);
  EXPECT_EQ(thread.names.back(), qualified ? "Thread._bootstrap" : "_bootstrap");
  EXPECT_GE(thread.entries, 2u);  // the thread's entry, and the generator's before 3.12

  size_t none = 0;
  EXPECT_EQ((*interpreter)->ReadStack(999999, std::span<PythonFrame>(), &none),
            ReadOutcome::kNoThread);

  // The frames copied at each sample by the kernel (not under qemu, which has no perf events).
  if (module.has_value() && guest_elf == nullptr) {
    CheckCapture(**interpreter, child.pid, main.names);
    // The generator's line moves between samples; its frames do not.
    Read again;
    ASSERT_TRUE(ReadUntilConsistent(**interpreter, worker, &again, /*min_frames=*/5));
    CheckCapture(**interpreter, worker, again.names);
  }
}

// A chain through more coroutines, each frame in its own object, than a read keeps blocks of
// memory for: every frame still comes, in every read.
// A module naming thousands of functions _PyEval_EvalFrameDefault.* is refused: each sample
// would test every one of them on every frame. A few (a compiler's .cold parts) are fine.
TEST(InspectModuleTest, RefusesAModuleWithThousandsOfEvalLoops) {
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> self = elf::ElfFile::Open("/proc/self/exe");
  ASSERT_TRUE(self.ok()) << self.status();
  auto symbols_named = [](size_t n) {
    std::vector<elf::FunctionSymbol> functions;
    for (size_t i = 0; i < n; ++i) {
      functions.push_back({.start = 0x10000 + 64 * i, .size = 16,
                           .name = i == 0 ? "_PyEval_EvalFrameDefault"
                                          : "_PyEval_EvalFrameDefault.part." + std::to_string(i),
                           .global = true});
    }
    return elf::SymbolTable::FromFunctions(std::move(functions), {}, {});
  };
  const absl::Status many = InspectModule(**self, symbols_named(5000), "python").status();
  EXPECT_EQ(many.code(), absl::StatusCode::kInvalidArgument) << many;
  // Two pass that test and stop at the next: this binary has no _PyRuntime.
  const absl::Status two = InspectModule(**self, symbols_named(2), "python").status();
  // (as CPython 3.6 has): said, so that the agent's log tells why a Python has no frames.
  EXPECT_EQ(two.code(), absl::StatusCode::kFailedPrecondition) << two;
  EXPECT_NE(two.message().find("_PyRuntime"), std::string_view::npos) << two;
  EXPECT_NE(two.message().find("3.8 to 3.15"), std::string_view::npos) << two;
}

// The interpreter of the first module of `pid` that holds one, or null.
std::unique_ptr<Interpreter> AttachToInterpreterOf(pid_t pid) {
  symbols::ModuleCache cache;
  symbols::ProcessAddressSpace space(pid, &cache);
  if (!space.Refresh().ok()) return nullptr;
  std::unique_ptr<Interpreter> interpreter;
  space.ForEachModule([&](const symbols::Module& m, int64_t bias) {
    absl::StatusOr<InterpreterModule> found = InspectModule(*m.elf, m.symbols, m.path);
    if (interpreter != nullptr || !found.ok()) return;
    if (auto attached = Interpreter::Attach(pid, *found, bias); attached.ok()) {
      interpreter = std::move(*attached);
    }
  });
  return interpreter;
}

TEST(InterpreterTest, ReadsAChainThroughManyCoroutines) {
  constexpr char kPython[] = "/usr/bin/python3.11";
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << kPython << " is not installed";
  constexpr int kDepth = 150;
  strata::testing::TempDir dir;
  const std::string script = dir.path() + "/nested.py";
  std::ofstream(script) << "import asyncio, threading\n"
                           "async def level(n):\n"
                           "    if n == 0:\n"
                           "        print(threading.get_native_id(), flush=True)\n"
                           "        x = 0\n"
                           "        while True: x += 1\n"
                           "    await level(n - 1)\n"
                           "asyncio.run(level("
                        << kDepth << "))\n";
  Child child;
  pid_t main_tid = 0;
  ASSERT_TRUE(Start({kPython, "-S", script}, &child, &main_tid));
  std::unique_ptr<Interpreter> interpreter = AttachToInterpreterOf(child.pid);
  ASSERT_NE(interpreter, nullptr);
  for (int i = 0; i < 3; ++i) {
    Read read;
    ASSERT_TRUE(ReadUntilConsistent(*interpreter, main_tid, &read));
    EXPECT_EQ(std::count(read.names.begin(), read.names.end(), "level"), kDepth + 1)
        << ::testing::PrintToString(read.names);
    // Copied at the sample: the first kMaxCapturedFrames frames, the rest read from memory.
    if (i == 2) CheckCapture(*interpreter, main_tid, read.names);
  }
}

// A target whose code objects carry line tables of 1 MiB each (CPython takes any bytes as
// one), 80 of them on one stack: the cache stops at its bytes instead of copying them all,
// and a stack that needs more than that is reported inconsistent, read after read.
TEST(InterpreterTest, CodeObjectsOfHugeLineTablesStopAtTheCacheBytes) {
  constexpr char kPython[] = "/usr/bin/python3.11";
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << kPython << " is not installed";
  constexpr int kDepth = 80;
  strata::testing::TempDir dir;
  const std::string script = dir.path() + "/huge_tables.py";
  std::ofstream(script) << "import threading, types\n"
                           "def leaf():\n"
                           "    print(threading.get_native_id(), flush=True)\n"
                           "    x = 0\n"
                           "    while True: x += 1\n"
                           "def level():\n"
                           "    inner()\n"
                           "fn = leaf\n"
                           "for i in range("
                        << kDepth
                        << "):\n"
                           "    code = level.__code__.replace(co_name=f'level{i}',\n"
                           "        co_qualname=f'level{i}', co_linetable=bytes(1 << 20))\n"
                           "    fn = types.FunctionType(code, {'inner': fn})\n"
                           "fn()\n";
  Child child;
  pid_t main_tid = 0;
  ASSERT_TRUE(Start({kPython, "-S", script}, &child, &main_tid));
  std::unique_ptr<Interpreter> interpreter = AttachToInterpreterOf(child.pid);
  ASSERT_NE(interpreter, nullptr);
  std::vector<PythonFrame> frames(256);
  uint64_t most_bytes = 0;
  for (int i = 0; i < 5; ++i) {
    size_t count = 0;
    EXPECT_EQ(interpreter->ReadStack(main_tid, frames, &count), ReadOutcome::kInconsistent);
    most_bytes = std::max(most_bytes, interpreter->stats().code_bytes);
  }
  EXPECT_LE(most_bytes, Interpreter::kMaxCodeBytes);
  EXPECT_GE(most_bytes, Interpreter::kMaxCodeBytes / 2);
  EXPECT_GE(interpreter->stats().code_refused, 5u);
  EXPECT_LE(interpreter->stats().code_misses, 5u * (Interpreter::kMaxCodeBytes >> 20) + 5);
}

// CPython 3.9's thread states in a made-up memory: two states whose pthreads (glibc's
// struct pthread, 2 KiB of it) hold `tids` at kTidOffset, between words of other values.
class PthreadTidTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRuntime = 0x10000, kInterp = 0x20000, kTstate = 0x30000,
                            kPthread = 0x40000, kTidOffset = 720;

  std::unique_ptr<Interpreter> Attach(const std::vector<pid_t>& tids) {
    auto memory = std::make_unique<testing::FakeMemory>();
    memory_ = memory.get();
    const Offsets o = *OffsetsForVersion(3, 9);
    memory->Map(kRuntime, 0x1000);
    memory->Map(kInterp, 0x1000);
    memory->Put(kRuntime + o.runtime_interpreters_head, kInterp);
    memory->Put(kInterp + o.interp_threads_head, kTstate);
    for (size_t i = 0; i < tids.size(); ++i) {
      const uint64_t tstate = kTstate + 0x1000 * i, pthread = kPthread + 0x1000 * i;
      memory->Map(tstate, 0x1000);
      memory->Put(tstate + o.tstate_next, i + 1 < tids.size() ? tstate + 0x1000 : 0);
      memory->Put(tstate + o.tstate_thread_id, pthread);
      memory->Map(pthread, 0x1000);
      for (uint64_t at = 0; at < 0x800; at += 8) memory->Put(pthread + at, pthread + at);
      memory->Put(pthread + kTidOffset, static_cast<uint64_t>(tids[i]));
    }
    InterpreterModule module{3, 9, kRuntime, {{0x1000, 0x2000}}};
    absl::StatusOr<std::unique_ptr<Interpreter>> attached =
        Interpreter::Attach(getpid(), module, 0, std::move(memory));
    EXPECT_TRUE(attached.ok()) << attached.status();
    return attached.ok() ? *std::move(attached) : nullptr;
  }
  testing::FakeMemory* memory_ = nullptr;
};

// An embedding program that runs Python on two threads of its own, never on its main
// thread: their thread states are found by their tids all the same.
TEST_F(PthreadTidTest, FoundWhenPythonNeverRanOnTheMainThread) {
  std::atomic<pid_t> tids[2] = {0, 0};
  std::atomic<bool> done = false;
  std::vector<std::thread> threads;
  for (auto& tid : tids) {
    threads.emplace_back([&tid, &done] {
      tid = static_cast<pid_t>(syscall(SYS_gettid));
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
  }
  while (tids[0] == 0 || tids[1] == 0) std::this_thread::yield();
  std::unique_ptr<Interpreter> interpreter = Attach({tids[0], tids[1]});
  ASSERT_NE(interpreter, nullptr);
  std::vector<PythonFrame> frames(8);
  size_t count = 0;
  EXPECT_EQ(interpreter->ReadStack(tids[1], frames, &count), ReadOutcome::kOk);
  EXPECT_EQ(count, 0u);  // (no frame: it runs no Python now)
  EXPECT_EQ(interpreter->stats().calibration_failures, 0u);
  done = true;
  for (std::thread& t : threads) t.join();
}

// Pthreads holding no thread of the process: the search fails, and is not made again per
// thread state and walk, but once a second.
TEST_F(PthreadTidTest, AFailedSearchIsNotRepeatedPerWalk) {
  std::unique_ptr<Interpreter> interpreter = Attach({4000001, 4000002, 4000003});
  ASSERT_NE(interpreter, nullptr);
  std::vector<PythonFrame> frames(8);
  const auto start = std::chrono::steady_clock::now();
  size_t reads = 0;
  // Walks of the thread states, at most one per 50 ms, for half a second.
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500)) {
    size_t count = 0;
    EXPECT_EQ(interpreter->ReadStack(getpid(), frames, &count), ReadOutcome::kNoThread);
    ++reads;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(reads, 20u);
  EXPECT_EQ(interpreter->stats().calibration_failures, 1u);
  // Each walk reads the three states (and their pthread pointers): 2 KiB of every pthread
  // only for the one search.
  EXPECT_LT(memory_->reads, 200u) << interpreter->stats().thread_scans << " walks";
}

class InterpreterTest : public ::testing::TestWithParam<std::string> {};

TEST_P(InterpreterTest, ReadsTheFramesOfEveryThread) {
  const std::string python = GetParam();
  if (!std::filesystem::exists(python)) GTEST_SKIP() << python << " is not installed";
  CheckFramesOf({python});
}

// Debian unstable's python3.14 and python3.15 (stripped: no .symtab), unpacked into the build
// with their own C library by deploy/cross/make-python-next-root.sh and run through its loader.
class NextInterpreterTest : public ::testing::TestWithParam<std::string> {};

TEST_P(NextInterpreterTest, ReadsTheFramesOfEveryThread) {
  const std::string root = STRATA_PYTHON_NEXT_ROOT;
  const std::string python = root + "/usr/bin/python" + GetParam();
  if (!std::filesystem::exists(python)) {
    GTEST_SKIP() << python << " is not there (deploy/cross/make-python-next-root.sh " << root
                 << ")";
  }
  CheckFramesOf({root + "/usr/lib64/ld-linux-x86-64.so.2", "--library-path",
                 root + "/usr/lib/x86_64-linux-gnu", python});
}

INSTANTIATE_TEST_SUITE_P(Unstable, NextInterpreterTest, ::testing::Values("3.14", "3.15"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = "python" + info.param;
                           for (char& c : name) c = c == '.' ? '_' : c;
                           return name;
                         });

// Debian's mips64el python3.11 under qemu-mips64el (user mode: guest threads are host threads,
// guest memory the qemu process's), from a folder its packages were unpacked into
// (STRATA_MIPS64EL_PYTHON_ROOT, see deploy/cross/make-python-root.sh).
TEST(InterpreterTest, ReadsTheFramesOfMips64elPythonUnderQemu) {
  const char* root = getenv("STRATA_MIPS64EL_PYTHON_ROOT");
  const std::string qemu = "/usr/bin/qemu-mips64el";
  if (root == nullptr || !std::filesystem::exists(qemu)) {
    GTEST_SKIP() << "set STRATA_MIPS64EL_PYTHON_ROOT (and install qemu-user)";
  }
  CheckFramesOf({qemu, "-L", root, std::string(root) + "/usr/bin/python3.11"});
}

INSTANTIATE_TEST_SUITE_P(
    Versions, InterpreterTest,
    ::testing::Values("/usr/bin/python3.11", "/root/.pyenv/versions/3.8.18/bin/python3.8",
                    "/root/.pyenv/versions/3.9.18/bin/python3.9",
                    "/root/.pyenv/versions/3.10.13/bin/python3.10",
                    "/root/.pyenv/versions/3.12.1/bin/python3.12",
                    "/root/.pyenv/versions/3.13.0/bin/python3.13"),
    [](const ::testing::TestParamInfo<std::string>& info) {
      std::string name = std::filesystem::path(info.param).filename().string();
      for (char& c : name) c = c == '.' ? '_' : c;
      return info.param.starts_with("/usr") ? "debian_" + name : "pyenv_" + name;
    });

}  // namespace
}  // namespace strata::agent::python
