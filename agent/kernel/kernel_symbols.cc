#include "agent/kernel/kernel_symbols.h"

#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace strata::agent::kernel {
namespace {

struct ParsedLine {
  uint64_t address = 0;
  char type = 0;
  std::string_view name;
  std::string_view module;
};

bool ParseLine(std::string_view line, ParsedLine* out) {
  const size_t space = line.find(' ');
  if (space == std::string_view::npos || space == 0 || space + 3 > line.size() ||
      line[space + 2] != ' ') {
    return false;
  }
  auto [end, ec] = std::from_chars(line.data(), line.data() + space, out->address, 16);
  if (ec != std::errc() || end != line.data() + space) return false;
  out->type = line[space + 1];
  std::string_view rest = line.substr(space + 3);
  out->module = {};
  if (const size_t tab = rest.find('\t'); tab != std::string_view::npos) {
    std::string_view module = rest.substr(tab + 1);
    rest = rest.substr(0, tab);
    if (module.size() < 2 || module.front() != '[' || module.back() != ']') return false;
    out->module = module.substr(1, module.size() - 2);
  }
  out->name = rest;
  return !rest.empty();
}

}  // namespace

absl::StatusOr<std::unique_ptr<KernelSymbols>> KernelSymbols::Parse(std::string_view text) {
  return Build([&text](std::string_view* line) {
    if (text.empty()) return false;
    const size_t newline = text.find('\n');
    *line = text.substr(0, newline);
    text = newline == std::string_view::npos ? std::string_view() : text.substr(newline + 1);
    return true;
  });
}

absl::StatusOr<std::unique_ptr<KernelSymbols>> KernelSymbols::Build(
    absl::FunctionRef<bool(std::string_view*)> next_line) {
  auto symbols = std::unique_ptr<KernelSymbols>(new KernelSymbols());
  struct Entry {
    uint64_t address;
    uint32_t name;
    uint16_t module;
  };
  std::vector<Entry> entries;
  absl::flat_hash_map<std::string, uint16_t> module_index;
  symbols->module_names_.push_back("");
  uint64_t text_base = 0;
  bool any_address = false;
  size_t line_number = 0;
  std::string_view line;
  while (next_line(&line)) {
    ++line_number;
    if (line.empty()) continue;
    ParsedLine parsed;
    if (!ParseLine(line, &parsed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("kallsyms line ", line_number, ": cannot parse '",
                       std::string(line.substr(0, 80)), "'"));
    }
    any_address |= parsed.address != 0;
    if (parsed.name == "_text" && parsed.module.empty()) text_base = parsed.address;
    if (parsed.type != 't' && parsed.type != 'T') continue;
    uint16_t module = 0;
    if (!parsed.module.empty()) {
      auto [it, inserted] = module_index.try_emplace(
          std::string(parsed.module), static_cast<uint16_t>(symbols->module_names_.size()));
      if (inserted) {
        if (symbols->module_names_.size() == UINT16_MAX) {
          return absl::InvalidArgumentError("kallsyms: too many modules");
        }
        symbols->module_names_.emplace_back(parsed.module);
      }
      module = it->second;
    }
    if (symbols->names_.size() + parsed.name.size() + 1 > UINT32_MAX) {
      return absl::InvalidArgumentError("kallsyms: names exceed 4 GiB");
    }
    entries.push_back({parsed.address, static_cast<uint32_t>(symbols->names_.size()), module});
    symbols->names_.append(parsed.name);
    symbols->names_.push_back('\0');
  }
  if (!any_address) {
    return absl::FailedPreconditionError(
        "kallsyms addresses are hidden from this process (kernel.kptr_restrict; needs "
        "CAP_SYSLOG or root with kptr_restrict <= 1)");
  }
  if (entries.empty()) return absl::FailedPreconditionError("kallsyms has no text symbols");
  std::stable_sort(entries.begin(), entries.end(),
                   [](const Entry& a, const Entry& b) { return a.address < b.address; });
  symbols->module_bases_.assign(symbols->module_names_.size(), UINT64_MAX);
  symbols->module_bases_[0] = text_base;
  symbols->addresses_.reserve(entries.size());
  symbols->name_offsets_.reserve(entries.size());
  symbols->modules_.reserve(entries.size());
  for (const Entry& e : entries) {
    symbols->addresses_.push_back(e.address);
    symbols->name_offsets_.push_back(e.name);
    symbols->modules_.push_back(e.module);
    if (e.module != 0) {
      symbols->module_bases_[e.module] = std::min(symbols->module_bases_[e.module], e.address);
    }
  }
  if (text_base == 0) symbols->module_bases_[0] = symbols->addresses_.front();
  symbols->names_.shrink_to_fit();
  return symbols;
}

absl::StatusOr<std::unique_ptr<KernelSymbols>> KernelSymbols::Load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::UnavailableError(absl::StrCat("cannot read ", path));
  // Line by line: the file is several MiB of text the agent need not hold at once.
  std::string buffer;
  absl::StatusOr<std::unique_ptr<KernelSymbols>> symbols =
      Build([&](std::string_view* line) {
        if (!std::getline(in, buffer)) return false;
        *line = buffer;
        return true;
      });
  if (!symbols.ok()) return symbols;
#ifdef __GLIBC__
  // The parse's temporaries (the unsorted entries, the line buffer) are freed; hand their
  // pages back rather than keep them in the agent's resident set.
  malloc_trim(0);
#endif
  std::ifstream notes("/sys/kernel/notes", std::ios::binary);
  if (notes) {
    std::stringstream bytes;
    bytes << notes.rdbuf();
    (*symbols)->set_build_id(BuildIdFromNotes(bytes.str()));
  }
  return symbols;
}

bool KernelSymbols::Lookup(uint64_t pc, KernelSymbol* out) const {
  auto it = std::upper_bound(addresses_.begin(), addresses_.end(), pc);
  if (it == addresses_.begin()) return false;
  const size_t i = static_cast<size_t>(it - addresses_.begin()) - 1;
  out->name = std::string_view(names_.data() + name_offsets_[i]);
  out->module = module_names_[modules_[i]];
  const uint64_t base = module_bases_[modules_[i]];
  out->offset = addresses_[i] >= base ? addresses_[i] - base : 0;
  return true;
}

std::string BuildIdFromNotes(std::string_view notes) {
  // Elf64_Nhdr and Elf32_Nhdr are the same: namesz, descsz, type (u32 each), then the name and
  // the descriptor, each padded to 4 bytes.
  auto align4 = [](size_t n) { return (n + 3) & ~size_t{3}; };
  size_t at = 0;
  while (at + 12 <= notes.size()) {
    uint32_t namesz, descsz, type;
    std::memcpy(&namesz, notes.data() + at, 4);
    std::memcpy(&descsz, notes.data() + at + 4, 4);
    std::memcpy(&type, notes.data() + at + 8, 4);
    at += 12;
    if (align4(namesz) > notes.size() - at) break;
    std::string_view name = notes.substr(at, namesz);
    at += align4(namesz);
    if (align4(descsz) > notes.size() - at) break;
    constexpr uint32_t kNtGnuBuildId = 3;
    if (type == kNtGnuBuildId && name == std::string_view("GNU\0", 4) && descsz > 0 &&
        descsz <= 64) {
      return std::string(notes.substr(at, descsz));
    }
    at += align4(descsz);
  }
  return "";
}

}  // namespace strata::agent::kernel
