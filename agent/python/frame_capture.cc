#include "agent/python/frame_capture.h"

#include <unistd.h>

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

// A record as the program writes it: this header, then the frames (FrameSnapshot).
struct RecordHeader {
  uint64_t time_ns;
  uint32_t tid;
  uint32_t frame_size;
  uint64_t frame_field;
  uint64_t leaf;
  uint64_t next;
};
static_assert(sizeof(RecordHeader) == 40);

constexpr uint32_t kMaxSlot = 8 + kMaxCopiedStruct;
// The program's per-CPU scratch: the record (header, frames), then the thread state's bytes
// and the place of the next frame (kept in memory, so that the verifier sees the same bounds
// at every step).
constexpr uint32_t kRecordBytes = sizeof(RecordHeader) + kMaxCapturedFrames * kMaxSlot;
constexpr uint32_t kLastSlot = kRecordBytes - kMaxSlot;
static_assert(kLastSlot <= 0x3ff8);  // the program's mask of the cursor
constexpr uint32_t kTstateAt = kRecordBytes;
constexpr uint32_t kCursorAt = kTstateAt + kMaxCapturedTstate;
constexpr uint32_t kScratchBytes = kCursorAt + 8;
constexpr uint32_t kRingBytes = 8 << 20;
constexpr uint32_t kMaxThreads = 16384;
// A snapshot is stamped just before the sample (the same clock, in the same interrupt).
constexpr uint64_t kMatchNs = 100'000;
// Snapshots this much older than the one found for a sample of their thread are dropped: a
// thread's samples reach the agent in order per ring, and per-CPU rings are drained within
// a period.
constexpr uint64_t kKeepNs = 2'000'000'000;
// A thread's queue never holds more (a thread whose samples stopped coming through).
constexpr size_t kMaxQueued = 4096;
// A queue's bytes move once this many entries before its head are gone (and half of it).
constexpr size_t kCompactAfter = 64;

#define FIELD(s, f) static_cast<int16_t>(offsetof(s, f))

