// agent/sampler (strata::agent::sampler): perf events, the kernel side of sampling. The
// sampler owns its events and rings; in the agent it is owned by agent/sources' PerfSource.
//
// perf_event_open-based sampling of threads: user registers + a copy of the top of the user
// stack (and, when asked, the kernel's call chain), at a fixed rate per sampling session or at
// every context switch, delivered to a callback.
//
// Model. A *session* (id chosen by the caller, e.g. 0 for continuous profiling, a capture id for
// an ad hoc capture) has its own rate, stack-copy size, event and scope, and every sample
// carries its session id, so two sessions on the same thread sample independently at their
// own rates. cpu-clock sessions (PERF_TYPE_SOFTWARE / PERF_COUNT_SW_CPU_CLOCK in frequency
// mode, exclude_hv, exclude_kernel unless kernel_stacks) count CPU time, so an idle thread
// costs nothing; context-switch sessions (SessionEvent) sample every switch of their threads.
// The scope says what one event covers:
//
//  - kPerThread: one event per (session, thread) (pid = tid, cpu = -1). Works for an
//    unprivileged agent on its own processes; costs one descriptor and one ring per thread.
//    One ring per thread rather than PERF_EVENT_IOC_SET_OUTPUT into one ring per process: the
//    kernel refuses SET_OUTPUT between events of different tasks unless both are per-CPU
//    events. (1 + ring_pages) pages per thread, by default 33 (132 KiB, about 7 samples of
//    16 KiB stacks).
//  - kPerCpu: one event per (session, online CPU) (pid = -1, cpu = N), which samples whatever
//    runs there in user mode; samples of processes that are not targets of the session are
//    dropped by a BPF program before the kernel writes them, where it can be loaded
//    (cpu_filter.h; counted as `filtered_in_kernel`), and here in any case (counted as
//    `filtered`). Costs and descriptors scale with CPUs, not with
//    threads, and threads need no attaching; needs system-wide events (CAP_PERFMON or
//    perf_event_paranoid <= 0). CPUs brought online later are not sampled.
//
// The kernel wakes the reader once a ring holds wakeup_samples samples (by default half a
// ring), not at every sample; the rest of the ring is headroom for the reader's own latency
// (a busy host may not run it at once). The owner sizes both (RingPagesFor). A target attached
// with Wake::kEachSample is the exception: its reader reads something of the thread right
// after each sample (Python frames), so each of its threads gets its own event, whatever the
// scope, whose ring wakes the reader at every sample; in a kPerCpu session the CPUs' samples
// of it are dropped, and the CPUs' events are opened only for the other targets.
//
// Targets are attached explicitly (AttachProcess / AttachNewThread) by the owner, from process
// and thread events or /proc scans, rather than with perf `inherit`: inherited events also
// follow fork()ed child processes, do not cover threads that already exist, and do not take a
// run-time rate change (PERF_EVENT_IOC_PERIOD applies to the parent event only). Per thread, a
// thread living shorter than the owner takes to see it is not sampled; per CPU, every thread of
// a target is. Threads that exit are detected by the kernel's hang-up on their event (or by
// DetachThread): their remaining samples are delivered by the next Drain() and their events
// are closed.
//
// Use from one thread (the agent's main loop): Wait(timeout) blocks until some ring has data or
// the timeout passes, Drain(callback) delivers everything buffered. No allocation per sample:
// records are handed out in place, or through one scratch buffer when they wrap the ring.
//
// Errors: perf events missing (ENOSYS under qemu-user, ENOENT/EOPNOTSUPP/ENODEV on kernels or
// cores without them) -> UnavailableError; EACCES/EPERM (perf_event_paranoid, no CAP_PERFMON)
// -> PermissionDeniedError; the thread is gone (ESRCH) -> NotFoundError.

#ifndef STRATA_AGENT_SAMPLER_PERF_SAMPLER_H_
#define STRATA_AGENT_SAMPLER_PERF_SAMPLER_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "agent/sampler/perf_regs.h"
#include "agent/sampler/raw_sample.h"

