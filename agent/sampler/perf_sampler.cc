#include "agent/sampler/perf_sampler.h"

#include <errno.h>
#include <linux/perf_event.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <charconv>
#include <fstream>
#include <string>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "agent/sampler/cpu_filter.h"
#include "agent/sampler/perf_record.h"
#include "common/base/split.h"

namespace strata::agent::sampler {

// One perf event and its ring: of a thread (per-thread sessions) or of a CPU (per-CPU ones).
struct PerfSampler::RingEvent {
  pid_t pid = 0;
  pid_t tid = 0;  // -1 for a per-CPU event
  int cpu = -1;   // -1 for a per-thread event
  int fd = -1;
  void* mapping = nullptr;
  size_t mapping_size = 0;
  perf_event_mmap_page* control = nullptr;
  uint8_t* data = nullptr;
  size_t data_size = 0;
  bool exited = false;  // the kernel hung up: the thread is gone
};

struct PerfSampler::Session {
  SessionOptions options;
  // pid -> tid -> event. A pid with no threads stays as a target (see AttachNewThread). Per
  // CPU the thread maps stay empty: the targets are the filter of the CPUs' samples.
  absl::flat_hash_map<pid_t, absl::flat_hash_map<pid_t, std::unique_ptr<RingEvent>>> targets;
  std::vector<std::unique_ptr<RingEvent>> cpu_events;  // kPerCpu: one per online CPU
  SamplerStats stats;
  // drain_every_ms sessions: their rings had samples at the last drain, so they are out of
  // the epoll set and drained on the period.
  bool paced = false;
  uint64_t filtered_at_drain = 0;  // stats.filtered at the last drain
  uint32_t drain_every_ms = 0;     // options.drain_every_ms where the rings allow it, else 0
  // Targets attached with Wake::kEachSample: sampled per thread in either scope.
  absl::flat_hash_set<pid_t> each_sample;

  // kPerCpu: the CPU events' program that drops other processes' samples in the kernel
  // (null where it cannot be loaded: filter_status says why).
  std::unique_ptr<CpuSampleFilter> filter;
  absl::Status filter_status;

  bool per_cpu() const { return options.scope == SamplingScope::kPerCpu; }
  // Whether `pid`'s threads have events of their own (else the CPUs' events sample it).
  bool per_thread(pid_t pid) const { return !per_cpu() || each_sample.contains(pid); }
  // Whether the CPUs' samples of `pid` are delivered: the targets sampled by the CPU events.
  bool sampled_by_cpus(pid_t pid) const {
    return targets.contains(pid) && !each_sample.contains(pid);
  }
  // Statistics with the filter's count read from the kernel.
  SamplerStats current_stats() const {
    SamplerStats s = stats;
    if (filter != nullptr) {
      s.filtered_in_kernel = filter->dropped();
      const bpf::ProgramRuns runs = filter->runs();
      s.filter_runs = runs.count;
      s.filter_ns = runs.ns;
    }
    return s;
  }
};

template <typename Fn>
void PerfSampler::ForEachEvent(Session& session, Fn fn) {
  for (auto& event : session.cpu_events) fn(*event);
  for (auto& [pid, threads] : session.targets) {
    for (auto& [tid, event] : threads) fn(*event);
  }
}

namespace {

// The kernel's default limit of call chain entries (kernel.perf_event_max_stack), plus the
// context marker; a longer chain is cut by the kernel.
constexpr size_t kMaxKernelChain = 128;
// Samples a Wake::kEachSample thread's ring holds in a kPerCpu session (whose own rings are
// sized for CPUs): room for a reader that runs a few samples late.
constexpr uint32_t kEachSampleRingSamples = 8;

// Sample records carry a header, pid/tid, time, [a call chain,] abi, registers and two u64
// around the stack.
size_t MaxSampleRecordSize(const SessionOptions& options, const UserRegsLayout& layout) {
  // The kernel bounds the chain's entries, kernel and user parts together, by the sysctl
  // perf_event_max_stack (127 by default) plus context markers.
  const size_t chain =
      options.kernel_stacks || options.user_frame_chain ? 8 + 8 * (kMaxKernelChain + 8) : 0;
  return sizeof(perf_event_header) + 8 + 8 + chain + 8 + 8 * layout.count + 8 +
         options.stack_bytes + 8;
}

absl::Status ValidateOptions(const SessionOptions& options, const UserRegsLayout& layout,
                             size_t page_size) {
  if (options.frequency_hz == 0) return absl::InvalidArgumentError("frequency_hz must be > 0");
  if (options.stack_bytes % 8 != 0 || options.stack_bytes > kMaxStackBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "stack_bytes must be a multiple of 8 and at most ", kMaxStackBytes, ", got ",
        options.stack_bytes));
  }
  if (options.ring_pages == 0 || !std::has_single_bit(options.ring_pages)) {
    return absl::InvalidArgumentError("ring_pages must be a power of two");
  }
  const size_t ring_bytes = size_t{options.ring_pages} * page_size;
  if (ring_bytes < 2 * MaxSampleRecordSize(options, layout)) {
    return absl::InvalidArgumentError(absl::StrCat("ring of ", options.ring_pages,
                                                   " pages cannot hold two samples of ",
                                                   options.stack_bytes, " stack bytes"));
  }
  return absl::OkStatus();
}

