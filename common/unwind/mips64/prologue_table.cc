#include "common/unwind/mips64/prologue_table.h"

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "common/elf/symbol_table.h"

namespace strata::unwind::mips64 {
namespace {

bool IsEntryPoint(std::string_view name) {
  return name == "__start" || name == "_start" || name == "__thread_start" ||
         name == "__thread_start3";
}

}  // namespace

absl::StatusOr<std::unique_ptr<PrologueTable>> BuildMips64Table(const elf::ElfFile& elf) {
  if (elf.machine() != elf::kMachineMips) {
    return absl::InvalidArgumentError("not a MIPS ELF file");
  }
  absl::StatusOr<elf::SymbolTable> symbols = elf::SymbolTable::Build(elf);
  if (!symbols.ok()) return symbols.status();

  std::vector<FunctionRange> functions;
  functions.reserve(symbols->size() + 4);
  for (const elf::SymbolTable::Function& f : symbols->functions()) {
    FunctionRange r;
    r.start = f.start;
    r.size = f.end > f.start ? f.end - f.start : 0;
    if (f.is_plt()) r.flags |= FunctionRange::kStub;
    if (IsEntryPoint(f.name)) r.flags |= FunctionRange::kOutermost;
    functions.push_back(r);
  }
  for (std::string_view name : {".MIPS.stubs", ".plt"}) {
    if (const elf::Section* s = elf.FindSection(name); s != nullptr && s->size > 0) {
      functions.push_back({s->addr, s->size, FunctionRange::kStub});
    }
  }

  std::vector<CodeRegion> code;
  for (const elf::LoadSegment& seg : elf.load_segments()) {
    if (!seg.executable() || seg.filesz == 0) continue;
    std::optional<std::string_view> bytes = elf.ReadAt(seg.vaddr, seg.filesz);
    if (!bytes) continue;
    code.push_back({seg.vaddr, reinterpret_cast<const uint8_t*>(bytes->data()), bytes->size()});
  }
  const Arch arch = elf.big_endian() ? Arch::kMips64Be : Arch::kMips64El;
  return PrologueTable::Build(arch, std::move(functions), code);
}

absl::StatusOr<std::unique_ptr<RuleSource>> BuildRuleSource(const elf::ElfFile& elf) {
  absl::StatusOr<std::unique_ptr<PrologueTable>> t = BuildMips64Table(elf);
  if (!t.ok()) return t.status();
  return std::unique_ptr<RuleSource>(std::move(*t));
}

}  // namespace strata::unwind::mips64