// Stack slots of the program.
constexpr int16_t kTidSlot = -4, kPidSlot = -8, kZeroSlot = -12;

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
  // dst = the value of `map` under the key at `key_slot`, or out.
  auto lookup = [&b, out](int map, int16_t key_slot, uint8_t dst) {
    b.AddMap(kR1, map);
    b.Add(MovReg(kR2, kFp));
    b.Add(AluImm(BPF_ADD, kR2, key_slot));
    b.Add(Call(BPF_FUNC_map_lookup_elem));
    b.AddJump(JumpImm(BPF_JEQ, kR0, 0, 0), out);
    b.Add(MovReg(dst, kR0));
  };
  lookup(threads_map, kTidSlot, kR7);
  b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, pid)));
  b.Add(Load(BPF_W, kR2, kFp, kPidSlot));
  b.AddJump(JumpReg(BPF_JNE, kR1, kR2, 0), out);  // a tid of another process now
  // r8 = this CPU's scratch.
  b.Add(StoreImm(BPF_W, kFp, kZeroSlot, 0));
  lookup(scratch_map, kZeroSlot, kR8);
  // The thread state's bytes that hold the check and the frame pointer, in one read.
  b.Add(MovReg(kR1, kR8));
  b.Add(AluImm(BPF_ADD, kR1, kTstateAt));
  b.Add(Load(BPF_W, kR2, kR7, FIELD(CaptureThread, tstate_span)));
  b.AddJump(JumpImm(BPF_JGT, kR2, kMaxCapturedTstate, 0), out);
  b.Add(Load(BPF_DW, kR3, kR7, FIELD(CaptureThread, tstate)));
  b.Add(Load(BPF_W, kR4, kR7, FIELD(CaptureThread, tstate_span_start)));
  b.Add(AluReg(BPF_ADD, kR3, kR4));
  b.Add(Call(BPF_FUNC_probe_read_user));
  b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), out);
  // dst = the word of the thread state's copy at the CaptureThread field `at` says.
  auto tstate_word = [&b](int16_t at, uint8_t dst) {
    b.Add(Load(BPF_W, kR1, kR7, at));
    b.Add(AluImm(BPF_AND, kR1, (kMaxCapturedTstate - 8) & ~7u));
    b.Add(AluReg(BPF_ADD, kR1, kR8));
    b.Add(Load(BPF_DW, dst, kR1, kTstateAt));
  };
  // The thread state is still this thread's.
  tstate_word(FIELD(CaptureThread, check_at), kR1);
  b.Add(Load(BPF_DW, kR2, kR7, FIELD(CaptureThread, check_value)));
  b.AddJump(JumpReg(BPF_JNE, kR1, kR2, 0), out);
  // The header.
  b.Add(Call(BPF_FUNC_ktime_get_ns));
  b.Add(Store(BPF_DW, kR8, kR0, FIELD(RecordHeader, time_ns)));
  b.Add(Load(BPF_W, kR1, kFp, kTidSlot));
  b.Add(Store(BPF_W, kR8, kR1, FIELD(RecordHeader, tid)));
  b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_size)));
  b.Add(Store(BPF_W, kR8, kR1, FIELD(RecordHeader, frame_size)));
  b.Add(StoreImm(BPF_DW, kR8, kCursorAt, sizeof(RecordHeader)));
  // r9 = the current frame: *(tstate + tstate_frame), through the _PyCFrame when there is one.
  tstate_word(FIELD(CaptureThread, frame_at), kR9);
  b.Add(Store(BPF_DW, kR8, kR9, FIELD(RecordHeader, frame_field)));
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
  // The chain, each frame's address and first frame_size bytes copied into the record, one
  // read per frame (reading a block of the data stack around them instead cost as much:
  // each run's cost is mostly its cache misses). Unrolled; every step starts from the same
  // verifier state (the cursor reloaded from memory).
  for (uint32_t i = 0; i < kMaxCapturedFrames; ++i) {
    b.AddJump(JumpImm(BPF_JEQ, kR9, 0, 0), done);
    b.Add(Load(BPF_DW, kR6, kR8, kCursorAt));
    b.AddJump(JumpImm(BPF_JGT, kR6, kLastSlot, 0), done);
    b.Add(AluImm(BPF_AND, kR6, 0x3ff8));  // (aligned, as the verifier can see: kLastSlot fits)
    b.Add(AluReg(BPF_ADD, kR6, kR8));  // r6 = the frame's slot
    b.Add(Store(BPF_DW, kR6, kR9, 0));
    // Its bytes from frame_copy_from on, where they lie in a whole frame's copy.
    b.Add(Load(BPF_W, kR4, kR7, FIELD(CaptureThread, frame_copy_from)));
    b.Add(AluImm(BPF_AND, kR4, (kMaxCopiedStruct - 1) & ~7u));
    b.Add(Load(BPF_W, kR2, kR7, FIELD(CaptureThread, frame_size)));
    b.AddJump(JumpImm(BPF_JGT, kR2, kMaxCopiedStruct, 0), done);
    b.AddJump(JumpReg(BPF_JLE, kR2, kR4, 0), done);
    b.Add(AluReg(BPF_SUB, kR2, kR4));
    b.Add(AluImm(BPF_AND, kR2, 2 * kMaxCopiedStruct - 1));  // (positive: bounds for the verifier)
    b.AddJump(JumpImm(BPF_JGT, kR2, kMaxCopiedStruct, 0), done);
    b.Add(MovReg(kR1, kR6));
    b.Add(AluImm(BPF_ADD, kR1, 8));
    b.Add(AluReg(BPF_ADD, kR1, kR4));
    b.Add(MovReg(kR3, kR9));
    b.Add(AluReg(BPF_ADD, kR3, kR4));
    b.Add(Call(BPF_FUNC_probe_read_user));
    b.AddJump(JumpImm(BPF_JNE, kR0, 0, 0), done);
    // r9 = this frame's previous, from the copy (an aligned field inside the frame).
    b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_previous)));
    b.Add(AluImm(BPF_AND, kR1, (kMaxCopiedStruct - 1) & ~7u));
    b.Add(AluReg(BPF_ADD, kR1, kR6));
    b.Add(Load(BPF_DW, kR9, kR1, 8));
    // cursor += 8 + frame_size rounded up to 8 (at most kMaxSlot).
    b.Add(Load(BPF_W, kR1, kR7, FIELD(CaptureThread, frame_size)));
    b.Add(AluImm(BPF_ADD, kR1, 15));
    b.Add(AluImm(BPF_AND, kR1, 0x3f8));  // bits 3-9: a multiple of 8, bounded
    b.AddJump(JumpImm(BPF_JGT, kR1, kMaxSlot, 0), done);
    b.Add(Load(BPF_DW, kR2, kR8, kCursorAt));
    b.Add(AluReg(BPF_ADD, kR2, kR1));
    b.Add(Store(BPF_DW, kR8, kR2, kCursorAt));
  }
  b.Bind(done);
  b.Add(Store(BPF_DW, kR8, kR9, FIELD(RecordHeader, next)));
  b.Add(Load(BPF_DW, kR3, kR8, kCursorAt));
  b.AddJump(JumpImm(BPF_JGT, kR3, kRecordBytes, 0), out);
  b.AddMap(kR1, ring_map);
  b.Add(MovReg(kR2, kR8));
  b.Add(MovImm(kR4, BPF_RB_NO_WAKEUP));  // the agent reads the ring with the samples
  b.Add(Call(BPF_FUNC_ringbuf_output));
  b.Bind(out);
  b.Add(MovImm(kR0, 1));  // the sample is written as always
  b.Add(Exit());
  return std::move(b).Build();
}