perf_event_attr MakeAttr(const SessionOptions& options, const UserRegsLayout& layout,
                         size_t ring_bytes, bool wake_each_sample = false) {
  perf_event_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.size = sizeof(attr);
  attr.type = PERF_TYPE_SOFTWARE;
  attr.sample_type =
      PERF_SAMPLE_TID | PERF_SAMPLE_TIME | PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER;
  if (options.event == SessionEvent::kContextSwitches) {
    attr.config = PERF_COUNT_SW_CONTEXT_SWITCHES;
    attr.sample_period = 1;  // every switch: each carries its own off-CPU interval
    attr.context_switch = 1;  // PERF_RECORD_SWITCH*: when the thread runs again
    attr.sample_id_all = 1;   // ... with its tid and time
  } else {
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    attr.freq = 1;
    attr.sample_freq = options.frequency_hz;
  }
  if (options.kernel_stacks || options.user_frame_chain) {
    attr.sample_type |= PERF_SAMPLE_CALLCHAIN;
    // The agent unwinds user stacks itself; the frame-pointer walk only serves what the copy
    // does not hold (user_frame_chain).
    attr.exclude_callchain_user = options.user_frame_chain ? 0 : 1;
    attr.exclude_callchain_kernel = options.kernel_stacks ? 0 : 1;
  }
  attr.sample_regs_user = layout.mask;
  attr.sample_stack_user = options.stack_bytes;
  // A context switch is kernel code: its event must count in the kernel.
  attr.exclude_kernel =
      options.kernel_stacks || options.event == SessionEvent::kContextSwitches ? 0 : 1;
  attr.exclude_hv = 1;
  // Timestamps comparable with clock_gettime(CLOCK_MONOTONIC) elsewhere in the agent.
  attr.use_clockid = 1;
  attr.clockid = CLOCK_MONOTONIC;
  // Wake the reader after a batch of samples rather than at every sample.
  attr.watermark = 1;
  attr.wakeup_watermark = static_cast<uint32_t>(ring_bytes / 2);
  if (options.wakeup_samples > 0) {
    attr.wakeup_watermark = static_cast<uint32_t>(std::min(
        ring_bytes / 2, options.wakeup_samples * MaxSampleRecordSize(options, layout)));
  }
  if (wake_each_sample) {  // counted in samples, not bytes: a stack copy may be short
    attr.watermark = 0;
    attr.wakeup_events = 1;
  }
  return attr;
}

