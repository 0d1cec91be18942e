#include "server/symbolize/source_lines.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/elf/elf_file.h"

namespace strata::server::symbolize {
namespace {

// Nesting of scopes followed below a unit DIE. Real code nests a few dozen deep at most; the
// cap bounds the recursion on corrupt DWARF.
constexpr int kMaxScopeDepth = 256;
// Address ranges read per DIE; the cap bounds the work on a corrupt range list.
constexpr int kMaxRangesPerDie = 1 << 20;

bool HasDebugInfoSection(Elf* elf) {
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return false;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const char* name = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (name == nullptr) continue;
    // A stripped debug file keeps the section headers of what it dropped, as NOBITS.
    if ((std::strcmp(name, ".debug_info") == 0 || std::strcmp(name, ".zdebug_info") == 0) &&
        shdr.sh_type != SHT_NOBITS && shdr.sh_size > 0) {
      return true;
    }
  }
  return false;
}

// `path` as is when absolute, else under the compilation directory of `die`'s unit.
std::string WithCompDir(Dwarf_Die* die, const char* path) {
  if (path == nullptr || *path == '\0') return "";
  if (*path == '/') return path;
  Dwarf_Die cu;
  Dwarf_Attribute attr;
  const char* comp_dir = nullptr;
  if (dwarf_diecu(die, &cu, nullptr, nullptr) != nullptr &&
      dwarf_attr(&cu, DW_AT_comp_dir, &attr) != nullptr) {
    comp_dir = dwarf_formstring(&attr);
  }
  if (comp_dir == nullptr || *comp_dir == '\0') return path;
  std::string joined(comp_dir);
  if (joined.back() != '/') joined += '/';
  return joined + path;
}

// The linkage name, demangled, else DW_AT_name; both possibly on the abstract origin (inlined
// code, out-of-line copies of inline functions) or the declaration (DW_AT_specification).
// addr2line -C prefers the linkage name too: it carries the namespace, class and parameters.
std::string FunctionName(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dwarf_attr_integrate(die, name, &attr) != nullptr) {
      const char* s = dwarf_formstring(&attr);
      if (s != nullptr && *s != '\0') return elf::Demangle(s);
    }
  }
  if (dwarf_attr_integrate(die, DW_AT_name, &attr) != nullptr) {
    const char* s = dwarf_formstring(&attr);
    if (s != nullptr) return s;
  }
  return "";
}

bool HasPcAttributes(Dwarf_Die* die) {
  return dwarf_hasattr(die, DW_AT_low_pc) || dwarf_hasattr(die, DW_AT_ranges);
}

// Calls `fn(range)` for each range of `sorted` (by start, with max_end) containing `address`,
// nearest start first.
template <typename Range, typename Fn>
void ForEachCovering(const std::vector<Range>& sorted, uint64_t address, Fn fn) {
  auto it = std::upper_bound(sorted.begin(), sorted.end(), address,
                             [](uint64_t a, const Range& r) { return a < r.start; });
  for (size_t i = it - sorted.begin(); i-- > 0 && sorted[i].max_end > address;) {
    if (sorted[i].end > address) fn(sorted[i]);
  }
}

template <typename Range>
void SortByStart(std::vector<Range>* ranges) {
  std::sort(ranges->begin(), ranges->end(),
            [](const Range& a, const Range& b) { return a.start < b.start; });
  uint64_t max_end = 0;
  for (Range& r : *ranges) {
    max_end = std::max(max_end, r.end);
    r.max_end = max_end;
  }
}

// Calls `fn(start, end)` for the address ranges of `die` that can hold code of a linked module.
template <typename Fn>
void ForEachRange(Dwarf_Die* die, Fn fn) {
  Dwarf_Addr base = 0, start = 0, end = 0;
  ptrdiff_t offset = 0;
  for (int n = 0;
       n < kMaxRangesPerDie && (offset = dwarf_ranges(die, offset, &base, &start, &end)) > 0;
       ++n) {
    // Linkers resolve the addresses of discarded code to 0 (ld.bfd) or to a tombstone near
    // 2^64 (lld, making end < start); no code of a linked module lives at address 0.
    if (start != 0 && end > start) fn(start, end);
  }
}

