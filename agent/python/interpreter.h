// One CPython interpreter in a target process, and the Python frames of its threads read from
// the target's memory.
//
// InspectModule() recognizes the module that holds the interpreter (an executable such as
// /usr/bin/python3.11, or a libpython3.X.so loaded by an embedding program) from its symbols:
// `_PyEval_EvalFrameDefault` (the eval loop, whose native frames the Python frames replace),
// `_PyRuntime` (the runtime state), and the version from `Py_Version` (3.11+) or the file name.
// Interpreter::Attach() then reads the runtime through the module's load bias; 3.13+ takes the
// offsets from the target's own _Py_DebugOffsets, older versions from offsets.h's tables.
//
// ReadStack(tid) finds the thread's state (by native_thread_id on 3.11+, by the pthread's tid
// before, see below), follows its frame chain from the innermost frame and returns, innermost
// first, each frame's code object (names, file, line table: cached by address, re-checked
// when last checked more than kCodeRecheckNs ago) and line, with `entry` set on the outermost
// frame each native eval-loop call runs. It reads a running thread: a chain that changed while
// it was read (the current frame or the leaf's code moved, a cycle, a chain deeper than asked
// for, memory that went away) is reported as kInconsistent, never returned as frames.
//
// A read costs few system calls (it runs for every sample of a Python thread): the thread
// state with the current frame of the _PyCFrame the thread's last read went through (3.11,
// 3.12) and the memory where its last read found frames; then the frames not found there, in
// blocks of the thread's data stack (3.11+: frames lie next to each other there, a
// generator's inside its object); then, when one of its code objects is due for a check,
// the headers of all of them (so that they fall due together) with the re-read of the current
// frame and the leaf's code that shows the chain held still.
// Two calls for a chain like the last; one when it starts at the last read's innermost frame
// and no code object is due for a check (that re-read then ends the first call: the reads of
// one call are made in order). Frame objects before 3.11 cost one per frame besides the
// innermost four.
//
// Threads before 3.11 carry only the pthread_t (the address of glibc's struct pthread); the
// kernel tid inside that struct is found once per process: the offset at which the thread
// states' pthreads hold distinct threads of the process (/proc/PID/task).
//
// Single-threaded (the agent's main loop). A read of a known thread and code objects allocates
// nothing; a code object seen first is copied into the cache.
#ifndef STRATA_AGENT_PYTHON_INTERPRETER_H_
#define STRATA_AGENT_PYTHON_INTERPRETER_H_

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agent/python/frame_capture.h"
#include "agent/python/offsets.h"
#include "agent/python/remote_memory.h"
#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"

