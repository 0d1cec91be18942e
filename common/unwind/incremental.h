// Per-thread incremental unwinding (seed 000: efficient call sequence restoration).
//
// A thread sampled at 99 Hz usually sits in the same outer call chain sample after sample;
// only the innermost frames change. IncrementalUnwinder keeps, per thread, the previous
// sample's procedure-linkage elements -- for every frame: its pc, sp, fp, the stack address
// of the slot its return address was read from (ra_slot) and the unwind row that was used --
// and on a new sample:
//
//  1. unwinds from the leaf with the normal rule lookups (AddressSpace + RuleSource): the
//     walk of unwind::Unwind() itself (walk.h), with the cache hooked into it;
//  2. after every step compares the (ra_slot, return address, caller sp) just read from the
//     live stack copy with the cached elements (slots are sorted, so one forward cursor);
//  3. at the first match, the caller and everything outside it is the cached outer part:
//     - VerifyMode::kBoundary: only that splice element is compared (the patent's lowest
//       confidence threshold). The cached outer frames are copied as they are.
//     - VerifyMode::kFull: every cached outer element is checked against the new stack
//       bytes -- the patent's full comparison of the reference map with the live stack: the
//       return-address word at its cached slot is compared with the cached one, a load and a
//       compare per frame and no row math, because with the same (pc, sp) an sp-based row
//       reads the same slots and yields the same caller sp. The fp is tracked lazily (the
//       slot of the last restored fp) and compared only for fp-based rows, whose slots depend
//       on it. Where a word or such an fp differs, the element is re-derived with its cached
//       row (StepWithRow, no rule lookups); a difference in slot, return address or sp
//       discards the rest of the splice and the walk continues from the diverging frame with
//       rule lookups. Since a row depends only on (pc, mappings), the result is frame for
//       frame what unwind::Unwind() returns.
//     - VerifyMode::kOff: no cache, every sample is unwound fully (the reference): the same
//       object and call for an owner whose threads are unwound in any mode.
//
// Frames beyond the copied stack bytes. A cached element whose slot lies outside the new
// copy (the thread went deeper than the copy reaches) cannot be compared. kFull never reuses
// it: verification fails there, exactly like a full unwind stops (kStackOutOfRange). kBoundary
// reuses it: it was read from real bytes in an earlier sample of the same thread, the
// mappings epoch and the stack range are unchanged, and the thread cannot have unwound past
// it without changing the matched boundary element below it (outside longjmp-style stack
// switching at the same slot with the same return address). Such frames are counted in
// SampleStats::frames_beyond_copy so the trade-off is visible.
//
// Signal frames (RaRule::kSignalFrame) are unwound through like in unwind::Unwind() (the
// interrupted frame's pc is exact), but never spliced across: when the previous sample's
// stack held a signal frame the new sample is unwound in full, and a signal frame's step is
// never a splice point (the reasons are at the walk in incremental.cc).
//
// Stack switches (RaRule::kStackSwitch, Go's) are crossed like in unwind::Unwind(), and
// likewise never spliced across: the frames beyond a crossing lie on another stack, read from
// the process's memory, not from the sample's copy. A sample whose previous stack crossed
// one is unwound in full; samples that stay on one stack keep their reuse.
//
// JIT frames (AddressSpace::LookupJit) without rules are left by the frame-pointer row, an
// fp-based row like that of any frame-pointer code: their elements cache it, and full
// verification re-derives them when the fp they were stepped with changed, as for any
// fp-based row. A JIT region mapped or unmapped is a mappings change like dlopen/dlclose.
//
// Invalidation: a different mappings epoch (dlopen/dlclose/exec: the owner passes a counter it
// bumps whenever the process's AddressSpace changes), a change of the stack range (see
// SampleInput::stack_end_known), and Invalidate() (owner: on exec, on thread exit; or simply
// destroy the object).
//
// Ownership and cost: one object per thread, owned by whoever tracks threads (the agent).
// Its arrays are allocated once in the constructor (options.max_frames elements; none for
// kOff), so Unwind() never allocates. Not thread-safe; architecture-neutral (x86-64 and
// MIPS64 as data, like unwind::Unwind()).
#ifndef STRATA_COMMON_UNWIND_INCREMENTAL_H_
#define STRATA_COMMON_UNWIND_INCREMENTAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind {

enum class VerifyMode : uint8_t { kOff, kBoundary, kFull };

std::string_view VerifyModeName(VerifyMode mode);  // "off", "boundary", "full"
absl::StatusOr<VerifyMode> ParseVerifyMode(std::string_view name);

struct IncrementalOptions {
  UnwindOptions unwind;  // arch, max_frames (the per-thread array size), fp fallback
  VerifyMode verify = VerifyMode::kFull;
};

// One sample as seen by the incremental unwinder.
struct SampleInput {
  Registers regs;
  StackSnapshot stack;
  // Changes whenever the process's mappings change (the owner's refresh counter).
  uint64_t epoch = 0;
  // True when the copy ended at the end of the thread's stack (it is shorter than requested):
  // then stack.start + stack.size is the stack's top, and a different top than the cached
  // one means the thread runs on another stack (tid reused, stack switched): invalidate.
  bool stack_end_known = false;
};