// Appends to `chain` the inlined subroutines below `parent` whose ranges contain `address`,
// outermost first. dwarf_getscopes is not used: past the innermost inlined instance it returns
// the scopes of the inline function's abstract definition, not the functions the code was
// inlined into.
void FindInlined(Dwarf_Die* parent, uint64_t address, int depth, std::vector<Dwarf_Die>* chain) {
  if (depth > kMaxScopeDepth) return;
  Dwarf_Die child;
  if (dwarf_child(parent, &child) != 0) return;
  do {
    switch (dwarf_tag(&child)) {
      case DW_TAG_inlined_subroutine:
        if (dwarf_haspc(&child, address) == 1) {
          chain->push_back(child);
          FindInlined(&child, address, depth + 1, chain);
          return;
        }
        break;
      // A block without addresses (gcc emits some) may still hold inlined subroutines that have
      // them, so it is searched; one whose addresses do not contain `address` is not.
      case DW_TAG_lexical_block:
      case DW_TAG_try_block:
      case DW_TAG_catch_block:
      case DW_TAG_with_stmt: {
        const bool covers = dwarf_haspc(&child, address) == 1;
        if (covers || !HasPcAttributes(&child)) {
          const size_t before = chain->size();
          FindInlined(&child, address, depth + 1, chain);
          if (covers || chain->size() > before) return;
        }
        break;
      }
      default:  // nested functions are looked up on their own; the rest holds no code
        break;
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

// DIEs that may hold an out-of-line function below them: besides the unit and namespaces,
// gcc puts a lambda's operator() inside its closure type, inside the enclosing function.
bool MayHoldFunctions(int tag) {
  switch (tag) {
    case DW_TAG_subprogram:
    case DW_TAG_inlined_subroutine:
    case DW_TAG_lexical_block:
    case DW_TAG_try_block:
    case DW_TAG_catch_block:
    case DW_TAG_with_stmt:
    case DW_TAG_namespace:
    case DW_TAG_module:
    case DW_TAG_structure_type:
    case DW_TAG_class_type:
    case DW_TAG_union_type:
      return true;
    default:
      return false;
  }
}

uint32_t ToLine(int64_t line) {
  return line > 0 && line <= UINT32_MAX ? static_cast<uint32_t>(line) : 0;
}

}  // namespace

struct SourceLines::Impl {
  // An out-of-line function's address range.
  struct FunctionRange {
    uint64_t start = 0;
    uint64_t end = 0;      // exclusive
    uint64_t max_end = 0;  // largest `end` of this and all earlier ranges (sorted by start)
    Dwarf_Off offset = 0;  // of `die`
    Dwarf_Die die;
  };
  struct Unit {
    Dwarf_Die die;
    bool indexed = false;
    std::vector<FunctionRange> functions;  // built on the unit's first lookup
  };
  struct UnitRange {
    uint64_t start = 0;
    uint64_t end = 0;
    uint64_t max_end = 0;
    size_t unit = 0;  // index into `units`
  };
  // An ELF function symbol; `name` points into libelf's image of the string table.
  struct Symbol {
    uint64_t start = 0;
    uint64_t size = 0;
    const char* name = nullptr;
  };

  int fd = -1;
  Elf* elf = nullptr;
  Dwarf* dwarf = nullptr;
  std::vector<Unit> units;  // compilation units with code
  absl::flat_hash_map<Dwarf_Off, size_t> unit_by_offset;
  // gcc gives a lambda's operator() no DW_AT_decl_line; its closure type has the lambda's line.
  // By the offset of the operator()'s declaration, for the units indexed so far.
  absl::flat_hash_map<Dwarf_Off, uint32_t> lambda_decl_lines;
  std::vector<UnitRange> ranges;
  bool symbols_read = false;
  std::vector<Symbol> symbols;  // by start; read on first need

  ~Impl() {
    if (dwarf != nullptr) dwarf_end(dwarf);
    if (elf != nullptr) elf_end(elf);
    if (fd >= 0) close(fd);
  }

  absl::Status IndexUnits(const std::string& path);
  size_t AddUnit(const Dwarf_Die& die);
  // `type_line`: DW_AT_decl_line of `parent` when it is a class type, else 0.
  void IndexFunctions(Dwarf_Die* parent, uint32_t type_line, int depth,
                      std::vector<FunctionRange>* out);
  // The function DIEs at `address`, out-of-line function first, and the unit they are in.
  // False when no unit has a function there; `unit` is then the first unit covering the
  // address, if any (`unit_found`).
  bool FindChain(uint64_t address, Dwarf_Die* unit, std::vector<Dwarf_Die>* chain,
                 bool* unit_found);

  void ReadSymbols();
  const char* SymbolStartingAt(uint64_t address);
  const char* SymbolContaining(uint64_t address);
  // Frame name of an out-of-line function: see Frames in the header.
  std::string OutOfLineName(Dwarf_Die* die);
  // DW_AT_decl_line of a function DIE (or its origin's), the closure type's for a lambda;
  // 0 when unknown.
  uint32_t DeclLine(Dwarf_Die die);
};

size_t SourceLines::Impl::AddUnit(const Dwarf_Die& die) {
  Dwarf_Die copy = die;
  unit_by_offset[dwarf_dieoffset(&copy)] = units.size();
  units.push_back({die, false, {}});
  return units.size() - 1;
}

absl::Status SourceLines::Impl::IndexUnits(const std::string& path) {
  Dwarf_CU* cu = nullptr;
  Dwarf_CU* next = nullptr;
  Dwarf_Half version = 0;
  uint8_t unit_type = 0;
  Dwarf_Die cudie;
  int units_read = 0;
  int rc;
  while ((rc = dwarf_get_units(dwarf, cu, &next, &version, &unit_type, &cudie, nullptr)) == 0) {
    cu = next;
    ++units_read;
    // Type units have no code; split units (.dwo) are not looked for.
    if (unit_type != DW_UT_compile && unit_type != DW_UT_partial) continue;
    std::vector<UnitRange> unit_ranges;
    ForEachRange(&cudie, [&](uint64_t start, uint64_t end) {
      unit_ranges.push_back({start, end, 0, 0});
    });
    if (unit_ranges.empty()) continue;
    const size_t index = AddUnit(cudie);
    for (UnitRange& r : unit_ranges) {
      r.unit = index;
      ranges.push_back(r);
    }
  }
  // A read error after the first units leaves the ones read usable.
  if (units_read == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no readable compilation unit in .debug_info",
                     rc < 0 ? absl::StrCat(" (", std::string(dwarf_errmsg(-1)), ")") : ""));
  }
  SortByStart(&ranges);
  return absl::OkStatus();
}