namespace strata::agent::python {

// The eval loop's function; a compiler's split-off parts of it are named NAME.SUFFIX.
inline constexpr std::string_view kEvalLoop = "_PyEval_EvalFrameDefault";
// InEvalLoop tests every range on every frame: CPython has one, and its split-off parts a few.
inline constexpr size_t kMaxEvalRanges = 16;

// What a module's file says about the interpreter in it (ELF virtual addresses).
// (interpreter_module.cc)
struct InterpreterModule {
  int major = 0;
  int minor = 0;
  uint64_t runtime_vaddr = 0;  // _PyRuntime
  std::vector<elf::AddressRange> eval_ranges;  // _PyEval_EvalFrameDefault (and .cold parts)
  // The module names no local function (no .symtab): a compiler's split-off parts of the eval
  // loop (GCC's .cold) have no name, and on 3.12+ the stacks show where they are (see
  // Interpreter::learns_eval_parts).
  bool learn_eval_parts = false;
  uint64_t init_cleanup_vaddr = 0;  // _Py_InitCleanup (3.14+ export it; 0: not found)
};

// The interpreter in `elf` (named `path`, with its function symbols `symbols`); NotFound when
// the module holds none, Unimplemented for a version without offsets.
absl::StatusOr<InterpreterModule> InspectModule(const elf::ElfFile& elf,
                                                const elf::SymbolTable& symbols,
                                                std::string_view path);

// An object (STT_OBJECT) symbol's address from .dynsym or .symtab.
std::optional<uint64_t> FindObjectSymbol(const elf::ElfFile& elf, std::string_view name);
// The file's initial bytes at `vaddr` (in an allocated section with contents), or empty.
std::string_view FileBytesAt(const elf::ElfFile& elf, uint64_t vaddr, size_t size);

struct CodeInfo {
  std::string name;      // co_qualname (3.11+), else co_name
  std::string filename;  // co_filename
  int first_line = 0;
  std::string line_table;
  // What a later use compares, to see the address now holds another code object, and when
  // it last did (CLOCK_MONOTONIC).
  uint64_t name_ptr = 0, filename_ptr = 0, line_table_ptr = 0;
  uint64_t checked_ns = 0;
  // For the owner: e.g. the function node it resolved this code object to (0: none yet).
  mutable uint32_t owner_id = 0;
  // The interpreter's own code, not the program's: 3.13+'s _Py_InitCleanup, the shim frame
  // CALL_ALLOC_AND_ENTER_INIT pushes between a class's caller and its __init__ (filename and
  // name "__init__"). Such frames are not returned.
  bool interpreter_shim = false;
  // Lines of offsets decoded before (direct-mapped by offset): the offsets of a thread's
  // callers repeat from one sample to the next, and decoding walks the table from its start.
  struct CachedLine {
    int64_t offset = INT64_MIN;
    int line = -1;
  };
  mutable std::array<CachedLine, 8> lines;
};

struct PythonFrame {
  const CodeInfo* code = nullptr;  // valid until the next ReadStack()
  int line = -1;
  bool entry = false;  // the outermost frame of its native eval-loop call
};

enum class ReadOutcome {
  kOk,            // frames read (possibly none: the thread runs no Python now)
  kNoThread,      // no thread state of this tid (not a Python thread, or not yet known)
  kInconsistent,  // the chain changed while it was read, or could not be followed
};

struct InterpreterStats {
  uint64_t reads = 0;
  uint64_t frames = 0;
  uint64_t inconsistent = 0;
  uint64_t code_misses = 0;    // code objects copied into the cache
  uint64_t code_bytes = 0;     // what the cached code objects hold now (CodeBytes)
  uint64_t code_refused = 0;   // code objects not cached: the cache's bytes were spent
  uint64_t thread_scans = 0;   // walks of the thread-state lists
  uint64_t line_misses = 0;    // lines decoded from a line table (not found in CodeInfo::lines)
  uint64_t one_call_reads = 0;  // reads checked with the thread state's call alone
  uint64_t snapshot_reads = 0;  // reads from a FrameSnapshot (counted in reads too)
  uint64_t calibration_failures = 0;  // searches for the tid in struct pthread that failed
};

class Interpreter {
 public:
  // `bias`: the module's load bias in the process (absolute = vaddr + bias). `memory` null:
  // the process's memory through RemoteMemory(pid).
  static absl::StatusOr<std::unique_ptr<Interpreter>> Attach(
      pid_t pid, const InterpreterModule& module, int64_t bias,
      std::unique_ptr<RemoteMemory> memory = nullptr);

  // True when the absolute `pc` lies in the eval loop.
  bool InEvalLoop(uint64_t pc) const {
    for (const elf::AddressRange& r : eval_ranges_) {
      if (r.Contains(pc)) return true;
    }
    return false;
  }

  // Split-off parts of the eval loop that no symbol names run its native frames too (Debian's
  // stripped python3.14 runs most of its bytecode in its unnamed .cold part). From 3.12 each
  // native eval call keeps its entry frame, the shim below the Python frames it runs, in its
  // own stack frame: the native frame whose stack holds a read's entry frame (entry_frames())
  // is that call's, whatever its pc. While learns_eval_parts(), the caller looks for such
  // frames in reads with more groups than eval-loop frames (or none) and proposes the function
  // around each one's pc with ProposeEvalPart(); CountLearningRead() spends the budget.
  bool learns_eval_parts() const { return learning_reads_left_ > 0; }
  std::span<const uint64_t> entry_frames() const { return entry_frames_; }
  // Where the native eval call running the last read's innermost group keeps its state on its
  // own native stack frame: the _PyCFrame the chain was read through (3.11, 3.12), else that
  // group's shim (3.13+); 0: not known (before 3.11, no shim read). In a call's prologue, before
  // it publishes that state, and its epilogue, after it put back its caller's, the call's
  // native frame already (or still) runs but the chain's innermost group is its caller's: that
  // state then lies outside the native frame (3.11 enters a call per generator resumption).
  uint64_t innermost_call() const { return innermost_call_; }
  // Proposes an absolute range as a part of the eval loop; true when this adds it: once
  // kEvalPartConfirmations reads proposed it (a read made after the sample may pair a chain
  // with a stack it no longer matches), while fewer than kMaxEvalRanges are known.
  bool ProposeEvalPart(elf::AddressRange range);
  static constexpr uint32_t kEvalPartConfirmations = 3;
  void CountLearningRead() {
    if (learning_reads_left_ > 0) --learning_reads_left_;
  }
  static constexpr uint32_t kLearningReads = 4096;

