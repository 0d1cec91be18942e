// Fuzz target: the DWARF call-frame decoders, .eh_frame (with and without .eh_frame_hdr's
// search table) and .debug_frame: common/elf/cfi_records.h (record walk, pointer encodings,
// CIE/FDE parsing) and the x86-64 CFA-program compiler common/unwind/x86_64/cfi_table.h.
//
// Mutating whole ELF files rarely reaches the CFA programs, so the harness wraps the
// fuzzed section bytes into a minimal ELF64 file (each section at the address the input
// gives it, each in its own PT_LOAD segment so that pcrel/datarel/indirect pointers and the
// signal-trampoline code check resolve) and opens it with ElfFile::FromBytes.
//
// Input: u8 arch (0 x86-64, 1 mips64el, 2 mips64), then five sections in this order, each
// u64 address, u32 length, bytes (length 0: no such section): .text, .eh_frame_hdr,
// .eh_frame, .debug_frame, .got. Little-endian framing whatever the ELF byte order.
// Oracles besides the sanitizers: FDE views lie inside the image; FdeRanges is sorted and
// one range per start; cached and uncached CFI row lookups agree.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/elf/cfi_records.h"
#include "common/elf/elf_file.h"
#include "common/unwind/rule_source.h"
#include "common/unwind/x86_64/cfi_table.h"
#include "fuzz/fuzz_util.h"

namespace {

namespace elf = strata::elf;
using strata::unwind::UnwindRow;

struct InputSection {
  const char* name;
  uint32_t type;  // SHT_PROGBITS = 1
  uint64_t flags;  // SHF_ALLOC = 2, SHF_EXECINSTR = 4
  uint64_t addr = 0;
  std::string_view bytes;
};

class Writer {
 public:
  explicit Writer(bool big_endian) : big_endian_(big_endian) {}
  void Put(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      const int shift = big_endian_ ? 8 * (bytes - 1 - i) : 8 * i;
      out_.push_back(static_cast<char>(v >> shift));
    }
  }
  void PutAt(size_t pos, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) {
      const int shift = big_endian_ ? 8 * (bytes - 1 - i) : 8 * i;
      out_[pos + i] = static_cast<char>(v >> shift);
    }
  }
  void Align(size_t a) { out_.resize((out_.size() + a - 1) / a * a, '\0'); }
  std::string& out() { return out_; }

 private:
  bool big_endian_;
  std::string out_;
};

// A minimal ELF64 image holding `sections` (those with bytes), each in its own PT_LOAD.
std::string BuildElf(uint16_t machine, bool big_endian, const std::vector<InputSection>& in) {
  std::vector<InputSection> sections;
  for (const auto& s : in) {
    if (!s.bytes.empty()) sections.push_back(s);
  }
  std::string shstrtab(1, '\0');
  std::vector<uint32_t> name_offsets;
  for (const auto& s : sections) {
    name_offsets.push_back(static_cast<uint32_t>(shstrtab.size()));
    shstrtab.append(s.name).push_back('\0');
  }
  const uint32_t shstrtab_name = static_cast<uint32_t>(shstrtab.size());
  shstrtab.append(".shstrtab").push_back('\0');

  Writer w(big_endian);
  const size_t phnum = sections.size();
  w.out().append("\x7f" "ELF", 4);
  w.Put(2, 1);                       // ELFCLASS64
  w.Put(big_endian ? 2 : 1, 1);      // ELFDATA2MSB / LSB
  w.Put(1, 1);                       // EV_CURRENT
  w.out().resize(16, '\0');
  w.Put(3, 2);                       // ET_DYN
  w.Put(machine, 2);
  w.Put(1, 4);                       // e_version
  w.Put(0, 8);                       // e_entry
  w.Put(64, 8);                      // e_phoff
  const size_t shoff_pos = w.out().size();
  w.Put(0, 8);                       // e_shoff, patched below
  w.Put(0, 4);                       // e_flags
  w.Put(64, 2);
  w.Put(56, 2);
  w.Put(phnum, 2);
  w.Put(64, 2);
  w.Put(sections.size() + 2, 2);     // null + sections + .shstrtab
  w.Put(sections.size() + 1, 2);     // e_shstrndx
  const size_t ph_pos = w.out().size();
  w.out().resize(ph_pos + 56 * phnum, '\0');

  std::vector<uint64_t> offsets;
  for (size_t i = 0; i < sections.size(); ++i) {
    w.Align(16);
    offsets.push_back(w.out().size());
    w.out().append(sections[i].bytes);
    // PT_LOAD: vaddr = the section's address, file bytes = the section's bytes.
    const size_t p = ph_pos + 56 * i;
    w.PutAt(p, 1, 4);                                          // PT_LOAD
    w.PutAt(p + 4, (sections[i].flags & 4) ? 5 : 4, 4);        // R(+X)
    w.PutAt(p + 8, offsets[i], 8);
    w.PutAt(p + 16, sections[i].addr, 8);
    w.PutAt(p + 24, sections[i].addr, 8);
    w.PutAt(p + 32, sections[i].bytes.size(), 8);
    w.PutAt(p + 40, sections[i].bytes.size(), 8);
    w.PutAt(p + 48, 16, 8);
  }
  const size_t shstrtab_offset = w.out().size();
  w.out().append(shstrtab);
  w.Align(8);
  w.PutAt(shoff_pos, w.out().size(), 8);
  w.out().append(64, '\0');  // SHN_UNDEF
  auto section_header = [&](uint32_t name, uint32_t type, uint64_t flags, uint64_t addr,
                            uint64_t offset, uint64_t size) {
    w.Put(name, 4);
    w.Put(type, 4);
    w.Put(flags, 8);
    w.Put(addr, 8);
    w.Put(offset, 8);
    w.Put(size, 8);
    w.Put(0, 4);
    w.Put(0, 4);
    w.Put(8, 8);
    w.Put(0, 8);
  };
  for (size_t i = 0; i < sections.size(); ++i) {
    section_header(name_offsets[i], sections[i].type, sections[i].flags, sections[i].addr,
                   offsets[i], sections[i].bytes.size());
  }
  section_header(shstrtab_name, 3, 0, 0, shstrtab_offset, shstrtab.size());  // SHT_STRTAB
  return std::move(w.out());
}