struct SampleStats {
  uint32_t frames_unwound = 0;      // frames whose caller was found with rule lookups
  uint32_t frames_reused = 0;       // frames copied from the cache
  uint32_t frames_verified = 0;     // of those, re-derived from the new bytes (kFull)
  uint32_t frames_beyond_copy = 0;  // reused frames whose ra slot is outside the copy
  // Reused elements full verification re-derived with their cached row because the word
  // compare could not decide (a word differed, the fp an fp-based row depends on differed,
  // the copy or the output ended there); includes the one where a difference ended reuse.
  uint32_t frames_rederived = 0;
  // Outermost frames of this sample that are the previous sample's outermost frames, index
  // for index counted from the outside (reused in place: same elements, nothing found
  // beyond them). Per-frame data an owner keeps outer-first alongside the frames (function
  // nodes, edge IDs of the path prefix) stays valid for these; 0 after any other change.
  uint32_t outer_kept = 0;
  // Of the frames_unwound, those in JIT code (AddressSpace::LookupJit), by how they were left:
  // with rules describing the JIT code, or by frame pointers. Reused frames are not counted
  // again (they were when found).
  uint32_t jit_frames_cfi = 0;
  uint32_t jit_frames_fp = 0;
  bool spliced = false;             // a cached element matched
  bool verify_failed = false;       // kFull found a changed element after the splice point
  bool invalidated = false;         // the cache was dropped (epoch / stack range change)
};

struct IncrementalTotals {
  uint64_t samples = 0;
  uint64_t frames_unwound = 0;
  uint64_t frames_reused = 0;
  uint64_t frames_verified = 0;
  uint64_t frames_beyond_copy = 0;
  uint64_t frames_rederived = 0;
  uint64_t jit_frames_cfi = 0;
  uint64_t jit_frames_fp = 0;
  uint64_t splices = 0;
  uint64_t verify_failures = 0;
  uint64_t invalidations = 0;
  void Add(const SampleStats& s);
};

class IncrementalUnwinder {
 public:
  explicit IncrementalUnwinder(const IncrementalOptions& options);
  ~IncrementalUnwinder();
  IncrementalUnwinder(const IncrementalUnwinder&) = delete;
  IncrementalUnwinder& operator=(const IncrementalUnwinder&) = delete;

  // Unwinds `in` into `frames` (innermost first, at most min(capacity, max_frames)), with the
  // same contract as unwind::Unwind(), and remembers the result for the next sample of this
  // thread. `stats` (optional) receives this sample's figures.
  UnwindResult Unwind(const SampleInput& in, const AddressSpace& space, Frame* frames,
                      size_t capacity, SampleStats* stats = nullptr);

  // Forgets the cached elements (exec, thread exit, mapping change known to the owner).
  void Invalidate();

  const IncrementalOptions& options() const { return options_; }
  const IncrementalTotals& totals() const { return totals_; }
  size_t cached_frames() const { return num_cached_; }

 private:
  // One procedure-linkage element: a frame and how it was left.
  struct alignas(64) Element {  // one cache line each
    uint64_t pc;
    uint64_t sp;
    // The fp the step out of this frame was derived with: ra_slot, fp_slot and the caller's
    // sp are functions of (sp or fp, row). Not necessarily the frame's latest fp (full
    // verification does not write back fp values that no row depends on).
    uint64_t fp;
    uint64_t ra_slot;  // slot of the return address into the caller; 0 = none
    // The return address read at ra_slot, in target byte order as it sits in memory (the
    // word full verification compares). Valid when ra_slot != 0.
    uint64_t ra_word;
    // Slot of the saved fp when the row restores fp, otherwise ra_slot (so the bounds check
    // of full verification needs no branch on the row).
    uint64_t fp_slot;
    UnwindRow row;  // the row used to step out of this frame
  };
  static bool VerifyStep(Arch arch, const Element& el, uint64_t fp, const StackSnapshot& stack,
                         Registers* caller, uint64_t* slot);
  // Records how `el` was left: `row` applied to `regs` read `caller` from the stack.
  static void Seal(Arch arch, Element& el, const UnwindRow& row, const Registers& regs,
                   uint64_t ra_slot, const Registers& caller);
  static size_t VerifyRun(Arch arch, const Element* cached, size_t q, size_t room,
                          const StackSnapshot& stack, uint64_t* fp, Frame* frames);

  // The splice into the shared walk (walk.h), defined in incremental.cc.
  struct Hooks;
  UnwindResult UnwindAndCache(const SampleInput& in, const AddressSpace& space, Frame* frames,
                              size_t limit, SampleStats* stats);

  IncrementalOptions options_;
  size_t capacity_;
  // The previous sample's elements, OUTERMOST FIRST: the outer part stays in place and a new
  // sample only rewrites the inner part after the splice point.
  std::unique_ptr<Element[]> cached_;
  size_t num_cached_ = 0;
  StopReason cached_stop_ = StopReason::kOutermost;
  // A cached element is a signal frame or a crossed stack switch: do not splice.
  bool cached_unspliceable_ = false;
  uint64_t cached_epoch_ = 0;
  uint64_t cached_stack_end_ = 0;  // 0 = unknown
  // Elements of the frames unwound in the current sample, innermost first.
  std::unique_ptr<Element[]> scratch_;
  IncrementalTotals totals_;
};

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_INCREMENTAL_H_
