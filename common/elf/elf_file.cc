#include "common/elf/elf_file.h"

#include <cxxabi.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/escaping.h"
#include "absl/container/flat_hash_map.h"

namespace strata::elf {
namespace {

constexpr uint32_t kShtSymtab = 2;
constexpr uint32_t kShtRela = 4;
constexpr uint32_t kShtNote = 7;
constexpr uint32_t kShtNobits = 8;
constexpr uint32_t kShtDynsym = 11;
constexpr uint32_t kPtLoad = 1;
constexpr uint32_t kPtNote = 4;
constexpr uint32_t kNtGnuBuildId = 3;
constexpr uint8_t kSttFunc = 2;
constexpr uint8_t kSttGnuIfunc = 10;
constexpr uint8_t kStbLocal = 0;
constexpr size_t kMaxSections = 1 << 16;
constexpr size_t kMaxSegments = 1 << 12;

// Names of one string table, read for symbols that each give an offset into it. Every symbol
// may name the same string of megabytes, and a name is scanned for its end, copied and
// demangled per symbol; real tables name each string about once (the linker's tail merging
// lets some share their ends), so the bytes scanned are bounded by a few times the table.
class SymbolNames {
 public:
  explicit SymbolNames(std::string_view strings)
      : strings_(strings), budget_(4 * strings.size() + (size_t{1} << 20)) {}

  // The name at `offset`: empty when there is none (outside, unterminated, empty) or when
  // the budget is spent (then spent()).
  std::string_view At(uint64_t offset) {
    if (offset >= strings_.size()) return {};
    const size_t end = strings_.find('\0', offset);
    scanned_ += (end == std::string_view::npos ? strings_.size() : end) - offset;
    if (spent() || end == std::string_view::npos) return {};
    return strings_.substr(offset, end - offset);
  }
  bool spent() const { return scanned_ > budget_; }
  absl::Status SpentError(const Section& table) const {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the names of ", std::string(table.name.substr(0, 80)), "'s symbols exceed ", budget_,
        " bytes: its symbols name the same strings again and again"));
  }

 private:
  std::string_view strings_;
  size_t budget_;
  size_t scanned_ = 0;
};

}  // namespace

// ---------------------------------------------------------------------------- ByteReader

bool ByteReader::Take(size_t n, const char** p) {
  if (!ok_ || n > data_.size() - pos_) {
    ok_ = false;
    return false;
  }
  *p = data_.data() + pos_;
  pos_ += n;
  return true;
}

void ByteReader::Seek(size_t pos) {
  if (pos > data_.size()) ok_ = false;
  else pos_ = pos;
}

void ByteReader::Skip(size_t n) {
  const char* p;
  Take(n, &p);
}

uint8_t ByteReader::U8() {
  const char* p;
  return Take(1, &p) ? static_cast<uint8_t>(*p) : 0;
}

uint16_t ByteReader::U16() {
  const char* p;
  if (!Take(2, &p)) return 0;
  uint16_t v;
  std::memcpy(&v, p, 2);
  return big_endian_ ? __builtin_bswap16(v) : v;
}

uint32_t ByteReader::U32() {
  const char* p;
  if (!Take(4, &p)) return 0;
  uint32_t v;
  std::memcpy(&v, p, 4);
  return big_endian_ ? __builtin_bswap32(v) : v;
}

uint64_t ByteReader::U64() {
  const char* p;
  if (!Take(8, &p)) return 0;
  uint64_t v;
  std::memcpy(&v, p, 8);
  return big_endian_ ? __builtin_bswap64(v) : v;
}

uint64_t ByteReader::Uleb128() {
  uint64_t result = 0;
  for (int shift = 0;; shift += 7) {
    uint8_t b = U8();
    if (!ok_) return 0;
    if (shift < 64) result |= static_cast<uint64_t>(b & 0x7f) << shift;
    else if ((b & 0x7f) != 0 || shift > 70) { ok_ = false; return 0; }  // overlong
    if (!(b & 0x80)) return result;
  }
}

int64_t ByteReader::Sleb128() {
  int64_t result = 0;
  int shift = 0;
  uint8_t b;
  do {
    b = U8();
    if (!ok_) return 0;
    if (shift < 64) result |= static_cast<int64_t>(static_cast<uint64_t>(b & 0x7f) << shift);
    else if (shift > 70) { ok_ = false; return 0; }
    shift += 7;
  } while (b & 0x80);
  if (shift < 64 && (b & 0x40)) result |= -(static_cast<int64_t>(1) << shift);
  return result;
}

