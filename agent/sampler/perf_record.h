// Decoding of the perf mmap ring: walking records in a ring (including records that wrap
// around its end) and parsing the record types the sampler asks for: PERF_RECORD_SAMPLE (with
// sample_type = TID | TIME [| CALLCHAIN] | REGS_USER | STACK_USER), PERF_RECORD_LOST, and the
// context switch records of off-CPU sessions (PERF_RECORD_SWITCH, PERF_RECORD_SWITCH_CPU_WIDE,
// with sample_id_all carrying TID | TIME).
//
// Pure functions over memory, so they are tested on synthetic rings and records; the sampler
// (perf_sampler.h) owns the real mappings. Malformed records are reported, never trusted.

#ifndef STRATA_AGENT_SAMPLER_PERF_RECORD_H_
#define STRATA_AGENT_SAMPLER_PERF_RECORD_H_

#include <linux/perf_event.h>

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/sampler/perf_regs.h"
#include "agent/sampler/raw_sample.h"

namespace strata::agent::sampler {

// A record's size is a u16, so no record is larger than this; scratch buffers use it.
inline constexpr size_t kMaxRecordSize = 65535;

// Parses a whole PERF_RECORD_SAMPLE (header included) into `out` (pid, tid, time, registers,
// stack). `out->stack` points into `record`. Registers missing from `layout` are left 0. A
// sample taken while the thread had no user context (abi = PERF_SAMPLE_REGS_ABI_NONE) is valid
// and has pc = sp = 0 and no stack. InvalidArgumentError if the record is truncated or its
// fields disagree (e.g. dyn_size > size). With `callchain`, the record carries
// PERF_SAMPLE_CALLCHAIN: its kernel part (kernel stacks) and its user part (the kernel's
// frame-pointer walk, user_frame_chain); `out->kernel_pcs` and `out->user_pcs` point into
// `record` (8-byte aligned, as ring records are).
absl::Status ParseSampleRecord(const uint8_t* record, size_t size, const UserRegsLayout& layout,
                               RawSample* out, bool callchain = false);

// Parses a whole PERF_RECORD_SWITCH or PERF_RECORD_SWITCH_CPU_WIDE (header included, with
// sample_id TID | TIME): `out` gets kind, pid, tid and time of the task the record is about
// (the one switching in or out on this CPU). Returns true for a switch-out.
absl::StatusOr<bool> ParseSwitchRecord(const uint8_t* record, size_t size, RawSample* out);

// Parses a whole PERF_RECORD_LOST (header included); returns the number of lost records.
absl::StatusOr<uint64_t> ParseLostRecord(const uint8_t* record, size_t size);

// Reads the records between data_tail and data_head of one ring.
class RingReader {
 public:
  // `control` is the ring's first page; `data` the data area of `data_size` bytes (a power of
  // two). Both are owned by the caller and outlive the reader.
  RingReader(perf_event_mmap_page* control, uint8_t* data, size_t data_size)
      : control_(control), data_(data), data_size_(data_size) {}

  struct ReadResult {
    size_t records = 0;
    size_t bytes = 0;
    // The ring's header chain was inconsistent (a record size of 0, not 8-byte aligned, or past
    // data_head). The unread remainder was discarded so the kernel can keep writing.
    bool corrupt = false;
  };

  // Calls `fn(record, size)` for every complete record, in order; each record is contiguous:
  // records that wrap around the end of the ring are first copied into `scratch` (at least
  // kMaxRecordSize bytes). The record memory is valid only during the call; data_tail is
  // advanced past each record after `fn` returns it.
  ReadResult ReadAll(absl::FunctionRef<void(const uint8_t* record, size_t size)> fn,
                     uint8_t* scratch);

  // True if the ring holds unread data.
  bool HasData() const;

 private:
  // The header of the record at ring position `position`.
  perf_event_header HeaderAt(uint64_t position) const;
  // Starts loading the parts of the record at ring position `position` that a sample's
  // parse and unwind read, so that they arrive while the record before it is handled: the
  // kernel wrote them on the target's CPU, and each is otherwise a cache miss, and a TLB miss
  // on a page of its own. Prefetches only; reads the record's header.
  void PrefetchRecordAt(uint64_t position, uint64_t head) const;

  perf_event_mmap_page* control_;
  uint8_t* data_;
  size_t data_size_;
};

}  // namespace strata::agent::sampler

#endif  // STRATA_AGENT_SAMPLER_PERF_RECORD_H_
