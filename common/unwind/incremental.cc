#include "common/unwind/incremental.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/unwind/walk.h"

namespace strata::unwind {

std::string_view VerifyModeName(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kOff: return "off";
    case VerifyMode::kBoundary: return "boundary";
    case VerifyMode::kFull: return "full";
  }
  return "unknown";
}

absl::StatusOr<VerifyMode> ParseVerifyMode(std::string_view name) {
  if (name == "off") return VerifyMode::kOff;
  if (name == "boundary") return VerifyMode::kBoundary;
  if (name == "full") return VerifyMode::kFull;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown unwind verification mode '", std::string(name),
                   "' (expected full, boundary or off)"));
}

void IncrementalTotals::Add(const SampleStats& s) {
  ++samples;
  frames_unwound += s.frames_unwound;
  frames_reused += s.frames_reused;
  frames_verified += s.frames_verified;
  frames_beyond_copy += s.frames_beyond_copy;
  frames_rederived += s.frames_rederived;
  jit_frames_cfi += s.jit_frames_cfi;
  jit_frames_fp += s.jit_frames_fp;
  splices += s.spliced;
  verify_failures += s.verify_failed;
  invalidations += s.invalidated;
}

IncrementalUnwinder::IncrementalUnwinder(const IncrementalOptions& options)
    : options_(options),
      capacity_(std::max<size_t>(options.unwind.max_frames, 1)) {
  if (options_.verify != VerifyMode::kOff) {  // kOff keeps nothing between samples
    cached_.reset(new Element[capacity_]);
    scratch_.reset(new Element[capacity_]);
  }
}

IncrementalUnwinder::~IncrementalUnwinder() = default;

void IncrementalUnwinder::Invalidate() {
  num_cached_ = 0;
  cached_unspliceable_ = false;
  cached_stack_end_ = 0;
}

UnwindResult IncrementalUnwinder::Unwind(const SampleInput& in, const AddressSpace& space,
                                         Frame* frames, size_t capacity, SampleStats* stats) {
  SampleStats local;
  SampleStats* s = stats != nullptr ? stats : &local;
  *s = SampleStats{};
  const size_t limit = std::min({capacity, options_.unwind.max_frames, capacity_});
  UnwindResult result;
  if (options_.verify == VerifyMode::kOff || limit == 0) {
    result = unwind::Unwind(options_.unwind, in.regs, in.stack, space, frames, limit);
    s->frames_unwound = static_cast<uint32_t>(result.num_frames);
  } else {
    const uint64_t stack_end = in.stack.start + in.stack.size;
    if (num_cached_ > 0 &&
        (in.epoch != cached_epoch_ ||
         (in.stack_end_known && cached_stack_end_ != 0 && stack_end != cached_stack_end_))) {
      Invalidate();
      s->invalidated = true;
    }
    cached_epoch_ = in.epoch;
    if (in.stack_end_known) cached_stack_end_ = stack_end;
    result = UnwindAndCache(in, space, frames, limit, s);
  }
  s->jit_frames_cfi = result.jit_frames_cfi;
  s->jit_frames_fp = result.jit_frames_fp;
  totals_.Add(*s);
  return result;
}

// Re-derives the caller of a reused element from the new stack bytes with its cached row,
// `fp` being the element's current incoming fp (the general check, where the word compare of
// VerifyRun cannot decide). For sp-based rows the CFA and the slot addresses depend only on
// the element's sp and row, which are the cached ones, so only the words read from the stack
// (return address, saved fp) can differ: read just those. Other rows take the general step.
inline bool IncrementalUnwinder::VerifyStep(Arch arch, const Element& el, uint64_t fp,
                                            const StackSnapshot& stack, Registers* caller,
                                            uint64_t* slot) {
  const UnwindRow& row = el.row;
  if (row.cfa_base == UnwindRow::CfaBase::kSp && row.ra_rule == UnwindRow::RaRule::kAtCfaOffset) {
    const bool be = IsBigEndian(arch);
    const uint64_t cfa = el.sp + static_cast<int64_t>(row.cfa_offset);
    *slot = cfa + static_cast<int64_t>(row.ra_offset);
    caller->sp = cfa;
    caller->ra = 0;
    caller->fp = fp;
    if (!stack.Read64(*slot, be, &caller->pc)) return false;
    return row.fp_rule != UnwindRow::FpRule::kAtCfaOffset ||
           stack.Read64(cfa + static_cast<int64_t>(row.fp_offset), be, &caller->fp);
  }
  return StepWithRow(arch, row, {el.pc, el.sp, fp, 0}, false, stack, caller, slot);
}

