// Unwind rules of a Go executable, from its .gopclntab (common/elf/go_pclntab.h): the data
// Go's own traceback (runtime/traceback.go) unwinds with, compiled once per module into rows
// the one unwinding loop (walk.h) steps with like CFI rows, so incremental unwinding and its
// verification work on Go stacks unchanged.
//
// Per Go function, its SP delta table (pcsp) becomes a short run list of rows:
//  - x86-64: CFA = SP + pcsp(pc) + 8, return address at CFA-8 (the CALL pushed it); the
//    caller's rbp at CFA-16 where Go's ABI saved it (a compiled function with a frame, at a
//    call site: its prologue stores rbp at the top of the frame), else rbp kept;
//  - MIPS64 (a link-register architecture): CFA = SP + pcsp(pc); a function with a frame
//    saved its return address at 0(SP) of that frame (CFA - pcsp); at a pc with no frame
//    (a leaf, before the prologue's SP adjustment, after the epilogue's) it is still in r31.
// Stack roots end the walk as complete (RaRule::kUndefined, StopReason::kOutermost): the
// functions Go marks TOPFRAME (runtime.goexit -- every goroutine's outermost frame --,
// runtime.mstart, runtime.rt0_go) and the SPWRITE ones that switch to a stack no saved state
// leads back from (gogo, ...). The stack switches Go's own profiler follows
// (runtime/traceback.go) are rows of their own (RaRule::kStackSwitch, with their SP deltas):
// systemstack, mcall and morestack on g0 lead to the goroutine's stack (g.m.curg.sched),
// asmcgocall under C code to the calling goroutine's (saved in its frame), cgocallback under a
// Go callback to g0's stack and the C code that called back (m.g0.sched.sp). The walk crosses
// them with the target's memory (AddressSpace::CrossStack); where it cannot, they end the
// stack as complete, like a root.
//
// Code outside the Go functions (C code linked into cgo programs, with its .eh_frame) is left
// to the architecture's own decoder, passed in as the fallback.
//
// Immutable after Build() but for its lookup cache (common/unwind/lookup_cache.h: the
// function and run of each address looked up, so a frame seen before costs one probe, not
// the searches over the functions and the function's runs), allocation-free to query, so one
// table is shared by every process mapping the module and can be used from a signal handler.
#ifndef STRATA_COMMON_UNWIND_GO_GO_RULES_H_
#define STRATA_COMMON_UNWIND_GO_GO_RULES_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/elf/go_pclntab.h"
#include "common/unwind/lookup_cache.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind::go {

struct GoRulesStats {
  size_t functions = 0;
  size_t roots = 0;
  size_t stack_switches = 0;  // of the roots, the stack switches (crossed with CrossStack)
  size_t runs = 0;
  size_t without_table = 0;  // functions whose pcsp table did not decode (no rule)
};

class GoRuleSource final : public RuleSource {
 public:
  // `fallback` (may be null): the rules for pcs outside every Go function.
  static std::unique_ptr<GoRuleSource> Build(Arch arch, const elf::GoPclntab& table,
                                             std::unique_ptr<RuleSource> fallback);

  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override;
  bool IsPlausibleReturnAddress(uint64_t return_address) const override;

  const GoRulesStats& stats() const { return stats_; }
  const RuleSource* fallback() const { return fallback_.get(); }

 private:
  struct Func {
    uint64_t start;
    uint64_t end;
    uint32_t first_run;
    uint32_t num_runs;
    bool root;
    bool compiled;  // not assembly: Go's prologue saves rbp in every frame
    StackSwitch stack_switch;  // a root that switches stacks (its rows: kStackSwitch)
    // Where the return address is saved, from sp, when not at 0(SP) (link-register
    // architectures); 0: the usual place.
    uint16_t ra_at_sp = 0;
  };
  struct Run {
    uint32_t start;  // offset from the function's start
    int32_t sp;
  };
  // Text is indexed in buckets of 4 KiB, like the Go runtime's findfunctab: a lookup
  // searches the few functions of one bucket instead of all of them.
  static constexpr int kBucketShift = 12;

  // Where an address lies: its function (null: in none) and the index in runs_ of the run
  // covering it (kNoRun: before the function's first run, or no runs).
  struct Location {
    const Func* func = nullptr;
    uint32_t run = kNoRun;
  };
  static constexpr uint32_t kNoRun = 0xffffffffu;

  GoRuleSource() = default;
  const Func* FindFunc(uint64_t pc) const;
  Location Locate(uint64_t pc) const;  // through cache_
  void IndexBuckets();

  Arch arch_ = Arch::kX86_64;
  std::vector<Func> funcs_;  // sorted by start, disjoint
  // bucket_first_[b]: the first function that ends after bucket b's first byte (from
  // funcs_.front().start); a pc in bucket b lies in one of bucket_first_[b] ..
  // bucket_first_[b + 1], or in none. One more entry than buckets; empty when the text's span
  // is implausible for its number of functions (a corrupt table: every function is searched).
  std::vector<uint32_t> bucket_first_;
  std::vector<Run> runs_;
  // Offset from funcs_.front().start -> func index << kRunBits | the run's index in the
  // function (kNoRunInFunc: none), or kNotInFunc.
  LookupCache cache_;
  static constexpr int kRunBits = 12;
  static constexpr uint32_t kNoRunInFunc = (1u << kRunBits) - 1;
  static constexpr uint32_t kNotInFunc = 0xffffffffu;
  std::unique_ptr<RuleSource> fallback_;
  GoRulesStats stats_;
};

// The row for a Go frame whose SP delta at the pc is `sp_delta` (exposed for tests).
// `saved_fp`: the frame holds the caller's rbp at CFA-16 (x86-64 only).
UnwindRow GoRow(Arch arch, int32_t sp_delta, bool saved_fp = false);

// Builds the Go rules of `elf` when it has a .gopclntab (NotFound otherwise), with `fallback`
// for the code outside Go functions.
absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(Arch arch, const elf::ElfFile& elf,
                                                            std::unique_ptr<RuleSource> fallback);

}  // namespace strata::unwind::go

#endif  // STRATA_COMMON_UNWIND_GO_GO_RULES_H_
