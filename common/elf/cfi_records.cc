#include "common/elf/cfi_records.h"

#include <algorithm>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace strata::elf {
namespace {

constexpr uint8_t kPeAbsptr = 0x00;
constexpr uint8_t kPeUleb128 = 0x01;
constexpr uint8_t kPeUdata2 = 0x02;
constexpr uint8_t kPeUdata4 = 0x03;
constexpr uint8_t kPeUdata8 = 0x04;
constexpr uint8_t kPeSleb128 = 0x09;
constexpr uint8_t kPeSdata2 = 0x0a;
constexpr uint8_t kPeSdata4 = 0x0b;
constexpr uint8_t kPeSdata8 = 0x0c;
constexpr uint8_t kPePcrel = 0x10;
constexpr uint8_t kPeDatarel = 0x30;

// Where a CFI section lives: its bytes and the vaddr of its first byte.
struct CfiSection {
  std::string_view data;
  uint64_t vaddr = 0;
  CfiSectionKind kind;
  // Base of datarel pointers: the .got's address (0 without one). Found once per walk, not
  // once per record (a search of every section).
  uint64_t data_base = 0;
};

uint64_t DataRelBase(const ElfFile& elf) {
  const Section* got = elf.FindSection(".got");
  return got != nullptr ? got->addr : 0;
}

// Parses the CIE at `offset`. False for malformed or unsupported CIEs.
bool ParseCie(const ElfFile& elf, const CfiSection& sec, uint64_t offset, Cie* cie) {
  ByteReader r = elf.Reader(sec.data);
  r.Seek(offset);
  uint64_t length = r.U32();
  bool dwarf64 = length == 0xffffffff;
  if (dwarf64) length = r.U64();
  size_t body = r.pos();
  if (!r.ok() || length > r.remaining() || length == 0) return false;
  ByteReader c = elf.Reader(sec.data.substr(body, length));
  uint64_t id = dwarf64 ? c.U64() : c.U32();
  uint64_t expected_id = sec.kind == CfiSectionKind::kEhFrame ? 0 : (dwarf64 ? ~uint64_t{0} : 0xffffffffu);
  if (id != expected_id) return false;
  uint8_t version = c.U8();
  if (version != 1 && version != 3 && version != 4) return false;
  cie->augmentation = c.CString();
  if (version == 4) {
    cie->address_size = c.U8();
    c.U8();  // segment selector size
  }
  cie->code_align = c.Uleb128();
  cie->data_align = c.Sleb128();
  cie->ra_register = version == 1 ? c.U8() : c.Uleb128();
  std::string_view aug = cie->augmentation;
  size_t aug_end = 0;
  if (!aug.empty() && aug[0] == 'z') {
    cie->has_augmentation_data = true;
    uint64_t aug_len = c.Uleb128();
    if (!c.ok() || aug_len > c.remaining()) return false;
    aug_end = c.pos() + aug_len;
    for (size_t i = 1; i < aug.size(); ++i) {
      switch (aug[i]) {
        case 'L': cie->lsda_encoding = c.U8(); break;
        case 'R': cie->fde_encoding = c.U8(); break;
        case 'S': cie->signal_frame = true; break;
        case 'B': case 'G': break;
        case 'P': {
          uint8_t enc = c.U8();
          uint64_t ignored;
          uint64_t field = sec.vaddr + body + c.pos();
          if (!ReadEncodedPointer(elf, &c, enc & ~kPeIndirect, field, sec.data_base, &ignored)) {
            return false;
          }
          break;
        }
        default: return false;  // unknown augmentation: the data layout is unknown
      }
    }
    c.Seek(aug_end);
  } else if (!aug.empty() && aug != "eh") {
    return false;
  }
  if (!c.ok()) return false;
  cie->initial_instructions = c.data().substr(c.pos());
  return true;
}

// Parses the FDE at `offset` (its CIE resolved through `cies`). False when malformed.
bool ParseFde(const ElfFile& elf, const CfiSection& sec, uint64_t offset,
              absl::flat_hash_map<uint64_t, std::optional<Cie>>* cies, CfiWalkStats* stats,
              const Cie** cie_out, Fde* fde) {
  ByteReader r = elf.Reader(sec.data);
  r.Seek(offset);
  uint64_t length = r.U32();
  bool dwarf64 = length == 0xffffffff;
  if (dwarf64) length = r.U64();
  size_t body = r.pos();
  if (!r.ok() || length > r.remaining() || length == 0) return false;
  ByteReader f = elf.Reader(sec.data.substr(body, length));
  uint64_t cie_ptr = dwarf64 ? f.U64() : f.U32();
  uint64_t cie_offset;
  if (sec.kind == CfiSectionKind::kEhFrame) {
    if (cie_ptr == 0 || cie_ptr > body) return false;  // 0 would be a CIE
    cie_offset = body - cie_ptr;
  } else {
    cie_offset = cie_ptr;
  }
  auto [it, inserted] = cies->try_emplace(cie_offset);
  if (inserted) {
    Cie cie;
    if (ParseCie(elf, sec, cie_offset, &cie)) {
      it->second = cie;
      ++stats->cies;
    } else {
      ++stats->bad_records;
    }
  }
  if (!it->second.has_value()) return false;
  const Cie& cie = *it->second;
  const uint64_t data_base = sec.data_base;
  uint8_t enc = sec.kind == CfiSectionKind::kEhFrame ? cie.fde_encoding : kPeAbsptr;
  uint64_t start = 0, range = 0;
  if (!ReadEncodedPointer(elf, &f, enc, sec.vaddr + body + f.pos(), data_base, &start)) return false;
  // The range uses only the value format of the encoding, never its application.
  if (!ReadEncodedPointer(elf, &f, enc & 0x0f, 0, 0, &range)) return false;
  if (cie.has_augmentation_data) {
    uint64_t aug_len = f.Uleb128();
    f.Skip(aug_len);
  }
  if (!f.ok() || range > ~start) return false;
  fde->pc_start = start;
  fde->pc_end = start + range;
  fde->instructions = f.data().substr(f.pos());
  fde->cie_offset = cie_offset;
  *cie_out = &cie;
  return true;
}

// FDE offsets (inside .eh_frame) listed by .eh_frame_hdr's binary search table, or nullopt
// when there is no usable header.
std::optional<std::vector<uint64_t>> FdeOffsetsFromHeader(const ElfFile& elf,
                                                          const CfiSection& eh_frame) {
  const Section* hdr = elf.FindSection(".eh_frame_hdr");
  if (hdr == nullptr) return std::nullopt;
  absl::StatusOr<std::string_view> data = elf.SectionData(*hdr);
  if (!data.ok()) return std::nullopt;
  ByteReader r = elf.Reader(*data);
  uint8_t version = r.U8();
  uint8_t eh_frame_ptr_enc = r.U8();
  uint8_t fde_count_enc = r.U8();
  uint8_t table_enc = r.U8();
  if (!r.ok() || version != 1 || fde_count_enc == kPeOmit || table_enc == kPeOmit) return std::nullopt;
  uint64_t eh_frame_ptr = 0, count = 0;
  if (!ReadEncodedPointer(elf, &r, eh_frame_ptr_enc, hdr->addr + r.pos(), hdr->addr, &eh_frame_ptr) ||
      !ReadEncodedPointer(elf, &r, fde_count_enc, hdr->addr + r.pos(), hdr->addr, &count)) {
    return std::nullopt;
  }
  if (eh_frame_ptr != eh_frame.vaddr || count > r.remaining()) return std::nullopt;
  std::vector<uint64_t> offsets;
  offsets.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t loc, fde;
    if (!ReadEncodedPointer(elf, &r, table_enc, hdr->addr + r.pos(), hdr->addr, &loc) ||
        !ReadEncodedPointer(elf, &r, table_enc, hdr->addr + r.pos(), hdr->addr, &fde)) {
      return std::nullopt;
    }
    if (fde < eh_frame.vaddr || fde - eh_frame.vaddr >= eh_frame.data.size()) return std::nullopt;
    offsets.push_back(fde - eh_frame.vaddr);
  }
  // A linker lists each FDE once. A table naming one many times (a corrupt or hostile file)
  // would have it compiled again for each entry: walk the section instead.
  std::vector<uint64_t> sorted = offsets;
  std::sort(sorted.begin(), sorted.end());
  if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) return std::nullopt;
  return offsets;
}

}  // namespace