inline void IncrementalUnwinder::Seal(Arch arch, Element& el, const UnwindRow& row,
                                      const Registers& regs, uint64_t ra_slot,
                                      const Registers& caller) {
  el.fp = regs.fp;
  el.ra_slot = ra_slot;
  el.ra_word = IsBigEndian(arch) ? __builtin_bswap64(caller.pc) : caller.pc;
  el.fp_slot = ra_slot;
  if (row.ra_rule == UnwindRow::RaRule::kSignalFrame) {
    // Offsets from sp, not from a CFA. Such elements are never verified (see the walk), so
    // this only keeps the element self-consistent.
    if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset) {
      el.fp_slot = regs.sp + static_cast<int64_t>(row.fp_offset);
    }
  } else if (row.fp_rule == UnwindRow::FpRule::kAtCfaOffset) {
    const uint64_t cfa = (row.cfa_base == UnwindRow::CfaBase::kFp ? regs.fp : regs.sp) +
                         static_cast<int64_t>(row.cfa_offset);
    el.fp_slot = cfa + static_cast<int64_t>(row.fp_offset);
  }
}

// Why comparing words is enough. Element q was stepped, in an earlier sample, with its row
// from (pc, sp, fp) and read its caller's pc at ra_slot, a function of (sp or fp, row) only.
// If q's pc and sp are the cached ones -- true for the splice element, and inductively for
// every element whose callee's return-address word compared equal (the callee's caller sp is
// its CFA, fixed by the same inputs) -- and, for an fp-based row, its incoming fp is the one
// the slots were derived with, the step reads the same slots, so it yields the cached caller
// exactly when the return-address word is unchanged. That is the patent's comparison of the
// reference map with the live stack and needs no row math per frame. The fp itself is not
// compared where no row depends on it (rbp is an ordinary register in code built without
// frame pointers, and its saved copies change freely): the run only remembers where the
// latest saved fp sits and reads it when an fp-based row, or the caller of this function,
// needs the value.
//
// Accepts elements cached[q], cached[q-1], ... (outwards) while that holds, their slots lie
// inside the copy and fewer than `room` frames have been accepted. Returns the number
// accepted; `frames` receives the callers, with the callee's ra_slot filled in (frames[-1]
// is cached[q]'s frame). `fp`: in, cached[q]'s incoming fp; out, that of the first element
// not accepted (or of cached[0]).
size_t IncrementalUnwinder::VerifyRun(Arch arch, const Element* cached, size_t q, size_t room,
                                      const StackSnapshot& stack, uint64_t* fp, Frame* frames) {
  if (stack.size < 8) return 0;
  const bool be = IsBigEndian(arch);
  const uint64_t start = stack.start;
  const uint64_t last = stack.size - 8;  // highest readable offset
  const uint8_t* data = stack.data;
  const uint8_t* fp_at = nullptr;  // the latest restored fp in the copy; null: still *fp
  auto current_fp = [&] {
    if (fp_at == nullptr) return *fp;
    uint64_t v;
    std::memcpy(&v, fp_at, 8);
    return be ? __builtin_bswap64(v) : v;
  };
  const size_t stop = q > room ? q - room : 0;
  frames[-1].ra_slot = cached[q].ra_slot;  // cleared again below when nothing is accepted
  size_t i = q;
  for (; i > stop; --i) {
    const Element& e = cached[i];
    const uint64_t ra_off = e.ra_slot - start;
    const uint64_t fp_off = e.fp_slot - start;
    if (ra_off > last || fp_off > last) break;
    if (e.row.cfa_base != UnwindRow::CfaBase::kSp && current_fp() != e.fp) break;
    uint64_t ra;
    std::memcpy(&ra, data + ra_off, 8);
    if (ra != e.ra_word) break;
    if (e.row.fp_rule == UnwindRow::FpRule::kAtCfaOffset) fp_at = data + fp_off;
    // The caller's own ra_slot goes in with it (one store less per frame); it holds only
    // once the caller is accepted in turn, so the last frame written is cleared below.
    const Element& up = cached[i - 1];
    *frames++ = {up.pc, up.sp, up.ra_slot};
  }
  frames[-1].ra_slot = 0;
  *fp = current_fp();
  return q - i;
}