void SourceLines::Impl::IndexFunctions(Dwarf_Die* parent, uint32_t type_line, int depth,
                                       std::vector<FunctionRange>* out) {
  if (depth > kMaxScopeDepth) return;
  Dwarf_Die child;
  if (dwarf_child(parent, &child) != 0) return;
  do {
    const int tag = dwarf_tag(&child);
    if (tag == DW_TAG_subprogram) {
      if (HasPcAttributes(&child)) {
        const Dwarf_Off offset = dwarf_dieoffset(&child);
        ForEachRange(&child, [&](uint64_t start, uint64_t end) {
          out->push_back({start, end, 0, offset, child});
        });
      }
      if (type_line > 0 && !dwarf_hasattr(&child, DW_AT_decl_line)) {
        const char* name = dwarf_diename(&child);
        if (name != nullptr && std::strcmp(name, "operator()") == 0) {
          lambda_decl_lines[dwarf_dieoffset(&child)] = type_line;
        }
      }
    }
    if (MayHoldFunctions(tag) && dwarf_haschildren(&child) > 0) {
      uint32_t line = 0;
      if (tag == DW_TAG_structure_type || tag == DW_TAG_class_type) {
        int decl_line = 0;
        if (dwarf_decl_line(&child, &decl_line) == 0) line = ToLine(decl_line);
      }
      IndexFunctions(&child, line, depth + 1, out);
    }
  } while (dwarf_siblingof(&child, &child) == 0);
}

bool SourceLines::Impl::FindChain(uint64_t address, Dwarf_Die* unit,
                                  std::vector<Dwarf_Die>* chain, bool* unit_found) {
  std::vector<size_t> candidates;
  ForEachCovering(ranges, address, [&](const UnitRange& r) {
    if (std::find(candidates.begin(), candidates.end(), r.unit) == candidates.end()) {
      candidates.push_back(r.unit);
    }
  });
  if (candidates.empty()) {  // units without DW_AT_ranges/low_pc: .debug_aranges may know
    Dwarf_Die cudie;
    if (dwarf_addrdie(dwarf, address, &cudie) != nullptr) {
      auto it = unit_by_offset.find(dwarf_dieoffset(&cudie));
      candidates.push_back(it != unit_by_offset.end() ? it->second : AddUnit(cudie));
    }
  }
  *unit_found = !candidates.empty();
  if (*unit_found) *unit = units[candidates[0]].die;
  chain->clear();
  for (size_t index : candidates) {
    Unit& u = units[index];
    if (!u.indexed) {
      IndexFunctions(&u.die, 0, 0, &u.functions);
      SortByStart(&u.functions);
      u.indexed = true;
    }
    // The smallest range containing the address is the innermost function: a nested one
    // (GNU C) rather than its parent. Ties go to the later (deeper) DIE.
    const FunctionRange* best = nullptr;
    ForEachCovering(u.functions, address, [&](const FunctionRange& f) {
      if (best == nullptr || f.end - f.start < best->end - best->start ||
          (f.end - f.start == best->end - best->start && f.offset > best->offset)) {
        best = &f;
      }
    });
    if (best == nullptr) continue;
    chain->push_back(best->die);
    FindInlined(&chain->front(), address, 0, chain);
    *unit = u.die;
    return true;
  }
  return false;
}

