#include "agent/runtime/sampler.h"

#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <sys/syscall.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/runtime/ring.h"
#include "common/elf/elf_file.h"
#include "common/unwind/host_arch.h"
#include "common/unwind/rule_source.h"
#include "common/unwind/unwinder.h"

namespace strata::agent::runtime {
namespace {

constexpr size_t kMaxThreads = 4096;
constexpr size_t kMaxModules = kMaxRingModules;

// An executable range of one loaded module, with the rules the handler unwinds it by.
struct ModuleRange {
  uint64_t start;
  uint64_t end;
  uint64_t bias;  // module_pc = pc - bias
  const unwind::RuleSource* rules;  // null: no unwind info (x86-64 falls back to rbp)
};

// The handler's view of this process's modules. Immutable once published.
class SelfSpace final : public unwind::AddressSpace {
 public:
  bool Lookup(uint64_t pc, const unwind::RuleSource** rules,
              uint64_t* module_pc) const override {
    // Sorted by start; a handful of modules, so a binary search without allocation.
    size_t lo = 0, hi = num_;
    while (lo < hi) {
      const size_t mid = (lo + hi) / 2;
      if (ranges_[mid].start <= pc) lo = mid + 1; else hi = mid;
    }
    if (lo == 0 || pc >= ranges_[lo - 1].end) return false;
    *rules = ranges_[lo - 1].rules;
    *module_pc = pc - ranges_[lo - 1].bias;
    return true;
  }
  ModuleRange ranges_[kMaxModules];
  size_t num_ = 0;
};

// A module opened once and kept for the life of the process.
struct LoadedModule {
  std::string path;
  uint64_t bias;
  std::unique_ptr<elf::ElfFile> elf;
  std::unique_ptr<unwind::RuleSource> rules;
};

struct ThreadSlot {
  std::atomic<pid_t> tid{0};  // 0: free
  uint64_t stack_lo = 0;
  uint64_t stack_hi = 0;
  timer_t timer{};
  bool has_timer = false;
};

struct State {
  SamplerOptions options;
  RingWriter ring;
  std::mutex mu;  // registration and module refresh; never taken by the handler
  std::vector<std::unique_ptr<LoadedModule>> modules;  // never shrinks (see header)
  std::vector<std::unique_ptr<SelfSpace>> spaces;      // every published table
  uint64_t module_stamp = 0;                           // dlpi_adds + dlpi_subs seen
  pthread_key_t exit_key;
  std::thread watcher;
  std::atomic<bool> stop_watcher{false};
};

State* g_state = nullptr;  // created by Start(), never freed
std::atomic<bool> g_running{false};
std::atomic<const SelfSpace*> g_space{nullptr};
std::atomic<uint64_t> g_samples{0};
std::atomic<uint64_t> g_off_stack{0};
ThreadSlot g_threads[kMaxThreads];
// Initial-exec TLS: reading it from a signal handler never allocates.
thread_local ThreadSlot* t_slot __attribute__((tls_model("initial-exec"))) = nullptr;

pid_t GetTid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

void OnSigprof(int, siginfo_t*, void* context) {
  const int saved_errno = errno;
  ThreadSlot* slot = t_slot;
  const SelfSpace* space = g_space.load(std::memory_order_acquire);
  if (slot != nullptr && space != nullptr && g_running.load(std::memory_order_acquire)) {
    const unwind::Registers regs =
        unwind::RegistersFromContext(*static_cast<const ucontext_t*>(context));
    if (regs.sp >= slot->stack_lo && regs.sp < slot->stack_hi) {
      // x86-64 epilogues restore registers from just below sp (CFI keeps describing the
      // popped slots); the kernel leaves the 128-byte red zone intact, so it is readable.
      const uint64_t lo = std::max<uint64_t>(slot->stack_lo, regs.sp - unwind::kRedZoneBytes);
      const unwind::StackSnapshot stack{lo, reinterpret_cast<const uint8_t*>(lo),
                                        static_cast<size_t>(slot->stack_hi - lo)};
      unwind::UnwindOptions options;
      options.arch = unwind::kHostArch;
      options.max_frames = kMaxRecordFrames;
      unwind::Frame frames[kMaxRecordFrames];
      const unwind::UnwindResult result =
          unwind::Unwind(options, regs, stack, *space, frames, kMaxRecordFrames);
      uint64_t pcs[kMaxRecordFrames];
      for (size_t i = 0; i < result.num_frames; ++i) pcs[i] = frames[i].pc;
      const bool truncated = result.stop != unwind::StopReason::kOutermost;
      timespec now{};
      clock_gettime(CLOCK_MONOTONIC, &now);
      const uint64_t ns = static_cast<uint64_t>(now.tv_sec) * 1000000000ull +
                          static_cast<uint64_t>(now.tv_nsec);
      if (g_state->ring.Append(static_cast<uint32_t>(slot->tid.load(std::memory_order_relaxed)),
                               ns, pcs, result.num_frames, truncated,
                               static_cast<uint8_t>(result.stop))) {
        g_samples.fetch_add(1, std::memory_order_relaxed);
      }
      if (strata_inproc_on_sample != nullptr) {
        strata_inproc_on_sample(pcs, result.num_frames, truncated ? 1 : 0);
      }
    } else {
      // Running on a stack we do not know (e.g. sigaltstack, or a coroutine).
      g_off_stack.fetch_add(1, std::memory_order_relaxed);
      g_state->ring.header()->unwind_errors.fetch_add(1, std::memory_order_relaxed);
    }
  }
  errno = saved_errno;
}

std::string SelfExePath() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return "/proc/self/exe";
  return std::string(buf, static_cast<size_t>(n));
}

struct PhdrModule {
  std::string name;
  uint64_t bias;
  std::vector<RingModule> exec;  // absolute executable ranges with file offsets
  uint64_t image_lo = UINT64_MAX;  // loaded extent of the PT_LOAD segments
  uint64_t image_hi = 0;
};

// Builds and publishes a new SelfSpace and the ring's module table. Caller holds mu.
absl::Status RebuildSpaceLocked(State& s) {
  std::vector<PhdrModule> found;
  uint64_t stamp = 0;
  struct Ctx {
    std::vector<PhdrModule>* found;
    uint64_t* stamp;
  } ctx{&found, &stamp};
  dl_iterate_phdr([](dl_phdr_info* info, size_t size, void* data) {
    auto* c = static_cast<Ctx*>(data);
    if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
      *c->stamp = info->dlpi_adds + info->dlpi_subs;
    }
    PhdrModule m;
    m.name = info->dlpi_name != nullptr ? info->dlpi_name : "";
    m.bias = info->dlpi_addr;
    for (int i = 0; i < info->dlpi_phnum; ++i) {
      const ElfW(Phdr)& ph = info->dlpi_phdr[i];
      if (ph.p_type != PT_LOAD) continue;
      m.image_lo = std::min<uint64_t>(m.image_lo, info->dlpi_addr + ph.p_vaddr);
      m.image_hi = std::max<uint64_t>(m.image_hi, info->dlpi_addr + ph.p_vaddr + ph.p_filesz);
      if (!(ph.p_flags & PF_X)) continue;
      RingModule r;
      // Page-aligned like the kernel maps it, so the agent's offset -> vaddr lookup works.
      const uint64_t page = 4096;
      const uint64_t start = info->dlpi_addr + ph.p_vaddr;
      r.start = start & ~(page - 1);
      r.end = start + ph.p_memsz;
      r.offset = ph.p_offset - (start - r.start);
      m.exec.push_back(r);
    }
    if (!m.exec.empty()) c->found->push_back(std::move(m));
    return 0;
  }, &ctx);