bool ReadEncodedPointer(const ElfFile& elf, ByteReader* r, uint8_t encoding, uint64_t field_vaddr,
                        uint64_t data_base, uint64_t* out) {
  if (encoding == kPeOmit) return false;
  uint64_t value;
  switch (encoding & 0x0f) {
    case kPeAbsptr: value = r->U64(); break;
    case kPeUleb128: value = r->Uleb128(); break;
    case kPeUdata2: value = r->U16(); break;
    case kPeUdata4: value = r->U32(); break;
    case kPeUdata8: value = r->U64(); break;
    case kPeSleb128: value = static_cast<uint64_t>(r->Sleb128()); break;
    case kPeSdata2: value = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int16_t>(r->U16()))); break;
    case kPeSdata4: value = static_cast<uint64_t>(static_cast<int64_t>(static_cast<int32_t>(r->U32()))); break;
    case kPeSdata8: value = r->U64(); break;
    default: return false;
  }
  if (!r->ok()) return false;
  switch (encoding & 0x70) {
    case 0: break;
    case kPePcrel: value += field_vaddr; break;
    case kPeDatarel: value += data_base; break;
    default: return false;  // textrel/funcrel/aligned: not produced by GNU toolchains
  }
  if (encoding & kPeIndirect) {
    std::optional<std::string_view> slot = elf.ReadAt(value, 8);
    if (!slot) return false;
    value = elf.Reader(*slot).U64();
  }
  *out = value;
  return true;
}

