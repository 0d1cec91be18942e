#include "common/elf/go_pclntab.h"

#include <algorithm>
#include <array>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace strata::elf {
namespace {

constexpr uint32_t kMagic116 = 0xfffffffa;
constexpr uint32_t kMagic118 = 0xfffffff0;
constexpr uint32_t kMagic120 = 0xfffffff1;

constexpr uint32_t kPcdataInlTreeIndex = 2;  // _PCDATA_InlTreeIndex
constexpr uint32_t kFuncdataInlTree = 3;     // _FUNCDATA_InlTree

// A pc-value table never needs more steps than this (a runaway table is corrupt).
constexpr size_t kMaxTableSteps = 1 << 20;
// Nor a function more bytes of code (Go's largest functions are a few hundred KiB).
constexpr uint64_t kMaxFunctionBytes = 64ull << 20;

// Field offsets inside a _func record, by version (runtime/symtab.go of each release).
struct FuncLayout {
  uint32_t nameoff, pcsp, pcfile, pcln, npcdata, cu_offset, func_id, flag, nfuncdata, size;
};
FuncLayout LayoutOf(GoPclntab::Version v, uint8_t ptr_size) {
  switch (v) {
    case GoPclntab::Version::kGo116: {
      // entry is a full pointer; 1.17 put the flag byte where 1.16 had padding (zero).
      const uint32_t p = ptr_size;
      return {p, p + 12, p + 16, p + 20, p + 24, p + 28, p + 32, p + 33, p + 35, p + 36};
    }
    case GoPclntab::Version::kGo118:
      return {4, 16, 20, 24, 28, 32, 36, 37, 39, 40};
    case GoPclntab::Version::kGo120:  // startLine (int32) after cuOffset
      return {4, 16, 20, 24, 28, 32, 40, 41, 43, 44};
  }
  return {};
}

// Functions that begin a stack or switch stacks. Tables since Go 1.17 mark them with
// TOPFRAME / SPWRITE; Go 1.16's have no flags, so they are known by name there (and the names
// stay a safety net for the others).
constexpr std::array<std::string_view, 12> kRootNames = {
    "runtime.goexit",     "runtime.mstart",      "runtime.rt0_go",
    "runtime.mcall",      "runtime.morestack",   "runtime.systemstack",
    "runtime.systemstack_switch", "runtime.asmcgocall", "runtime.cgocallback",
    "runtime.gogo",       "runtime.asmcgocall.abi0", "runtime.goexit.abi0"};

bool IsRootName(std::string_view name) {
  return std::find(kRootNames.begin(), kRootNames.end(), name) != kRootNames.end();
}

}  // namespace

std::string_view GoPclntabVersionName(GoPclntab::Version v) {
  switch (v) {
    case GoPclntab::Version::kGo116: return "1.16";
    case GoPclntab::Version::kGo118: return "1.18";
    case GoPclntab::Version::kGo120: return "1.20";
  }
  return "unknown";
}

uint64_t GoPclntab::Word(size_t offset) const {
  ByteReader r(data_, big_endian_);
  r.Seek(offset);
  uint64_t v = ptr_size_ == 8 ? r.U64() : r.U32();
  return r.ok() ? v : 0;
}

