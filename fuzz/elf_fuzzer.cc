// Fuzz target: ELF files as the agent reads them from a host's disk (common/elf/elf_file.h,
// symbol_table.h, cfi_records.h) and compiles them into unwind rules (x86-64 CFI tables,
// MIPS64 prologue tables): the agent's module load, agent/symbols ModuleCache::Get, over a
// file holding the input, then every query the agent makes of a module.
//
// Input: the bytes of an ELF file. Oracles besides the sanitizers: symbol lookups return a
// function that contains the address (or starts at it, size unknown); cached and uncached
// CFI row lookups agree.
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "agent/symbols/module_cache.h"
#include "common/elf/cfi_records.h"
#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"
#include "common/unwind/x86_64/cfi_table.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace elf = strata::elf;
using strata::unwind::UnwindRow;

bool SameRow(const UnwindRow& a, const UnwindRow& b) {
  return a.cfa_base == b.cfa_base && a.ra_rule == b.ra_rule && a.fp_rule == b.fp_rule &&
         a.cfa_offset == b.cfa_offset && a.ra_offset == b.ra_offset &&
         a.fp_offset == b.fp_offset;
}

void Lookups(const strata::agent::symbols::Module& module, uint64_t vaddr) {
  if (const elf::SymbolTable::Function* f = module.symbols.Lookup(vaddr)) {
    STRATA_FUZZ_CHECK(f->start <= vaddr && (f->end == f->start || vaddr < f->end),
                      "Lookup(%#llx) returned [%#llx, %#llx)",
                      static_cast<unsigned long long>(vaddr),
                      static_cast<unsigned long long>(f->start),
                      static_cast<unsigned long long>(f->end));
  }
  if (module.rules != nullptr) {
    for (bool innermost : {true, false}) {
      UnwindRow row;
      const bool found = module.rules->FindRow(vaddr, innermost, &row);
      if (auto* cfi = dynamic_cast<const strata::unwind::x86_64::CfiTable*>(module.rules.get())) {
        UnwindRow uncached;
        const bool found_uncached = cfi->FindRowUncached(vaddr, innermost, &uncached);
        STRATA_FUZZ_CHECK(found == found_uncached && (!found || SameRow(row, uncached)),
                          "cached and uncached FindRow disagree at %#llx",
                          static_cast<unsigned long long>(vaddr));
      }
    }
    (void)module.rules->IsPlausibleReturnAddress(vaddr);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = strata::fuzz::ScratchDir() + "/module.elf";
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  STRATA_FUZZ_CHECK(fd >= 0, "cannot create %s", path.c_str());
  STRATA_FUZZ_CHECK(size == 0 || write(fd, data, size) == static_cast<ssize_t>(size),
                    "cannot write %s", path.c_str());
  close(fd);

  strata::agent::symbols::ModuleCache cache;
  auto module_or = cache.Get(path, "/fuzz/module.elf", 0);
  if (!module_or.ok()) return 0;
  const strata::agent::symbols::Module& module = **module_or;
  const elf::ElfFile& file = *module.elf;

  for (const elf::Section& s : file.sections()) {
    auto bytes = file.SectionData(s);
    if (bytes.ok()) {
      STRATA_FUZZ_CHECK(bytes->empty() || (bytes->data() >= file.image().data() &&
                                           bytes->data() + bytes->size() <=
                                               file.image().data() + file.image().size()),
                        "section %.*s data outside the image", static_cast<int>(s.name.size()),
                        s.name.data());
    }
    (void)file.FindSection(s.name);
  }
  (void)file.MinLoadVaddr();
  (void)file.BuildIdHex();
  (void)file.ReadFunctionSymbols();
  (void)file.ReadPltEntries();
  for (const elf::AddressRange& r : file.PltRanges()) Lookups(module, r.start);
  for (const elf::LoadSegment& seg : file.load_segments()) {
    (void)file.FileOffsetToVaddr(seg.offset);
    (void)file.FileOffsetToVaddr(seg.offset + seg.filesz / 2);
    if (auto bytes = file.ReadAt(seg.vaddr, std::min<uint64_t>(seg.filesz, 64))) {
      STRATA_FUZZ_CHECK(bytes->data() >= file.image().data() &&
                            bytes->data() + bytes->size() <=
                                file.image().data() + file.image().size(),
                        "ReadAt outside the image");
    }
    (void)file.ReadU32At(seg.vaddr + seg.filesz - 2);
  }
  elf::CfiWalkStats stats;
  for (auto kind : {elf::CfiSectionKind::kEhFrame, elf::CfiSectionKind::kDebugFrame}) {
    (void)elf::ForEachFde(file, kind, [](const elf::Cie&, const elf::Fde&) {}, &stats);
  }
  const std::vector<elf::AddressRange> fdes = elf::FdeRanges(file);
  size_t probes = 0;
  for (const elf::AddressRange& r : fdes) {
    if (++probes > 256) break;
    Lookups(module, r.start);
    Lookups(module, r.start + (r.end - r.start) / 2);
    Lookups(module, r.end);
  }
  probes = 0;
  for (const auto& f : module.symbols.functions()) {
    if (++probes > 256) break;
    Lookups(module, f.start);
    if (f.end > f.start) Lookups(module, f.end - 1);
  }
  return 0;
}