namespace {

// For the cache's outermost element, whose walk ended with kOutermost in an earlier sample:
// true when stepping it with its cached row ends the walk again (an undefined return address,
// a zero return address, or a word outside the copy), with the stop reason in `stop`.
// False: it has a caller now; the walk must go on with lookups.
template <typename Element>
bool OutermostEnds(Arch arch, const Element& el, uint64_t fp, const StackSnapshot& stack,
                   StopReason* stop) {
  const UnwindRow& row = el.row;
  if (row.ra_rule == UnwindRow::RaRule::kUndefined) {
    *stop = StopReason::kOutermost;
    return true;
  }
  if (row.cfa_base == UnwindRow::CfaBase::kUndefined ||
      row.ra_rule != UnwindRow::RaRule::kAtCfaOffset) {
    return false;
  }
  Registers caller;
  uint64_t slot = 0;
  if (!StepWithRow(arch, row, {el.pc, el.sp, fp, 0}, false, stack, &caller, &slot)) {
    *stop = StopReason::kStackOutOfRange;
    return true;
  }
  if (caller.pc == 0) {
    *stop = StopReason::kOutermost;
    return true;
  }
  return false;
}

}  // namespace

// The incremental unwinder's part of the shared walk (walk.h): every frame found with rule
// lookups gets an element in scratch_, and the first step that matches a cached element
// splices the cached outer frames in. Taking the walk's steps from walk.h makes the output
// interchangeable with a full unwind; incremental_test.cc checks this frame for frame.
struct IncrementalUnwinder::Hooks {
  IncrementalUnwinder& self;
  const Arch arch;
  const StackSnapshot& stack;
  SampleStats* const s;
  size_t ns = 1;          // scratch elements written (frames found with rule lookups)
  size_t inner = 0;       // scratch elements before the splice point
  size_t lo = 0, hi = 0;  // reused cached elements [lo, hi] (outer-first indices)
  bool spliced = false;
  // Candidate splice element: cached elements are outer-first and their slots rise towards
  // index 0, like the new walk's slots, so one cursor moving outwards finds every match.
  size_t cursor;
  // Never splice across a signal frame. Its step reads the interrupted pc, sp AND fp from
  // the signal context, so the caller's sp is not a function of (sp, row) and the word
  // compare of a reused element proves nothing about it; and a later signal delivered at
  // the same depth reproduces the handler's slots and return addresses exactly while the
  // interrupted context differs. So a sample whose previous stack held a signal frame is
  // unwound in full, and a signal frame's own step is never a splice point. (Splicing the
  // interrupted chain outside a signal frame to a cache without one is sound: those are
  // ordinary frames.) Samples inside signal handlers are rare enough for the full cost.
  bool can_splice;
  bool saw_signal = false;
  // Likewise never across a stack switch (RaRule::kStackSwitch): the frames beyond it are on
  // another stack, outside the sample's copy and out of the slot order the cursor relies on,
  // read from the process's memory after the sample. A sample whose previous stack crossed
  // one is unwound in full, and the walk stops looking for a splice point once it crossed.
  bool saw_switch = false;
  Element* cur_el;  // the element of the frame being left

  // The row goes straight into the element (no copy through a local: the rule source
  // writes it field by field, and reading it back whole would stall).
  UnwindRow& Row(const WalkState&) { return cur_el->row; }

  void Found(const WalkState& w, const UnwindRow& row) {
    cur_el->fp = w.regs.fp;
    saw_signal |= row.ra_rule == UnwindRow::RaRule::kSignalFrame;
  }

  WalkAction AtCaller(WalkState& w, WalkOutput& out, const UnwindRow& row, const WalkStep& step,
                      StopReason* stop) {
    if (step.crossed) {
      saw_switch = true;
      can_splice = false;
    }
    if (!can_splice || !step.sp_rises || step.ra_slot == 0 || step.interrupted) {
      return WalkAction::kGoOn;
    }
    const Element* cached = self.cached_.get();
    while (cursor > 0 && (cached[cursor].ra_slot == 0 || cached[cursor].ra_slot < step.ra_slot)) {
      --cursor;
    }
    if (cursor == 0 || cached[cursor].ra_slot != step.ra_slot ||
        cached[cursor - 1].pc != step.caller.pc || cached[cursor - 1].sp != step.caller.sp) {
      return WalkAction::kGoOn;
    }
    return Splice(w, out, row, step, stop);
  }