std::string_view ByteReader::Bytes(size_t n) {
  const char* p;
  return Take(n, &p) ? std::string_view(p, n) : std::string_view();
}

std::string_view ByteReader::CString() {
  if (!ok_) return {};
  size_t end = data_.find('\0', pos_);
  if (end == std::string_view::npos) {
    ok_ = false;
    return {};
  }
  std::string_view s = data_.substr(pos_, end - pos_);
  pos_ = end + 1;
  return s;
}

// ---------------------------------------------------------------------------- ElfFile

ElfFile::~ElfFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<ElfFile>> ElfFile::Open(const std::string& path) {
  // Not blocking: a FIFO put where a module was (under /proc/PID/root) would otherwise hold
  // the open until a writer came; it is refused below like any other non-file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("open ", path, ": ", strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<ElfFile> elf(new ElfFile());
  if (st.st_size > 0) {
    void* p = mmap(nullptr, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap ", path, ": ", strerror(errno)));
    }
    elf->mapping_ = p;
    elf->mapping_size_ = st.st_size;
    elf->image_ = std::string_view(static_cast<const char*>(p), st.st_size);
  }
  ::close(fd);
  absl::Status s = elf->Parse();
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  return elf;
}

absl::StatusOr<std::unique_ptr<ElfFile>> ElfFile::FromBytes(std::string bytes) {
  std::unique_ptr<ElfFile> elf(new ElfFile());
  elf->owned_ = std::move(bytes);
  elf->image_ = elf->owned_;
  absl::Status s = elf->Parse();
  if (!s.ok()) return s;
  return elf;
}

absl::Status ElfFile::Parse() {
  if (image_.size() < 64 || image_.substr(0, 4) != "\x7f" "ELF") {
    return absl::InvalidArgumentError("not an ELF file");
  }
  if (image_[4] != 2) return absl::InvalidArgumentError("not ELF64");
  if (image_[5] != 1 && image_[5] != 2) return absl::InvalidArgumentError("bad ELF data encoding");
  big_endian_ = image_[5] == 2;
  ByteReader r = Reader(image_);
  r.Seek(16);
  type_ = r.U16();
  machine_ = r.U16();
  r.U32();  // e_version
  r.U64();  // e_entry
  uint64_t phoff = r.U64();
  uint64_t shoff = r.U64();
  r.U32();  // e_flags
  r.U16();  // e_ehsize
  uint16_t phentsize = r.U16();
  uint16_t phnum = r.U16();
  uint16_t shentsize = r.U16();
  uint16_t shnum = r.U16();
  uint16_t shstrndx = r.U16();
  if (!r.ok()) return absl::InvalidArgumentError("truncated ELF header");
  if (absl::Status s = ParseProgramHeaders(phoff, phentsize, phnum); !s.ok()) return s;
  if (absl::Status s = ParseSectionHeaders(shoff, shentsize, shnum, shstrndx); !s.ok()) return s;
  ParseBuildId();
  return absl::OkStatus();
}

absl::Status ElfFile::ParseProgramHeaders(uint64_t phoff, uint16_t phentsize, uint16_t phnum) {
  if (phnum == 0) return absl::OkStatus();
  if (phentsize < 56 || phnum > kMaxSegments || phoff > image_.size() ||
      static_cast<uint64_t>(phentsize) * phnum > image_.size() - phoff) {
    return absl::InvalidArgumentError("program headers outside the file");
  }
  for (uint16_t i = 0; i < phnum; ++i) {
    ByteReader r = Reader(image_);
    r.Seek(phoff + static_cast<uint64_t>(i) * phentsize);
    uint32_t type = r.U32();
    uint32_t flags = r.U32();
    uint64_t offset = r.U64();
    uint64_t vaddr = r.U64();
    r.U64();  // paddr
    uint64_t filesz = r.U64();
    uint64_t memsz = r.U64();
    if (!r.ok()) return absl::InvalidArgumentError("truncated program header");
    if (type == kPtLoad) {
      load_segments_.push_back({vaddr, offset, filesz, memsz, flags});
    } else if (type == kPtNote) {
      note_segments_.emplace_back(offset, filesz);
    }
  }
  return absl::OkStatus();
}

