// The one place that picks the architecture's unwind-rule decoder for a module:
// x86-64 -> compiled DWARF CFI (x86_64/cfi_table.h); MIPS64 -> decoded prologues
// (mips64/prologue_table.h). Every decoder is a folder <arch>/ with the same contract: CMake
// target strata_unwind_<arch>, and in its header
//   absl::StatusOr<std::unique_ptr<RuleSource>>
//   strata::unwind::<arch>::BuildRuleSource(const elf::ElfFile& elf);
// A decoder that was not built, or any other architecture: an "unsupported architecture" error.
// Go executables (a .gopclntab) get Go's own tables as rules (go/go_rules.h), with the
// architecture's decoder behind them for their non-Go code (cgo's C functions).
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
