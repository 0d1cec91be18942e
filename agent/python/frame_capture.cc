#include "agent/python/frame_capture.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <span>
#include <utility>

namespace strata::agent::python {
namespace {

using bpf::kFp;
using bpf::kR0;
using bpf::kR1;
using bpf::kR2;
using bpf::kR3;
using bpf::kR4;
using bpf::kR6;
using bpf::kR7;
using bpf::kR8;
using bpf::kR9;

// A record as the program writes it: this header, then num_frames frames (FrameSnapshot).
struct RecordHeader {
  uint64_t time_ns;
  uint32_t tid;
  uint32_t num_frames;
  uint64_t frame_field;
  uint64_t leaf;
  uint64_t next;
  uint32_t frame_size;
  uint32_t reserved;
};
static_assert(sizeof(RecordHeader) == 48);

constexpr uint32_t kMaxSlot = 8 + kMaxCopiedStruct;
constexpr uint32_t kRecordBytes = sizeof(RecordHeader) + kMaxCapturedFrames * kMaxSlot;
constexpr uint32_t kLastSlot = kRecordBytes - kMaxSlot;
constexpr uint32_t kRingBytes = 4 << 20;
constexpr uint32_t kMaxThreads = 16384;
// A snapshot is stamped just before the sample (the same clock, in the same interrupt).
constexpr uint64_t kMatchNs = 100'000;
// Snapshots this much older than the one found for a sample of their thread are dropped: a
// thread's samples reach the agent in order per ring, and per-CPU rings are drained within
// a period.
constexpr uint64_t kKeepNs = 2'000'000'000;
// A thread's queue never holds more (a thread whose samples stopped coming through).
constexpr size_t kMaxQueued = 4096;

#define FIELD(s, f) static_cast<int16_t>(offsetof(s, f))

// Stack slots of the program.
constexpr int16_t kTidSlot = -4, kPidSlot = -8, kZeroSlot = -12, kCheckSlot = -24;

}  // namespace

uint64_t FrameSnapshot::AddressOf(size_t i) const {
  uint64_t address;
  std::memcpy(&address, frames + i * stride(), sizeof(address));
  return address;
}

std::vector<bpf::Insn> FrameCaptureProgram(int threads_map, int scratch_map, int ring_map) {
  using namespace bpf;  // NOLINT: the instruction builders
  ProgramBuilder b;
  const auto out = b.NewLabel(), have_leaf = b.NewLabel(), done = b.NewLabel();
  // r7 = the thread's CaptureThread, or out.
  b.Add(Call(BPF_FUNC_get_current_pid_tgid));
  b.Add(Store(BPF_W, kFp, kR0, kTidSlot));
  b.Add(AluImm(BPF_RSH, kR0, 32));
  b.Add(Store(BPF_W, kFp, kR0, kPidSlot));
  b.AddMap(kR1, threads_map);
  b.Add(MovReg(kR2, kFp));
  b.Add(AluImm(BPF_ADD, kR2, kTidSlot));
  b.Add(Call(BPF_FUNC_map_lookup_elem));
  b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), out);
  b.Add(MovReg(kR7, kR0));
  b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, pid)));
  b.Add(Load(BPF_W, kR2, kFp, kPidSlot));
  b.AddJump(JumpReg(BPF_JNE, kR1, kR2, 0), out);  // a tid of another process now
  // r8 = this CPU's record.
  b.Add(StoreImm(BPF_W, kFp, kZeroSlot, 0));
  b.AddMap(kR1, scratch_map);
  b.Add(MovReg(kR2, kFp));
  b.Add(AluImm(BPF_ADD, kR2, kZeroSlot));
  b.Add(Call(BPF_FUNC_map_lookup_elem));
  b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), out);
  b.Add(MovReg(kR8, kR0));
  // The thread state is still this thread's.
  b.Add(MovReg(kR1, kFp));
  b.Add(AluImm(BPF_ADD, kR1, kCheckSlot));
  b.Add(MovImm(kR2, 8));
  b.Add(Load(BPF_DW, kR3, kR7, FIELD(CaptureThread, tstate)));
  b.Add(Load(BPF_W, kR4, kR7, FIELD(CaptureThread, check_offset)));
  b.Add(AluReg(BPF_ADD, kR3, kR4));
  b.Add(Call(BPF_FUNC_probe_read_user));
  b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), out);
  b.Add(Load(BPF_DW, kR1, kFp, kCheckSlot));
  b.Add(Load(BPF_DW, kR2, kR7, FIELD(CaptureThread, check_value)));
  b.AddJump(JumpReg(BPF_JNE, kR1, kR2, 0), out);
  // The header.
  b.Add(Call(BPF_FUNC_ktime_get_ns));
  b.Add(Store(BPF_DW, kR8, kR0, FIELD(RecordHeader, time_ns)));
  b.Add(Load(BPF_W, kR1, kFp, kTidSlot));
  b.Add(Store(BPF_W, kR8, kR1, FIELD(RecordHeader, tid)));
  b.Add(StoreImm(BPF_W, kR8, FIELD(RecordHeader, num_frames), 0));
  b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_size)));
  b.Add(Store(BPF_W, kR8, kR1, FIELD(RecordHeader, frame_size)));
  // r9 = the current frame: *(tstate + tstate_frame), through the _PyCFrame when there is one.
  b.Add(MovReg(kR1, kR8));
  b.Add(AluImm(BPF_ADD, kR1, FIELD(RecordHeader, frame_field)));
  b.Add(MovImm(kR2, 8));
  b.Add(Load(BPF_DW, kR3, kR7, FIELD(CaptureThread, tstate)));
  b.Add(Load(BPF_W, kR4, kR7, FIELD(CaptureThread, tstate_frame)));
  b.Add(AluReg(BPF_ADD, kR3, kR4));
  b.Add(Call(BPF_FUNC_probe_read_user));
  b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), out);
  b.Add(Load(BPF_DW, kR9, kR8, FIELD(RecordHeader, frame_field)));
  b.Add(Load(BPF_W, kR3, kR7, FIELD(CaptureThread, cframe_frame)));
  b.AddJump(Jump32Imm(BPF_JEQ, kR3, -1, 0), have_leaf);  // kNoOffset
  b.AddJump(JumpImm(BPF_JEQ, kR9, 0, 0), have_leaf);
  b.Add(AluReg(BPF_ADD, kR3, kR9));
  b.Add(MovReg(kR1, kR8));
  b.Add(AluImm(BPF_ADD, kR1, FIELD(RecordHeader, leaf)));
  b.Add(MovImm(kR2, 8));
  b.Add(Call(BPF_FUNC_probe_read_user));
  b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), out);
  b.Add(Load(BPF_DW, kR9, kR8, FIELD(RecordHeader, leaf)));
  b.Bind(have_leaf);
  b.Add(Store(BPF_DW, kR8, kR9, FIELD(RecordHeader, leaf)));
  // The frames, r6 the next one's place in the record. Unrolled: each step is checked by the
  // verifier on its own, with r6's bound (kLastSlot) keeping every access inside the record.
  b.Add(MovImm(kR6, sizeof(RecordHeader)));
  for (uint32_t i = 0; i < kMaxCapturedFrames; ++i) {
    b.AddJump(JumpImm(BPF_JEQ, kR9, 0, 0), done);
    b.AddJump(JumpImm(BPF_JGT, kR6, kLastSlot, 0), done);
    b.Add(MovReg(kR1, kR8));
    b.Add(AluReg(BPF_ADD, kR1, kR6));
    b.Add(Store(BPF_DW, kR1, kR9, 0));
    b.Add(AluImm(BPF_ADD, kR1, 8));
    b.Add(Load(BPF_W, kR2, kR7, FIELD(CaptureThread, frame_size)));
    b.AddJump(JumpImm(BPF_JGT, kR2, kMaxCopiedStruct, 0), done);
    b.Add(MovReg(kR3, kR9));
    b.Add(Call(BPF_FUNC_probe_read_user));
    b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), done);
    b.Add(StoreImm(BPF_W, kR8, FIELD(RecordHeader, num_frames), static_cast<int32_t>(i + 1)));
    // r9 = this frame's previous, from the copy (an aligned field inside the frame).
    b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_previous)));
    b.Add(AluImm(BPF_AND, kR1, 0xf8));  // bits 3-7: aligned, inside the copied frame
    b.Add(MovReg(kR2, kR8));
    b.Add(AluReg(BPF_ADD, kR2, kR6));
    b.Add(AluReg(BPF_ADD, kR2, kR1));
    b.Add(Load(BPF_DW, kR9, kR2, 8));
    // r6 += 8 + frame_size rounded up to 8 (at most kMaxSlot).
    b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_size)));
    b.Add(AluImm(BPF_ADD, kR1, 15));
    b.Add(AluImm(BPF_AND, kR1, 0x3f8));  // bits 3-9: a multiple of 8, bounded
    b.AddJump(JumpImm(BPF_JGT, kR1, kMaxSlot, 0), done);
    b.Add(AluReg(BPF_ADD, kR6, kR1));
  }
  b.Bind(done);
  b.Add(Store(BPF_DW, kR8, kR9, FIELD(RecordHeader, next)));
  b.AddJump(JumpImm(BPF_JGT, kR6, kRecordBytes, 0), out);
  b.AddMap(kR1, ring_map);
  b.Add(MovReg(kR2, kR8));
  b.Add(MovReg(kR3, kR6));
  b.Add(MovImm(kR4, 0));
  b.Add(Call(BPF_FUNC_ringbuf_output));
  b.Bind(out);
  b.Add(MovImm(kR0, 1));  // the sample is written as always
  b.Add(Exit());
  return std::move(b).Build();
}