void SourceLines::Impl::ReadSymbols() {
  symbols_read = true;
  // .symtab first: at an address both name, its entries come first after the stable sort.
  for (const Elf64_Word type : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
      GElf_Shdr shdr;
      if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != type ||
          shdr.sh_entsize == 0) {
        continue;
      }
      Elf_Data* data = elf_getdata(scn, nullptr);
      if (data == nullptr || data->d_buf == nullptr) continue;
      const size_t count = std::min<uint64_t>(shdr.sh_size / shdr.sh_entsize,
                                              data->d_size / sizeof(Elf64_Sym));
      for (size_t i = 0; i < count; ++i) {
        GElf_Sym sym;
        if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) break;
        const int kind = GELF_ST_TYPE(sym.st_info);
        if ((kind != STT_FUNC && kind != STT_GNU_IFUNC) || sym.st_shndx == SHN_UNDEF ||
            sym.st_value == 0) {
          continue;
        }
        const char* name = elf_strptr(elf, shdr.sh_link, sym.st_name);
        if (name != nullptr && *name != '\0') symbols.push_back({sym.st_value, sym.st_size, name});
      }
    }
  }
  std::stable_sort(symbols.begin(), symbols.end(),
                   [](const Symbol& a, const Symbol& b) { return a.start < b.start; });
}

const char* SourceLines::Impl::SymbolStartingAt(uint64_t address) {
  if (!symbols_read) ReadSymbols();
  auto it = std::lower_bound(symbols.begin(), symbols.end(), address,
                             [](const Symbol& s, uint64_t a) { return s.start < a; });
  return it != symbols.end() && it->start == address ? it->name : nullptr;
}

const char* SourceLines::Impl::SymbolContaining(uint64_t address) {
  if (!symbols_read) ReadSymbols();
  auto it = std::upper_bound(symbols.begin(), symbols.end(), address,
                             [](uint64_t a, const Symbol& s) { return a < s.start; });
  // Symbols rarely overlap; a few steps back cover aliases and nested local labels.
  for (int steps = 0; it != symbols.begin() && steps < 8; ++steps) {
    --it;
    if (address - it->start < std::max<uint64_t>(it->size, 1)) return it->name;
  }
  return nullptr;
}

std::string SourceLines::Impl::OutOfLineName(Dwarf_Die* die) {
  Dwarf_Attribute attr;
  for (int name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name}) {
    if (dwarf_attr_integrate(die, name, &attr) != nullptr) return FunctionName(die);
  }
  // No linkage name (anonymous namespaces, lambdas, some clones): gcc's DW_AT_name is bare
  // ("operator()"); the symbol at the function's entry says which one, as in addr2line.
  uint64_t entry = 0;
  ForEachRange(die, [&](uint64_t start, uint64_t) {
    if (entry == 0) entry = start;
  });
  if (entry != 0) {
    if (const char* symbol = SymbolStartingAt(entry); symbol != nullptr) {
      return elf::Demangle(symbol);
    }
  }
  return FunctionName(die);
}

uint32_t SourceLines::Impl::DeclLine(Dwarf_Die die) {
  int line = 0;
  if (dwarf_decl_line(&die, &line) == 0 && line > 0) return ToLine(line);
  // A lambda: its declaration (through the abstract origin of an out-of-line copy, a clone or
  // an inlined instance) sits in the closure type.
  for (int hops = 0; hops < 8; ++hops) {
    if (auto it = lambda_decl_lines.find(dwarf_dieoffset(&die)); it != lambda_decl_lines.end()) {
      return it->second;
    }
    Dwarf_Attribute attr;
    if (dwarf_attr(&die, DW_AT_abstract_origin, &attr) == nullptr &&
        dwarf_attr(&die, DW_AT_specification, &attr) == nullptr) {
      break;
    }
    if (dwarf_formref_die(&attr, &die) == nullptr) break;
  }
  return 0;
}