  auto space = std::make_unique<SelfSpace>();
  std::vector<RingModule> table;
  for (PhdrModule& m : found) {
    const bool is_main = m.name.empty();
    const bool is_vdso = m.name.find("linux-vdso") != std::string::npos ||
                         m.name.find("linux-gate") != std::string::npos;
    const std::string path = is_main ? SelfExePath() : m.name;
    LoadedModule* loaded = nullptr;
    for (auto& lm : s.modules) {
      if (lm->path == path && lm->bias == m.bias) loaded = lm.get();
    }
    if (loaded == nullptr) {
      auto lm = std::make_unique<LoadedModule>();
      lm->path = path;
      lm->bias = m.bias;
      // Under qemu-user /proc/self/exe is the guest program; opening it is the reliable way.
      // The vDSO has no file: its image is read from memory.
      absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf =
          is_vdso ? elf::ElfFile::FromBytes(std::string(reinterpret_cast<const char*>(m.image_lo),
                                                        m.image_hi - m.image_lo))
                  : elf::ElfFile::Open(is_main ? std::string("/proc/self/exe") : path);
      if (elf.ok()) {
        lm->elf = std::move(*elf);
        absl::StatusOr<std::unique_ptr<unwind::RuleSource>> rules =
            unwind::MakeRuleSource(unwind::kHostArch, *lm->elf);
        if (rules.ok()) lm->rules = std::move(*rules);
      }
      loaded = lm.get();
      s.modules.push_back(std::move(lm));
    }
    for (const RingModule& r : m.exec) {
      if (space->num_ >= kMaxModules) break;
      space->ranges_[space->num_++] = {m.bias + (r.start - m.bias), r.end, m.bias,
                                       loaded != nullptr ? loaded->rules.get() : nullptr};
      if (is_vdso) continue;
      RingModule entry = r;
      std::snprintf(entry.path, sizeof(entry.path), "%s", path.c_str());
      table.push_back(entry);
    }
  }
  std::sort(space->ranges_, space->ranges_ + space->num_,
            [](const ModuleRange& a, const ModuleRange& b) { return a.start < b.start; });
  s.ring.SetModules(table.data(), table.size());
  g_space.store(space.get(), std::memory_order_release);
  s.spaces.push_back(std::move(space));
  s.module_stamp = stamp;
  return absl::OkStatus();
}

