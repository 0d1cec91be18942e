// PrologueTable: the MIPS64 RuleSource for one module. Built once from the module's function
// ranges and code bytes; immutable afterwards and allocation-free to query, so the agent and
// the in-process sampler's signal handler can share it.
//
//  - PC -> function: functions sorted by start address plus a page index (one entry per
//    4 KiB of text: the first function that can contain an address of that page), so the
//    common lookup is one index read and at most a few compares instead of a binary search;
//    binary search alone where the index would outnumber the functions many times over.
//  - Function -> row: every function's code is analyzed once at construction
//    (prologue_analyzer.h) into a short run-length list of rows; per sample only the PC's
//    offset inside the function is compared with that list.
//  - Return-address sanity: bitmaps over the code regions mark addresses that follow a call
//    (jal/jalr/bal + delay slot, or an R6 compact call), for IsPlausibleReturnAddress().
//
// The table copies what it needs; the code bytes passed to Build() may be released after.
#ifndef STRATA_COMMON_UNWIND_MIPS64_FUNCTION_TABLE_H_
#define STRATA_COMMON_UNWIND_MIPS64_FUNCTION_TABLE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/unwind/mips64/prologue_analyzer.h"
#include "common/unwind/unwind_types.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind::mips64 {

// A function (module-relative addresses). size 0 = unknown: runs to the next start.
struct FunctionRange {
  enum Flags : uint8_t {
    kNone = 0,
    kStub = 1,       // PLT / .MIPS.stubs: no frame, ra in register throughout
    kOutermost = 2,  // process/thread entry (__start, __thread_start): stop here
  };
  uint64_t start = 0;
  uint64_t size = 0;
  uint8_t flags = kNone;
};

// Executable bytes at module-relative `vaddr`, in the module's byte order.
struct CodeRegion {
  uint64_t vaddr = 0;
  const uint8_t* bytes = nullptr;
  size_t size = 0;
};

struct TableStats {
  size_t functions = 0;
  size_t rows = 0;            // run-length entries over all functions
  size_t instructions = 0;
  size_t unreached = 0;       // instructions filled by the linear fallback
  size_t conflicts = 0;
  size_t without_code = 0;    // functions whose bytes were not in any CodeRegion
  size_t memory_bytes = 0;    // table footprint
};

class PrologueTable final : public RuleSource {
 public:
  static constexpr unsigned kPageShift = 12;
  // The page index is built when it has at most this many entries per function.
  static constexpr uint64_t kMaxPagesPerFunction = 16;

  // Functions may be unsorted, overlapping or duplicated (aliases): one entry per start is
  // kept (the largest size). Of code regions that share bytes only one is used (the one
  // whose bytes start first). Never fails: functions without code get no rule.
  static std::unique_ptr<PrologueTable> Build(Arch arch, std::vector<FunctionRange> functions,
                                              std::span<const CodeRegion> code);

  // RuleSource. Async-signal-safe: no allocation, no locks.
  bool FindRow(uint64_t pc, bool innermost, UnwindRow* row) const override;
  bool IsPlausibleReturnAddress(uint64_t return_address) const override;

  // Index of the function containing `pc`, or -1. Page-indexed (the production path) and a
  // plain binary search (benchmark baseline); both give the same answer.
  int64_t FindFunction(uint64_t pc) const;
  int64_t FindFunctionBinarySearch(uint64_t pc) const;

  size_t num_functions() const { return funcs_.size(); }
  uint64_t function_start(size_t i) const { return funcs_[i].start; }
  uint64_t function_end(size_t i) const { return funcs_[i].end; }
  // Rows of function i (for tests and diagnostics).
  std::span<const RowRange> function_rows(size_t i) const {
    return {rows_.data() + funcs_[i].first_row, funcs_[i].num_rows};
  }
  Arch arch() const { return arch_; }
  const TableStats& stats() const { return stats_; }

 private:
  struct Func {
    uint64_t start;
    uint64_t end;  // exclusive
    uint32_t first_row;
    uint16_t num_rows;
    uint8_t flags;
  };
  PrologueTable() = default;
  bool RowAt(const Func& f, uint64_t offset, UnwindRow* row) const;

  Arch arch_ = Arch::kMips64El;
  std::vector<Func> funcs_;          // sorted by start, disjoint
  std::vector<RowRange> rows_;
  uint64_t page_base_ = 0;           // first function start, page aligned
  std::vector<uint32_t> page_first_; // page -> index of the last function starting <= page
  // Return-address bitmaps, disjoint and sorted by base, over one code region or a few close
  // ones: bit i of a bitmap (its words start at after_call_[first_word]) marks base + 4*i as
  // following a call.
  struct CallBitmap {
    uint64_t base;
    uint64_t bits;
    size_t first_word;
  };
  std::vector<CallBitmap> call_bitmaps_;
  std::vector<uint64_t> after_call_;
  TableStats stats_;
};

// Reads the instruction word at `bytes` in the given byte order (any host).
inline uint32_t LoadWord(const uint8_t* bytes, bool big_endian) {
  uint32_t w = big_endian ? (uint32_t{bytes[0]} << 24 | uint32_t{bytes[1]} << 16 |
                             uint32_t{bytes[2]} << 8 | bytes[3])
                          : (uint32_t{bytes[3]} << 24 | uint32_t{bytes[2]} << 16 |
                             uint32_t{bytes[1]} << 8 | bytes[0]);
  return w;
}

}  // namespace strata::unwind::mips64

#endif  // STRATA_COMMON_UNWIND_MIPS64_FUNCTION_TABLE_H_