absl::Status PerfOpenError(int err, pid_t tid, int cpu = -1,
                           const SessionOptions& options = {}) {
  const char* event =
      options.event == SessionEvent::kContextSwitches ? "context-switches" : "cpu-clock";
  std::string message =
      absl::StrCat("perf_event_open(", event, options.kernel_stacks ? " with kernel stacks" : "",
                   ", ", cpu >= 0 ? "cpu " : "tid ",
                   cpu >= 0 ? cpu : tid, "): ", strerror(err));
  switch (err) {
    case ENOSYS:
    case ENOENT:
    case EOPNOTSUPP:
    case ENODEV:
      return absl::UnavailableError(
          absl::StrCat(message, " (perf events are not available on this kernel or CPU)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(absl::StrCat(
          message, cpu >= 0 ? " (system-wide events need CAP_PERFMON/root or "
                              "kernel.perf_event_paranoid <= 0)"
                   : options.kernel_stacks || options.event != SessionEvent::kCpuClock
                       ? " (kernel-mode events need CAP_PERFMON/root or "
                         "kernel.perf_event_paranoid <= 1)"
                       : " (needs CAP_PERFMON/root or a lower kernel.perf_event_paranoid)"));
    case ESRCH:
      return absl::NotFoundError(message);
    case EMFILE:
    case ENFILE:
    case ENOMEM:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

int PerfEventOpen(perf_event_attr* attr, pid_t tid, int cpu = -1) {
  return static_cast<int>(
      syscall(__NR_perf_event_open, attr, tid, cpu, /*group_fd=*/-1, PERF_FLAG_FD_CLOEXEC));
}

bool ParseInt(std::string_view text, int* out) {
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && end == text.data() + text.size();
}

}  // namespace

absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view text) {
  std::vector<int> cpus;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty()) return cpus;
  for (std::string_view part : base::Split(text, ',')) {
    const size_t dash = part.find('-');
    int first = 0;
    int last = 0;
    if (!ParseInt(part.substr(0, dash), &first) ||
        (dash != std::string_view::npos && !ParseInt(part.substr(dash + 1), &last))) {
      return absl::InvalidArgumentError(absl::StrCat("bad cpu list '", std::string(text), "'"));
    }
    if (dash == std::string_view::npos) last = first;
    if (first < 0 || last < first || last > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("bad cpu range in '", std::string(text), "'"));
    }
    for (int cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
  }
  return cpus;
}

namespace {
// A sample record of the largest register set (MIPS64: 32 general registers + pc), for sizing
// rings and their watermarks.
size_t WorstCaseRecordBytes(uint32_t stack_bytes) {
  return sizeof(perf_event_header) + 8 * 4 + 8 * 34 + 16 + stack_bytes;
}
}  // namespace

uint32_t RingPagesFor(uint32_t stack_bytes, uint32_t samples, uint32_t min_pages) {
  const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t record = WorstCaseRecordBytes(stack_bytes);
  const size_t bytes = size_t{std::max<uint32_t>(samples, 2)} * record;
  const size_t pages = std::max<size_t>(min_pages, (bytes + page_size - 1) / page_size);
  return static_cast<uint32_t>(std::bit_ceil(pages));
}

uint32_t PerCpuWakeupSamples(uint32_t ring_pages, uint32_t stack_bytes, uint32_t frequency_hz) {
  const size_t page_size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uint32_t ring_samples =
      static_cast<uint32_t>(size_t{ring_pages} * page_size / WorstCaseRecordBytes(stack_bytes));
  const uint32_t second = std::max<uint32_t>(1, frequency_hz);
  const uint32_t limit =
      std::max(ring_samples / 4, ring_samples > second ? ring_samples - second : 0);
  return std::max<uint32_t>(1, std::min(second, limit));
}

absl::StatusOr<std::vector<int>> OnlineCpus() {
  constexpr const char* kPath = "/sys/devices/system/cpu/online";
  std::ifstream in(kPath);
  std::string text;
  if (!in || !std::getline(in, text)) {
    return absl::UnavailableError(absl::StrCat("cannot read ", kPath));
  }
  absl::StatusOr<std::vector<int>> cpus = ParseCpuList(text);
  if (cpus.ok() && cpus->empty()) return absl::UnavailableError(absl::StrCat(kPath, " is empty"));
  return cpus;
}