absl::Status GoPclntab::ParseHeader() {
  ByteReader r(data_, big_endian_);
  const uint32_t magic = r.U32();
  const uint8_t pad1 = r.U8(), pad2 = r.U8();
  min_lc_ = r.U8();
  ptr_size_ = r.U8();
  if (!r.ok()) return absl::InvalidArgumentError("gopclntab: header truncated");
  switch (magic) {
    case kMagic116: version_ = Version::kGo116; break;
    case kMagic118: version_ = Version::kGo118; break;
    case kMagic120: version_ = Version::kGo120; break;
    default:
      return absl::InvalidArgumentError(absl::StrCat("gopclntab: unknown magic 0x",
                                                     absl::Hex(magic)));
  }
  if (pad1 != 0 || pad2 != 0 || (min_lc_ != 1 && min_lc_ != 2 && min_lc_ != 4) ||
      (ptr_size_ != 4 && ptr_size_ != 8)) {
    return absl::InvalidArgumentError("gopclntab: bad header (pad, quantum or pointer size)");
  }
  const size_t p = ptr_size_;
  if (data_.size() < 8 + 8 * p) return absl::InvalidArgumentError("gopclntab: header truncated");
  size_t at = 8;
  nfunc_ = Word(at);
  at += 2 * p;  // nfunc, nfiles
  if (version_ != Version::kGo116) {
    text_start_ = Word(at);
    at += p;
  }
  funcname_off_ = Word(at);
  cu_off_ = Word(at + p);
  filetab_off_ = Word(at + 2 * p);
  pctab_off_ = Word(at + 3 * p);
  pcln_off_ = Word(at + 4 * p);
  for (uint64_t off : {funcname_off_, cu_off_, filetab_off_, pctab_off_, pcln_off_}) {
    if (off == 0 || off >= data_.size()) {
      return absl::InvalidArgumentError("gopclntab: table offset out of range");
    }
  }
  const uint64_t ftab_entry = version_ == Version::kGo116 ? 2 * p : 8;
  // nfunc + 1 function table entries (the last one marks the end of the text).
  if (nfunc_ == 0 || nfunc_ >= (data_.size() - pcln_off_) / ftab_entry) {
    return absl::InvalidArgumentError("gopclntab: function count out of range");
  }
  return absl::OkStatus();
}

uint32_t GoPclntab::FuncField(const Function& f, size_t field_offset) const {
  ByteReader r(data_, big_endian_);
  r.Seek(pcln_off_ + f.func_offset + field_offset);
  uint32_t v = r.U32();
  return r.ok() ? v : 0;
}

std::string_view GoPclntab::NameAt(uint32_t nameoff, size_t* scanned) const {
  const uint64_t at = funcname_off_ + nameoff;
  if (at >= data_.size()) return {};
  const size_t end = data_.find('\0', at);
  if (scanned != nullptr) *scanned = (end == std::string_view::npos ? data_.size() : end) - at + 1;
  return end == std::string_view::npos ? std::string_view() : data_.substr(at, end - at);
}

absl::Status GoPclntab::ParseFunctions() {
  const FuncLayout layout = LayoutOf(version_, ptr_size_);
  ByteReader ftab(data_, big_endian_);
  ftab.Seek(pcln_off_);
  std::vector<std::pair<uint64_t, uint64_t>> entries;  // (entry pc, _func offset)
  entries.reserve(nfunc_ + 1);
  for (uint64_t i = 0; i <= nfunc_; ++i) {
    uint64_t entry, funcoff;
    if (version_ == Version::kGo116) {
      entry = ptr_size_ == 8 ? ftab.U64() : ftab.U32();
      funcoff = ptr_size_ == 8 ? ftab.U64() : ftab.U32();
    } else {
      entry = text_start_ + ftab.U32();
      funcoff = ftab.U32();
    }
    if (!ftab.ok()) return absl::InvalidArgumentError("gopclntab: function table truncated");
    entries.emplace_back(entry, funcoff);
  }
  functions_.clear();
  functions_.reserve(nfunc_);
  // Each function's name is scanned for its end (and copied by those who keep names): real
  // tables hold each name once, a corrupt one may have every function name one long string.
  size_t name_budget = 2 * data_.size() + (size_t{1} << 20);
  // Every step of a table takes at least two of its bytes, so the SP tables of all functions
  // together take fewer steps than the table has bytes -- unless a corrupt table points many
  // functions at one long run, which must not cost the reader quadratic time.
  size_t budget = data_.size();
  for (uint64_t i = 0; i < nfunc_; ++i) {
    const auto [entry, funcoff] = entries[i];
    const uint64_t next = entries[i + 1].first;
    if (next < entry || funcoff >= data_.size() - pcln_off_ ||
        data_.size() - pcln_off_ - funcoff < layout.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("gopclntab: function ", i, " out of order or out of range"));
    }
    Function f;
    f.entry = entry;
    f.end = next;
    f.func_offset = static_cast<uint32_t>(funcoff);
    size_t scanned = 0;
    f.name = NameAt(FuncField(f, layout.nameoff), &scanned);
    if (scanned > name_budget) {
      return absl::InvalidArgumentError(
          "gopclntab: function names longer than the table (corrupt)");
    }
    name_budget -= scanned;
    ByteReader r(data_, big_endian_);
    r.Seek(pcln_off_ + funcoff + layout.func_id);
    f.func_id = r.U8();
    r.Seek(pcln_off_ + funcoff + layout.flag);
    f.flags = r.U8();  // 0 in Go 1.16 tables (padding)
    f.root = (f.flags & (kFlagTopFrame | kFlagSpWrite)) != 0 || IsRootName(f.name);
    // The pcsp table ends where the function's code does (padding between functions is not
    // the function's); a table that does not decode leaves the next entry as the end.
    std::vector<PcValueRange> sp;
    if (DecodeTable(f, FuncField(f, layout.pcsp), &sp, &budget) && !sp.empty() &&
        sp.back().end <= next) {
      f.end = sp.back().end;
    }
    if (budget == 0) {
      return absl::InvalidArgumentError("gopclntab: SP tables larger than the table (corrupt)");
    }
    functions_.push_back(f);
  }
  return absl::OkStatus();
}