  void Left(const WalkState& w, const UnwindRow& row, const WalkStep& step) {
    Seal(arch, *cur_el, row, w.regs, step.ra_slot, step.caller);
    self.scratch_[ns++] = {step.caller.pc, step.caller.sp, step.caller.fp, 0, 0, 0, {}};
    cur_el = &self.scratch_[ns - 1];
  }

  WalkAction Splice(WalkState& w, WalkOutput& out, const UnwindRow& row, const WalkStep& step,
                    StopReason* stop);

  // Continues the walk from a reused element (the cache's outermost frame, or where full
  // verification diverged): from there on, rule lookups as usual.
  WalkAction ResumeFrom(WalkState& w, WalkOutput& out, Element& el, uint64_t fp,
                        StopReason* stop) {
    cur_el = &el;
    el.ra_slot = 0;
    out.frames[out.n - 1].ra_slot = 0;
    can_splice = false;
    if (!w.MoveTo({el.pc, el.sp, fp, 0}, /*exact=*/false)) {
      *stop = StopReason::kNoModule;
      return WalkAction::kStop;
    }
    return WalkAction::kResumed;
  }
};

// The boundary element matches: the caller is cached element cursor - 1.
// Works on a local frame count (stores to frames[] could alias out.n) and hands it back in
// `out` whenever it returns.
WalkAction IncrementalUnwinder::Hooks::Splice(WalkState& w, WalkOutput& out, const UnwindRow& row,
                                              const WalkStep& step, StopReason* stop) {
  Frame* const frames = out.frames;
  const size_t limit = out.limit;
  size_t n = out.n;
  Element* const cached = self.cached_.get();
  if (n >= limit) {
    *stop = StopReason::kMaxFrames;
    out.n = n;
    return WalkAction::kStop;
  }
  const size_t c = cursor - 1;
  can_splice = false;
  spliced = true;
  inner = ns;
  frames[n - 1].ra_slot = step.ra_slot;
  Seal(arch, *cur_el, row, w.regs, step.ra_slot, step.caller);
  hi = c;
  if (self.options_.verify != VerifyMode::kFull) {
    const size_t keep = std::min(c + 1, limit - n);
    lo = c + 1 - keep;
    // Locals: stores to frames[] could alias the copy's bounds and the count in memory.
    const StackSnapshot copy = stack;
    uint32_t beyond_copy = 0;
    for (size_t q = c + 1; q-- > lo;) {
      const Element& el = cached[q];
      frames[n++] = {el.pc, el.sp, el.ra_slot};
      beyond_copy += el.ra_slot != 0 && !copy.Contains(el.ra_slot, 8);
    }
    s->frames_beyond_copy += beyond_copy;
    s->frames_reused += static_cast<uint32_t>(keep);
    if (keep < c + 1) {
      frames[n - 1].ra_slot = 0;
      *stop = StopReason::kMaxFrames;
      out.n = n;
      return WalkAction::kStop;
    }
    // A cache that ended because its copy or its array ran out may continue further out
    // now; everything else ended for a reason that belongs to the reused frames.
    if (self.cached_stop_ == StopReason::kMaxFrames ||
        self.cached_stop_ == StopReason::kStackOutOfRange) {
      out.n = n;
      return ResumeFrom(w, out, cached[0], cached[0].fp, stop);
    }
    *stop = self.cached_stop_;
    out.n = n;
    return WalkAction::kStop;
  }
  // Full verification of every reused element against the new bytes: the word compare of
  // VerifyRun, and where it cannot decide (a word or an fp-based row's fp differs, the copy
  // or the output ends), a re-derivation with the cached row (no lookups) that decides
  // exactly like the full unwind. Any difference in slot, return address or sp ends the reuse
  // there.
  uint64_t fp = step.caller.fp;  // the incoming fp of cached[q]
  frames[n++] = {cached[c].pc, cached[c].sp, 0};
  size_t verified = 1;
  size_t q = c;
  bool stopped = false;
  while (q > 0) {
    const size_t k = VerifyRun(arch, cached, q, limit - n, stack, &fp, frames + n);
    n += k;
    q -= k;
    verified += k;
    if (q == 0) break;
    Element& el = cached[q];
    Registers nx;
    uint64_t slot = 0;
    ++s->frames_rederived;
    if (!VerifyStep(arch, el, fp, stack, &nx, &slot)) {
      *stop = StopReason::kStackOutOfRange;
      stopped = true;
      break;
    }
    const Element& up = cached[q - 1];
    if (slot != el.ra_slot || nx.pc != up.pc || nx.sp != up.sp) {
      s->verify_failed = true;
      break;  // resume the walk with lookups from el
    }
    if (n >= limit) {
      *stop = StopReason::kMaxFrames;
      stopped = true;
      break;
    }
    frames[n - 1].ra_slot = slot;
    Seal(arch, el, el.row, {el.pc, el.sp, fp, 0}, slot, nx);
    fp = nx.fp;
    frames[n++] = {up.pc, up.sp, 0};
    ++verified;
    --q;
  }
  s->frames_reused += static_cast<uint32_t>(verified);
  s->frames_verified += static_cast<uint32_t>(verified);
  lo = q;
  if (stopped) {
    cached[q].ra_slot = 0;
    out.n = n;
    return WalkAction::kStop;
  }
  // The outermost cached frame (or the diverging one) is stepped with lookups, so the stop
  // reason is exactly the full unwind's -- except in the steady state where the cache's
  // outermost frame ended the walk: its row is a function of its pc and the mappings, both
  // unchanged, so stepping it with the cached row decides the same without the lookups.
  if (q == 0 && self.cached_stop_ == StopReason::kOutermost &&
      OutermostEnds(arch, cached[0], fp, stack, stop)) {
    cached[0].fp = fp;
    out.n = n;
    return WalkAction::kStop;
  }
  out.n = n;
  return ResumeFrom(w, out, cached[q], fp, stop);
}

