// The one place that picks the architecture's unwind-rule decoder for a module:
// x86-64 -> compiled DWARF CFI (x86_64/cfi_table.h); MIPS64 -> decoded prologues, provided by
// common/unwind/mips64/ when that library is built (its contract: header
// "common/unwind/mips64/prologue_table.h" declaring
//   absl::StatusOr<std::unique_ptr<RuleSource>>
//   strata::unwind::mips64::BuildPrologueTable(const elf::ElfFile& elf);
// in CMake target strata_unwind_mips64). Anything else: an "unsupported architecture" error.
#ifndef STRATA_COMMON_UNWIND_RULE_SOURCE_H_
#define STRATA_COMMON_UNWIND_RULE_SOURCE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"
#include "common/unwind/unwind_types.h"
#include "common/unwind/unwinder.h"

namespace strata::unwind {

// The architecture an ELF file was built for, from e_machine and its byte order.
absl::StatusOr<Arch> ArchOf(const elf::ElfFile& elf);

absl::StatusOr<std::unique_ptr<RuleSource>> MakeRuleSource(Arch arch, const elf::ElfFile& elf);

}  // namespace strata::unwind

#endif  // STRATA_COMMON_UNWIND_RULE_SOURCE_H_