bool GoPclntab::DecodeTable(const Function& f, uint32_t offset, std::vector<PcValueRange>* out,
                            size_t* budget, uint64_t stop_at) const {
  out->clear();
  if (offset == 0) return false;
  ByteReader r(data_, big_endian_);
  r.Seek(pctab_off_ + offset);
  uint64_t pc = f.entry;
  int32_t value = -1;
  for (size_t step = 0; step < kMaxTableSteps; ++step) {
    if (budget != nullptr) {
      if (*budget == 0) return false;
      --*budget;
    }
    const uint64_t uvdelta = r.Uleb128();
    if (!r.ok()) return false;
    if (uvdelta == 0 && step > 0) return true;
    const uint32_t u = static_cast<uint32_t>(uvdelta);
    // Zigzag delta, added with int32 wraparound as Go's runtime does (no signed overflow).
    value = static_cast<int32_t>(static_cast<uint32_t>(value) + (-(u & 1) ^ (u >> 1)));
    const uint64_t pcdelta = r.Uleb128();
    if (!r.ok()) return false;
    if (pcdelta > kMaxFunctionBytes) return false;  // (and no wraparound below)
    const uint64_t start = pc;
    pc += pcdelta * min_lc_;
    if (pc < start || pc - f.entry > kMaxFunctionBytes) return false;
    out->push_back({start, pc, value});
    if (pc > stop_at) return true;  // the caller needs nothing beyond
  }
  return false;
}

std::optional<int32_t> GoPclntab::ValueAt(const Function& f, uint32_t offset, uint64_t pc) const {
  std::vector<PcValueRange> ranges;
  if (!DecodeTable(f, offset, &ranges, nullptr, pc)) return std::nullopt;
  for (const PcValueRange& r : ranges) {
    if (pc >= r.start && pc < r.end) return r.value;
  }
  return std::nullopt;
}

int64_t GoPclntab::FindFunction(uint64_t pc) const {
  auto it = std::upper_bound(functions_.begin(), functions_.end(), pc,
                             [](uint64_t a, const Function& f) { return a < f.entry; });
  if (it == functions_.begin()) return -1;
  --it;
  if (pc >= it->end) return -1;
  return it - functions_.begin();
}

std::vector<GoPclntab::PcValueRange> GoPclntab::SpDeltas(const Function& f) const {
  std::vector<PcValueRange> out;
  if (!DecodeTable(f, FuncField(f, LayoutOf(version_, ptr_size_).pcsp), &out)) out.clear();
  return out;
}

uint32_t GoPclntab::PcdataOffset(const Function& f, uint32_t table) const {
  const FuncLayout layout = LayoutOf(version_, ptr_size_);
  if (table >= FuncField(f, layout.npcdata)) return 0;
  return FuncField(f, layout.size + 4 * table);
}