absl::StatusOr<std::unique_ptr<FrameCapture>> FrameCapture::Create() {
  absl::StatusOr<base::UniqueFd> threads = bpf::CreateMap(
      BPF_MAP_TYPE_HASH, sizeof(uint32_t), sizeof(CaptureThread), kMaxThreads, "py_threads");
  if (!threads.ok()) return threads.status();
  absl::StatusOr<base::UniqueFd> scratch =
      bpf::CreateMap(BPF_MAP_TYPE_PERCPU_ARRAY, sizeof(uint32_t), kRecordBytes, 1, "py_record");
  if (!scratch.ok()) return scratch.status();
  absl::StatusOr<base::UniqueFd> ring =
      bpf::CreateMap(BPF_MAP_TYPE_RINGBUF, 0, 0, kRingBytes, "py_frames");
  if (!ring.ok()) return ring.status();
  absl::StatusOr<bpf::RingReader> reader = bpf::RingReader::Map(ring->get(), kRingBytes);
  if (!reader.ok()) return reader.status();
  const std::vector<bpf::Insn> program =
      FrameCaptureProgram(threads->get(), scratch->get(), ring->get());
  if (program.empty()) return absl::InternalError("python frame capture: program not built");
  absl::StatusOr<base::UniqueFd> loaded =
      bpf::LoadProgram(BPF_PROG_TYPE_PERF_EVENT, program, "py_frames");
  if (!loaded.ok()) return loaded.status();
  return std::unique_ptr<FrameCapture>(
      new FrameCapture(std::move(*threads), std::move(*scratch), std::move(*ring),
                       std::move(*reader), std::move(*loaded)));
}