namespace {

// Opens and closes one event of the default session on `tid` (per thread) or `cpu` (per CPU).
absl::Status ProbeEvent(pid_t tid, int cpu, const SessionOptions& options = {}) {
  absl::StatusOr<Arch> arch = HostArch();
  if (!arch.ok()) return arch.status();
  perf_event_attr attr = MakeAttr(options, RegsLayoutFor(*arch), 1 << 20);
  int fd = PerfEventOpen(&attr, tid, cpu);
  if (fd < 0) return PerfOpenError(errno, tid, cpu, options);
  close(fd);
  return absl::OkStatus();
}

}  // namespace

absl::Status ProbePerfEvents() { return ProbeEvent(static_cast<pid_t>(syscall(SYS_gettid)), -1); }

absl::Status ProbePerCpuEvents() { return ProbeEvent(/*tid=*/-1, /*cpu=*/0); }

absl::Status ProbeKernelEvents(SamplingScope scope, SessionEvent event) {
  SessionOptions options;
  options.event = event;
  options.kernel_stacks = true;
  if (scope == SamplingScope::kPerCpu) return ProbeEvent(/*tid=*/-1, /*cpu=*/0, options);
  return ProbeEvent(static_cast<pid_t>(syscall(SYS_gettid)), -1, options);
}

absl::Status ProbeCpuFilter() { return CpuSampleFilter::Create().status(); }

absl::StatusOr<std::unique_ptr<PerfSampler>> PerfSampler::Create() {
  absl::StatusOr<Arch> arch = HostArch();
  if (!arch.ok()) return arch.status();
  int epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd < 0) {
    return absl::InternalError(absl::StrCat("epoll_create1: ", strerror(errno)));
  }
  return std::unique_ptr<PerfSampler>(new PerfSampler(epoll_fd, RegsLayoutFor(*arch)));
}

PerfSampler::PerfSampler(int epoll_fd, const UserRegsLayout& layout)
    : epoll_fd_(epoll_fd),
      layout_(layout),
      page_size_(static_cast<size_t>(sysconf(_SC_PAGESIZE))),
      scratch_(new uint8_t[kMaxRecordSize]) {}

PerfSampler::~PerfSampler() {
  for (auto& [id, session] : sessions_) {
    ForEachEvent(*session, [this](RingEvent& event) { CloseEvent(&event); });
  }
  close(epoll_fd_);
}

absl::Status PerfSampler::AddSession(const SessionOptions& options) {
  if (sessions_.contains(options.session_id)) {
    return absl::AlreadyExistsError(absl::StrCat("session ", options.session_id, " exists"));
  }
  if (absl::Status status = ValidateOptions(options, layout_, page_size_); !status.ok()) {
    return status;
  }
  auto session = std::make_unique<Session>();
  session->options = options;
  UpdatePeriod(*session);
  sessions_.emplace(options.session_id, std::move(session));
  return absl::OkStatus();
}

absl::Status PerfSampler::OpenCpuEvents(Session& session) {
  if (!session.cpu_events.empty()) return absl::OkStatus();
  absl::StatusOr<std::vector<int>> cpus = OnlineCpus();
  if (!cpus.ok()) return cpus.status();
  if (session.filter == nullptr && session.filter_status.ok()) {
    absl::StatusOr<std::unique_ptr<CpuSampleFilter>> filter = CpuSampleFilter::Create();
    if (filter.ok()) {
      session.filter = std::move(*filter);
      for (const auto& [pid, threads] : session.targets) UpdateFilter(session, pid);
      if (session.options.event == SessionEvent::kCpuClock && sample_program_fd_ >= 0) {
        (void)session.filter->Chain(sample_program_fd_);
      }
    } else {
      session.filter_status = filter.status();
    }
  }
  for (int cpu : *cpus) {
    absl::StatusOr<std::unique_ptr<RingEvent>> event = OpenEvent(session, -1, -1, cpu);
    if (!event.ok()) {
      for (auto& opened : session.cpu_events) CloseEvent(opened.get());
      session.cpu_events.clear();
      return event.status();
    }
    session.cpu_events.push_back(std::move(*event));
  }
  return absl::OkStatus();
}