namespace strata::agent::sampler {

enum class SamplingScope { kPerThread, kPerCpu };

// What a session's events count.
//  - kCpuClock: cpu-clock in frequency mode, a sample per period of CPU time (on-CPU profiles).
//  - kContextSwitches: every context switch of a target thread; the sample is taken as the
//    thread switches out (its user registers and stack, its kernel chain where blocked), and a
//    kSwitchIn event follows when it runs again (context_switch records), so the owner can
//    weight the switch-out's stack by the time off CPU. Needs kernel-mode events (the switch
//    happens in the kernel): CAP_PERFMON/root or perf_event_paranoid <= 1.
enum class SessionEvent { kCpuClock, kContextSwitches };

struct SessionOptions {
  uint32_t session_id = 0;
  SamplingScope scope = SamplingScope::kPerThread;
  uint32_t frequency_hz = 99;
  // Bytes of user stack copied per sample; a multiple of 8, at most kMaxStackBytes.
  uint32_t stack_bytes = 16 * 1024;
  // Data pages of each thread's ring; a power of two, large enough for two samples.
  uint32_t ring_pages = 32;
  // The reader is woken once a ring holds about this many samples (at least one, at most half
  // the ring's worth); 0: at half the ring.
  uint32_t wakeup_samples = 0;
  // kPerCpu only; 0: off. While the session's rings have samples, the kernel does not wake
  // the reader for them: it drains them every `drain_every_ms` (max_wait()), so a host whose
  // N CPUs all run targets wakes the agent once a period, not N times. Once a drain finds
  // them empty they wake the reader again (wakeup_samples) when samples come back. The rings
  // must hold two periods of samples at the rate (else, also after a rate change, the kernel
  // wakes the reader as without a period): a CPU's event samples at most at its rate, whatever
  // runs there, so the fill between two drains is bounded.
  uint32_t drain_every_ms = 0;
  SessionEvent event = SessionEvent::kCpuClock;
  // Samples also carry the kernel call chain (PERF_SAMPLE_CALLCHAIN, kernel part), and
  // cpu-clock counts time in the kernel too (without it, time in system calls is not
  // sampled at all). Needs CAP_PERFMON/root or perf_event_paranoid <= 1.
  bool kernel_stacks = false;
  // Samples also carry the kernel's frame-pointer walk of the user stack (PERF_SAMPLE_CALLCHAIN,
  // user part): return addresses read at the sample from memory the stack copy does not hold,
  // such as a goroutine's stack below the system stack the sample was taken on (Go keeps
  // frame pointers on x86-64). Costs the target one walk of its frame pointers per sample.
  bool user_frame_chain = false;
};

// Leaves room for the rest of the sample in a record whose size is a u16.
inline constexpr uint32_t kMaxStackBytes = 63 * 1024;

// Data pages of a ring that holds at least `samples` samples of `stack_bytes` each: a power of
// two, at least `min_pages`.
uint32_t RingPagesFor(uint32_t stack_bytes, uint32_t samples, uint32_t min_pages = 8);

// Samples after which the kernel should wake the reader of a per-CPU ring of `ring_pages`
// data pages sampling one CPU at `frequency_hz`: about a second of a busy CPU's samples while
// the ring keeps at least as many free behind the watermark (headroom for a reader the host
// runs late), else a quarter of the ring. At least 1.
uint32_t PerCpuWakeupSamples(uint32_t ring_pages, uint32_t stack_bytes, uint32_t frequency_hz);

struct SamplerStats {
  uint64_t samples = 0;   // samples delivered to callbacks
  uint64_t lost = 0;      // samples the kernel dropped (ring full), from PERF_RECORD_LOST
  uint64_t bytes = 0;     // ring bytes consumed
  uint64_t malformed = 0;  // records that did not parse, and rings found corrupt
  uint64_t threads_attached = 0;  // events opened over the sampler's life
  uint64_t threads_exited = 0;    // events closed because their thread exited
  uint64_t filtered = 0;  // per-CPU samples of processes that are not targets of the session
  uint64_t filtered_in_kernel = 0;  // ... dropped before they were written (CpuSampleFilter)
  // Runs of that filter's program and their time (kernel.bpf_stats_enabled): a cost of the
  // sampled processes, with the chained sample program's.
  uint64_t filter_runs = 0;
  uint64_t filter_ns = 0;
  uint64_t switches_in = 0;  // kSwitchIn events delivered (off-CPU sessions)
  uint64_t programs_not_attached = 0;  // events opened without SessionOptions' program