  // The frames of thread `tid`, innermost first, into `out`; *count frames written.
  ReadOutcome ReadStack(pid_t tid, std::span<PythonFrame> out, size_t* count);
  // The same from the frames copied at a sample (FrameCapture): frames past the copied ones,
  // and code objects not in the cache or due for a check, are read from memory.
  ReadOutcome ReadSnapshot(const FrameSnapshot& snapshot, std::span<PythonFrame> out,
                           size_t* count);
  // What FrameCapture needs to copy thread `tid`'s frames: known once a ReadStack of it or
  // ThreadIds() found its thread state.
  std::optional<CaptureThread> CaptureThreadOf(pid_t tid);
  // The threads whose states the interpreter lists (walked again unless walked within the
  // last few milliseconds).
  std::vector<pid_t> ThreadIds();

  const Offsets& offsets() const { return offsets_; }
  const InterpreterStats& stats() const { return stats_; }
  // The code-object cache's bytes (CodeBytes of each entry): a line table may be 1 MiB, so
  // the count alone bounds it only at 64 GiB; 65,536 code objects of a few hundred bytes each
  // take tens of MiB.
  static constexpr size_t kMaxCodeBytes = size_t{64} << 20;
  int minor() const { return offsets_.minor; }

 private:
  Interpreter(pid_t pid, Offsets offsets, uint64_t runtime, std::vector<elf::AddressRange> eval,
              std::unique_ptr<RemoteMemory> memory)
      : pid_(pid),
        offsets_(offsets),
        runtime_(runtime),
        eval_ranges_(std::move(eval)),
        memory_(std::move(memory)) {}

  // A thread state found for a tid, and (3.11, 3.12) the _PyCFrame its last read went
  // through: the next read takes that _PyCFrame's current frame along with the thread state,
  // and uses it while the thread state still points there.
  // `hints`: where the frames of its last read lay (the used part of each block, up to a
  // little above, within the page: a deeper call's frame), read along with the thread state.
  struct Range {
    uint64_t start;
    uint32_t size;
  };
  static constexpr size_t kMaxHints = 4;
  struct KnownThread {
    uint64_t tstate = 0;  // 0: none, until the next walk of the thread states
    uint64_t cframe = 0;
    std::array<Range, kMaxHints> hints;
    size_t num_hints = 0;
    uint64_t leaf = 0;  // the innermost frame of its last read (0: none)
  };
  // The re-read of where the chain starts, made at the end of the thread state's call (after
  // the hints) when the thread has hints and a leaf: for a read that needs no other call, it
  // takes the place of ReadStack's re-read. `cframe` and `leaf`: where it was read.
  struct Recheck {
    bool read = false;
    uint64_t cframe = 0, leaf = 0;
    uint64_t frame_field = 0, current = 0, leaf_code = 0;
  };
  // The thread state of `tid` (cached, re-checked), or null. Its first tstate_bytes_ bytes go
  // to the start of scratch_, followed (when *cframe_current is set true) by the current
  // frame of the known _PyCFrame, and the thread's hints as blocks (blocks_), read in the
  // same call.
  KnownThread* ThreadStateOf(pid_t tid, bool* cframe_current);
  // Walks the interpreters' thread-state lists into thread_states_ (uses scratch_), unless
  // walked within kRescanGapNs: false then, or when the list is unreadable.
  bool WalkThreadStates();
  // The kernel tid of a thread state read into `bytes`, or -1.
  pid_t TidOf(const uint8_t* tstate);
  // Finds pthread_tid_offset_ (FindPthreadTid), at most once per kCalibrationRetryNs after
  // a failure.
  bool CalibratePthreadTid();
  bool FindPthreadTid();
  // The thread's innermost frame (0: none) from its state's `bytes` (see ThreadStateOf), or
  // false when unreadable.
  bool CurrentFrame(KnownThread& thread, const uint8_t* bytes, bool cframe_current,
                    uint64_t* frame);
  // Frame `address`'s first frame_size bytes: from a block of the chain read before, else
  // from a block read now (3.11+: the frame and what lies below it), or null when unreadable.
  const uint8_t* FrameBytes(uint64_t address);
  // The thread's hints from the blocks the last walk used.
  void KeepHints(KnownThread& thread);
  // A consistent chain_ (every frame's info set) into `out`, and what the next read of the
  // thread starts from.
  // `thread` null: a read from a snapshot (no hints kept).
  ReadOutcome Finish(KnownThread* thread, uint64_t leaf, std::span<PythonFrame> out,
                     size_t* count);
  // ReadStack and ReadSnapshot (`snapshot` non-null).
  ReadOutcome Read(pid_t tid, const FrameSnapshot* snapshot, std::span<PythonFrame> out,
                   size_t* count);
  // The code object at `address` whose first code_size bytes are `header` (read already, at
  // `now`).
  const CodeInfo* Code(uint64_t address, const uint8_t* header, uint64_t now);
  // What a cached code object counts against kMaxCodeBytes.
  static size_t CodeBytes(const CodeInfo& code);
  // The code objects of chain_'s frames without one, from the headers at the start of
  // code_headers_ (read at `now`, in chain order); false when one is unreadable.
  bool ChainCode(uint64_t now);
  // The line of `offset` in `code`.
  int LineOf(const CodeInfo& code, int64_t offset);
  bool ReadString(uint64_t address, std::string* out);
  bool ReadBytes(uint64_t address, std::string* out);