absl::Status ForEachFde(const ElfFile& elf, CfiSectionKind kind,
                        const std::function<void(const Cie&, const Fde&)>& visit,
                        CfiWalkStats* stats) {
  const char* name = kind == CfiSectionKind::kEhFrame ? ".eh_frame" : ".debug_frame";
  const Section* section = elf.FindSection(name);
  if (section == nullptr) return absl::NotFoundError(absl::StrCat("no ", name));
  absl::StatusOr<std::string_view> data = elf.SectionData(*section);
  if (!data.ok()) return data.status();
  CfiSection sec{*data, kind == CfiSectionKind::kEhFrame ? section->addr : 0, kind,
                 DataRelBase(elf)};
  absl::flat_hash_map<uint64_t, std::optional<Cie>> cies;

  auto visit_fde = [&](uint64_t offset) {
    const Cie* cie = nullptr;
    Fde fde;
    if (!ParseFde(elf, sec, offset, &cies, stats, &cie, &fde)) {
      ++stats->bad_records;
      return;
    }
    ++stats->fdes;
    if (fde.pc_end > fde.pc_start) visit(*cie, fde);
  };

  if (kind == CfiSectionKind::kEhFrame) {
    if (std::optional<std::vector<uint64_t>> offsets = FdeOffsetsFromHeader(elf, sec)) {
      for (uint64_t offset : *offsets) visit_fde(offset);
      return absl::OkStatus();
    }
  }
  // Linear walk: every record is (length, id, ...); id 0 (eh_frame) or ~0 (debug_frame) = CIE.
  ByteReader r = elf.Reader(sec.data);
  while (r.remaining() >= 4) {
    size_t offset = r.pos();
    uint64_t length = r.U32();
    if (length == 0) {
      if (kind == CfiSectionKind::kEhFrame) break;  // terminator
      continue;
    }
    bool dwarf64 = length == 0xffffffff;
    if (dwarf64) length = r.U64();
    if (!r.ok() || length > r.remaining()) {
      ++stats->bad_records;
      break;
    }
    size_t next = r.pos() + length;
    uint64_t id = dwarf64 ? r.U64() : r.U32();
    bool is_cie = kind == CfiSectionKind::kEhFrame ? id == 0
                                                   : id == (dwarf64 ? ~uint64_t{0} : 0xffffffffu);
    if (!is_cie) visit_fde(offset);
    r.Seek(next);
  }
  return absl::OkStatus();
}

std::vector<AddressRange> FdeRanges(const ElfFile& elf) {
  std::vector<AddressRange> out;
  CfiWalkStats stats;
  for (CfiSectionKind kind : {CfiSectionKind::kEhFrame, CfiSectionKind::kDebugFrame}) {
    (void)ForEachFde(elf, kind, [&](const Cie&, const Fde& fde) {
      out.push_back({fde.pc_start, fde.pc_end});
    }, &stats);
  }
  std::sort(out.begin(), out.end(), [](const AddressRange& a, const AddressRange& b) {
    return a.start != b.start ? a.start < b.start : a.end < b.end;
  });
  out.erase(std::unique(out.begin(), out.end(), [](const AddressRange& a, const AddressRange& b) {
    return a.start == b.start;
  }), out.end());
  return out;
}

}  // namespace strata::elf