absl::Status ElfFile::ParseSectionHeaders(uint64_t shoff, uint16_t shentsize, uint16_t shnum,
                                          uint16_t shstrndx) {
  if (shnum == 0 || shoff == 0) return absl::OkStatus();  // stripped of section headers
  if (shentsize < 64 || shnum > kMaxSections || shoff > image_.size() ||
      static_cast<uint64_t>(shentsize) * shnum > image_.size() - shoff) {
    return absl::InvalidArgumentError("section headers outside the file");
  }
  std::vector<uint32_t> name_offsets;
  sections_.reserve(shnum);
  for (uint16_t i = 0; i < shnum; ++i) {
    ByteReader r = Reader(image_);
    r.Seek(shoff + static_cast<uint64_t>(i) * shentsize);
    Section s;
    name_offsets.push_back(r.U32());
    s.type = r.U32();
    s.flags = r.U64();
    s.addr = r.U64();
    s.offset = r.U64();
    s.size = r.U64();
    s.link = r.U32();
    s.info = r.U32();
    r.U64();  // addralign
    s.entsize = r.U64();
    if (!r.ok()) return absl::InvalidArgumentError("truncated section header");
    sections_.push_back(std::move(s));
  }
  if (shstrndx < sections_.size()) {
    const Section& strtab = sections_[shstrndx];
    absl::StatusOr<std::string_view> names = SectionData(strtab);
    if (!names.ok()) return absl::InvalidArgumentError("section name table outside the file");
    // Views, not copies, and each byte of the table scanned once: 65,536 headers may all
    // name one string of megabytes. In the order of their offsets, a name starting before
    // the end of the one before it ends there too.
    std::vector<uint32_t> order(sections_.size());
    std::iota(order.begin(), order.end(), 0u);
    std::sort(order.begin(), order.end(),
              [&](uint32_t a, uint32_t b) { return name_offsets[a] < name_offsets[b]; });
    size_t end = 0;
    bool found = false;
    for (const uint32_t i : order) {
      const size_t at = name_offsets[i];
      if (at >= names->size()) break;
      if (!found || at > end) {
        end = std::min(names->find('\0', at), names->size());
        found = true;
      }
      if (end < names->size()) sections_[i].name = names->substr(at, end - at);
    }
  }
  return absl::OkStatus();
}

void ElfFile::ParseBuildId() {
  auto scan = [&](std::string_view notes) {
    ByteReader r = Reader(notes);
    while (r.remaining() >= 12) {
      uint32_t namesz = r.U32();
      uint32_t descsz = r.U32();
      uint32_t type = r.U32();
      std::string_view name = r.Bytes((namesz + 3u) & ~3u);
      std::string_view desc = r.Bytes((descsz + 3u) & ~3u);
      if (!r.ok() || namesz > notes.size() || descsz > notes.size()) return false;
      if (type == kNtGnuBuildId && namesz == 4 && name.substr(0, 4) == std::string_view("GNU\0", 4)) {
        build_id_ = std::string(desc.substr(0, descsz));
        return true;
      }
    }
    return false;
  };
  for (const Section& s : sections_) {
    if (s.type != kShtNote) continue;
    absl::StatusOr<std::string_view> data = SectionData(s);
    if (data.ok() && scan(*data)) return;
  }
  for (auto [offset, size] : note_segments_) {
    if (offset > image_.size() || size > image_.size() - offset) continue;
    if (scan(image_.substr(offset, size))) return;
  }
  // Go's linker writes no GNU build ID unless asked (-B), but always its own: the note "Go",
  // type 4, "actionID/contentID" of the packages and of the link. The link's two parts (the
  // last 41 characters) identify the binary; they stand in for the GNU build ID, so a Go
  // binary is known to agent, uploads and server by the same ID (stripping keeps the note).
  if (const Section* go = FindSection(".note.go.buildid"); go != nullptr) {
    absl::StatusOr<std::string_view> data = SectionData(*go);
    if (!data.ok()) return;
    ByteReader r = Reader(*data);
    const uint32_t namesz = r.U32(), descsz = r.U32(), type = r.U32();
    std::string_view name = r.Bytes((namesz + 3u) & ~3u);
    std::string_view desc = r.Bytes(descsz);
    if (!r.ok() || type != 4 || name.substr(0, 2) != "Go") return;
    size_t cut = desc.size();
    for (int slashes = 0; cut > 0;) {
      if (desc[cut - 1] == '/' && ++slashes == 2) break;
      --cut;
    }
    std::string_view link = desc.substr(cut);
    if (link.size() > 64) link = link.substr(link.size() - 64);
    if (!link.empty()) build_id_ = std::string(link);
  }
}