absl::Status PerfSampler::RemoveSession(uint32_t session_id) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  Session& session = *it->second;
  ForEachEvent(session, [this](RingEvent& event) { CloseEvent(&event); });
  retired_stats_ += session.current_stats();
  sessions_.erase(it);
  return absl::OkStatus();
}

absl::Status PerfSampler::SetFrequency(uint32_t session_id, uint32_t frequency_hz) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  if (frequency_hz == 0) return absl::InvalidArgumentError("frequency_hz must be > 0");
  Session& session = *it->second;
  session.options.frequency_hz = frequency_hz;
  UpdatePeriod(session);
  // cpu-clock is driven by an hrtimer: at open the kernel turns sample_freq into a fixed period
  // in nanoseconds and clears attr.freq, so PERF_EVENT_IOC_PERIOD takes a period here.
  uint64_t period_ns = 1'000'000'000ull / frequency_hz;
  std::vector<std::pair<pid_t, pid_t>> reopen;
  for (auto& event : session.cpu_events) {
    if (ioctl(event->fd, PERF_EVENT_IOC_PERIOD, &period_ns) != 0) {
      return absl::InternalError(absl::StrCat("PERF_EVENT_IOC_PERIOD on cpu ", event->cpu, ": ",
                                              strerror(errno)));
    }
  }
  for (auto& [pid, threads] : session.targets) {
    for (auto& [tid, event] : threads) {
      if (ioctl(event->fd, PERF_EVENT_IOC_PERIOD, &period_ns) != 0) reopen.emplace_back(pid, tid);
    }
  }
  // A kernel that kept frequency mode rejects the period; reopen those events at the new rate
  // (their undrained samples are dropped).
  for (auto [pid, tid] : reopen) {
    auto& threads = session.targets[pid];
    CloseEvent(threads[tid].get());
    threads.erase(tid);
    absl::Status status = AttachThread(session_id, pid, tid);
    if (!status.ok() && !absl::IsNotFound(status)) return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PerfSampler::RingEvent>> PerfSampler::OpenEvent(
    Session& session, pid_t pid, pid_t tid, int cpu) {
  const bool each_sample = cpu < 0 && session.each_sample.contains(pid);
  const uint32_t pages =
      each_sample && session.per_cpu()
          ? RingPagesFor(session.options.stack_bytes, kEachSampleRingSamples)
          : session.options.ring_pages;
  const size_t data_size = size_t{pages} * page_size_;
  perf_event_attr attr = MakeAttr(session.options, layout_, data_size, each_sample);
  auto event = std::make_unique<RingEvent>();
  event->pid = pid;
  event->tid = tid;
  event->cpu = cpu;
  event->fd = PerfEventOpen(&attr, tid, cpu);
  if (event->fd < 0) return PerfOpenError(errno, tid, cpu, session.options);
  if (cpu >= 0 && session.filter != nullptr) {
    // Where the kernel refuses, the CPU's samples are filtered here, as without the program.
    if (ioctl(event->fd, PERF_EVENT_IOC_SET_BPF, session.filter->program_fd()) != 0) {
      ++session.stats.programs_not_attached;
    }
  } else {
    AttachSampleProgram(session, event->fd);
  }
  event->mapping_size = page_size_ + data_size;
  event->mapping =
      mmap(nullptr, event->mapping_size, PROT_READ | PROT_WRITE, MAP_SHARED, event->fd, 0);
  if (event->mapping == MAP_FAILED) {
    int err = errno;
    event->mapping = nullptr;
    CloseEvent(event.get());
    // EPERM here is the perf_event_mlock_kb limit for unprivileged users.
    return absl::ResourceExhaustedError(absl::StrCat(
        "mmap of perf ring for ", cpu >= 0 ? "cpu " : "tid ", cpu >= 0 ? cpu : tid, ": ",
        strerror(err)));
  }
  event->control = static_cast<perf_event_mmap_page*>(event->mapping);
  event->data = static_cast<uint8_t*>(event->mapping) + page_size_;
  event->data_size = data_size;
  if (!session.paced && !Watch(*event)) {
    int err = errno;
    CloseEvent(event.get());
    return absl::InternalError(absl::StrCat("epoll_ctl: ", strerror(err)));
  }
  return event;
}

void PerfSampler::AttachSampleProgram(Session& session, int fd) {
  if (sample_program_fd_ < 0 || session.options.event != SessionEvent::kCpuClock) return;
  if (ioctl(fd, PERF_EVENT_IOC_SET_BPF, sample_program_fd_) != 0 && errno != EEXIST) {
    ++session.stats.programs_not_attached;
  }
}

void PerfSampler::SetSampleProgram(int program_fd) {
  if (program_fd == sample_program_fd_) return;
  sample_program_fd_ = program_fd;
  for (auto& [id, owned] : sessions_) {
    Session& session = *owned;
    if (session.filter != nullptr) {
      // The CPU events run the filter, which runs the sample program for targets.
      if (session.options.event == SessionEvent::kCpuClock &&
          !session.filter->Chain(program_fd).ok()) {
        session.stats.programs_not_attached += session.cpu_events.size();
      }
      for (auto& [pid, threads] : session.targets) {
        for (auto& [tid, event] : threads) AttachSampleProgram(session, event->fd);
      }
    } else {
      ForEachEvent(session, [&](RingEvent& event) { AttachSampleProgram(session, event.fd); });
    }
  }
}

void PerfSampler::UpdateFilter(Session& session, pid_t pid) {
  if (session.filter == nullptr || session.filter->passing()) return;
  // A target the map cannot hold makes the filter pass every sample (filtered here instead).
  (void)session.filter->SetTarget(pid, session.sampled_by_cpus(pid));
}

bool PerfSampler::Watch(RingEvent& event) {
  epoll_event ev;
  std::memset(&ev, 0, sizeof(ev));
  ev.events = EPOLLIN;
  ev.data.ptr = &event;
  return epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event.fd, &ev) == 0;
}