  static constexpr size_t kMaxThreads = 4096;
  static constexpr size_t kMaxCodeObjects = 1 << 16;
  static constexpr size_t kMaxStringBytes = 4096;
  static constexpr size_t kMaxTstateBytes = 512;
  // Blocks of a chain read, each at most kChainBlock bytes ending at the end of the frame it
  // was read for: a thread's data stack holds its frames in a row below the innermost.
  static constexpr size_t kChainBlock = 4096;
  static constexpr size_t kMaxChainBlocks = 8;
  static constexpr size_t kHintAbove = 512;
  // A cached code object is trusted this long after its header was last compared.
  static constexpr uint64_t kCodeRecheckNs = 1'000'000'000;
  // A failed search for the tid in struct pthread is tried again this long after.
  static constexpr uint64_t kCalibrationRetryNs = 1'000'000'000;

  pid_t pid_;
  Offsets offsets_;
  uint64_t runtime_;
  std::vector<elf::AddressRange> eval_ranges_;  // absolute
  uint32_t learning_reads_left_ = 0;
  uint64_t init_cleanup_ = 0;  // absolute; 0: known by its names only
  struct ProposedPart {
    elf::AddressRange range;
    uint32_t reads = 0;
  };
  std::vector<ProposedPart> proposed_parts_;  // at most kMaxProposedParts
  std::vector<uint64_t> entry_frames_;  // of the last read's groups, innermost first
  uint64_t innermost_call_ = 0;         // innermost_call() of the last read
  std::unique_ptr<RemoteMemory> memory_;
  uint32_t tstate_bytes_ = 0;  // bytes copied of a thread state
  absl::flat_hash_map<pid_t, KnownThread> thread_states_;
  // Before 3.11: offset of the kernel tid in glibc's struct pthread (-1: not found yet).
  int64_t pthread_tid_offset_ = -1;
  uint64_t calibration_failed_ns_ = 0;  // CLOCK_MONOTONIC of the last failure (0: none)
  uint64_t last_scan_ns_ = 0;  // CLOCK_MONOTONIC of the last walk of the thread states
  absl::flat_hash_map<uint64_t, std::unique_ptr<CodeInfo>> code_;
  // A code object was refused for want of bytes: the next read starts with an empty cache.
  bool code_full_ = false;
  // Per frame of the current read (sized once): its code object, instruction offset, entry
  // flag; then every code object's header, read in one go.
  struct ChainFrame {
    uint64_t code;
    int64_t offset;
    bool entry;
    const CodeInfo* info;  // from the cache, unchecked (see kCodeRecheckNs)
  };
  std::vector<ChainFrame> chain_;
  // The blocks of the current read: [start, start + size) of the target at scratch_[at], and
  // the part of it the walk used, [low, high).
  struct ChainBlock {
    uint64_t start;
    size_t size;
    size_t at;
    uint64_t low, high;
  };
  std::array<ChainBlock, kMaxHints + kMaxChainBlocks> blocks_;
  size_t num_blocks_ = 0;
  size_t blocks_read_ = 0;  // by FrameBytes, in the current read
  // Memory read after the thread state's call in the current read (so recheck_ came first).
  bool read_since_thread_ = false;
  Recheck recheck_;
  // The snapshot of the current read (FrameBytes takes its frames first), and its next frame.
  const FrameSnapshot* snapshot_ = nullptr;
  size_t snapshot_next_ = 0;
  // The current read's thread state, then its blocks (scratch_used_ bytes so far); sized once.
  std::vector<uint8_t> scratch_;
  size_t scratch_used_ = 0;
  std::array<uint8_t, kMaxCopiedStruct> frame_bytes_;  // a frame read alone
  std::vector<uint64_t> code_addresses_;
  std::vector<size_t> code_sizes_;
  std::vector<uint8_t> code_headers_;
  InterpreterStats stats_;
};

}  // namespace strata::agent::python

#endif  // STRATA_AGENT_PYTHON_INTERPRETER_H_
