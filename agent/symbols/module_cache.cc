#include "agent/symbols/module_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/elf/cfi_records.h"
#include "common/elf/debug_file.h"
#include "common/elf/go_pclntab.h"
#include "common/unwind/rule_source.h"

namespace strata::agent::symbols {
namespace {

// Appends the .symtab function symbols of `from` (a MiniDebugInfo image or a debug file: its
// .dynsym, if any, repeats the module's).
absl::Status AppendSymtab(const elf::ElfFile& from, std::vector<elf::FunctionSymbol>* symbols) {
  absl::StatusOr<std::vector<elf::FunctionSymbol>> extra = from.ReadFunctionSymbols();
  if (!extra.ok()) return extra.status();
  for (elf::FunctionSymbol& s : *extra) {
    if (!s.from_dynsym) symbols->push_back(std::move(s));
  }
  return absl::OkStatus();
}

// Adds to `symbols` (the module's own) the local functions of the first source that has them,
// in the order of the header, and records which one it was.
void AddLocalSymbols(const elf::ElfFile& elf, const std::string& path, const std::string& root,
                     std::vector<elf::FunctionSymbol>* symbols, Module* module) {
  if (std::any_of(symbols->begin(), symbols->end(),
                  [](const elf::FunctionSymbol& s) { return !s.from_dynsym; })) {
    module->symbols_from = SymbolsSource::kSymtab;
    module->symbols_source = "symtab";
    return;
  }
  std::vector<std::string> why_not;
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> mini = elf::ReadMiniDebugInfo(elf);
  if (mini.ok()) {
    if (absl::Status s = AppendSymtab(**mini, symbols); s.ok()) {
      module->symbols_from = SymbolsSource::kMiniDebugInfo;
      module->symbols_source = "minidebuginfo";
      return;
    } else {
      why_not.push_back(absl::StrCat(".gnu_debugdata: ", s.message()));
    }
  } else if (!absl::IsNotFound(mini.status())) {
    why_not.push_back(std::string(mini.status().message()));
  }
  // Only the debug file's symbol table is read; it is unmapped when `debug` goes out of scope.
  absl::StatusOr<elf::DebugFile> debug = elf::OpenDebugFile(elf, path, root);
  if (debug.ok()) {
    if (absl::Status s = AppendSymtab(*debug->elf, symbols); s.ok()) {
      module->symbols_from = SymbolsSource::kDebugFile;
      module->symbols_source = absl::StrCat("debug file ", debug->path);
      return;
    } else {
      why_not.push_back(absl::StrCat(debug->path, ": ", s.message()));
    }
  } else {
    why_not.push_back(std::string(debug.status().message()));
  }
  module->symbols_from = SymbolsSource::kDynsymOnly;
  module->symbols_source = "dynsym only";
  module->debug_status = absl::NotFoundError(absl::StrJoin(why_not, "; "));
}

// Names the Go functions of a Go executable from its .gopclntab. Returns how many were added
// (0: not Go).
size_t AddGoFunctions(const elf::ElfFile& elf, std::vector<elf::FunctionSymbol>* symbols) {
  if (!elf::LooksLikeGo(elf)) return 0;
  absl::StatusOr<std::unique_ptr<elf::GoPclntab>> table = elf::GoPclntab::Find(elf);
  return table.ok() ? elf::AddGoFunctionSymbols(**table, symbols) : 0;
}

// `root`: the target's root as the agent reads it, for separate debug files.
std::shared_ptr<const Module> BuildModule(std::unique_ptr<elf::ElfFile> elf, const std::string& path,
                                          const std::string& root) {
  auto module = std::make_shared<Module>();
  module->path = path;
  module->build_id_hex = elf->BuildIdHex();
  // A module without readable symbols is still unwindable and shown as "module+0x..."; one
  // whose own tables are corrupt may still be named by its debug symbols.
  absl::StatusOr<std::vector<elf::FunctionSymbol>> symbols = elf->ReadFunctionSymbols();
  if (!symbols.ok()) symbols = std::vector<elf::FunctionSymbol>();
  const bool has_symtab = std::any_of(symbols->begin(), symbols->end(),
                                      [](const elf::FunctionSymbol& s) { return !s.from_dynsym; });
  if (AddGoFunctions(*elf, &*symbols) > 0 && !has_symtab) {
    module->symbols_from = SymbolsSource::kGoPclntab;
    module->symbols_source = "gopclntab";
  } else {
    AddLocalSymbols(*elf, path, root, &*symbols, module.get());
  }
  absl::StatusOr<std::vector<elf::PltEntry>> plt = elf->ReadPltEntries();
  module->symbols = elf::SymbolTable::FromFunctions(
      *std::move(symbols), elf::FdeRanges(*elf),
      plt.ok() ? *std::move(plt) : std::vector<elf::PltEntry>());
  absl::StatusOr<unwind::Arch> arch = unwind::ArchOf(*elf);
  if (arch.ok()) {
    absl::StatusOr<std::unique_ptr<unwind::RuleSource>> rules = unwind::MakeRuleSource(*arch, *elf);
    if (rules.ok()) module->rules = *std::move(rules);
    else module->rules_status = rules.status();
  } else {
    module->rules_status = arch.status();
  }
  module->elf = std::move(elf);
  return module;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Module>> ModuleCache::Get(const std::string& open_path,
                                                                const std::string& path,
                                                                uint64_t inode) {
  struct stat st;
  if (stat(open_path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("stat ", open_path, " failed"));
  }
  FileKey key{path, inode != 0 ? inode : st.st_ino,
              static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  if (auto it = by_file_.find(key); it != by_file_.end()) {
    // The build ID's module may have gained symbols since (below).
    if (it->second->build_id_hex.empty()) return it->second;
    return by_build_id_.at(it->second->build_id_hex);
  }
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::Open(open_path);
  if (!elf.ok()) return elf.status();
  std::string build_id = (*elf)->BuildIdHex();
  auto known = build_id.empty() ? by_build_id_.end() : by_build_id_.find(build_id);
  // One build ID is one module, but not every file of it has the same symbols: a stripped
  // copy seen first must not leave the unstripped binary (same build ID) unnamed, so a module
  // with .dynsym only is built again from each further file of its build ID until one names
  // more.
  if (known != by_build_id_.end() && known->second->symbols_from != SymbolsSource::kDynsymOnly) {
    by_file_.emplace(key, known->second);
    return known->second;
  }
  ++opens_;
  std::shared_ptr<const Module> module =
      BuildModule(*std::move(elf), path, elf::RootOf(open_path, path));
  if (known != by_build_id_.end() && module->symbols_from == SymbolsSource::kDynsymOnly) {
    module = known->second;  // names nothing more: keep the build ID's module
  } else {
    Count(*module);
    if (build_id.empty()) by_file_only_.emplace(key, module);
    else by_build_id_[build_id] = module;  // new, or replacing a .dynsym-only module
  }
  by_file_.emplace(key, module);
  return module;
}

std::shared_ptr<const Module> ModuleCache::Adopt(std::unique_ptr<elf::ElfFile> elf,
                                                 const std::string& path) {
  std::string build_id = elf->BuildIdHex();
  if (!build_id.empty()) {
    if (auto it = by_build_id_.find(build_id); it != by_build_id_.end()) return it->second;
  }
  ++opens_;
  // An image from memory (the [vdso]) has no file to look beside: its debug file can only be
  // found by build ID, in the agent's own root (the kernel's vdso is the host's).
  std::shared_ptr<const Module> module = BuildModule(std::move(elf), path, "");
  Count(*module);
  if (!build_id.empty()) by_build_id_.emplace(build_id, module);
  return module;
}

void ModuleCache::Count(const Module& module) {
  switch (module.symbols_from) {
    case SymbolsSource::kSymtab: ++sources_.symtab; break;
    case SymbolsSource::kMiniDebugInfo: ++sources_.minidebuginfo; break;
    case SymbolsSource::kDebugFile: ++sources_.debug_file; break;
    case SymbolsSource::kGoPclntab: ++sources_.go_pclntab; break;
    case SymbolsSource::kDynsymOnly: ++sources_.dynsym_only; break;
  }
}

}  // namespace strata::agent::symbols