bool SameRow(const UnwindRow& a, const UnwindRow& b) {
  return a.cfa_base == b.cfa_base && a.ra_rule == b.ra_rule && a.fp_rule == b.fp_rule &&
         a.cfa_offset == b.cfa_offset && a.ra_offset == b.ra_offset &&
         a.fp_offset == b.fp_offset;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  strata::fuzz::InputReader in(data, size);
  const uint8_t arch = in.U8() % 3;
  std::vector<InputSection> sections = {
      {".text", 1, 2 | 4, 0, {}},
      {".eh_frame_hdr", 1, 2, 0, {}},
      {".eh_frame", 1, 2, 0, {}},
      {".debug_frame", 1, 0, 0, {}},
      {".got", 1, 2 | 1, 0, {}},
  };
  for (InputSection& s : sections) {
    s.addr = in.U64();
    s.bytes = in.Chunk();
  }
  const bool big_endian = arch == 2;
  auto file = elf::ElfFile::FromBytes(
      BuildElf(arch == 0 ? elf::kMachineX86_64 : elf::kMachineMips, big_endian, sections));
  STRATA_FUZZ_CHECK(file.ok(), "the harness's ELF image does not parse: %s",
                    file.status().ToString().c_str());
  const elf::ElfFile& elf = **file;
  const std::string_view image = elf.image();
  auto inside = [&](std::string_view v) {
    return v.empty() || (v.data() >= image.data() && v.data() + v.size() <= image.data() + image.size());
  };

  std::vector<uint64_t> probes;
  for (auto kind : {elf::CfiSectionKind::kEhFrame, elf::CfiSectionKind::kDebugFrame}) {
    elf::CfiWalkStats stats;
    (void)elf::ForEachFde(
        elf, kind,
        [&](const elf::Cie& cie, const elf::Fde& fde) {
          STRATA_FUZZ_CHECK(inside(cie.augmentation) && inside(cie.initial_instructions) &&
                                inside(fde.instructions),
                            "CIE/FDE view outside the image");
          if (probes.size() < 512) {
            probes.push_back(fde.pc_start);
            probes.push_back(fde.pc_start + (fde.pc_end - fde.pc_start) / 2);
            probes.push_back(fde.pc_end - 1);
          }
        },
        &stats);
  }
  const std::vector<elf::AddressRange> ranges = elf::FdeRanges(elf);
  for (size_t i = 1; i < ranges.size(); ++i) {
    STRATA_FUZZ_CHECK(ranges[i - 1].start < ranges[i].start,
                      "FdeRanges not sorted or not deduplicated at %zu", i);
  }

  if (arch == 0) {
    auto table = strata::unwind::x86_64::CfiTable::Build(elf);
    if (table.ok()) {
      (void)(*table)->stats().ToString();
      (void)(*table)->MemoryBytes();
      for (uint64_t pc : probes) {
        for (bool innermost : {true, false}) {
          UnwindRow cached, uncached;
          const bool a = (*table)->FindRow(pc, innermost, &cached);
          const bool b = (*table)->FindRowUncached(pc, innermost, &uncached);
          STRATA_FUZZ_CHECK(a == b && (!a || SameRow(cached, uncached)),
                            "cached and uncached FindRow disagree at %#llx",
                            static_cast<unsigned long long>(pc));
          // Twice: the second lookup is served by the cache.
          const bool c = (*table)->FindRow(pc, innermost, &cached);
          STRATA_FUZZ_CHECK(c == b && (!c || SameRow(cached, uncached)),
                            "a cache hit differs from the lookup at %#llx",
                            static_cast<unsigned long long>(pc));
        }
      }
    }
  } else {
    // MIPS64 modules take their function ranges from FDEs when stripped.
    auto arch_or = strata::unwind::ArchOf(elf);
    if (arch_or.ok()) {
      auto rules = strata::unwind::MakeRuleSource(*arch_or, elf);
      if (rules.ok()) {
        for (uint64_t pc : probes) {
          UnwindRow row;
          (void)(*rules)->FindRow(pc, true, &row);
          (void)(*rules)->IsPlausibleReturnAddress(pc);
        }
      }
    }
  }
  return 0;
}