FrameCapture::~FrameCapture() = default;

absl::Status FrameCapture::Register(pid_t tid, const CaptureThread& thread) {
  if (thread.frame_size == 0 || thread.frame_size > kMaxCopiedStruct ||
      thread.frame_previous + 8 > thread.frame_size) {
    return absl::InvalidArgumentError("python frame capture: frame layout out of bounds");
  }
  const uint32_t key = static_cast<uint32_t>(tid);
  if (absl::Status st = bpf::UpdateElement(threads_.get(), &key, &thread); !st.ok()) return st;
  queues_.try_emplace(tid);
  return absl::OkStatus();
}

void FrameCapture::Forget(pid_t tid) {
  const uint32_t key = static_cast<uint32_t>(tid);
  (void)bpf::DeleteElement(threads_.get(), &key);
  if (auto it = queues_.find(tid); it != queues_.end()) {
    stats_.unmatched += it->second.entries.size() - it->second.head;
    queues_.erase(it);
  }
}

void FrameCapture::Collect() {
  std::span<const uint8_t> record;
  uint64_t position = 0;
  bool any = false;
  while (reader_.Next(&record, &position)) {
    any = true;
    RecordHeader header;
    if (record.size() < sizeof(header)) {
      ++stats_.malformed;
      continue;
    }
    std::memcpy(&header, record.data(), sizeof(header));
    ++stats_.snapshots;
    auto it = queues_.find(static_cast<pid_t>(header.tid));
    if (it == queues_.end()) {  // forgotten since
      ++stats_.unmatched;
      continue;
    }
    Queue& q = it->second;
    if (q.entries.size() - q.head >= kMaxQueued) {
      ++stats_.unmatched;
      DropBefore(q, q.head + 1);
    }
    q.entries.push_back({header.time_ns, static_cast<uint32_t>(q.bytes.size()),
                         static_cast<uint32_t>(record.size())});
    q.bytes.insert(q.bytes.end(), record.begin(), record.end());
  }
  if (any) reader_.Release(reader_.end());
}

