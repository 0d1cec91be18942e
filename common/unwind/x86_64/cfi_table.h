// x86-64 unwind rules of one module, compiled once from its DWARF CFI (.eh_frame, found
// through .eh_frame_hdr when present, and .debug_frame) into a compact sorted row table:
// pc range -> UnwindRow (CFA = rsp/rbp + offset, return address at CFA-8, saved rbp rule).
//
// Per sample a lookup is a direct-mapped cache probe, then a binary search over 32-bit
// offsets. The table is immutable after Build(); the cache is lock-free (single 64-bit
// relaxed atomics), so one table is shared by every thread and process mapping the module and
// is usable from a signal handler.
//
// Signal trampolines (FDEs with the 'S' augmentation, glibc's __restore_rt) compile to
// RaRule::kSignalFrame rows: the interrupted rip/rsp/rbp at fixed offsets from rsp, taken from
// glibc's DW_OP_breg7 expressions, or from the kernel's sigframe layout when the FDE covers
// the `mov $15,%rax; syscall` trampoline code but says it differently.
//
// CFI that a row cannot represent (CFA expressions other than the PLT and signal-frame
// patterns, registers other than rsp/rbp as CFA base, rbp/rip rules other than
// offset/same/undefined, other signal frames) is counted in CfiStats and its pc ranges are
// marked unrepresentable: FindRow() then returns a row with cfa_base == kUndefined so the
// unwinder stops with kNoRule instead of guessing.
#ifndef STRATA_COMMON_UNWIND_X86_64_CFI_TABLE_H_
#define STRATA_COMMON_UNWIND_X86_64_CFI_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"
#include "common/unwind/lookup_cache.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind::x86_64 {

struct CfiStats {
  uint64_t cies = 0;
  uint64_t fdes = 0;
  uint64_t cie_programs_run = 0;       // once per CIE, whatever the number of its FDEs
  uint64_t debug_frame_fdes = 0;       // FDEs taken from .debug_frame
  uint64_t overlapping_fdes = 0;       // dropped: range already covered
  uint64_t bad_records = 0;            // malformed CIE/FDE skipped
  uint64_t bad_instructions = 0;       // FDEs whose CFA program was malformed (dropped)
  uint64_t rows = 0;                   // entries in the table (incl. gaps)
  uint64_t distinct_rows = 0;
  uint64_t plt_expressions = 0;        // PLT CFA expressions compiled to per-stub rows
  uint64_t unsupported_cfa_expressions = 0;  // pc ranges marked unrepresentable, by cause:
  uint64_t unsupported_cfa_registers = 0;
  uint64_t unsupported_register_rules = 0;   // rbp or rip rule
  uint64_t signal_frames = 0;               // FDEs with the 'S' augmentation
  uint64_t signal_frame_rows = 0;           // of those, compiled to kSignalFrame rows
  uint64_t unsupported_signal_frames = 0;   // neither glibc's expressions nor the kernel's code
  uint64_t unsupported_ranges() const {
    return unsupported_cfa_expressions + unsupported_cfa_registers +
           unsupported_register_rules + unsupported_signal_frames;
  }
  std::string ToString() const;
};

class CfiTable final : public RuleSource {
 public:
  // Compiles the module's CFI. Error when the module has no CFI section at all or its
  // sections are unusable (a module whose records are all bad gives an empty table).
  static absl::StatusOr<std::unique_ptr<CfiTable>> Build(const elf::ElfFile& elf);

  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override;
  // The same lookup without the cache (benchmarks, tests).
  bool FindRowUncached(uint64_t pc, bool innermost, UnwindRow* row) const;

  const CfiStats& stats() const { return stats_; }
  size_t size() const { return starts_.size(); }
  size_t MemoryBytes() const;

  // Construction input: one row covering [start, end). Public for the builder in cfi_table.cc.
  struct Span {
    uint64_t start;
    uint64_t end;
    UnwindRow row;
  };

 private:
  CfiTable() = default;
  void Assemble(std::vector<Span> spans);
  bool Search(uint64_t addr, uint32_t* row_index) const;

  static constexpr uint32_t kGap = 0xffffffffu;
  uint64_t base_ = 0;               // starts_ are offsets from base_
  std::vector<uint32_t> starts_;    // sorted
  std::vector<uint32_t> row_index_; // into rows_, or kGap
  std::vector<UnwindRow> rows_;     // distinct rows
  LookupCache cache_;  // offset -> row index
  CfiStats stats_;
};

// The rule decoder's entry point every architecture provides (rule_source.h): CfiTable::Build.
absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(const elf::ElfFile& elf);

}  // namespace strata::unwind::x86_64

#endif  // STRATA_COMMON_UNWIND_X86_64_CFI_TABLE_H_
