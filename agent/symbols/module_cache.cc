#include "agent/symbols/module_cache.h"

#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "common/unwind/rule_source.h"

namespace strata::agent::symbols {
namespace {

std::shared_ptr<const Module> BuildModule(std::unique_ptr<elf::ElfFile> elf, const std::string& path) {
  auto module = std::make_shared<Module>();
  module->path = path;
  module->build_id_hex = elf->BuildIdHex();
  // A module without readable symbols is still unwindable and shown as "module+0x...".
  if (absl::StatusOr<elf::SymbolTable> symbols = elf::SymbolTable::Build(*elf); symbols.ok()) {
    module->symbols = *std::move(symbols);
  }
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
  if (auto it = by_file_.find(key); it != by_file_.end()) return it->second;
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::Open(open_path);
  if (!elf.ok()) return elf.status();
  std::string build_id = (*elf)->BuildIdHex();
  if (!build_id.empty()) {
    if (auto it = by_build_id_.find(build_id); it != by_build_id_.end()) {
      by_file_.emplace(key, it->second);
      return it->second;
    }
  }
  ++opens_;
  std::shared_ptr<const Module> module = BuildModule(*std::move(elf), path);
  by_file_.emplace(key, module);
  if (build_id.empty()) by_file_only_.emplace(key, module);
  else by_build_id_.emplace(build_id, module);
  return module;
}

std::shared_ptr<const Module> ModuleCache::Adopt(std::unique_ptr<elf::ElfFile> elf,
                                                 const std::string& path) {
  std::string build_id = elf->BuildIdHex();
  if (!build_id.empty()) {
    if (auto it = by_build_id_.find(build_id); it != by_build_id_.end()) return it->second;
  }
  ++opens_;
  std::shared_ptr<const Module> module = BuildModule(std::move(elf), path);
  if (!build_id.empty()) by_build_id_.emplace(build_id, module);
  return module;
}

}  // namespace strata::agent::symbols
