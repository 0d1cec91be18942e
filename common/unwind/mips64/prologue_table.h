// Entry point used by the rule-source factory (common/unwind/rule_source.h): builds the MIPS64
// PrologueTable (function_table.h) for one ELF module of either byte order.
//
// Function ranges come from the ELF symbol tables and FDE ranges (common/elf/SymbolTable),
// PLT and .MIPS.stubs ranges become frameless stubs (they copy ra into t7 and jump), and the
// thread/process entry points are marked outermost. Code bytes are the file-backed parts of the
// executable PT_LOAD segments. `.pdr` is ignored (4-byte addresses on n64, often discarded).
#ifndef STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_TABLE_H_
#define STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_TABLE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"
#include "common/unwind/mips64/function_table.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind::mips64 {

// Errors: not a MIPS ELF file, unreadable symbol tables.
absl::StatusOr<std::unique_ptr<PrologueTable>> BuildMips64Table(const elf::ElfFile& elf);

// The rule decoder's entry point every architecture provides (rule_source.h).
absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(const elf::ElfFile& elf);

}  // namespace strata::unwind::mips64

#endif  // STRATA_COMMON_UNWIND_MIPS64_PROLOGUE_TABLE_H_