SourceLines::SourceLines(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

SourceLines::~SourceLines() = default;

absl::StatusOr<std::unique_ptr<SourceLines>> SourceLines::Open(const std::string& path) {
  // libelf must be told the ELF version it is used with before its first use.
  static const unsigned kElfVersion = elf_version(EV_CURRENT);
  if (kElfVersion == EV_NONE) return absl::InternalError("libelf: unsupported ELF version");

  auto impl = std::make_unique<Impl>();
  impl->fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (impl->fd < 0) {
    const int error = errno;
    const std::string message = absl::StrCat(path, ": ", std::string(std::strerror(error)));
    return error == ENOENT || error == ENOTDIR ? absl::NotFoundError(message)
                                               : absl::InternalError(message);
  }
  impl->elf = elf_begin(impl->fd, ELF_C_READ_MMAP, nullptr);
  if (impl->elf == nullptr) {
    return absl::InternalError(absl::StrCat(path, ": ", std::string(elf_errmsg(-1))));
  }
  if (elf_kind(impl->elf) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not an ELF file"));
  }
  if (!HasDebugInfoSection(impl->elf)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": no DWARF (.debug_info): stripped; its debug file or an unstripped build is "
              "needed"));
  }
  impl->dwarf = dwarf_begin_elf(impl->elf, DWARF_C_READ, nullptr);
  if (impl->dwarf == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": unreadable DWARF: ", std::string(dwarf_errmsg(-1))));
  }
  if (absl::Status status = impl->IndexUnits(path); !status.ok()) return status;
  return std::unique_ptr<SourceLines>(new SourceLines(std::move(impl)));
}

std::vector<SourceFrame> SourceLines::Frames(uint64_t address) const {
  absl::MutexLock lock(&mu_);
  Dwarf_Die unit;
  std::vector<Dwarf_Die> chain;
  bool unit_found = false;
  impl_->FindChain(address, &unit, &chain, &unit_found);
  if (!unit_found) return {};

  std::vector<SourceFrame> frames(std::max<size_t>(chain.size(), 1));
  for (size_t i = 0; i < chain.size(); ++i) {
    Dwarf_Die* die = &chain[chain.size() - 1 - i];
    const bool inlined = i + 1 < chain.size();
    frames[i].function = inlined ? FunctionName(die) : impl_->OutOfLineName(die);
    frames[i].inlined = inlined;
    frames[i].decl_line = impl_->DeclLine(*die);
    for (const unsigned name : {DW_AT_linkage_name, DW_AT_MIPS_linkage_name, DW_AT_name}) {
      Dwarf_Attribute attr;
      if (dwarf_attr_integrate(die, name, &attr) == nullptr) continue;
      if (const char* text = dwarf_formstring(&attr); text != nullptr) {
        frames[i].linkage_name = text;
        break;
      }
    }
  }
  if (chain.empty()) {  // code without a function DIE: the ELF symbol names it, if any
    if (const char* symbol = impl_->SymbolContaining(address); symbol != nullptr) {
      frames[0].function = elf::Demangle(symbol);
    }
  }
  // The innermost frame is where the line table puts the address.
  if (Dwarf_Line* line = dwarf_getsrc_die(&unit, address); line != nullptr) {
    int lineno = 0;
    if (dwarf_lineno(line, &lineno) == 0) frames[0].line = ToLine(lineno);
    frames[0].file = WithCompDir(&unit, dwarf_linesrc(line, nullptr, nullptr));
  } else if (chain.empty()) {
    return {};
  }
  // Each outer frame is where the frame inside it was inlined: its call site.
  for (size_t i = 1; i < chain.size(); ++i) {
    Dwarf_Die* inlined = &chain[chain.size() - i];
    Dwarf_Attribute attr;
    Dwarf_Word value = 0;
    if (dwarf_attr(inlined, DW_AT_call_line, &attr) != nullptr &&
        dwarf_formudata(&attr, &value) == 0) {
      frames[i].line = ToLine(static_cast<int64_t>(std::min<Dwarf_Word>(value, INT64_MAX)));
    }
    Dwarf_Die cu;
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    if (dwarf_attr(inlined, DW_AT_call_file, &attr) != nullptr &&
        dwarf_formudata(&attr, &value) == 0 &&
        dwarf_diecu(inlined, &cu, nullptr, nullptr) != nullptr &&
        dwarf_getsrcfiles(&cu, &files, &nfiles) == 0 && value < nfiles) {
      frames[i].file = WithCompDir(&cu, dwarf_filesrc(files, value, nullptr, nullptr));
    }
  }
  return frames;
}

uint32_t SourceLines::FunctionDeclLine(uint64_t address) const {
  absl::MutexLock lock(&mu_);
  Dwarf_Die unit;
  std::vector<Dwarf_Die> chain;
  bool unit_found = false;
  if (!impl_->FindChain(address, &unit, &chain, &unit_found)) return 0;
  return impl_->DeclLine(chain.front());
}

}  // namespace strata::server::symbolize