uint64_t GoPclntab::FuncdataAddress(const Function& f, uint32_t index) const {
  const FuncLayout layout = LayoutOf(version_, ptr_size_);
  ByteReader r(data_, big_endian_);
  r.Seek(pcln_off_ + f.func_offset + layout.nfuncdata);
  const uint8_t nfuncdata = r.U8();
  if (!r.ok() || index >= nfuncdata) return 0;
  const uint32_t npcdata = FuncField(f, layout.npcdata);
  uint64_t at = pcln_off_ + f.func_offset + layout.size + 4ull * npcdata;
  if (version_ == Version::kGo116) {
    // Pointers, aligned to the pointer size in memory.
    if (ptr_size_ == 8 && ((vaddr_ + at) & 4) != 0) at += 4;
    const uint64_t addr = Word(at + uint64_t{ptr_size_} * index);
    return addr;
  }
  r.Seek(at + 4ull * index);
  const uint32_t off = r.U32();
  if (!r.ok() || off == 0xffffffffu || gofunc_ == 0) return 0;
  return gofunc_ + off;
}

std::string_view GoPclntab::FileName(const Function& f, int32_t file_index) const {
  if (file_index < 0) return {};
  const uint32_t cu = FuncField(f, LayoutOf(version_, ptr_size_).cu_offset);
  ByteReader r(data_, big_endian_);
  r.Seek(cu_off_ + 4ull * (uint64_t{cu} + static_cast<uint32_t>(file_index)));
  const uint32_t off = r.U32();
  if (!r.ok() || off == 0xffffffffu) return {};
  r.Seek(filetab_off_ + off);
  std::string_view name = r.CString();
  return r.ok() ? name : std::string_view();
}

std::vector<GoPclntab::SourceFrame> GoPclntab::Symbolize(const Function& f, uint64_t pc) const {
  std::vector<SourceFrame> frames;
  const FuncLayout layout = LayoutOf(version_, ptr_size_);
  const uint32_t pcfile = FuncField(f, layout.pcfile);
  const uint32_t pcln = FuncField(f, layout.pcln);
  auto position = [&](uint64_t at, SourceFrame* frame) {
    frame->file = FileName(f, ValueAt(f, pcfile, at).value_or(-1));
    frame->line = ValueAt(f, pcln, at).value_or(0);
  };
  // The inline tree: PCDATA_InlTreeIndex says which inlined call `pc` is in; each call names
  // its callee and the offset of an instruction at its call site in the parent (parentPc).
  const uint64_t tree = FuncdataAddress(f, kFuncdataInlTree);
  const uint32_t index_table = PcdataOffset(f, kPcdataInlTreeIndex);
  const size_t record = version_ == Version::kGo120 ? 16 : 20;
  uint64_t at = pc;
  for (size_t depth = 0; tree != 0 && index_table != 0 && elf_ != nullptr && depth < 64; ++depth) {
    const std::optional<int32_t> ix = ValueAt(f, index_table, at);
    if (!ix || *ix < 0) break;
    const std::optional<std::string_view> bytes =
        elf_->ReadAt(tree + uint64_t(*ix) * record, record);
    if (!bytes) break;
    ByteReader r(*bytes, big_endian_);
    int32_t name_off, parent_pc;
    if (version_ == Version::kGo120) {
      r.Skip(4);  // funcID, padding
      name_off = static_cast<int32_t>(r.U32());
      parent_pc = static_cast<int32_t>(r.U32());
    } else {
      r.Skip(12);  // parent, funcID, padding, file, line
      name_off = static_cast<int32_t>(r.U32());
      parent_pc = static_cast<int32_t>(r.U32());
    }
    if (!r.ok() || name_off < 0 || parent_pc < 0) break;
    SourceFrame frame{NameAt(static_cast<uint32_t>(name_off)), {}, 0, true};
    position(at, &frame);
    frames.push_back(frame);
    const uint64_t parent = f.entry + static_cast<uint32_t>(parent_pc);
    if (parent == at || parent >= f.end) break;
    at = parent;
  }
  SourceFrame outer{f.name, {}, 0, false};
  position(at, &outer);
  frames.push_back(outer);
  return frames;
}