  SamplerStats& operator+=(const SamplerStats& other) {
    switches_in += other.switches_in;
    samples += other.samples;
    lost += other.lost;
    bytes += other.bytes;
    malformed += other.malformed;
    threads_attached += other.threads_attached;
    threads_exited += other.threads_exited;
    filtered += other.filtered;
    filtered_in_kernel += other.filtered_in_kernel;
    filter_runs += other.filter_runs;
    filter_ns += other.filter_ns;
    programs_not_attached += other.programs_not_attached;
    return *this;
  }
};

// Opens and closes one cpu-clock sampling event on the calling thread: OK if this host can use
// the sampler, otherwise the error AttachThread would return (see above).
absl::Status ProbePerfEvents();
// Opens and closes one system-wide cpu-clock event on CPU 0: OK if kPerCpu sessions can be
// added, otherwise the error AddSession would return.
absl::Status ProbePerCpuEvents();
// Loads and frees the in-kernel filter of per-CPU events (cpu_filter.h): OK if kPerCpu
// sessions will drop other processes' samples in the kernel, else why they will not.
absl::Status ProbeCpuFilter();
// Opens and closes an event of `event` with kernel stacks in `scope`: OK if sessions with
// kernel_stacks (or of kContextSwitches) can be added.
absl::Status ProbeKernelEvents(SamplingScope scope, SessionEvent event);
// The online CPUs (/sys/devices/system/cpu/online), ascending.
absl::StatusOr<std::vector<int>> OnlineCpus();
// The kernel's cpu list format, "0-3,5" -> {0, 1, 2, 3, 5}; "" -> {}.
absl::StatusOr<std::vector<int>> ParseCpuList(std::string_view text);

class PerfSampler {
 public:
  // UnimplementedError on an unsupported architecture; errors from epoll_create1.
  static absl::StatusOr<std::unique_ptr<PerfSampler>> Create();
  ~PerfSampler();

  PerfSampler(const PerfSampler&) = delete;
  PerfSampler& operator=(const PerfSampler&) = delete;

  // AlreadyExistsError if the id is taken; InvalidArgumentError for bad options. A kPerCpu
  // session opens its events with its first target (the errors of AttachThread, for CPUs).
  absl::Status AddSession(const SessionOptions& options);
  // Closes all of the session's events; samples not yet drained are dropped (Drain() first to
  // keep them). Its statistics are forgotten.
  absl::Status RemoveSession(uint32_t session_id);
  // Changes the rate of every event of the session, now and for threads attached later.
  absl::Status SetFrequency(uint32_t session_id, uint32_t frequency_hz);
  // Runs `program_fd`, a BPF_PROG_TYPE_PERF_EVENT program, at every sample of the CPU-time
  // sessions, in the sampled thread's context before the sample is written (e.g.
  // agent/python/frame_capture.h): on their events now and on those opened later, and on
  // those of sessions added later. An event the kernel will not attach it to samples without
  // it (SessionStats::programs_not_attached). A program already attached stays.
  void SetSampleProgram(int program_fd);