void FrameCapture::DropBefore(Queue& q, size_t index) {
  q.head = std::max(q.head, index);
  if (q.head == q.entries.size()) {
    q.entries.clear();
    q.bytes.clear();
    q.head = 0;
    q.hint = 0;
    return;
  }
  if (q.head * 2 < q.entries.size()) return;
  const uint32_t base = q.entries[q.head].offset;
  q.bytes.erase(q.bytes.begin(), q.bytes.begin() + base);
  q.entries.erase(q.entries.begin(), q.entries.begin() + static_cast<ptrdiff_t>(q.head));
  for (Entry& e : q.entries) e.offset -= base;
  q.hint = q.hint > q.head ? q.hint - q.head : 0;
  q.head = 0;
}

const FrameSnapshot* FrameCapture::Find(pid_t tid, uint64_t sample_time_ns) {
  auto it = queues_.find(tid);
  if (it == queues_.end()) return nullptr;
  Queue* q = &it->second;
  auto search = [&]() -> size_t {
    // From where the last one was found: the next one is mostly right after it.
    const size_t n = q->entries.size();
    for (size_t k = 0; k < n - q->head; ++k) {
      const size_t i = q->head + (std::max(q->hint, q->head) - q->head + k) % (n - q->head);
      const Entry& e = q->entries[i];
      if (e.time_ns <= sample_time_ns + kMatchNs && e.time_ns + kMatchNs >= sample_time_ns) {
        return i;
      }
    }
    return SIZE_MAX;
  };
  size_t i = q->entries.size() > q->head ? search() : SIZE_MAX;
  if (i == SIZE_MAX) {  // written after the ring was last read: read it again
    Collect();
    q = &queues_.find(tid)->second;
    i = q->entries.size() > q->head ? search() : SIZE_MAX;
  }
  if (i == SIZE_MAX) {
    ++stats_.missing;
    return nullptr;
  }
  const Entry e = q->entries[i];
  RecordHeader header;
  std::memcpy(&header, q->bytes.data() + e.offset, sizeof(header));
  found_ = {};
  found_.time_ns = header.time_ns;
  found_.frame_field = header.frame_field;
  found_.leaf = header.leaf;
  found_.next = header.next;
  found_.frame_size = header.frame_size;
  found_.num_frames = header.num_frames;
  if (header.frame_size > kMaxCopiedStruct || header.num_frames > kMaxCapturedFrames ||
      sizeof(header) + header.num_frames * found_.stride() > e.size) {
    ++stats_.malformed;
    return nullptr;
  }
  ++stats_.found;
  // Entries older than this one by kKeepNs are for samples that will not come; this one is
  // used up (marked by its time: entries of one thread have distinct times).
  size_t old = q->head;
  while (old < q->entries.size() && q->entries[old].time_ns + kKeepNs < e.time_ns) ++old;
  stats_.unmatched += old - q->head;
  q->entries[i].time_ns = 0;  // matches no sample again
  q->hint = i + 1;
  // Copy out before the queue moves its bytes.
  frame_bytes_.assign(q->bytes.begin() + e.offset + sizeof(header),
                      q->bytes.begin() + e.offset + e.size);
  found_.frames = frame_bytes_.data();
  size_t first_live = old;
  while (first_live < q->entries.size() && q->entries[first_live].time_ns == 0) ++first_live;
  DropBefore(*q, first_live);
  return &found_;
}

CaptureStats FrameCapture::stats() const {
  CaptureStats s = stats_;
  s.threads = queues_.size();
  return s;
}

bpf::ProgramRuns FrameCapture::runs() const {
  absl::StatusOr<bpf::ProgramRuns> runs = bpf::RunsOf(program_.get());
  return runs.ok() ? *runs : bpf::ProgramRuns{};
}

}  // namespace strata::agent::python