absl::StatusOr<FrameCapture::Loaded> FrameCapture::Load(uint32_t program_flags,
                                                        uint32_t ring_bytes) {
  absl::StatusOr<base::UniqueFd> threads = bpf::CreateMap(
      BPF_MAP_TYPE_HASH, sizeof(uint32_t), sizeof(CaptureThread), kMaxThreads, "py_threads");
  if (!threads.ok()) return threads.status();
  absl::StatusOr<base::UniqueFd> scratch =
      bpf::CreateMap(BPF_MAP_TYPE_PERCPU_ARRAY, sizeof(uint32_t), kScratchBytes, 1, "py_record");
  if (!scratch.ok()) return scratch.status();
  absl::StatusOr<base::UniqueFd> ring =
      bpf::CreateMap(BPF_MAP_TYPE_RINGBUF, 0, 0, ring_bytes, "py_frames");
  if (!ring.ok()) return ring.status();
  absl::StatusOr<bpf::RingReader> reader = bpf::RingReader::Map(ring->get(), ring_bytes);
  if (!reader.ok()) return reader.status();
  const std::vector<bpf::Insn> program =
      FrameCaptureProgram(threads->get(), scratch->get(), ring->get());
  if (program.empty()) return absl::InternalError("python frame capture: program not built");
  absl::StatusOr<base::UniqueFd> loaded =
      bpf::LoadProgram(BPF_PROG_TYPE_PERF_EVENT, program, "py_frames", program_flags);
  if (!loaded.ok()) return loaded.status();
  return Loaded{std::move(*threads), std::move(*scratch), std::move(*ring), std::move(*reader),
                std::move(*loaded)};
}

absl::StatusOr<std::unique_ptr<FrameCapture>> FrameCapture::Create(uint32_t program_flags) {
  // The same program over a ring of one page: what the kernel and its verifier say of it.
  absl::StatusOr<Loaded> probe = Load(program_flags, static_cast<uint32_t>(getpagesize()));
  if (!probe.ok()) return probe.status();
  return std::unique_ptr<FrameCapture>(new FrameCapture(program_flags));
}

FrameCapture::~FrameCapture() = default;

bool CaptureThread::Set(uint64_t tstate_address, uint32_t check_offset, uint64_t check,
                        pid_t process, const Offsets& offsets) {
  tstate = tstate_address;
  check_value = check;
  pid = static_cast<uint32_t>(process);
  const uint32_t first = std::min(check_offset, offsets.tstate_frame) & ~7u;
  const uint32_t end = std::max(check_offset, offsets.tstate_frame) + 8;
  tstate_span_start = first;
  tstate_span = end - first;
  check_at = check_offset - first;
  frame_at = offsets.tstate_frame - first;
  cframe_frame = offsets.cframe_frame;
  frame_previous = offsets.frame_previous;
  frame_size = offsets.frame_size;
  // The fields read lie at the frame's end (3.11: f_code on); what lies before is not copied.
  uint32_t from = std::min({offsets.frame_code, offsets.frame_previous, offsets.frame_instr});
  if (offsets.frame_owner != kNoOffset) from = std::min(from, offsets.frame_owner);
  if (offsets.frame_is_entry != kNoOffset) from = std::min(from, offsets.frame_is_entry);
  frame_copy_from = from & ~7u;
  return tstate_span <= kMaxCapturedTstate && check_at % 8 == 0 && frame_at % 8 == 0 &&
         frame_size > 0 && frame_size <= kMaxCopiedStruct && frame_previous % 8 == 0 &&
         frame_previous + 8 <= frame_size;
}

absl::Status FrameCapture::Register(pid_t tid, const CaptureThread& thread) {
  if (!loaded_.has_value()) {
    absl::StatusOr<Loaded> loaded = Load(program_flags_, kRingBytes);
    if (!loaded.ok()) return loaded.status();
    loaded_.emplace(std::move(*loaded));
  }
  const uint32_t key = static_cast<uint32_t>(tid);
  if (absl::Status st = bpf::UpdateElement(loaded_->threads.get(), &key, &thread); !st.ok()) {
    return st;
  }
  queues_.try_emplace(tid);
  return absl::OkStatus();
}

void FrameCapture::Forget(pid_t tid) {
  const uint32_t key = static_cast<uint32_t>(tid);
  if (loaded_.has_value()) (void)bpf::DeleteElement(loaded_->threads.get(), &key);
  if (auto it = queues_.find(tid); it != queues_.end()) {
    const Queue& q = it->second;
    for (size_t i = q.head; i < q.entries.size(); ++i) stats_.unmatched += !q.entries[i].used;
    queues_.erase(it);
  }
}