const Section* ElfFile::FindSection(std::string_view name) const {
  for (const Section& s : sections_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

absl::StatusOr<std::string_view> ElfFile::SectionData(const Section& section) const {
  if (section.type == kShtNobits) return std::string_view();
  if (section.offset > image_.size() || section.size > image_.size() - section.offset) {
    return absl::OutOfRangeError(
        absl::StrCat("section ", std::string(section.name.substr(0, 80)), " outside the file"));
  }
  return image_.substr(section.offset, section.size);
}

std::optional<uint64_t> ElfFile::FileOffsetToVaddr(uint64_t offset) const {
  // Two segments can share a file page (the end of one and the start of the next, e.g. a
  // read-only segment and the RELRO start of the data segment). A mapping begins at its own
  // segment's first page, so a segment starting on exactly this page wins.
  for (const LoadSegment& seg : load_segments_) {
    if ((seg.offset & ~uint64_t{0xfff}) == offset) return seg.vaddr - (seg.offset - offset);
  }
  for (const LoadSegment& seg : load_segments_) {
    // A mapping's file offset is page aligned: it may sit before the segment's own offset
    // inside the same page.
    uint64_t page_start = seg.offset & ~uint64_t{0xfff};
    if (offset >= page_start && offset - page_start < seg.filesz + (seg.offset - page_start)) {
      return seg.vaddr - (seg.offset - offset);
    }
  }
  return std::nullopt;
}

uint64_t ElfFile::MinLoadVaddr() const {
  uint64_t min = UINT64_MAX;
  for (const LoadSegment& seg : load_segments_) min = std::min(min, seg.vaddr & ~uint64_t{0xfff});
  return min == UINT64_MAX ? 0 : min;
}

std::string ElfFile::BuildIdHex() const { return absl::BytesToHexString(build_id_); }

std::optional<std::string_view> ElfFile::ReadAt(uint64_t vaddr, size_t len) const {
  for (const LoadSegment& seg : load_segments_) {
    if (vaddr < seg.vaddr || vaddr - seg.vaddr >= seg.filesz) continue;
    uint64_t rel = vaddr - seg.vaddr;
    if (len > seg.filesz - rel) return std::nullopt;
    uint64_t off = seg.offset + rel;
    if (off > image_.size() || len > image_.size() - off) return std::nullopt;
    return image_.substr(off, len);
  }
  return std::nullopt;
}

std::optional<uint32_t> ElfFile::ReadU32At(uint64_t vaddr) const {
  std::optional<std::string_view> b = ReadAt(vaddr, 4);
  if (!b) return std::nullopt;
  return Reader(*b).U32();
}

absl::Status ElfFile::AppendSymbols(const Section& symtab, bool dynsym,
                                    std::vector<FunctionSymbol>* out) const {
  if (symtab.link >= sections_.size()) return absl::InvalidArgumentError("bad symbol string table");
  absl::StatusOr<std::string_view> syms = SectionData(symtab);
  if (!syms.ok()) return syms.status();
  absl::StatusOr<std::string_view> strs = SectionData(sections_[symtab.link]);
  if (!strs.ok()) return strs.status();
  constexpr size_t kSymSize = 24;
  size_t count = syms->size() / kSymSize;
  SymbolNames names(*strs);
  for (size_t i = 1; i < count; ++i) {
    ByteReader r = Reader(syms->substr(i * kSymSize, kSymSize));
    uint32_t name_off = r.U32();
    uint8_t info = r.U8();
    r.U8();  // other
    uint16_t shndx = r.U16();
    uint64_t value = r.U64();
    uint64_t size = r.U64();
    uint8_t type = info & 0xf;
    if (!r.ok() || (type != kSttFunc && type != kSttGnuIfunc) || shndx == 0 || value == 0) continue;
    const std::string_view name = names.At(name_off);
    if (names.spent()) return names.SpentError(symtab);
    if (name.empty()) continue;
    out->push_back({value, size, Demangle(name), (info >> 4) != kStbLocal, dynsym});
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<FunctionSymbol>> ElfFile::ReadFunctionSymbols() const {
  std::vector<FunctionSymbol> out;
  for (const Section* s : SymbolTableSections()) {
    if (absl::Status st = AppendSymbols(*s, s->type == kShtDynsym, &out); !st.ok()) return st;
  }
  return out;
}

std::vector<const Section*> ElfFile::SymbolTableSections() const {
  std::vector<const Section*> out;
  bool symtab = false, dynsym = false;
  for (const Section& s : sections_) {
    bool& seen = s.type == kShtSymtab ? symtab : dynsym;
    if ((s.type != kShtSymtab && s.type != kShtDynsym) || seen) continue;
    seen = true;
    out.push_back(&s);
  }
  return out;
}

std::vector<AddressRange> ElfFile::PltRanges() const {
  std::vector<AddressRange> out;
  for (std::string_view name : {".plt", ".plt.sec", ".plt.got"}) {
    if (const Section* s = FindSection(name); s != nullptr && s->size > 0) {
      out.push_back({s->addr, s->addr + s->size});
    }
  }
  return out;
}

absl::StatusOr<std::vector<PltEntry>> ElfFile::ReadPltEntries() const {
  std::vector<PltEntry> out;
  if (machine_ != kMachineX86_64) return out;  // MIPS uses .MIPS.stubs, not named here
  // GOT slot -> symbol name, from every RELA section that has a dynamic symbol table.
  absl::flat_hash_map<uint64_t, std::string> slot_names;
  uint64_t relocation_bytes = 0;
  for (const Section& rela : sections_) {
    if (rela.type != kShtRela || rela.link == 0 || rela.link >= sections_.size()) continue;
    const Section& dynsym = sections_[rela.link];
    if (dynsym.type != kShtDynsym || dynsym.link >= sections_.size()) continue;
    absl::StatusOr<std::string_view> rels = SectionData(rela);
    absl::StatusOr<std::string_view> syms = SectionData(dynsym);
    absl::StatusOr<std::string_view> strs = SectionData(sections_[dynsym.link]);
    if (!rels.ok() || !syms.ok() || !strs.ok()) return absl::InvalidArgumentError("bad relocations");
    // Real relocation sections do not overlap: headers aliasing one are read once in all.
    relocation_bytes += rels->size();
    if (relocation_bytes > image_.size()) break;
    SymbolNames names(*strs);
    for (size_t off = 0; off + 24 <= rels->size(); off += 24) {
      ByteReader r = Reader(rels->substr(off, 24));
      uint64_t slot = r.U64();
      uint64_t info = r.U64();
      uint64_t sym = info >> 32;
      if (sym == 0 || (sym + 1) * 24 > syms->size()) continue;
      ByteReader sr = Reader(syms->substr(sym * 24, 24));
      const std::string_view name = names.At(sr.U32());
      if (names.spent()) return names.SpentError(dynsym);
      if (!name.empty()) slot_names.emplace(slot, Demangle(name));
    }
  }
  for (std::string_view name : {".plt", ".plt.sec", ".plt.got"}) {
    const Section* s = FindSection(name);
    if (s == nullptr || s->size == 0) continue;
    absl::StatusOr<std::string_view> code = SectionData(*s);
    if (!code.ok()) return code.status();
    uint64_t entry = s->entsize >= 8 && s->entsize <= 32 ? s->entsize : 16;
    for (uint64_t off = 0; off + entry <= code->size(); off += entry) {
      PltEntry e{s->addr + off, entry, {}};
      // Find `jmp *disp32(%rip)` (ff 25, optionally bnd-prefixed) inside the stub.
      std::string_view stub = code->substr(off, entry);
      for (size_t i = 0; i + 6 <= stub.size(); ++i) {
        if (static_cast<uint8_t>(stub[i]) != 0xff || static_cast<uint8_t>(stub[i + 1]) != 0x25) continue;
        int32_t disp;
        std::memcpy(&disp, stub.data() + i + 2, 4);  // x86-64: little-endian
        uint64_t slot = e.start + i + 6 + static_cast<int64_t>(disp);
        if (auto it = slot_names.find(slot); it != slot_names.end()) e.target = it->second;
        break;
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

std::string Demangle(std::string_view name) {
  if (name.size() < 2 || name[0] != '_' || name[1] != 'Z') return std::string(name);
  std::string mangled(name);
  int status = 0;
  char* demangled = abi::__cxa_demangle(mangled.c_str(), nullptr, nullptr, &status);
  if (status != 0 || demangled == nullptr) return mangled;
  std::string result(demangled);
  std::free(demangled);
  return result;
}

}  // namespace strata::elf