uint64_t CurrentModuleStamp() {
  uint64_t stamp = 0;
  dl_iterate_phdr([](dl_phdr_info* info, size_t size, void* data) {
    if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof(info->dlpi_subs)) {
      *static_cast<uint64_t*>(data) = info->dlpi_adds + info->dlpi_subs;
    }
    return 1;  // the counters are the same in every entry
  }, &stamp);
  return stamp;
}

void ReleaseSlot(ThreadSlot* slot) {
  if (slot->has_timer) timer_delete(slot->timer);
  slot->has_timer = false;
  slot->tid.store(0, std::memory_order_release);
}

void OnThreadExit(void* p) {
  auto* slot = static_cast<ThreadSlot*>(p);
  t_slot = nullptr;  // a signal still pending finds no slot and returns
  std::lock_guard<std::mutex> lock(g_state->mu);
  ReleaseSlot(slot);
}

void WatchModules(State* s) {
  while (!s->stop_watcher.load()) {
    for (uint32_t waited = 0; waited < s->options.module_poll_ms && !s->stop_watcher.load();
         waited += 50) {
      usleep(50 * 1000);
    }
    if (s->stop_watcher.load()) break;
    const uint64_t stamp = CurrentModuleStamp();
    std::lock_guard<std::mutex> lock(s->mu);
    if (stamp != s->module_stamp) (void)RebuildSpaceLocked(*s);
  }
}

uint32_t EnvU32(const char* name, uint32_t fallback, uint32_t lo, uint32_t hi) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long n = strtoul(v, &end, 10);
  if (end == v || *end != '\0' || n < lo || n > hi) return fallback;
  return static_cast<uint32_t>(n);
}

}  // namespace

SamplerOptions OptionsFromEnvironment() {
  SamplerOptions o;
  o.hz = EnvU32("STRATA_INPROC_HZ", o.hz, 1, 10000);
  o.ring_capacity = EnvU32("STRATA_INPROC_RING", o.ring_capacity, 16, 1u << 20);
  if (const char* dir = getenv("STRATA_INPROC_DIR"); dir != nullptr && *dir != '\0') o.dir = dir;
  return o;
}

absl::Status Start(const SamplerOptions& options) {
  static std::mutex start_mu;
  std::lock_guard<std::mutex> start_lock(start_mu);
  if (g_running.load()) return absl::OkStatus();
  if (g_state == nullptr) g_state = new State;
  State& s = *g_state;
  s.options = options;
  if (auto st = s.ring.Create(options.dir, getpid(), static_cast<uint32_t>(unwind::kHostArch),
                              options.ring_capacity, options.hz);
      !st.ok()) {
    return st;
  }
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (auto st = RebuildSpaceLocked(s); !st.ok()) return st;
  }
  if (pthread_key_create(&s.exit_key, OnThreadExit) != 0) {
    return absl::InternalError("pthread_key_create failed");
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = OnSigprof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigemptyset(&sa.sa_mask);
  if (sigaction(SIGPROF, &sa, nullptr) != 0) {
    return absl::ErrnoToStatus(errno, "sigaction(SIGPROF)");
  }
  // Started before sampling is on, so the pthread_create interposers leave it unregistered:
  // the watcher itself is not sampled.
  s.stop_watcher.store(false);
  s.watcher = std::thread(WatchModules, &s);
  g_running.store(true, std::memory_order_release);
  return RegisterCurrentThread();
}

