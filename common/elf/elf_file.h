// Bounds-checked ELF64 reader for the files the agent symbolizes and unwinds: x86-64 and
// MIPS64 executables and shared objects of either byte order, read on any host.
//
// An ElfFile owns a read-only mapping (or an in-memory copy) of one file and parses only the
// headers up front; everything else is decoded on request from that image. Every read is
// checked against the image size, so truncated or corrupt files yield an error status, never
// a crash. Views returned (std::string_view) point into the image and live as long as the
// ElfFile. Addresses are ELF virtual addresses ("module-relative" elsewhere in Strata).
#ifndef STRATA_COMMON_ELF_ELF_FILE_H_
#define STRATA_COMMON_ELF_ELF_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::elf {

inline constexpr uint16_t kMachineX86_64 = 62;  // EM_X86_64
inline constexpr uint16_t kMachineMips = 8;     // EM_MIPS

struct Section {
  std::string_view name;  // in the file's image: valid while its ElfFile lives
  uint32_t type = 0;  // SHT_*
  uint64_t flags = 0;
  uint64_t addr = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t link = 0;
  uint32_t info = 0;
  uint64_t entsize = 0;

  bool Contains(uint64_t vaddr) const { return vaddr >= addr && vaddr - addr < size; }
};

// A PT_LOAD program header.
struct LoadSegment {
  uint64_t vaddr = 0;
  uint64_t offset = 0;
  uint64_t filesz = 0;
  uint64_t memsz = 0;
  uint32_t flags = 0;  // PF_X = 1, PF_W = 2, PF_R = 4
  bool executable() const { return flags & 1; }
};

struct AddressRange {
  uint64_t start = 0;
  uint64_t end = 0;  // exclusive
  bool Contains(uint64_t a) const { return a >= start && a < end; }
};

// A function from .symtab or .dynsym (STT_FUNC / STT_GNU_IFUNC, defined).
struct FunctionSymbol {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string name;  // demangled when it is a C++ name
  bool global = false;
  bool from_dynsym = false;
};

// One PLT stub and, when the relocations name it, the function it jumps to.
struct PltEntry {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string target;  // e.g. "malloc"; empty when not derivable (PLT0, unknown slot)
};

// A bounds-checked little/big-endian cursor over bytes. Reads past the end set an error flag
// and return 0, so decoders can read a whole record and check `ok()` once.
class ByteReader {
 public:
  ByteReader(std::string_view data, bool big_endian) : data_(data), big_endian_(big_endian) {}

  bool ok() const { return ok_; }
  size_t pos() const { return pos_; }
  size_t remaining() const { return ok_ ? data_.size() - pos_ : 0; }
  std::string_view data() const { return data_; }
  bool big_endian() const { return big_endian_; }
  void Seek(size_t pos);
  void Skip(size_t n);

  uint8_t U8();
  uint16_t U16();
  uint32_t U32();
  uint64_t U64();
  uint64_t Uleb128();
  int64_t Sleb128();
  std::string_view Bytes(size_t n);
  std::string_view CString();  // without the terminating NUL (which must be present)

 private:
  bool Take(size_t n, const char** p);
  std::string_view data_;
  bool big_endian_;
  size_t pos_ = 0;
  bool ok_ = true;
};

class ElfFile {
 public:
  // Maps `path` read-only. Errors: unreadable file, not ELF64, malformed headers.
  static absl::StatusOr<std::unique_ptr<ElfFile>> Open(const std::string& path);
  // Parses an in-memory image (tests, [vdso] copied from a process).
  static absl::StatusOr<std::unique_ptr<ElfFile>> FromBytes(std::string bytes);

  ~ElfFile();
  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;

  bool big_endian() const { return big_endian_; }
  uint16_t machine() const { return machine_; }
  uint16_t type() const { return type_; }  // ET_EXEC = 2, ET_DYN = 3
  std::string_view image() const { return image_; }

  const std::vector<Section>& sections() const { return sections_; }
  const Section* FindSection(std::string_view name) const;
  // File bytes of `section` (empty for SHT_NOBITS). Error if it lies outside the file.
  absl::StatusOr<std::string_view> SectionData(const Section& section) const;

  const std::vector<LoadSegment>& load_segments() const { return load_segments_; }
  // Converts a file offset (as in /proc/PID/maps) to the ELF vaddr mapped from it.
  std::optional<uint64_t> FileOffsetToVaddr(uint64_t offset) const;
  // Lowest PT_LOAD vaddr rounded down to its alignment boundary (the "load base").
  uint64_t MinLoadVaddr() const;

  // GNU build ID bytes (.note.gnu.build-id or a PT_NOTE), empty when absent.
  const std::string& build_id() const { return build_id_; }
  std::string BuildIdHex() const;

  // The symbol tables: the first SHT_SYMTAB and the first SHT_DYNSYM, in header order (the
  // ELF specification allows one of each; a file of thousands of headers naming one table
  // would otherwise have it read as many times).
  std::vector<const Section*> SymbolTableSections() const;
  // Function symbols of .symtab and .dynsym, unsorted, duplicates kept. ResourceExhausted
  // when a table's symbols name the same strings again and again (a few times its strings).
  absl::StatusOr<std::vector<FunctionSymbol>> ReadFunctionSymbols() const;
  // Ranges of .plt, .plt.sec and .plt.got (those present).
  std::vector<AddressRange> PltRanges() const;
  // PLT stubs with target names (x86-64: decoded `jmp *slot(%rip)` + .rela.plt/.rela.dyn).
  absl::StatusOr<std::vector<PltEntry>> ReadPltEntries() const;

  // File-backed bytes at [vaddr, vaddr+len) of one PT_LOAD segment; nullopt when not
  // entirely inside the file part of a segment. For instruction decoding.
  std::optional<std::string_view> ReadAt(uint64_t vaddr, size_t len) const;
  // One 32-bit instruction word in the file's byte order.
  std::optional<uint32_t> ReadU32At(uint64_t vaddr) const;

  ByteReader Reader(std::string_view bytes) const { return ByteReader(bytes, big_endian_); }

 private:
  ElfFile() = default;
  absl::Status Parse();
  absl::Status ParseSectionHeaders(uint64_t shoff, uint16_t shentsize, uint16_t shnum,
                                   uint16_t shstrndx);
  absl::Status ParseProgramHeaders(uint64_t phoff, uint16_t phentsize, uint16_t phnum);
  void ParseBuildId();
  absl::Status AppendSymbols(const Section& symtab, bool dynsym,
                             std::vector<FunctionSymbol>* out) const;

  std::string owned_;             // FromBytes
  void* mapping_ = nullptr;       // Open
  size_t mapping_size_ = 0;
  std::string_view image_;
  bool big_endian_ = false;
  uint16_t machine_ = 0;
  uint16_t type_ = 0;
  std::vector<Section> sections_;
  std::vector<LoadSegment> load_segments_;
  std::vector<std::pair<uint64_t, uint64_t>> note_segments_;  // PT_NOTE (offset, size)
  std::string build_id_;
};

// Demangles an Itanium C++ name; returns `name` unchanged when it is not one.
std::string Demangle(std::string_view name);

}  // namespace strata::elf

#endif  // STRATA_COMMON_ELF_ELF_FILE_H_
