// The shared-memory ring through which the in-process sampler (libstrata_inproc.so, running
// inside a target process) hands unwound stacks to strata-agent.
//
// One ring per target process: a file <dir>/strata-inproc-<pid> (dir: /dev/shm by default)
// created and sized by the target, mapped MAP_SHARED by both sides. Layout: a RingHeader,
// a module table (the target's executable mappings, so the agent symbolizes without reading
// /proc/PID/maps, which under qemu-user shows the emulator's own mappings), then `capacity`
// fixed-size RingRecords.
//
// Concurrency: many producers (signal handlers on any thread of the target), one consumer
// (the agent). A producer reserves a ticket with a compare-and-swap on `reserve` and only
// succeeds while the ticket is less than `capacity` ahead of the consumer's `consumed`
// cursor, so it never overwrites an unread record (a full ring drops the new sample and
// counts it in `lost`). It then fills slot ticket % capacity and publishes it by storing
// ticket + 1 into the slot's `seq` (release). The consumer reads slots in ticket order,
// accepts a slot once its `seq` equals ticket + 1 (acquire), copies it, and advances
// `consumed`. No locks, no allocation: the producer side is async-signal-safe.
//
// Both sides are the same binary architecture (the agent samples its own host), so the
// records are in native byte order.
#ifndef STRATA_AGENT_RUNTIME_RING_H_
#define STRATA_AGENT_RUNTIME_RING_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::agent::runtime {

inline constexpr uint64_t kRingMagic = 0x474e495250525453ull;  // "STRPRING"
inline constexpr uint32_t kRingVersion = 1;
inline constexpr size_t kMaxRecordFrames = 126;
inline constexpr size_t kMaxRingModules = 256;
inline constexpr size_t kModulePathBytes = 232;
inline constexpr char kRingPrefix[] = "strata-inproc-";

struct RingModule {
  uint64_t start = 0;   // absolute start of the executable mapping
  uint64_t end = 0;     // exclusive
  uint64_t offset = 0;  // file offset of `start`
  char path[kModulePathBytes] = {};
};
static_assert(sizeof(RingModule) == 256);

struct RingRecord {
  std::atomic<uint64_t> seq;  // ticket + 1 once published
  uint32_t pid;
  uint32_t tid;
  uint64_t time_ns;  // CLOCK_MONOTONIC
  uint16_t num_frames;
  uint8_t truncated;  // unwinding stopped before the outermost frame
  uint8_t stop;       // unwind::StopReason
  uint32_t reserved;
  uint64_t pcs[kMaxRecordFrames];  // absolute; pcs[0] exact, the others return addresses
};
static_assert(sizeof(RingRecord) == 1040);

struct RingHeader {
  std::atomic<uint64_t> magic;  // stored last by the producer
  uint32_t version;
  uint32_t arch;  // unwind::Arch of the producer
  uint32_t pid;
  uint32_t capacity;  // records
  uint32_t record_size;
  uint32_t hz;
  alignas(64) std::atomic<uint64_t> reserve;  // next ticket
  alignas(64) std::atomic<uint64_t> consumed;  // consumer cursor
  alignas(64) std::atomic<uint64_t> lost;      // samples dropped on a full ring
  std::atomic<uint64_t> unwind_errors;         // samples taken outside any known stack
  // Module table: the producer bumps modules_gen (odd while it writes, even when done).
  alignas(64) std::atomic<uint64_t> modules_gen;
  uint32_t num_modules;
  uint32_t pad;
  RingModule modules[kMaxRingModules];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free);

// Bytes of a ring file with `capacity` records.
inline size_t RingBytes(uint32_t capacity) {
  return sizeof(RingHeader) + size_t{capacity} * sizeof(RingRecord);
}
inline RingRecord* RingSlots(RingHeader* h) {
  return reinterpret_cast<RingRecord*>(reinterpret_cast<uint8_t*>(h) + sizeof(RingHeader));
}
std::string RingPath(const std::string& dir, pid_t pid);

// Producer side, owned by the in-process sampler.
class RingWriter {
 public:
  RingWriter() = default;
  ~RingWriter();
  RingWriter(const RingWriter&) = delete;
  RingWriter& operator=(const RingWriter&) = delete;

  // Creates (replacing a stale one) and maps the ring file of this process.
  absl::Status Create(const std::string& dir, pid_t pid, uint32_t arch, uint32_t capacity,
                      uint32_t hz);
  // Async-signal-safe. False when the ring is full (counted in header()->lost).
  bool Append(uint32_t tid, uint64_t time_ns, const uint64_t* pcs, size_t n, bool truncated,
              uint8_t stop);
  // Replaces the module table (not from a signal handler; one writer at a time).
  void SetModules(const RingModule* modules, size_t n);
  // Unmaps and removes the file.
  void Remove();

  RingHeader* header() const { return header_; }
  const std::string& path() const { return path_; }

 private:
  RingHeader* header_ = nullptr;
  size_t bytes_ = 0;
  std::string path_;
};

// One stack as delivered to the consumer (valid during the callback).
struct RingStack {
  pid_t pid = 0;
  pid_t tid = 0;
  uint64_t time_ns = 0;
  const uint64_t* pcs = nullptr;
  size_t num_frames = 0;
  bool truncated = false;
  uint8_t stop = 0;
};

// Consumer side, owned by the agent.
class RingReader {
 public:
  ~RingReader();
  RingReader(const RingReader&) = delete;
  RingReader& operator=(const RingReader&) = delete;

  // Maps an existing ring file; checks magic, version, size and `expected_arch`.
  static absl::StatusOr<std::unique_ptr<RingReader>> Open(const std::string& path,
                                                          uint32_t expected_arch);
  // Delivers every published record in ticket order, at most `max` of them.
  template <typename Callback>
  size_t Drain(Callback&& callback, size_t max = SIZE_MAX);
  // A consistent copy of the module table; false if the producer kept rewriting it.
  bool ReadModules(std::vector<RingModule>* out, uint64_t* generation) const;

  pid_t pid() const { return static_cast<pid_t>(header_->pid); }
  uint64_t lost() const { return header_->lost.load(std::memory_order_relaxed); }
  uint64_t unwind_errors() const {
    return header_->unwind_errors.load(std::memory_order_relaxed);
  }
  uint64_t modules_generation() const {
    return header_->modules_gen.load(std::memory_order_acquire);
  }

 private:
  RingReader(RingHeader* header, size_t bytes) : header_(header), bytes_(bytes) {}
  RingHeader* header_;
  size_t bytes_;
};

template <typename Callback>
size_t RingReader::Drain(Callback&& callback, size_t max) {
  RingRecord* slots = RingSlots(header_);
  uint64_t cursor = header_->consumed.load(std::memory_order_relaxed);
  size_t delivered = 0;
  while (delivered < max) {
    RingRecord& r = slots[cursor % header_->capacity];
    if (r.seq.load(std::memory_order_acquire) != cursor + 1) break;  // not published yet
    RingStack s;
    s.pid = static_cast<pid_t>(r.pid);
    s.tid = static_cast<pid_t>(r.tid);
    s.time_ns = r.time_ns;
    s.pcs = r.pcs;
    s.num_frames = r.num_frames < kMaxRecordFrames ? r.num_frames : kMaxRecordFrames;
    s.truncated = r.truncated != 0;
    s.stop = r.stop;
    callback(s);
    ++cursor;
    ++delivered;
    // Only now may a producer reuse the slot.
    header_->consumed.store(cursor, std::memory_order_release);
  }
  return delivered;
}

}  // namespace strata::agent::runtime

#endif  // STRATA_AGENT_RUNTIME_RING_H_