std::string_view GoPclntab::FindModuledata(const ElfFile& elf) const {
  const size_t p = ptr_size_;
  // Sections scanned to at most the file's size in all (headers may alias one range).
  uint64_t scanned = 0;
  for (const Section& s : elf.sections()) {
    if (s.type != 1 /*SHT_PROGBITS*/ || !(s.flags & 1 /*SHF_WRITE*/)) continue;
    absl::StatusOr<std::string_view> bytes = elf.SectionData(s);
    if (!bytes.ok()) continue;
    scanned += bytes->size();
    if (scanned > elf.image().size()) return {};
    ByteReader r(*bytes, big_endian_);
    for (size_t at = 0; at + 2 * p <= bytes->size(); at += p) {
      r.Seek(at);
      if ((p == 8 ? r.U64() : r.U32()) != vaddr_) continue;
      if ((p == 8 ? r.U64() : r.U32()) != vaddr_ + funcname_off_) continue;
      return bytes->substr(at);
    }
  }
  return {};
}

void GoPclntab::FindGoFunc(std::string_view moduledata) {
  // gofunc (go:func.*) follows moduledata's rodata, the .rodata section's address: word 38 in
  // Go 1.18-1.19, 40 in 1.20-1.23 (covctrs, ecovctrs), 43 in 1.27. Where no rodata is found,
  // the word of the release's layout.
  const size_t p = ptr_size_;
  ByteReader r(moduledata, big_endian_);
  auto word = [&](size_t w) -> uint64_t {
    if ((w + 1) * p > moduledata.size()) return 0;
    r.Seek(w * p);
    return p == 8 ? r.U64() : r.U32();
  };
  auto read_only_data = [&](uint64_t address) {
    for (const Section& ro : elf_->sections()) {
      if (ro.Contains(address) && !(ro.flags & 4 /*SHF_EXECINSTR*/) &&
          !(ro.flags & 1 /*SHF_WRITE*/)) {
        return true;
      }
    }
    return false;
  };
  size_t gofunc_word = version_ == Version::kGo118 ? 38 : 40;
  if (const Section* rodata = elf_->FindSection(".rodata"); rodata != nullptr) {
    for (size_t w = 30; w < 56; ++w) {
      if (word(w) == rodata->addr && read_only_data(word(w + 1))) {
        gofunc_word = w + 1;
        break;
      }
    }
  }
  if (const uint64_t gofunc = word(gofunc_word); read_only_data(gofunc)) gofunc_ = gofunc;
}

absl::StatusOr<std::unique_ptr<GoPclntab>> GoPclntab::Parse(std::string_view table,
                                                            uint64_t vaddr, bool big_endian,
                                                            const ElfFile* elf) {
  std::unique_ptr<GoPclntab> t(new GoPclntab());
  t->data_ = table;
  t->vaddr_ = vaddr;
  t->big_endian_ = big_endian;
  t->elf_ = elf;
  if (absl::Status s = t->ParseHeader(); !s.ok()) return s;
  std::string_view moduledata;
  if (elf != nullptr && t->version_ != Version::kGo116) {
    moduledata = t->FindModuledata(*elf);
    const auto in_code = [&](uint64_t address) {
      for (const LoadSegment& seg : elf->load_segments()) {
        if (seg.executable() && address >= seg.vaddr && address - seg.vaddr < seg.memsz) {
          return true;
        }
      }
      return false;
    };
    // Newer linkers (Go 1.26 and later) leave textStart 0, and a PIE's may be left to a
    // dynamic relocation: then it is moduledata's text (word 22 from Go 1.18 on), which
    // follows the build ID's bytes at .text's start, or where there is none, .text's address.
    if (!in_code(t->text_start_)) {
      const size_t p = t->ptr_size_;
      uint64_t text = 0;
      if (moduledata.size() >= 24 * p) {
        ByteReader r(moduledata, big_endian);
        r.Seek(22 * p);
        text = p == 8 ? r.U64() : r.U32();
      }
      const Section* section = elf->FindSection(".text");
      if (in_code(text)) {
        t->text_start_ = text;
      } else if (section != nullptr) {
        t->text_start_ = section->addr;
      } else {
        return absl::InvalidArgumentError("gopclntab: textStart outside code");
      }
    }
  }
  if (absl::Status s = t->ParseFunctions(); !s.ok()) return s;
  if (!moduledata.empty()) t->FindGoFunc(moduledata);
  return t;
}

