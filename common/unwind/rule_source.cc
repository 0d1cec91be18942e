#include "common/unwind/rule_source.h"

#include "absl/strings/str_cat.h"
#include "common/unwind/go/go_rules.h"
#ifdef STRATA_HAVE_X86_64_RULES
#include "common/unwind/x86_64/cfi_table.h"
#endif
#ifdef STRATA_HAVE_MIPS64_RULES
#include "common/unwind/mips64/prologue_table.h"
#endif

namespace strata::unwind {

absl::StatusOr<Arch> ArchOf(const elf::ElfFile& elf) {
  switch (elf.machine()) {
    case elf::kMachineX86_64:
      if (!elf.big_endian()) return Arch::kX86_64;
      break;
    case elf::kMachineMips:
      return elf.big_endian() ? Arch::kMips64Be : Arch::kMips64El;
  }
  return absl::UnimplementedError(
      absl::StrCat("unsupported architecture: e_machine ", elf.machine(),
                   elf.big_endian() ? " (big-endian)" : " (little-endian)"));
}

namespace {

absl::StatusOr<std::unique_ptr<RuleSource>> MakeArchRuleSource(Arch arch,
                                                               const elf::ElfFile& elf) {
  switch (arch) {
    case Arch::kX86_64:
#ifdef STRATA_HAVE_X86_64_RULES
      return x86_64::BuildRuleSource(elf);
#else
      break;
#endif
    case Arch::kMips64El:
    case Arch::kMips64Be:
#ifdef STRATA_HAVE_MIPS64_RULES
      return mips64::BuildRuleSource(elf);
#else
      break;
#endif
  }
  return absl::UnimplementedError(
      absl::StrCat("unsupported architecture: ", std::string(ArchName(arch)), " (no rule decoder built)"));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RuleSource>> MakeRuleSource(Arch arch, const elf::ElfFile& elf) {
  absl::StatusOr<Arch> file_arch = ArchOf(elf);
  if (!file_arch.ok()) return file_arch.status();
  if (*file_arch != arch) {
    return absl::InvalidArgumentError(
        absl::StrCat("architecture mismatch: module is ", std::string(ArchName(*file_arch)),
                     ", expected ", std::string(ArchName(arch))));
  }
  absl::StatusOr<std::unique_ptr<RuleSource>> native = MakeArchRuleSource(arch, elf);
  if (!elf::LooksLikeGo(elf)) return native;  // (GoPclntab::Find may scan for the magic)
  // A Go executable: Go's own tables describe its Go code; the architecture's decoder (its
  // C code's CFI in cgo programs) describes the rest.
  absl::StatusOr<std::unique_ptr<RuleSource>> go_rules =
      go::BuildRuleSource(arch, elf, native.ok() ? *std::move(native) : nullptr);
  if (go_rules.ok()) return go_rules;
  return absl::InvalidArgumentError(absl::StrCat("Go module: ", go_rules.status().message()));
}

}  // namespace strata::unwind
