// Python frame chains copied by the kernel at the moment of each sample, so that a sample's
// Python frames are the ones it interrupted and the agent neither wakes per sample nor reads
// the target's memory per sample.
//
// A BPF program (BPF_PROG_TYPE_PERF_EVENT), attached by the sampler to its CPU-time events
// once a target runs Python, runs in the sampled thread's context just before the kernel
// writes the sample. For a thread registered here (its thread state's address and its
// interpreter's offsets, CaptureThread: the layout is data, so one program serves every
// CPython version and every target), it follows the thread's current frame and copies up to
// kMaxCapturedFrames frames (each frame's address and its bytes from the first field read on)
// into a ring buffer, stamped with the thread and the time (CLOCK_MONOTONIC, the clock the
// sampler's samples carry). The agent drains the ring with the samples and hands each sample
// its snapshot (Find); Interpreter::ReadSnapshot walks the chain from it as from memory. The
// owner registers a process's threads when it finds the process, and a thread started later
// at its first sample; that sample, a snapshot that is missing (ring full) and frames past
// the copied ones are read from memory as before. The thread state is checked at each run
// (its pid, and the thread id the state holds), so a recycled state is never followed.
//
// Cost: the program runs in the target's time (a hash map lookup, two reads of the thread's
// state and one per frame, a ring buffer record); bpf::RunsOf reports it when
// kernel.bpf_stats_enabled is set. Needs root (CAP_BPF + CAP_PERFMON) and a 5.8+ kernel;
// Create() fails otherwise and the agent reads memory. Create() only checks that the program
// loads (with a one-page ring); the maps, the 8 MiB ring and the program are made at the
// first Register: an agent with no Python target holds none of them.
//
// Single-threaded (the agent's main loop). Find allocates only while a thread's queue grows.
#ifndef STRATA_AGENT_PYTHON_FRAME_CAPTURE_H_
#define STRATA_AGENT_PYTHON_FRAME_CAPTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/bpf/bpf.h"
#include "agent/python/offsets.h"
#include "common/base/unique_fd.h"

namespace strata::agent::python {

inline constexpr uint32_t kMaxCapturedFrames = 48;
inline constexpr uint32_t kMaxCapturedTstate = 256;  // bytes of the thread state copied

// What the program needs of one thread (the value of its map, keyed by tid).
struct CaptureThread {
  uint64_t tstate = 0;       // the thread's PyThreadState
  uint64_t check_value = 0;  // what the thread state holds at check_at while it is this thread's
  uint32_t pid = 0;
  // The thread state's bytes copied, [tstate + tstate_span_start, + tstate_span), and where
  // in them (8-byte aligned) the check and the frame pointer (Offsets::tstate_frame) lie.
  uint32_t tstate_span_start = 0;
  uint32_t tstate_span = 0;
  uint32_t check_at = 0;
  uint32_t frame_at = 0;
  uint32_t cframe_frame = kNoOffset;  // Offsets::cframe_frame
  uint32_t frame_previous = 0;
  uint32_t frame_size = 0;   // at most kMaxCopiedStruct
  uint32_t frame_copy_from = 0;  // bytes of each frame before the fields read (not copied)
  uint32_t reserved = 0;

  // The fields above from a thread state's address, its check (at `check_offset` in it) and
  // the interpreter's offsets; false when they do not fit the program's bounds.
  bool Set(uint64_t tstate_address, uint32_t check_offset, uint64_t check, pid_t process,
           const Offsets& offsets);
};
static_assert(sizeof(CaptureThread) == 56);

// One sample's copy of a thread's frame chain.
struct FrameSnapshot {
  uint64_t frame_field = 0;  // *(tstate + tstate_frame)
  uint64_t leaf = 0;         // the current frame (0: none)
  uint64_t next = 0;         // the frame after the last one followed (0: the chain ends there)
  uint32_t frame_size = 0;
  uint32_t num_frames = 0;
  // num_frames x stride(): the address, then frame_size bytes (those before
  // CaptureThread::frame_copy_from undefined).
  const uint8_t* frames = nullptr;

  size_t stride() const { return 8 + ((frame_size + 7) & ~size_t{7}); }
  uint64_t AddressOf(size_t i) const;
  const uint8_t* BytesOf(size_t i) const { return frames + i * stride() + 8; }
};

struct CaptureStats {
  uint64_t snapshots = 0;  // records taken from the ring
  uint64_t found = 0;      // ... handed to their sample
  uint64_t unmatched = 0;  // ... whose sample never came (it was lost or dropped)
  uint64_t missing = 0;    // samples of registered threads without a snapshot
  uint64_t malformed = 0;  // records that did not parse
  uint64_t threads = 0;    // threads registered now
};

class FrameCapture {
 public:
  // The maps and the program; Unavailable/PermissionDenied where the kernel has no BPF (or
  // no ring buffer) or the agent may not load programs, InvalidArgument (with the verifier's
  // log) where the verifier refuses the program. `program_flags`: bpf::LoadProgram's.
  static absl::StatusOr<std::unique_ptr<FrameCapture>> Create(uint32_t program_flags = 0);
  ~FrameCapture();

  // The program to attach to CPU-time perf events (PERF_EVENT_IOC_SET_BPF); -1 until a
  // thread was registered.
  int program_fd() const { return loaded_.has_value() ? loaded_->program.get() : -1; }

  // Thread `tid`'s samples carry its frames from now on.
  absl::Status Register(pid_t tid, const CaptureThread& thread);
  bool registered(pid_t tid) const { return queues_.contains(tid); }
  void Forget(pid_t tid);

  // The snapshot of `tid`'s sample taken at `sample_time_ns`, or null. Valid until the next
  // call. Called for every sample of a registered thread (also those that need no frames),
  // so that its snapshots are used up in order.
  const FrameSnapshot* Find(pid_t tid, uint64_t sample_time_ns);

  CaptureStats stats() const;
  // The program's runs and their time (zeros unless kernel.bpf_stats_enabled).
  bpf::ProgramRuns runs() const;

 private:
  struct Entry {
    uint64_t time_ns;
    uint32_t offset;  // in Queue::bytes
    uint32_t size;
    bool used;  // handed to its sample
  };
  struct Queue {
    std::vector<Entry> entries;  // in time order
    size_t head = 0;             // entries before it are gone
    std::vector<uint8_t> bytes;
  };

  // The maps and the program, with a ring of `ring_bytes`.
  struct Loaded {
    base::UniqueFd threads, scratch, ring;
    bpf::RingReader reader;
    base::UniqueFd program;
  };
  static absl::StatusOr<Loaded> Load(uint32_t program_flags, uint32_t ring_bytes);

  explicit FrameCapture(uint32_t program_flags) : program_flags_(program_flags) {}

  // Moves the ring's new records to their threads' queues.
  void Collect();
  // Drops `queue`'s entries before `index` (and compacts it when half of it is gone: a
  // snapshot found before is invalid then).
  void DropBefore(Queue& queue, size_t index);

  const uint32_t program_flags_;
  std::optional<Loaded> loaded_;  // from the first Register on
  absl::flat_hash_map<pid_t, Queue> queues_;  // the registered threads
  FrameSnapshot found_;  // its frames lie in its queue's bytes
  CaptureStats stats_;
};

// The program, for the map descriptors given (exposed for its load test).
std::vector<bpf::Insn> FrameCaptureProgram(int threads_map, int scratch_map, int ring_map);

}  // namespace strata::agent::python

#endif  // STRATA_AGENT_PYTHON_FRAME_CAPTURE_H_