void Stop() {
  if (g_state == nullptr || !g_running.exchange(false)) return;
  State& s = *g_state;
  s.stop_watcher.store(true);
  if (s.watcher.joinable()) s.watcher.join();
  std::lock_guard<std::mutex> lock(s.mu);
  for (ThreadSlot& slot : g_threads) {
    if (slot.tid.load() != 0 && slot.has_timer) {
      timer_delete(slot.timer);
      slot.has_timer = false;
    }
  }
  if (s.ring.header() != nullptr) unlink(s.ring.path().c_str());
}

bool Running() { return g_running.load(std::memory_order_acquire); }

absl::Status RegisterCurrentThread() {
  if (!Running()) return absl::FailedPreconditionError("sampler not started");
  if (t_slot != nullptr) return absl::OkStatus();
  State& s = *g_state;
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) {
    return absl::InternalError("pthread_getattr_np failed");
  }
  void* addr = nullptr;
  size_t size = 0;
  const int rc = pthread_attr_getstack(&attr, &addr, &size);
  pthread_attr_destroy(&attr);
  if (rc != 0) return absl::InternalError("pthread_attr_getstack failed");
  const pid_t tid = GetTid();
  std::lock_guard<std::mutex> lock(s.mu);
  ThreadSlot* slot = nullptr;
  for (ThreadSlot& candidate : g_threads) {
    if (candidate.tid.load(std::memory_order_relaxed) == 0) {
      slot = &candidate;
      break;
    }
  }
  if (slot == nullptr) return absl::ResourceExhaustedError("too many sampled threads");
  slot->stack_lo = reinterpret_cast<uint64_t>(addr);
  slot->stack_hi = slot->stack_lo + size;
  slot->tid.store(tid, std::memory_order_release);
  sigevent sev;
  std::memset(&sev, 0, sizeof sev);
  sev.sigev_notify = SIGEV_THREAD_ID;
  sev.sigev_signo = SIGPROF;
  sev._sigev_un._tid = tid;
  if (timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &slot->timer) != 0) {
    const int err = errno;
    slot->tid.store(0);
    return absl::ErrnoToStatus(err, "timer_create(CLOCK_THREAD_CPUTIME_ID)");
  }
  slot->has_timer = true;
  t_slot = slot;
  pthread_setspecific(s.exit_key, slot);
  const long period_ns = 1000000000L / static_cast<long>(s.options.hz);
  itimerspec its{};
  its.it_interval.tv_sec = period_ns / 1000000000L;
  its.it_interval.tv_nsec = period_ns % 1000000000L;
  its.it_value = its.it_interval;
  if (timer_settime(slot->timer, 0, &its, nullptr) != 0) {
    const int err = errno;
    t_slot = nullptr;
    ReleaseSlot(slot);
    return absl::ErrnoToStatus(err, "timer_settime");
  }
  return absl::OkStatus();
}

absl::Status RefreshModules() {
  if (g_state == nullptr) return absl::FailedPreconditionError("sampler not started");
  std::lock_guard<std::mutex> lock(g_state->mu);
  return RebuildSpaceLocked(*g_state);
}

SamplerStats Stats() {
  SamplerStats st;
  st.samples = g_samples.load();
  st.off_stack = g_off_stack.load();
  if (g_state == nullptr) return st;
  if (g_state->ring.header() != nullptr) st.lost = g_state->ring.header()->lost.load();
  std::lock_guard<std::mutex> lock(g_state->mu);
  for (const ThreadSlot& slot : g_threads) st.threads += slot.tid.load() != 0;
  if (const SelfSpace* space = g_space.load()) st.modules = space->num_;
  return st;
}

namespace {
struct StartArgs {
  void* (*start)(void*);
  void* arg;
};
void* RegisteredStart(void* p) {
  const StartArgs args = *static_cast<StartArgs*>(p);
  delete static_cast<StartArgs*>(p);
  (void)RegisterCurrentThread();  // a thread that cannot be sampled still runs
  return args.start(args.arg);
}
}  // namespace

int CreateRegisteredThread(PthreadCreateFn real, pthread_t* thread, const pthread_attr_t* attr,
                           void* (*start)(void*), void* arg) {
  if (!Running()) return real(thread, attr, start, arg);
  auto* args = new StartArgs{start, arg};
  const int rc = real(thread, attr, RegisteredStart, args);
  if (rc != 0) delete args;
  return rc;
}

}  // namespace strata::agent::runtime