void FrameCapture::Collect() {
  if (!loaded_.has_value()) return;
  bpf::RingReader& reader = loaded_->reader;
  std::span<const uint8_t> record;
  uint64_t position = 0;
  bool any = false;
  while (reader.Next(&record, &position)) {
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
      stats_.unmatched += !q.entries[q.head].used;
      DropBefore(q, q.head + 1);
    } else {
      DropBefore(q, q.head);
    }
    q.entries.push_back({header.time_ns, static_cast<uint32_t>(q.bytes.size()),
                         static_cast<uint32_t>(record.size()), false});
    q.bytes.insert(q.bytes.end(), record.begin(), record.end());
  }
  if (any) reader.Release(reader.end());
}

void FrameCapture::DropBefore(Queue& q, size_t index) {
  q.head = std::max(q.head, index);
  if (q.head == q.entries.size()) {
    q.entries.clear();
    q.bytes.clear();
    q.head = 0;
    return;
  }
  if (q.head < kCompactAfter || q.head * 2 < q.entries.size()) return;
  const uint32_t base = q.entries[q.head].offset;
  q.bytes.erase(q.bytes.begin(), q.bytes.begin() + base);
  q.entries.erase(q.entries.begin(), q.entries.begin() + static_cast<ptrdiff_t>(q.head));
  for (Entry& e : q.entries) e.offset -= base;
  q.head = 0;
}

const FrameSnapshot* FrameCapture::Find(pid_t tid, uint64_t sample_time_ns) {
  auto it = queues_.find(tid);
  if (it == queues_.end()) return nullptr;
  Queue* q = &it->second;
  DropBefore(*q, q->head);  // (the last snapshot found is used up)
  // A thread's snapshots are in time order (it runs on one CPU at a time); its samples may
  // come out of order (per-CPU rings drained one after the other).
  auto search = [&]() -> size_t {
    const uint64_t from = sample_time_ns > kMatchNs ? sample_time_ns - kMatchNs : 0;
    auto at = std::lower_bound(
        q->entries.begin() + static_cast<ptrdiff_t>(q->head), q->entries.end(), from,
        [](const Entry& e, uint64_t t) { return e.time_ns < t; });
    for (; at != q->entries.end() && at->time_ns <= sample_time_ns + kMatchNs; ++at) {
      if (!at->used) return static_cast<size_t>(at - q->entries.begin());
    }
    return SIZE_MAX;
  };
  size_t i = search();
  // Written after the ring was last read (its sample came out just now): read it again.
  if (i == SIZE_MAX && (q->entries.size() == q->head ||
                        q->entries.back().time_ns < sample_time_ns + kMatchNs)) {
    Collect();
    q = &queues_.find(tid)->second;
    i = search();
  }
  if (i == SIZE_MAX) {
    ++stats_.missing;
    return nullptr;
  }
  Entry& e = q->entries[i];
  e.used = true;
  RecordHeader header;
  std::memcpy(&header, q->bytes.data() + e.offset, sizeof(header));
  found_ = {};
  found_.frame_field = header.frame_field;
  found_.leaf = header.leaf;
  found_.next = header.next;
  found_.frame_size = header.frame_size;
  found_.frames = q->bytes.data() + e.offset + sizeof(header);
  const bool valid = header.frame_size <= kMaxCopiedStruct &&
                     (e.size - sizeof(header)) % found_.stride() == 0;
  found_.num_frames = valid ? static_cast<uint32_t>((e.size - sizeof(header)) / found_.stride())
                            : 0;
  // Snapshots this much older than the one found will not find their samples now. (The
  // queue's bytes move at its next change, Collect or the next Find, not before.)
  size_t first_live = q->head;
  for (; first_live < q->entries.size(); ++first_live) {
    const Entry& old = q->entries[first_live];
    if (!old.used && old.time_ns + kKeepNs >= header.time_ns) break;
    stats_.unmatched += !old.used;
  }
  q->head = first_live;
  if (!valid) {
    ++stats_.malformed;
    return nullptr;
  }
  ++stats_.found;
  return &found_;
}

CaptureStats FrameCapture::stats() const {
  CaptureStats s = stats_;
  s.threads = queues_.size();
  return s;
}

bpf::ProgramRuns FrameCapture::runs() const {
  if (!loaded_.has_value()) return {};
  absl::StatusOr<bpf::ProgramRuns> runs = bpf::RunsOf(loaded_->program.get());
  return runs.ok() ? *runs : bpf::ProgramRuns{};
}

}  // namespace strata::agent::python