UnwindResult IncrementalUnwinder::UnwindAndCache(const SampleInput& in, const AddressSpace& space,
                                                 Frame* frames, size_t limit, SampleStats* s) {
  scratch_[0] = {in.regs.pc, in.regs.sp, in.regs.fp, 0, 0, 0, {}};
  Hooks hooks{.self = *this,
              .arch = options_.unwind.arch,
              .stack = in.stack,
              .s = s,
              .cursor = num_cached_ > 0 ? num_cached_ - 1 : 0,
              .can_splice = num_cached_ > 1 && !cached_unspliceable_,
              .cur_el = &scratch_[0]};
  const UnwindResult result =
      Walk(options_.unwind, in.regs, in.stack, space, frames, limit, hooks);
  const size_t ns = hooks.ns;
  s->spliced = hooks.spliced;
  s->frames_unwound = static_cast<uint32_t>(ns);

  // New cache, outer-first: [frames found beyond the reused part] [reused cached_[lo..hi]]
  // [frames found inside the splice point]. In steady state lo == 0 and nothing beyond was
  // found, so the outer part stays in place and only the inner part is written.
  const size_t inner = hooks.spliced ? hooks.inner : ns;
  const size_t lo = hooks.lo;
  const size_t keep = hooks.spliced ? hooks.hi - lo + 1 : 0;
  const size_t outer_new = ns - inner;
  s->outer_kept = keep > 0 && lo == 0 && outer_new == 0 ? static_cast<uint32_t>(keep) : 0;
  if (keep > 0 && lo != outer_new) {
    std::memmove(&cached_[outer_new], &cached_[lo], keep * sizeof(Element));
  }
  for (size_t i = 0; i < outer_new; ++i) cached_[outer_new - 1 - i] = scratch_[inner + i];
  for (size_t i = 0; i < inner; ++i) cached_[outer_new + keep + inner - 1 - i] = scratch_[i];
  num_cached_ = outer_new + keep + inner;
  cached_stop_ = result.stop;
  // Reused elements never hold a signal frame or a stack switch (no splice when the cache had
  // one), so the frames found with lookups tell whether the new cache does.
  cached_unspliceable_ = hooks.saw_signal || hooks.saw_switch;
  return result;
}

}  // namespace strata::unwind