absl::StatusOr<std::unique_ptr<GoPclntab>> GoPclntab::Find(const ElfFile& elf) {
  for (std::string_view name : {".gopclntab", ".data.rel.ro.gopclntab"}) {
    const Section* s = elf.FindSection(name);
    if (s == nullptr || s->type == 8 /*SHT_NOBITS*/) continue;
    absl::StatusOr<std::string_view> bytes = elf.SectionData(*s);
    if (!bytes.ok()) return bytes.status();
    return Parse(*bytes, s->addr, elf.big_endian(), &elf);
  }
  // Without the section's name (other linkers, renamed sections): the header magic at a
  // pointer-aligned offset of loaded data, confirmed by a full parse. A parse may cost the
  // rest of the section, so only the first kMaxMagicCandidates headers are parsed (a real
  // file has one table), and sections are scanned to at most the file's size in all
  // (headers may alias one range).
  constexpr int kMaxMagicCandidates = 8;
  int candidates = 0;
  uint64_t scanned = 0;
  for (const Section& s : elf.sections()) {
    // Loaded data, not code.
    if (s.type != 1 /*SHT_PROGBITS*/ || (s.flags & 4 /*SHF_EXECINSTR*/) || !(s.flags & 2)) continue;
    absl::StatusOr<std::string_view> bytes = elf.SectionData(s);
    if (!bytes.ok()) continue;
    scanned += bytes->size();
    if (scanned > elf.image().size()) break;
    ByteReader r(*bytes, elf.big_endian());
    for (size_t at = 0; at + 64 <= bytes->size(); at += 8) {
      r.Seek(at);
      const uint32_t magic = r.U32();
      if (magic != kMagic116 && magic != kMagic118 && magic != kMagic120) continue;
      // The rest of the 8-byte header (padding, quantum, pointer size), as ParseHeader wants
      // it: the magic numbers alone are common words (-15 is one).
      const uint8_t pad1 = r.U8(), pad2 = r.U8(), quantum = r.U8(), pointer = r.U8();
      if (pad1 != 0 || pad2 != 0 || (quantum != 1 && quantum != 2 && quantum != 4) ||
          (pointer != 4 && pointer != 8)) {
        continue;
      }
      if (++candidates > kMaxMagicCandidates) {
        return absl::NotFoundError(absl::StrCat(
            "no Go symbol table (.gopclntab) in the first ", kMaxMagicCandidates,
            " places holding its magic number"));
      }
      auto t = Parse(bytes->substr(at), s.addr + at, elf.big_endian(), &elf);
      if (t.ok()) return t;
    }
  }
  return absl::NotFoundError("no Go symbol table (.gopclntab)");
}

size_t AddGoFunctionSymbols(const GoPclntab& table, std::vector<FunctionSymbol>* symbols) {
  absl::flat_hash_set<uint64_t> entries;
  for (const GoPclntab::Function& f : table.functions()) entries.insert(f.entry);
  symbols->erase(std::remove_if(symbols->begin(), symbols->end(),
                                [&](const FunctionSymbol& s) { return entries.contains(s.start); }),
                 symbols->end());
  for (const GoPclntab::Function& f : table.functions()) {
    symbols->push_back({f.entry, f.end - f.entry, std::string(f.name), /*global=*/true,
                        /*from_dynsym=*/false});
  }
  return table.functions().size();
}

bool LooksLikeGo(const ElfFile& elf) {
  return elf.FindSection(".gopclntab") != nullptr ||
         elf.FindSection(".data.rel.ro.gopclntab") != nullptr ||
         elf.FindSection(".gosymtab") != nullptr || elf.FindSection(".note.go.buildid") != nullptr;
}

}  // namespace strata::elf