void PerfSampler::Pace(Session& session, bool paced) {
  if (paced) {
    for (auto& event : session.cpu_events) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, event->fd, nullptr);
    session.paced = true;
    return;
  }
  // Back in the epoll set; a ring that cannot be (ENOMEM) keeps the session on its period.
  bool watched = true;
  for (auto& event : session.cpu_events) watched &= Watch(*event) || errno == EEXIST;
  session.paced = !watched;
}

void PerfSampler::UpdatePeriod(Session& session) {
  const SessionOptions& o = session.options;
  // Two periods of samples at the rate must fit the ring: one between drains, one for a
  // drain that comes late.
  const uint64_t period_samples = uint64_t{o.drain_every_ms} * o.frequency_hz / 1000 + 1;
  const bool fits = size_t{o.ring_pages} * page_size_ >=
                    2 * period_samples * MaxSampleRecordSize(o, layout_);
  session.drain_every_ms = session.per_cpu() && fits ? o.drain_every_ms : 0;
  if (session.drain_every_ms == 0 && session.paced) Pace(session, false);
}

absl::Duration PerfSampler::max_wait() const {
  absl::Duration wait = absl::InfiniteDuration();
  for (const auto& [id, session] : sessions_) {
    if (session->paced) wait = std::min(wait, absl::Milliseconds(session->drain_every_ms));
  }
  return wait;
}

void PerfSampler::CloseEvent(RingEvent* event) {
  if (event->fd >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, event->fd, nullptr);
  if (event->mapping != nullptr) munmap(event->mapping, event->mapping_size);
  if (event->fd >= 0) close(event->fd);
  event->fd = -1;
  event->mapping = nullptr;
}

absl::Status PerfSampler::AttachThread(uint32_t session_id, pid_t pid, pid_t tid) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  Session& session = *it->second;
  auto [target, added] = session.targets.try_emplace(pid);
  if (added) UpdateFilter(session, pid);
  auto& threads = target->second;
  if (!session.per_thread(pid)) return OpenCpuEvents(session);
  if (threads.contains(tid)) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<RingEvent>> event = OpenEvent(session, pid, tid, /*cpu=*/-1);
  if (!event.ok()) return event.status();
  threads.emplace(tid, std::move(*event));
  ++session.stats.threads_attached;
  return absl::OkStatus();
}

