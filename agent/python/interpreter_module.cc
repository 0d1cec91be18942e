// InspectModule() and the ELF reading it needs: what a module's file says about the
// interpreter in it, before any process is read.
#include "agent/python/interpreter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace strata::agent::python {
namespace {

constexpr uint32_t kShtNobits = 8;
constexpr uint8_t kSttObject = 1;
constexpr uint64_t kShfAlloc = 2;

// "3.11" out of ".../python3.11", ".../libpython3.11.so.1.0".
bool VersionFromPath(std::string_view path, int* major, int* minor) {
  const size_t slash = path.rfind('/');
  std::string_view file = slash == std::string_view::npos ? path : path.substr(slash + 1);
  const size_t at = file.find("python3.");
  if (at == std::string_view::npos) return false;
  std::string_view rest = file.substr(at + 8);
  int m = 0;
  size_t digits = 0;
  while (digits < rest.size() && digits < 3 && rest[digits] >= '0' && rest[digits] <= '9') {
    m = m * 10 + (rest[digits] - '0');
    ++digits;
  }
  if (digits == 0) return false;
  *major = 3;
  *minor = m;
  return true;
}

}  // namespace

std::string_view FileBytesAt(const elf::ElfFile& elf, uint64_t vaddr, size_t size) {
  for (const elf::Section& s : elf.sections()) {
    // Allocated sections only: the others (debug sections) have address 0.
    if (s.type == kShtNobits || !(s.flags & kShfAlloc) || !s.Contains(vaddr) ||
        vaddr + size > s.addr + s.size) {
      continue;
    }
    absl::StatusOr<std::string_view> data = elf.SectionData(s);
    if (!data.ok()) return {};
    return data->substr(vaddr - s.addr, size);
  }
  return {};
}

std::optional<uint64_t> FindObjectSymbol(const elf::ElfFile& elf, std::string_view name) {
  for (const elf::Section* s : elf.SymbolTableSections()) {
    if (s->link >= elf.sections().size()) continue;
    absl::StatusOr<std::string_view> table = elf.SectionData(*s);
    absl::StatusOr<std::string_view> strings = elf.SectionData(elf.sections()[s->link]);
    if (!table.ok() || !strings.ok()) continue;
    elf::ByteReader in(*table, elf.big_endian());
    while (in.remaining() >= 24) {
      const uint32_t name_offset = in.U32();
      const uint8_t info = in.U8();
      in.U8();   // st_other
      const uint16_t shndx = in.U16();
      const uint64_t value = in.U64();
      in.U64();  // st_size
      if ((info & 0xf) != kSttObject || shndx == 0 || name_offset >= strings->size()) continue;
      // `name` and its NUL, compared in place: scanning each symbol's name for its end would
      // cost a table whose symbols all name one long string its size per symbol.
      const std::string_view sym = strings->substr(name_offset, name.size() + 1);
      if (sym.size() == name.size() + 1 && sym.back() == '\0' && sym.starts_with(name)) {
        return value;
      }
    }
  }
  return std::nullopt;
}

absl::StatusOr<InterpreterModule> InspectModule(const elf::ElfFile& elf,
                                                const elf::SymbolTable& symbols,
                                                std::string_view path) {
  InterpreterModule m;
  for (const elf::SymbolTable::Function& f : symbols.functions()) {
    if (f.end <= f.start || !f.name.starts_with(kEvalLoop)) continue;
    if (f.name.size() == kEvalLoop.size() || f.name[kEvalLoop.size()] == '.') {
      m.eval_ranges.push_back({f.start, f.end});
    }
  }
  if (m.eval_ranges.empty()) return absl::NotFoundError("no _PyEval_EvalFrameDefault");
  m.learn_eval_parts = std::none_of(
      symbols.functions().begin(), symbols.functions().end(),
      [](const elf::SymbolTable::Function& f) {
        return f.origin == elf::SymbolTable::Origin::kSymtab;
      });
  // CPython has one, and a compiler's split-off parts (.cold) a few more; InEvalLoop tests
  // every range on every frame.
  if (m.eval_ranges.size() > kMaxEvalRanges) {
    return absl::InvalidArgumentError(absl::StrCat(
        m.eval_ranges.size(), " _PyEval_EvalFrameDefault functions: not a CPython we read"));
  }
  std::optional<uint64_t> runtime = FindObjectSymbol(elf, "_PyRuntime");
  if (!runtime.has_value()) {
    // An interpreter's eval loop without _PyRuntime: CPython before 3.7. Said, not left as
    // "no interpreter here", or an old Python's profile shows only its C frames unexplained.
    return absl::FailedPreconditionError(
        "CPython without a _PyRuntime symbol (older than 3.7): Python frames need CPython 3.8 "
        "to 3.15");
  }
  m.runtime_vaddr = *runtime;
  m.init_cleanup_vaddr = FindObjectSymbol(elf, "_Py_InitCleanup").value_or(0);
  bool known = false;
  if (std::optional<uint64_t> version = FindObjectSymbol(elf, "Py_Version")) {
    std::string_view bytes = FileBytesAt(elf, *version, 4);
    if (bytes.size() == 4) {
      elf::ByteReader in(bytes, elf.big_endian());
      const uint32_t hex = in.U32();
      m.major = static_cast<int>(hex >> 24);
      m.minor = static_cast<int>((hex >> 16) & 0xff);
      known = true;
    }
  }
  if (!known && !VersionFromPath(path, &m.major, &m.minor)) {
    return absl::NotFoundError(absl::StrCat("no CPython version in ", std::string(path)));
  }
  if (absl::StatusOr<Offsets> o = OffsetsForVersion(m.major, m.minor); !o.ok()) return o.status();
  return m;
}

}  // namespace strata::agent::python
