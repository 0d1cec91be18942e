#include "common/elf/symbol_table.h"

#include <algorithm>

#include "common/base/saturating.h"
#include "common/elf/cfi_records.h"

namespace strata::elf {
namespace {

// Which symbol names a start when several do: sized beats unsized, .symtab beats .dynsym
// (same names, more of them), global beats local, then the shortest name (aliases such as
// __GI_memcpy vs memcpy).
bool Better(const FunctionSymbol& a, const FunctionSymbol& b) {
  if ((a.size != 0) != (b.size != 0)) return a.size != 0;
  if (a.global != b.global) return a.global;
  if (a.name.size() != b.name.size()) return a.name.size() < b.name.size();
  return a.name < b.name;
}

}  // namespace

absl::StatusOr<SymbolTable> SymbolTable::Build(const ElfFile& elf) {
  absl::StatusOr<std::vector<FunctionSymbol>> symbols = elf.ReadFunctionSymbols();
  if (!symbols.ok()) return symbols.status();
  absl::StatusOr<std::vector<PltEntry>> plt = elf.ReadPltEntries();
  if (!plt.ok()) return plt.status();
  return FromFunctions(*std::move(symbols), FdeRanges(elf), *std::move(plt));
}

SymbolTable SymbolTable::FromFunctions(std::vector<FunctionSymbol> symbols,
                                       std::vector<AddressRange> fde_ranges,
                                       std::vector<PltEntry> plt) {
  std::sort(symbols.begin(), symbols.end(), [](const FunctionSymbol& a, const FunctionSymbol& b) {
    return a.start != b.start ? a.start < b.start : Better(a, b);
  });
  struct Pending {
    uint64_t start, end;
    std::string name;
    Origin origin;
  };
  std::vector<Pending> pending;
  for (size_t i = 0; i < symbols.size(); ++i) {
    if (i > 0 && symbols[i].start == symbols[i - 1].start) continue;  // best one came first
    FunctionSymbol& s = symbols[i];
    // A corrupt size must not wrap the end below the start (that would read as "size
    // unknown" and claim every address above): clamp it to the top of the address space.
    pending.push_back({s.start, base::SaturatingAdd(s.start, s.size), std::move(s.name),
                       s.from_dynsym ? Origin::kDynsym : Origin::kSymtab});
  }
  // PLT stubs are never covered by symbols; FDE ranges only where no symbol covers them.
  for (PltEntry& e : plt) {
    std::string name = e.target.empty() ? std::string() : e.target + "@plt";
    pending.push_back({e.start, base::SaturatingAdd(e.start, e.size), std::move(name), Origin::kPlt});
  }
  // An FDE can start inside a sized symbol: a function's second part with its own CFI (e.g.
  // glibc's clone3, whose child half `thread_start` has an FDE of its own). Unnamed, it would
  // shadow the symbol's name from that address on, so such FDEs are left out.
  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.start < b.start; });
  std::vector<uint64_t> starts, max_end;  // max_end[i]: the furthest end among pending[0..i]
  starts.reserve(pending.size());
  max_end.reserve(pending.size());
  for (const Pending& p : pending) {
    starts.push_back(p.start);
    max_end.push_back(std::max(max_end.empty() ? 0 : max_end.back(), p.end));
  }
  for (const AddressRange& r : fde_ranges) {
    size_t i = std::upper_bound(starts.begin(), starts.end(), r.start) - starts.begin();
    bool covered = i > 0 && (starts[i - 1] == r.start || max_end[i - 1] > r.start);
    if (!covered) pending.push_back({r.start, r.end, {}, Origin::kFde});
  }

  std::stable_sort(pending.begin(), pending.end(),
                   [](const Pending& a, const Pending& b) { return a.start < b.start; });

  SymbolTable table;
  size_t total = 0;
  for (const Pending& p : pending) total += p.name.size();
  table.names_.reserve(total);
  std::vector<std::pair<size_t, size_t>> name_spans;
  for (const Pending& p : pending) {
    if (!table.functions_.empty() && table.functions_.back().start == p.start) continue;
    name_spans.emplace_back(table.names_.size(), p.name.size());
    table.names_.insert(table.names_.end(), p.name.begin(), p.name.end());
    table.functions_.push_back({p.start, p.end, {}, p.origin});
  }
  for (size_t i = 0; i < table.functions_.size(); ++i) {
    table.functions_[i].name =
        std::string_view(table.names_.data() + name_spans[i].first, name_spans[i].second);
  }
  return table;
}

const SymbolTable::Function* SymbolTable::Lookup(uint64_t vaddr) const {
  auto it = std::upper_bound(functions_.begin(), functions_.end(), vaddr,
                             [](uint64_t a, const Function& f) { return a < f.start; });
  if (it == functions_.begin()) return nullptr;
  --it;
  if (it->end > it->start && vaddr >= it->end) return nullptr;
  return &*it;
}

}  // namespace strata::elf