absl::Status PerfSampler::AttachProcess(uint32_t session_id, pid_t pid,
                                        absl::Span<const pid_t> tids, Wake wake) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  Session& session = *it->second;
  session.targets.try_emplace(pid);
  if (wake == Wake::kEachSample) session.each_sample.insert(pid);
  UpdateFilter(session, pid);
  if (!session.per_thread(pid)) return OpenCpuEvents(session);
  for (pid_t tid : tids) {
    absl::Status status = AttachThread(session_id, pid, tid);
    if (!status.ok() && !absl::IsNotFound(status)) return status;
  }
  return absl::OkStatus();
}

absl::Status PerfSampler::AttachNewThread(pid_t pid, pid_t tid) {
  for (auto& [id, session] : sessions_) {
    if (!session->targets.contains(pid) || !session->per_thread(pid)) continue;
    absl::Status status = AttachThread(id, pid, tid);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

void PerfSampler::DetachThread(pid_t pid, pid_t tid) {
  for (auto& [id, session] : sessions_) {
    auto target = session->targets.find(pid);
    if (target == session->targets.end()) continue;
    auto thread = target->second.find(tid);
    if (thread == target->second.end()) continue;
    CloseEvent(thread->second.get());
    target->second.erase(thread);
  }
}

void PerfSampler::DetachProcess(uint32_t session_id, pid_t pid) {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return;
  auto target = it->second->targets.find(pid);
  if (target == it->second->targets.end()) return;
  for (auto& [tid, event] : target->second) CloseEvent(event.get());
  it->second->targets.erase(target);
  it->second->each_sample.erase(pid);
  UpdateFilter(*it->second, pid);
}

void PerfSampler::DetachProcess(pid_t pid) {
  for (auto& [id, session] : sessions_) DetachProcess(id, pid);
}

absl::StatusOr<int> PerfSampler::Wait(absl::Duration timeout) {
  int timeout_ms = -1;
  if (timeout != absl::InfiniteDuration()) {
    timeout_ms = static_cast<int>(std::clamp<int64_t>(
        absl::ToInt64Milliseconds(absl::Ceil(timeout, absl::Milliseconds(1))), 0, INT32_MAX));
  }
  epoll_event events[64];
  int n = epoll_wait(epoll_fd_, events, 64, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return 0;
    return absl::InternalError(absl::StrCat("epoll_wait: ", strerror(errno)));
  }
  for (int i = 0; i < n; ++i) {
    if (events[i].events & (EPOLLHUP | EPOLLERR)) {
      static_cast<RingEvent*>(events[i].data.ptr)->exited = true;
    }
  }
  return n;
}

size_t PerfSampler::DrainEvent(Session& session, RingEvent& event, SampleCallback callback) {
  size_t delivered = 0;
  // A CPU's samples of processes that are no targets of its events: others, and the targets
  // sampled per thread (Wake::kEachSample).
  const bool filter = event.cpu >= 0;
  // The last pid's answer: a ring's samples come in runs of one process (only targets' where
  // the kernel filters), and the targets cannot change during a drain.
  uint32_t last_pid = UINT32_MAX;  // no pid: (pid_t)-1
  bool last_sampled = false;
  auto sampled_here = [&](uint32_t pid) {
    if (pid != last_pid) {
      last_pid = pid;
      last_sampled = session.sampled_by_cpus(static_cast<pid_t>(pid));
    }
    return last_sampled;
  };
  const bool callchain = session.options.kernel_stacks || session.options.user_frame_chain;
  RingReader reader(event.control, event.data, event.data_size);
  RawSample sample;
  RingReader::ReadResult result = reader.ReadAll(
      [&](const uint8_t* record, size_t size) {
        perf_event_header header;
        std::memcpy(&header, record, sizeof(header));
        if (header.type == PERF_RECORD_SWITCH || header.type == PERF_RECORD_SWITCH_CPU_WIDE) {
          // Switch-outs come as samples (with the stack); switch-ins end their interval.
          sample.session_id = session.options.session_id;
          absl::StatusOr<bool> out = ParseSwitchRecord(record, size, &sample);
          if (!out.ok()) {
            ++session.stats.malformed;
          } else if (!*out && (!filter || sampled_here(sample.pid))) {
            callback(sample);
            ++session.stats.switches_in;
          }
        } else if (header.type == PERF_RECORD_SAMPLE) {
          sample.session_id = session.options.session_id;
          if (!ParseSampleRecord(record, size, layout_, &sample, callchain).ok()) {
            ++session.stats.malformed;
          } else if (filter && !sampled_here(sample.pid)) {
            ++session.stats.filtered;
          } else {
            callback(sample);
            ++delivered;
          }
        } else if (header.type == PERF_RECORD_LOST) {
          absl::StatusOr<uint64_t> lost = ParseLostRecord(record, size);
          if (lost.ok()) {
            session.stats.lost += *lost;
          } else {
            ++session.stats.malformed;
          }
        }
        // Other records (throttling) carry nothing the agent uses.
      },
      scratch_.get());
  session.stats.samples += delivered;
  session.stats.bytes += result.bytes;
  if (result.corrupt) ++session.stats.malformed;
  return delivered;
}

size_t PerfSampler::Drain(SampleCallback callback) {
  size_t delivered = 0;
  for (auto& [id, session] : sessions_) {
    size_t from_cpus = 0;
    for (auto& event : session->cpu_events) from_cpus += DrainEvent(*session, *event, callback);
    delivered += from_cpus;
    // Busy rings are drained on the period; idle ones wake the reader when samples return.
    // (Samples of other processes, dropped, count as busy: they fill the rings too.)
    const bool busy = from_cpus > 0 || session->stats.filtered != session->filtered_at_drain;
    session->filtered_at_drain = session->stats.filtered;
    if (session->drain_every_ms > 0 && busy != session->paced) {
      Pace(*session, busy);
    }
    for (auto& [pid, threads] : session->targets) {
      for (auto& [tid, event] : threads) delivered += DrainEvent(*session, *event, callback);
      // Events of exited threads are closed once their last samples are out.
      // (No structured binding in the capture: clang before 16 cannot capture one.)
      absl::erase_if(threads, [&, &stats = session->stats](const auto& entry) {
        if (!entry.second->exited) return false;
        CloseEvent(entry.second.get());
        ++stats.threads_exited;
        return true;
      });
    }
  }
  return delivered;
}

SamplerStats PerfSampler::stats() const {
  SamplerStats total = retired_stats_;
  for (const auto& [id, session] : sessions_) total += session->current_stats();
  return total;
}

uint64_t PerfSampler::lost() const {
  uint64_t lost = retired_stats_.lost;
  for (const auto& [id, session] : sessions_) lost += session->stats.lost;
  return lost;
}

absl::StatusOr<SamplerStats> PerfSampler::session_stats(uint32_t session_id) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  return it->second->current_stats();
}

absl::Status PerfSampler::CpuFilterStatus(uint32_t session_id) const {
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) {
    return absl::NotFoundError(absl::StrCat("no session ", session_id));
  }
  const Session& session = *it->second;
  if (!session.filter_status.ok()) return session.filter_status;
  if (session.filter == nullptr) {
    return absl::FailedPreconditionError("no CPU events open in this session");
  }
  if (session.filter->passing()) {
    return absl::ResourceExhaustedError("more targets than the kernel filter holds");
  }
  return absl::OkStatus();
}

size_t PerfSampler::attached_events() const {
  size_t count = 0;
  for (const auto& [id, session] : sessions_) {
    count += session->cpu_events.size();
    for (const auto& [pid, threads] : session->targets) count += threads.size();
  }
  return count;
}

std::vector<pid_t> PerfSampler::AttachedThreads(uint32_t session_id, pid_t pid) const {
  std::vector<pid_t> tids;
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return tids;
  auto target = it->second->targets.find(pid);
  if (target == it->second->targets.end()) return tids;
  for (const auto& [tid, event] : target->second) tids.push_back(tid);
  std::sort(tids.begin(), tids.end());
  return tids;
}

}  // namespace strata::agent::sampler
