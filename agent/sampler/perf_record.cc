#include "agent/sampler/perf_record.h"

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"

namespace strata::agent::sampler {
namespace {

// Sequential reader over one record; every read is bounds-checked.
class FieldReader {
 public:
  FieldReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool ReadU32(uint32_t* out) { return Read(out, sizeof(*out)); }
  bool ReadU64(uint64_t* out) { return Read(out, sizeof(*out)); }
  // Returns a pointer to `n` bytes in place and skips them.
  const uint8_t* Take(size_t n) {
    if (n > size_ - offset_) return nullptr;
    const uint8_t* p = data_ + offset_;
    offset_ += n;
    return p;
  }

 private:
  bool Read(void* out, size_t n) {
    const uint8_t* p = Take(n);
    if (p == nullptr) return false;
    std::memcpy(out, p, n);
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  size_t offset_ = 0;
};

absl::Status Truncated(const char* field) {
  return absl::InvalidArgumentError(std::string("perf sample record truncated at ") + field);
}

}  // namespace

absl::Status ParseSampleRecord(const uint8_t* record, size_t size, const UserRegsLayout& layout,
                               RawSample* out, bool callchain) {
  FieldReader reader(record, size);
  perf_event_header header;
  const uint8_t* header_bytes = reader.Take(sizeof(header));
  if (header_bytes == nullptr) return Truncated("header");
  std::memcpy(&header, header_bytes, sizeof(header));
  if (header.type != PERF_RECORD_SAMPLE) {
    return absl::InvalidArgumentError("not a PERF_RECORD_SAMPLE");
  }
  RawSample sample;
  sample.session_id = out->session_id;
  // PERF_SAMPLE_TID, PERF_SAMPLE_TIME
  if (!reader.ReadU32(&sample.pid) || !reader.ReadU32(&sample.tid)) return Truncated("tid");
  if (!reader.ReadU64(&sample.time_ns)) return Truncated("time");
  // PERF_SAMPLE_CALLCHAIN: nr, then nr entries; context markers (PERF_CONTEXT_KERNEL,
  // PERF_CONTEXT_USER, ...) start the parts. The first run after each of those two is kept.
  if (callchain) {
    uint64_t nr = 0;
    if (!reader.ReadU64(&nr)) return Truncated("callchain size");
    if (nr > kMaxRecordSize / 8) return Truncated("callchain");
    const uint8_t* chain = reader.Take(nr * 8);
    if (chain == nullptr) return Truncated("callchain");
    const uint64_t* ips = reinterpret_cast<const uint64_t*>(chain);
    for (size_t i = 0; i < nr;) {
      const uint64_t context = ips[i++];
      const size_t first = i;
      while (i < nr && ips[i] < PERF_CONTEXT_MAX) ++i;
      if (i == first) continue;
      if (context == PERF_CONTEXT_KERNEL && sample.kernel_pcs == nullptr) {
        sample.kernel_pcs = ips + first;
        sample.kernel_depth = i - first;
      } else if (context == PERF_CONTEXT_USER && sample.user_pcs == nullptr) {
        sample.user_pcs = ips + first;
        sample.user_depth = i - first;
      }
    }
  }
  // PERF_SAMPLE_REGS_USER: abi, then the requested registers only if abi != NONE.
  uint64_t abi = 0;
  if (!reader.ReadU64(&abi)) return Truncated("abi");
  if (abi != PERF_SAMPLE_REGS_ABI_NONE) {
    uint64_t regs[64];
    for (int i = 0; i < layout.count; ++i) {
      if (!reader.ReadU64(&regs[i])) return Truncated("regs");
    }
    if (layout.pc_index >= 0) sample.pc = regs[layout.pc_index];
    if (layout.sp_index >= 0) sample.sp = regs[layout.sp_index];
    if (layout.fp_index >= 0) sample.fp = regs[layout.fp_index];
    if (layout.ra_index >= 0) sample.ra = regs[layout.ra_index];
    if (layout.g_index >= 0) sample.g = regs[layout.g_index];
    if (layout.bcp_index >= 0) sample.bcp = regs[layout.bcp_index];
  }
  // PERF_SAMPLE_STACK_USER: size, then (only if size != 0) data[size] and dyn_size.
  uint64_t stack_size = 0;
  if (!reader.ReadU64(&stack_size)) return Truncated("stack size");
  if (stack_size != 0) {
    const uint8_t* stack = reader.Take(stack_size);
    if (stack == nullptr) return Truncated("stack data");
    uint64_t dyn_size = 0;
    if (!reader.ReadU64(&dyn_size)) return Truncated("dyn_size");
    if (dyn_size > stack_size) {
      return absl::InvalidArgumentError("perf sample record: dyn_size > stack size");
    }
    sample.stack = stack;
    sample.stack_size = dyn_size;
  }
  *out = sample;
  return absl::OkStatus();
}

absl::StatusOr<bool> ParseSwitchRecord(const uint8_t* record, size_t size, RawSample* out) {
  FieldReader reader(record, size);
  perf_event_header header;
  const uint8_t* header_bytes = reader.Take(sizeof(header));
  if (header_bytes == nullptr) return absl::InvalidArgumentError("switch record truncated");
  std::memcpy(&header, header_bytes, sizeof(header));
  if (header.type != PERF_RECORD_SWITCH && header.type != PERF_RECORD_SWITCH_CPU_WIDE) {
    return absl::InvalidArgumentError("not a context switch record");
  }
  // CPU-wide records name the other task first (next_prev_pid, next_prev_tid).
  uint64_t other = 0;
  if (header.type == PERF_RECORD_SWITCH_CPU_WIDE && !reader.ReadU64(&other)) {
    return absl::InvalidArgumentError("switch record truncated");
  }
  RawSample sample;
  sample.session_id = out->session_id;
  if (!reader.ReadU32(&sample.pid) || !reader.ReadU32(&sample.tid) ||
      !reader.ReadU64(&sample.time_ns)) {
    return absl::InvalidArgumentError("switch record truncated (sample_id)");
  }
  const bool switch_out = (header.misc & PERF_RECORD_MISC_SWITCH_OUT) != 0;
  sample.kind = switch_out ? RawEventKind::kSample : RawEventKind::kSwitchIn;
  *out = sample;
  return switch_out;
}

absl::StatusOr<uint64_t> ParseLostRecord(const uint8_t* record, size_t size) {
  // struct { perf_event_header header; u64 id; u64 lost; }
  FieldReader reader(record, size);
  perf_event_header header;
  const uint8_t* header_bytes = reader.Take(sizeof(header));
  if (header_bytes == nullptr) return absl::InvalidArgumentError("lost record truncated");
  std::memcpy(&header, header_bytes, sizeof(header));
  uint64_t id = 0;
  uint64_t lost = 0;
  if (header.type != PERF_RECORD_LOST || !reader.ReadU64(&id) || !reader.ReadU64(&lost)) {
    return absl::InvalidArgumentError("malformed PERF_RECORD_LOST");
  }
  return lost;
}

bool RingReader::HasData() const {
  uint64_t head = __atomic_load_n(&control_->data_head, __ATOMIC_ACQUIRE);
  return head != control_->data_tail;
}

perf_event_header RingReader::HeaderAt(uint64_t position) const {
  // Records are 8-byte aligned and the ring size is a power of two, so a header never
  // wraps; copy it anyway rather than rely on the kernel for memory safety.
  perf_event_header header;
  for (size_t i = 0; i < sizeof(header); ++i) {
    reinterpret_cast<uint8_t*>(&header)[i] = data_[(position + i) & (data_size_ - 1)];
  }
  return header;
}

void RingReader::PrefetchRecordAt(uint64_t position, uint64_t head) const {
  const uint64_t mask = data_size_ - 1;
  const perf_event_header header = HeaderAt(position);
  if (header.size < sizeof(header) || header.size > head - position) return;
  // Where a sample is read: its header and registers, the innermost part of its stack copy
  // (where an unwind starts, and where the frames it verifies mostly lie) and its last word
  // (the copy's dynamic size), pages apart in a record that copies 16 KiB.
  constexpr size_t kLine = 64;
  constexpr size_t kHeadBytes = 1024;
  const size_t head_bytes = std::min<size_t>(header.size, kHeadBytes);
  for (size_t at = 0; at < head_bytes; at += kLine) {
    __builtin_prefetch(data_ + ((position + at) & mask));
  }
  __builtin_prefetch(data_ + ((position + header.size - 8) & mask));
}

RingReader::ReadResult RingReader::ReadAll(
    absl::FunctionRef<void(const uint8_t* record, size_t size)> fn, uint8_t* scratch) {
  ReadResult result;
  // Acquire pairs with the kernel's store of data_head: record bytes are visible after it.
  const uint64_t head = __atomic_load_n(&control_->data_head, __ATOMIC_ACQUIRE);
  uint64_t tail = control_->data_tail;
  const uint64_t mask = data_size_ - 1;
  while (tail != head) {
    const uint64_t available = head - tail;
    const size_t offset = tail & mask;
    if (available < sizeof(perf_event_header) || available > data_size_) {
      result.corrupt = true;
      break;
    }
    const perf_event_header header = HeaderAt(tail);
    if (header.size < sizeof(header) || header.size % 8 != 0 || header.size > available) {
      result.corrupt = true;
      break;
    }
    const uint8_t* record = data_ + offset;
    if (offset + header.size > data_size_) {
      const size_t first = data_size_ - offset;
      std::memcpy(scratch, data_ + offset, first);
      std::memcpy(scratch + first, data_, header.size - first);
      record = scratch;
    }
    if (header.size < available) PrefetchRecordAt(tail + header.size, head);
    fn(record, header.size);
    tail += header.size;
    ++result.records;
    result.bytes += header.size;
    // Release: our reads of the record happen before the kernel may overwrite it.
    __atomic_store_n(&control_->data_tail, tail, __ATOMIC_RELEASE);
  }
  if (result.corrupt) {
    // Resynchronising inside a corrupt chain is guesswork; drop what is there.
    result.bytes += head - tail;
    __atomic_store_n(&control_->data_tail, head, __ATOMIC_RELEASE);
  }
  return result;
}

}  // namespace strata::agent::sampler
