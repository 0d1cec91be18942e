#include "agent/python/interpreter.h"

#include <time.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "agent/procfs/procfs.h"
#include "agent/python/line_table.h"

namespace strata::agent::python {
namespace {

constexpr size_t kMaxInterpreters = 64;
constexpr size_t kMaxChainFrames = 1024;
// Code objects checked along with a chain's beyond its own (see Read).
constexpr size_t kMaxSweptCodeObjects = 128;
// Thread-state lists are walked again for an unknown tid at most this often: samples of
// threads that run no Python (an embedding program's own) must not cost a walk each.
constexpr uint64_t kRescanGapNs = 50'000'000;

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

void AppendUtf8(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x110000) {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->append("\xEF\xBF\xBD");  // U+FFFD
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Interpreter>> Interpreter::Attach(
    pid_t pid, const InterpreterModule& module, int64_t bias,
    std::unique_ptr<RemoteMemory> memory) {
  if (memory == nullptr) memory = std::make_unique<RemoteMemory>(pid);
  const uint64_t runtime = module.runtime_vaddr + static_cast<uint64_t>(bias);
  absl::StatusOr<Offsets> offsets = OffsetsForVersion(module.major, module.minor);
  if (!offsets.ok()) return offsets.status();
  if (module.major == 3 && module.minor >= 13) {
    std::array<char, kDebugOffsetsSize> bytes;
    if (!memory->Read(runtime, bytes.data(), bytes.size())) {
      return absl::PermissionDeniedError(
          absl::StrCat("cannot read pid ", pid, "'s _PyRuntime (ptrace access needed)"));
    }
    offsets = OffsetsFromDebugOffsets(std::string_view(bytes.data(), bytes.size()));
    if (!offsets.ok()) return offsets.status();
  }
  uint64_t head;
  if (!memory->ReadValue(runtime + offsets->runtime_interpreters_head, &head)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot read pid ", pid, "'s _PyRuntime (ptrace access needed)"));
  }
  std::vector<elf::AddressRange> eval;
  for (const elf::AddressRange& r : module.eval_ranges) {
    eval.push_back({r.start + static_cast<uint64_t>(bias), r.end + static_cast<uint64_t>(bias)});
  }
  auto interpreter = std::unique_ptr<Interpreter>(
      new Interpreter(pid, *offsets, runtime, std::move(eval), std::move(memory)));
  const Offsets& o = interpreter->offsets_;
  uint32_t end = std::max({o.tstate_next, o.tstate_frame, o.tstate_thread_id});
  if (o.tstate_native_thread_id != kNoOffset) end = std::max(end, o.tstate_native_thread_id);
  interpreter->tstate_bytes_ = end + 8;
  if (module.learn_eval_parts && o.layout == FrameLayout::kInterpreterFrameCStack) {
    interpreter->learning_reads_left_ = kLearningReads;
  }
  if (module.init_cleanup_vaddr != 0) {
    interpreter->init_cleanup_ = module.init_cleanup_vaddr + static_cast<uint64_t>(bias);
  }
  interpreter->entry_frames_.reserve(kMaxChainFrames);
  interpreter->chain_.reserve(kMaxChainFrames);
  interpreter->code_addresses_.reserve(kMaxChainFrames + kMaxSweptCodeObjects + 3);
  interpreter->code_sizes_.reserve(kMaxChainFrames + kMaxSweptCodeObjects + 3);
  // The code objects' headers, then the re-read of the thread's current frame (three words).
  interpreter->code_headers_.resize((kMaxChainFrames + kMaxSweptCodeObjects) *
                                        interpreter->offsets_.code_size +
                                    3 * sizeof(uint64_t));
  interpreter->scratch_.resize(kMaxTstateBytes + sizeof(uint64_t) +
                               (kMaxHints + kMaxChainBlocks) * kChainBlock +
                               3 * sizeof(uint64_t));
  return interpreter;
}

pid_t Interpreter::TidOf(const uint8_t* tstate) {
  if (offsets_.tstate_native_thread_id != kNoOffset) {
    return static_cast<pid_t>(FieldAt<uint64_t>(tstate, offsets_.tstate_native_thread_id));
  }
  const uint64_t pthread = FieldAt<uint64_t>(tstate, offsets_.tstate_thread_id);
  if (pthread == 0) return -1;
  if (pthread_tid_offset_ < 0 && !CalibratePthreadTid()) return -1;
  int32_t tid;
  if (!memory_->ReadValue(pthread + static_cast<uint64_t>(pthread_tid_offset_), &tid)) return -1;
  return tid;
}

bool Interpreter::ProposeEvalPart(elf::AddressRange range) {
  constexpr size_t kMaxProposedParts = 8;
  if (eval_ranges_.size() >= kMaxEvalRanges || range.end <= range.start) return false;
  auto it = std::find_if(proposed_parts_.begin(), proposed_parts_.end(),
                         [&](const ProposedPart& p) {
                           return p.range.start == range.start && p.range.end == range.end;
                         });
  if (it == proposed_parts_.end()) {
    if (proposed_parts_.size() == kMaxProposedParts) proposed_parts_.erase(proposed_parts_.begin());
    proposed_parts_.push_back({range, 0});
    it = proposed_parts_.end() - 1;
  }
  if (++it->reads < kEvalPartConfirmations) return false;
  proposed_parts_.erase(it);
  eval_ranges_.push_back(range);
  return true;
}

bool Interpreter::CalibratePthreadTid() {
  // A failure is remembered for a while: it is asked per thread state on every walk.
  const uint64_t now = NowNs();
  if (calibration_failed_ns_ != 0 && now - calibration_failed_ns_ < kCalibrationRetryNs) {
    return false;
  }
  if (FindPthreadTid()) return true;
  ++stats_.calibration_failures;
  calibration_failed_ns_ = now;
  return false;
}

bool Interpreter::FindPthreadTid() {
  // The pthreads of every thread state.
  std::vector<uint64_t> pthreads;
  uint64_t interp = 0;
  if (!memory_->ReadValue(runtime_ + offsets_.runtime_interpreters_head, &interp)) return false;
  for (size_t i = 0; interp != 0 && i < kMaxInterpreters; ++i) {
    uint64_t ts = 0;
    if (!memory_->ReadValue(interp + offsets_.interp_threads_head, &ts)) return false;
    for (size_t t = 0; ts != 0 && t < kMaxThreads; ++t) {
      uint64_t pthread = 0, next = 0;
      if (!memory_->ReadValue(ts + offsets_.tstate_thread_id, &pthread) ||
          !memory_->ReadValue(ts + offsets_.tstate_next, &next)) {
        return false;
      }
      if (pthread != 0) pthreads.push_back(pthread);
      ts = next;
    }
    if (!memory_->ReadValue(interp + offsets_.interp_next, &interp)) break;
  }
  constexpr size_t kWords = 512;  // glibc's tid lies well inside 2 KiB of struct pthread
  std::vector<std::array<int32_t, kWords>> blocks(pthreads.size());
  for (size_t i = 0; i < pthreads.size(); ++i) {
    if (!memory_->Read(pthreads[i], blocks[i].data(), sizeof(blocks[i]))) return false;
  }
  if (blocks.empty()) return false;
  // The word where every thread state's pthread holds a distinct thread of the process. Its
  // threads, not its main thread alone: an embedding program may run Python on other
  // threads only.
  absl::StatusOr<std::vector<pid_t>> live = procfs::ListThreads(pid_);
  if (!live.ok()) return false;
  const absl::flat_hash_set<int32_t> threads(live->begin(), live->end());
  for (size_t word = 0; word < kWords; ++word) {
    bool plausible = true;
    absl::flat_hash_set<int32_t> seen;
    for (const auto& block : blocks) {
      const int32_t v = block[word];
      plausible &= threads.contains(v) && seen.insert(v).second;
    }
    if (plausible) {
      pthread_tid_offset_ = static_cast<int64_t>(word * sizeof(int32_t));
      return true;
    }
  }
  return false;
}

Interpreter::KnownThread* Interpreter::ThreadStateOf(pid_t tid, bool* cframe_current) {
  *cframe_current = false;
  num_blocks_ = 0;
  blocks_read_ = 0;
  read_since_thread_ = false;
  recheck_ = {};
  uint8_t* bytes = scratch_.data();
  if (tstate_bytes_ > kMaxTstateBytes) return nullptr;
  if (auto it = thread_states_.find(tid); it != thread_states_.end() && it->second.tstate != 0) {
    KnownThread& known = it->second;
    // The thread state, the known _PyCFrame's current frame, the hints and the re-read of
    // where the chain starts (Recheck): in one call, else without the re-read, else without
    // the hints (memory that went away), else the thread state alone.
    std::array<uint64_t, 2 + kMaxHints + 3> addresses;
    std::array<size_t, 2 + kMaxHints + 3> sizes;
    size_t count = 0;
    addresses[count] = known.tstate;
    sizes[count++] = tstate_bytes_;
    if (known.cframe != 0) {
      addresses[count] = known.cframe + offsets_.cframe_frame;
      sizes[count++] = sizeof(uint64_t);
    }
    const size_t fixed = count;
    size_t hinted_bytes = 0;
    for (size_t i = 0; i < known.num_hints; ++i) {
      addresses[count] = known.hints[i].start;
      sizes[count++] = known.hints[i].size;
      hinted_bytes += known.hints[i].size;
    }
    const size_t hinted = count;
    if (known.num_hints > 0 && known.leaf != 0) {
      addresses[count] = known.tstate + offsets_.tstate_frame;
      sizes[count++] = sizeof(uint64_t);
      if (known.cframe != 0) {
        addresses[count] = known.cframe + offsets_.cframe_frame;
        sizes[count++] = sizeof(uint64_t);
      }
      addresses[count] = known.leaf + offsets_.frame_code;
      sizes[count++] = sizeof(uint64_t);
    }
    bool read = memory_->ReadMany(addresses.data(), sizes.data(), count, bytes);
    if (read && count > hinted) {
      const uint8_t* again = bytes + tstate_bytes_ + (fixed - 1) * sizeof(uint64_t) + hinted_bytes;
      recheck_ = {true, known.cframe, known.leaf, FieldAt<uint64_t>(again, 0), 0, 0};
      again += sizeof(uint64_t);
      if (known.cframe != 0) {
        recheck_.current = FieldAt<uint64_t>(again, 0);
        again += sizeof(uint64_t);
      }
      recheck_.leaf_code = FieldAt<uint64_t>(again, 0) & ~kStackRefTagBits;
    }
    if (!read && count > hinted) {
      read = memory_->ReadMany(addresses.data(), sizes.data(), hinted, bytes);
    }
    if (!read && hinted > fixed) {
      known.num_hints = 0;
      read = memory_->ReadMany(addresses.data(), sizes.data(), fixed, bytes);
    }
    if (!read && known.cframe != 0) {
      known.cframe = 0;  // (its eval call returned, and its stack went away)
      read = memory_->Read(known.tstate, bytes, tstate_bytes_);
    }
    if (read && TidOf(bytes) == tid) {
      *cframe_current = known.cframe != 0;
      scratch_used_ = tstate_bytes_ + (*cframe_current ? sizeof(uint64_t) : 0);
      for (size_t i = 0; i < known.num_hints; ++i) {
        blocks_[num_blocks_++] = {known.hints[i].start, known.hints[i].size, scratch_used_,
                                  UINT64_MAX, 0};
        scratch_used_ += known.hints[i].size;
      }
      return &known;
    }
    known = {};  // gone, or now another thread's: look again
  }
  scratch_used_ = tstate_bytes_ + sizeof(uint64_t);
  if (!WalkThreadStates()) return nullptr;
  KnownThread& found = thread_states_[tid];  // none: remembered as such until the next walk
  if (found.tstate == 0 || !memory_->Read(found.tstate, bytes, tstate_bytes_)) return nullptr;
  return &found;
}

bool Interpreter::WalkThreadStates() {
  const uint64_t now = NowNs();
  if (last_scan_ns_ != 0 && now - last_scan_ns_ < kRescanGapNs) return false;
  last_scan_ns_ = now;
  ++stats_.thread_scans;
  for (auto& [known_tid, known] : thread_states_) known = {};
  uint8_t* bytes = scratch_.data();
  uint64_t interp = 0;
  if (!memory_->ReadValue(runtime_ + offsets_.runtime_interpreters_head, &interp)) return false;
  for (size_t i = 0; interp != 0 && i < kMaxInterpreters; ++i) {
    uint64_t ts = 0;
    if (!memory_->ReadValue(interp + offsets_.interp_threads_head, &ts)) break;
    for (size_t t = 0; ts != 0 && t < kMaxThreads; ++t) {
      if (!memory_->Read(ts, bytes, tstate_bytes_)) break;
      if (const pid_t owner = TidOf(bytes); owner > 0) thread_states_[owner].tstate = ts;
      ts = FieldAt<uint64_t>(bytes, offsets_.tstate_next);
    }
    if (!memory_->ReadValue(interp + offsets_.interp_next, &interp)) break;
  }
  return true;
}

std::vector<pid_t> Interpreter::ThreadIds() {
  WalkThreadStates();
  std::vector<pid_t> tids;
  for (const auto& [tid, known] : thread_states_) {
    if (known.tstate != 0) tids.push_back(tid);
  }
  return tids;
}

bool Interpreter::CurrentFrame(KnownThread& thread, const uint8_t* bytes, bool cframe_current,
                               uint64_t* frame) {
  uint64_t p = FieldAt<uint64_t>(bytes, offsets_.tstate_frame);
  if (offsets_.cframe_frame != kNoOffset && p != 0) {
    if (cframe_current && p == thread.cframe) {
      p = FieldAt<uint64_t>(bytes, tstate_bytes_);  // read along with the thread state
    } else {
      thread.cframe = p;
      read_since_thread_ = true;
      if (!memory_->ReadValue(p + offsets_.cframe_frame, &p)) return false;
    }
  }
  *frame = p;
  return true;
}

const uint8_t* Interpreter::FrameBytes(uint64_t address) {
  const size_t size = offsets_.frame_size;
  if (snapshot_ != nullptr && snapshot_next_ < snapshot_->num_frames &&
      snapshot_->AddressOf(snapshot_next_) == address) {
    return snapshot_->BytesOf(snapshot_next_++);
  }
  for (size_t i = 0; i < num_blocks_; ++i) {
    ChainBlock& b = blocks_[i];
    if (address >= b.start && address - b.start <= b.size - size) {
      b.low = std::min(b.low, address);
      b.high = std::max(b.high, address + size);
      return scratch_.data() + b.at + (address - b.start);
    }
  }
  if (address > UINT64_MAX - size) return nullptr;
  read_since_thread_ = true;
  // Frame objects (before 3.11) lie anywhere on the heap: only the frame. Else the block
  // below it (the first of a read a whole one; later ones mostly hold a generator's frame),
  // clipped to the frame's page when that reaches unmapped memory (the data stack chunk's
  // start).
  const size_t block = blocks_read_ == 0 ? kChainBlock : kChainBlock / 4;
  if (num_blocks_ == blocks_.size() || scratch_used_ + block > scratch_.size()) {
    // Out of blocks (a chain through many generators): the frame alone.
    return memory_->Read(address, frame_bytes_.data(), size) ? frame_bytes_.data() : nullptr;
  }
  uint8_t* to = scratch_.data() + scratch_used_;
  const uint64_t end = address + size;
  uint64_t start = address;
  if (offsets_.layout != FrameLayout::kFrameObject) start = end > block ? end - block : 0;
  const uint64_t page = address & ~uint64_t{4095};
  const uint64_t from = memory_->ReadDownTo(start, end - start, page, to);
  if (from == 0) return nullptr;
  ++blocks_read_;
  blocks_[num_blocks_++] = {from, end - from, scratch_used_ + (from - start), address, end};
  scratch_used_ += end - start;
  return to + (address - start);
}

void Interpreter::KeepHints(KnownThread& thread) {
  thread.num_hints = 0;
  for (size_t i = 0; i < num_blocks_ && thread.num_hints < kMaxHints; ++i) {
    const ChainBlock& b = blocks_[i];
    if (b.high == 0) continue;  // not used by this walk
    // Up to kHintAbove past the used part, within its last page (mapped as a whole).
    const uint64_t page_end = ((b.high - 1) | 4095) + 1;
    const uint64_t end = std::min(b.high + kHintAbove, page_end);
    if (end - b.low > kChainBlock) continue;
    thread.hints[thread.num_hints++] = {b.low, static_cast<uint32_t>(end - b.low)};
  }
}

bool Interpreter::ReadBytes(uint64_t address, std::string* out) {
  int64_t size = 0;
  if (address == 0 || !memory_->ReadValue(address + offsets_.varobject_size, &size)) return false;
  if (size < 0 || size > (1 << 20)) return false;
  out->resize(static_cast<size_t>(size));
  return memory_->Read(address + offsets_.bytes_sval, out->data(), out->size());
}

bool Interpreter::ReadString(uint64_t address, std::string* out) {
  std::array<uint8_t, 128> header;
  if (address == 0 || offsets_.unicode_compact_data > header.size() ||
      !memory_->Read(address, header.data(), offsets_.unicode_compact_data)) {
    return false;
  }
  const int64_t length = FieldAt<int64_t>(header.data(), offsets_.unicode_length);
  // PyASCIIObject.state: interned:2, kind:3, compact:1, ascii:1 from the low bit (GCC's
  // bitfield order on little-endian targets).
  const uint32_t state = FieldAt<uint32_t>(header.data(), offsets_.unicode_state);
  const uint32_t kind = (state >> 2) & 7;
  const bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (!compact || length < 0 || (kind != 1 && kind != 2 && kind != 4)) return false;
  const size_t chars = std::min<size_t>(static_cast<size_t>(length), kMaxStringBytes);
  const uint64_t data =
      address + (ascii ? offsets_.unicode_ascii_data : offsets_.unicode_compact_data);
  std::array<uint8_t, kMaxStringBytes * 4> raw;
  if (!memory_->Read(data, raw.data(), chars * kind)) return false;
  out->clear();
  if (ascii) {
    out->assign(reinterpret_cast<const char*>(raw.data()), chars);
    return true;
  }
  for (size_t i = 0; i < chars; ++i) {
    uint32_t c = raw[i * kind];
    if (kind == 2) c = FieldAt<uint16_t>(raw.data(), static_cast<uint32_t>(i * 2));
    if (kind == 4) c = FieldAt<uint32_t>(raw.data(), static_cast<uint32_t>(i * 4));
    AppendUtf8(c, out);
  }
  return true;
}

size_t Interpreter::CodeBytes(const CodeInfo& code) {
  return sizeof(CodeInfo) + code.name.size() + code.filename.size() + code.line_table.size();
}

const CodeInfo* Interpreter::Code(uint64_t address, const uint8_t* header, uint64_t now) {
  const uint8_t* bytes = header;
  const uint32_t name_at =
      offsets_.code_qualname != kNoOffset ? offsets_.code_qualname : offsets_.code_name;
  const uint64_t name = FieldAt<uint64_t>(bytes, name_at);
  const uint64_t filename = FieldAt<uint64_t>(bytes, offsets_.code_filename);
  const uint64_t table = FieldAt<uint64_t>(bytes, offsets_.code_linetable);
  const int first_line = FieldAt<int32_t>(bytes, offsets_.code_firstlineno);
  std::unique_ptr<CodeInfo>& slot = code_[address];
  if (slot != nullptr && slot->name_ptr == name && slot->filename_ptr == filename &&
      slot->line_table_ptr == table && slot->first_line == first_line) {
    slot->checked_ns = now;
    return slot.get();
  }
  // First sight, or the address holds another code object now.
  ++stats_.code_misses;
  if (slot != nullptr) stats_.code_bytes -= CodeBytes(*slot);
  auto info = std::make_unique<CodeInfo>();
  if (!ReadString(name, &info->name) || !ReadString(filename, &info->filename) ||
      !ReadBytes(table, &info->line_table)) {
    code_.erase(address);
    return nullptr;
  }
  if (stats_.code_bytes + CodeBytes(*info) > kMaxCodeBytes) {
    ++stats_.code_refused;
    code_full_ = true;
    code_.erase(address);
    return nullptr;
  }
  stats_.code_bytes += CodeBytes(*info);
  info->interpreter_shim =
      address == init_cleanup_ ||
      (init_cleanup_ == 0 && offsets_.minor >= 13 && info->name == "__init__" &&
       info->filename == "__init__");
  info->first_line = first_line;
  info->name_ptr = name;
  info->filename_ptr = filename;
  info->line_table_ptr = table;
  info->checked_ns = now;
  slot = std::move(info);
  return slot.get();
}

int Interpreter::LineOf(const CodeInfo& code, int64_t offset) {
  CodeInfo::CachedLine& cached =
      code.lines[static_cast<uint64_t>(offset >> 1) % code.lines.size()];
  if (cached.offset != offset) {
    ++stats_.line_misses;
    cached = {offset, LineForOffset(offsets_.line_table, code.line_table, code.first_line,
                                    offset)};
  }
  return cached.line;
}

ReadOutcome Interpreter::ReadStack(pid_t tid, std::span<PythonFrame> out, size_t* count) {
  return Read(tid, nullptr, out, count);
}

ReadOutcome Interpreter::ReadSnapshot(const FrameSnapshot& snapshot, std::span<PythonFrame> out,
                                      size_t* count) {
  return Read(0, &snapshot, out, count);
}

std::optional<CaptureThread> Interpreter::CaptureThreadOf(pid_t tid) {
  auto it = thread_states_.find(tid);
  if (it == thread_states_.end() || it->second.tstate == 0) return std::nullopt;
  const uint64_t tstate = it->second.tstate;
  CaptureThread t;
  uint32_t check_offset = offsets_.tstate_native_thread_id;
  uint64_t check = static_cast<uint64_t>(tid);
  if (check_offset == kNoOffset) {  // the pthread_t: TidOf found it to be this thread's
    check_offset = offsets_.tstate_thread_id;
    if (!memory_->ReadValue(tstate + check_offset, &check)) return std::nullopt;
  }
  if (!t.Set(tstate, check_offset, check, pid_, offsets_)) return std::nullopt;
  return t;
}

ReadOutcome Interpreter::Read(pid_t tid, const FrameSnapshot* snapshot,
                              std::span<PythonFrame> out, size_t* count) {
  *count = 0;
  innermost_call_ = 0;
  ++stats_.reads;
  if (code_.size() >= kMaxCodeObjects || code_full_) {  // before any frame points into it
    code_.clear();
    code_full_ = false;
    stats_.code_bytes = 0;
  }
  auto inconsistent = [this] {
    ++stats_.inconsistent;
    return ReadOutcome::kInconsistent;
  };
  KnownThread* thread = nullptr;
  uint64_t leaf = 0, frame_field = 0;
  snapshot_ = snapshot;
  snapshot_next_ = 0;
  if (snapshot != nullptr) {
    ++stats_.snapshot_reads;
    num_blocks_ = 0;
    blocks_read_ = 0;
    scratch_used_ = 0;
    read_since_thread_ = false;
    recheck_ = {};
    if (snapshot->frame_size != offsets_.frame_size) return inconsistent();
    leaf = snapshot->leaf;
    frame_field = snapshot->frame_field;
  } else {
    bool cframe_current = false;
    thread = ThreadStateOf(tid, &cframe_current);
    if (thread == nullptr) return ReadOutcome::kNoThread;
    if (!CurrentFrame(*thread, scratch_.data(), cframe_current, &leaf)) return inconsistent();
    frame_field = FieldAt<uint64_t>(scratch_.data(), offsets_.tstate_frame);
  }
  const bool frame_objects = offsets_.layout == FrameLayout::kFrameObject;
  if (offsets_.frame_size > kMaxCopiedStruct) return inconsistent();
  // First the chain (in blocks, FrameBytes; those where the last read found frames came with
  // the thread state), then every frame's code object header and the re-read of the current
  // frame in one batch, then names and lines (from the cache; a code object seen first costs
  // its strings).
  // A cycle (a chain that changed while it was read) runs into the bound on frames: on the
  // frames shown (`out`), or on all of them (C-stack shims are not shown).
  chain_.clear();
  entry_frames_.clear();
  size_t walked = 0;
  for (uint64_t frame = leaf; frame != 0;) {
    if (++walked > kMaxChainFrames) return inconsistent();
    const uint8_t* bytes = FrameBytes(frame);
    if (bytes == nullptr) return inconsistent();
    const uint64_t code = FieldAt<uint64_t>(bytes, offsets_.frame_code) & ~kStackRefTagBits;
    const uint64_t previous = FieldAt<uint64_t>(bytes, offsets_.frame_previous);
    if (offsets_.layout == FrameLayout::kInterpreterFrameCStack &&
        bytes[offsets_.frame_owner] == kFrameOwnedByCStack) {
      // The shim a native eval call pushed below the frames it runs (3.14 also ends each
      // thread's chain with one of its own, under the outermost call's).
      if (!chain_.empty() && !chain_.back().entry) {
        chain_.back().entry = true;
        entry_frames_.push_back(frame);
      }
      frame = previous;
      continue;
    }
    if (chain_.size() >= out.size() || code == 0) return inconsistent();
    int64_t offset;
    if (frame_objects) {
      const int32_t lasti = FieldAt<int32_t>(bytes, offsets_.frame_instr);
      offset = offsets_.minor >= 10 ? int64_t{lasti} * 2 : lasti;  // 3.10: code units
    } else {
      const uint64_t instr = FieldAt<uint64_t>(bytes, offsets_.frame_instr);
      offset = static_cast<int64_t>(instr - (code + offsets_.code_adaptive));
    }
    chain_.push_back({code, offset,
                      frame_objects || (offsets_.frame_is_entry != kNoOffset &&
                                        bytes[offsets_.frame_is_entry] != 0),
                      nullptr});
    frame = previous;
  }
  const size_t n = chain_.size();
  if (offsets_.cframe_frame != kNoOffset) {
    innermost_call_ = frame_field;
  } else if (!entry_frames_.empty()) {
    innermost_call_ = entry_frames_.front();
  }
  // Code objects checked within kCodeRecheckNs are taken from the cache as they are (a frame
  // holds its code object: only one freed since could have left its address to another);
  // the others' headers are read to be checked. With one due, the whole chain's are checked:
  // their checks then fall due together, one second call per period for a chain rather than
  // one per code object in it.
  const uint64_t now = NowNs();
  code_addresses_.clear();
  code_sizes_.clear();
  bool due = false;
  for (ChainFrame& f : chain_) {
    auto it = code_.find(f.code);
    f.info = it != code_.end() ? it->second.get() : nullptr;
    due |= f.info == nullptr || now - f.info->checked_ns >= kCodeRecheckNs;
  }
  for (ChainFrame& f : chain_) {
    if (!due) break;
    f.info = nullptr;
    code_addresses_.push_back(f.code);
    code_sizes_.push_back(offsets_.code_size);
  }
  const size_t headers = code_addresses_.size();
  // The thread ran on while we read if its current frame or that frame's code moved: read
  // again after the headers, in the same call (the reads of one call are made in order).
  // A chain found where the last read left it, starting at the same frame, with no header
  // due, was read again at the end of the thread state's call already: no second call.
  // A snapshot was copied while the thread stood still: only the headers due.
  const bool through_cframe = offsets_.cframe_frame != kNoOffset && frame_field != 0;
  if (snapshot != nullptr) {
    snapshot_ = nullptr;
    if (headers == 0) return Finish(nullptr, leaf, out, count);
    // The other code objects due within half a period come along: the chains of a process's
    // threads, each falling due on its own, would each cost a call.
    for (const auto& [address, info] : code_) {
      if (code_addresses_.size() == headers + kMaxSweptCodeObjects) break;
      if (now - info->checked_ns < kCodeRecheckNs / 2) continue;
      code_addresses_.push_back(address);
      code_sizes_.push_back(offsets_.code_size);
    }
    size_t read = code_addresses_.size();
    if (!memory_->ReadMany(code_addresses_.data(), code_sizes_.data(), read,
                           code_headers_.data())) {
      read = headers;  // (one of the others went away: the chain's alone)
      if (read == code_addresses_.size() ||
          !memory_->ReadMany(code_addresses_.data(), code_sizes_.data(), read,
                             code_headers_.data())) {
        return inconsistent();
      }
    }
    for (size_t i = headers; i < read; ++i) {
      Code(code_addresses_[i], code_headers_.data() + i * offsets_.code_size, now);
    }
    if (!ChainCode(now)) return inconsistent();
    return Finish(nullptr, leaf, out, count);
  }
  if (headers == 0 && recheck_.read && !read_since_thread_ && n > 0 && recheck_.leaf == leaf &&
      (!through_cframe || recheck_.cframe == frame_field)) {
    ++stats_.one_call_reads;
    if (recheck_.frame_field != frame_field || (through_cframe && recheck_.current != leaf) ||
        recheck_.leaf_code != chain_[0].code) {
      return inconsistent();
    }
    return Finish(thread, leaf, out, count);
  }
  code_addresses_.push_back(thread->tstate + offsets_.tstate_frame);
  code_sizes_.push_back(sizeof(uint64_t));
  if (through_cframe) {
    code_addresses_.push_back(frame_field + offsets_.cframe_frame);
    code_sizes_.push_back(sizeof(uint64_t));
  }
  if (n > 0) {
    code_addresses_.push_back(leaf + offsets_.frame_code);
    code_sizes_.push_back(sizeof(uint64_t));
  }
  if (!memory_->ReadMany(code_addresses_.data(), code_sizes_.data(), code_addresses_.size(),
                         code_headers_.data())) {
    return inconsistent();
  }
  const uint8_t* again = code_headers_.data() + headers * offsets_.code_size;
  if (FieldAt<uint64_t>(again, 0) != frame_field) return inconsistent();
  again += sizeof(uint64_t);
  if (through_cframe) {
    if (FieldAt<uint64_t>(again, 0) != leaf) return inconsistent();
    again += sizeof(uint64_t);
  }
  if (n > 0 && (FieldAt<uint64_t>(again, 0) & ~kStackRefTagBits) != chain_[0].code) {
    return inconsistent();
  }
  if (!ChainCode(now)) return inconsistent();
  return Finish(thread, leaf, out, count);
}

bool Interpreter::ChainCode(uint64_t now) {
  const uint8_t* header = code_headers_.data();
  for (ChainFrame& f : chain_) {
    if (f.info != nullptr) continue;
    f.info = Code(f.code, header, now);
    header += offsets_.code_size;
    if (f.info == nullptr) return false;
  }
  return true;
}

ReadOutcome Interpreter::Finish(KnownThread* thread, uint64_t leaf, std::span<PythonFrame> out,
                                size_t* count) {
  size_t n = 0;
  for (const ChainFrame& c : chain_) {
    if (c.info->interpreter_shim && !c.entry) continue;  // (never a call's outermost frame)
    PythonFrame& f = out[n++];
    f.code = c.info;
    f.line = LineOf(*c.info, c.offset);
    f.entry = c.entry;
  }
  if (thread != nullptr) {
    KeepHints(*thread);
    thread->leaf = n > 0 ? leaf : 0;
  }
  *count = n;
  stats_.frames += n;
  return ReadOutcome::kOk;
}

}  // namespace strata::agent::python