  // Starts sampling thread `tid` of process `pid` in the session; no-op if already sampled.
  // The pid becomes a target of the session (see AttachNewThread). In a kPerCpu session only
  // the pid counts: all of its threads are sampled.
  absl::Status AttachThread(uint32_t session_id, pid_t pid, pid_t tid);
  // AttachThread for each of `tids`; threads that already exited are skipped (NotFound is not
  // an error here). The pid is a target of the session even if no thread could be attached.
  // kEachSample: see the top; it holds for the pid's threads attached later too.
  enum class Wake { kBatched, kEachSample };
  absl::Status AttachProcess(uint32_t session_id, pid_t pid, absl::Span<const pid_t> tids,
                             Wake wake = Wake::kBatched);
  // Attaches a new thread of `pid` to every session for which `pid` is a target.
  absl::Status AttachNewThread(pid_t pid, pid_t tid);
  // Stops sampling `tid` in every session (its undrained samples are dropped).
  void DetachThread(pid_t pid, pid_t tid);
  // Stops sampling `pid` in one session / in every session, and forgets it as a target.
  void DetachProcess(uint32_t session_id, pid_t pid);
  void DetachProcess(pid_t pid);

  // Blocks until a ring has data (or a sampled thread exited), `timeout` passes, or a signal
  // arrives. Returns the number of ready events (0 on timeout or signal).
  absl::StatusOr<int> Wait(absl::Duration timeout);
  // How long the owner may wait (on wait_fd()) before the next Drain(): the period of the
  // sessions being drained on one (SessionOptions::drain_every_ms), else infinite.
  absl::Duration max_wait() const;
  // Delivers every buffered sample of every session to `callback`, then closes events of
  // threads that exited. Returns the number of samples delivered. `callback` must not call
  // back into the sampler.
  size_t Drain(SampleCallback callback);

  SamplerStats stats() const;  // summed over sessions, including removed ones
  uint64_t lost() const;       // stats().lost, without reading the kernel's counters
  absl::StatusOr<SamplerStats> session_stats(uint32_t session_id) const;
  // OK when the kPerCpu session's CPU events drop other processes' samples in the kernel;
  // else why not (FailedPrecondition before its events are open, or for another scope).
  absl::Status CpuFilterStatus(uint32_t session_id) const;
  // Number of events currently open: (session, thread) and (session, CPU).
  size_t attached_events() const;
  // Threads of `pid` currently sampled in the session, ascending.
  std::vector<pid_t> AttachedThreads(uint32_t session_id, pid_t pid) const;

  // The epoll descriptor that Wait() uses, for embedding in an outer event loop: readable when
  // Wait() would return > 0.
  int wait_fd() const { return epoll_fd_; }

 private:
  struct RingEvent;
  struct Session;

  PerfSampler(int epoll_fd, const UserRegsLayout& layout);

  // An event of `tid` (per thread) or of `cpu` (per CPU, tid -1).
  absl::StatusOr<std::unique_ptr<RingEvent>> OpenEvent(Session& session, pid_t pid, pid_t tid,
                                                         int cpu);
  // Attaches the session's sample program to `fd` (a CPU-time session's event), or counts
  // why not.
  void AttachSampleProgram(Session& session, int fd);
  // Tells the session's CPU filter whether the CPUs' samples of `pid` are kept.
  void UpdateFilter(Session& session, pid_t pid);
  template <typename Fn>
  static void ForEachEvent(Session& session, Fn fn);
  // Opens a kPerCpu session's events, once it has a target: until then they would only fill
  // their rings with samples nobody keeps.
  absl::Status OpenCpuEvents(Session& session);
  void CloseEvent(RingEvent* event);
  // Adds the event's ring to the epoll set (false, errno set, on failure).
  bool Watch(RingEvent& event);
  // Takes a kPerCpu session's rings out of the epoll set (drained on its period) or puts
  // them back.
  void Pace(Session& session, bool paced);
  // The session's drain period at its rate and ring size (SessionOptions::drain_every_ms).
  void UpdatePeriod(Session& session);
  size_t DrainEvent(Session& session, RingEvent& event, SampleCallback callback);

  int epoll_fd_;
  int sample_program_fd_ = -1;  // SetSampleProgram's; -1: none
  const UserRegsLayout& layout_;
  size_t page_size_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<Session>> sessions_;
  SamplerStats retired_stats_;  // of removed sessions
  std::unique_ptr<uint8_t[]> scratch_;  // kMaxRecordSize bytes for wrapped records
};

}  // namespace strata::agent::sampler

#endif  // STRATA_AGENT_SAMPLER_PERF_SAMPLER_H_
