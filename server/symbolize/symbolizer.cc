#include "server/symbolize/symbolizer.h"

#include <elfutils/debuginfod.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "common/elf/debug_file.h"
#include "common/elf/elf_file.h"
#include "common/elf/go_pclntab.h"
#include "common/elf/symbol_table.h"

namespace strata::server::symbolize {

struct Symbolizer::Module {
  LoadedDebugInfo info;
  elf::SymbolTable symbols;
  std::unique_ptr<SourceLines> lines;  // null without DWARF
  // A Go binary's .gopclntab: names, inlined calls and lines without DWARF (e.g. an uploaded
  // stripped binary). `go` holds views into `go_elf`, kept mapped for it.
  std::unique_ptr<elf::ElfFile> go_elf;
  std::unique_ptr<elf::GoPclntab> go;
};

Symbolizer::Symbolizer(SymbolizerOptions options, const DebugInfoStore* uploads)
    : options_(std::move(options)), uploads_(uploads) {}

Symbolizer::~Symbolizer() = default;

std::optional<std::string> Symbolizer::FunctionName(std::string_view build_id_hex,
                                                    uint64_t offset) {
  std::shared_ptr<const Module> module = ModuleOf(build_id_hex);
  if (module == nullptr) return std::nullopt;
  const elf::SymbolTable::Function* f = module->symbols.Lookup(offset);
  if (f == nullptr || f->name.empty()) return std::nullopt;
  absl::MutexLock lock(&mu_);
  ++stats_.named;
  return std::string(f->name);
}

std::vector<SourceFrame> Symbolizer::SourceFrames(std::string_view build_id_hex,
                                                  uint64_t address) {
  std::shared_ptr<const Module> module = ModuleOf(build_id_hex);
  if (module == nullptr) return {};
  // Go code by the runtime's own table, as the agent names it (DWARF and .symtab name an
  // assembly function with its ABI suffix, main.f.abi0); the rest (cgo's C) by DWARF.
  const int64_t i = module->go != nullptr ? module->go->FindFunction(address) : -1;
  if (i < 0) {
    return module->lines != nullptr ? module->lines->Frames(address) : std::vector<SourceFrame>();
  }
  std::vector<SourceFrame> frames;
  for (const elf::GoPclntab::SourceFrame& f :
       module->go->Symbolize(module->go->functions()[i], address)) {
    SourceFrame frame;
    frame.function = std::string(f.function);
    frame.file = std::string(f.file);
    frame.line = f.line > 0 ? static_cast<uint32_t>(f.line) : 0;
    frame.inlined = f.inlined;
    frame.linkage_name = frame.function;
    frames.push_back(std::move(frame));
  }
  return frames;
}

std::shared_ptr<const Symbolizer::Module> Symbolizer::ModuleOf(std::string_view build_id_hex) {
  if (!IsBuildIdHex(build_id_hex)) return nullptr;
  const std::string build_id(build_id_hex);
  std::shared_ptr<const Module> module;
  bool known = false;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.lookups;
    if (auto it = entries_.find(build_id); it != entries_.end()) {
      const bool retry = it->second.module == nullptr &&
                         absl::Now() - it->second.missing_since >= options_.retry_after;
      if (!retry) {
        known = true;
        module = it->second.module;
        it->second.last_use = ++use_clock_;
        if (module == nullptr) ++stats_.missing;
      }
    }
  }
  if (!known) module = Load(build_id);
  return module;
}

std::shared_ptr<const Symbolizer::Module> Symbolizer::Load(const std::string& build_id) {
  absl::MutexLock load_lock(&load_mu_);
  {  // Another caller may have loaded it while this one waited.
    absl::MutexLock lock(&mu_);
    if (auto it = entries_.find(build_id); it != entries_.end()) {
      if (it->second.module != nullptr ||
          absl::Now() - it->second.missing_since < options_.retry_after) {
        return it->second.module;
      }
    }
  }
  const absl::Time start = absl::Now();
  std::shared_ptr<const Module> module;
  if (uploads_ != nullptr) {
    if (std::optional<std::string> path = uploads_->PathOf(build_id)) {
      module = ReadFile(build_id, *path, "upload");
    }
  }
  for (size_t i = 0; module == nullptr && i < options_.debug_dirs.size(); ++i) {
    const std::string path = elf::BuildIdDebugPath(options_.debug_dirs[i], build_id);
    if (!path.empty() && access(path.c_str(), R_OK) == 0) {
      module = ReadFile(build_id, path, options_.debug_dirs[i]);
    }
  }
  if (module == nullptr && !options_.debuginfod_urls.empty()) {
    if (std::optional<std::string> path = FetchFromDebuginfod(build_id)) {
      module = ReadFile(build_id, *path, "debuginfod");
    }
  }
  absl::MutexLock lock(&mu_);
  stats_.load_ns += static_cast<uint64_t>(absl::ToInt64Nanoseconds(absl::Now() - start));
  Entry& entry = entries_[build_id];
  entry.module = module;
  entry.missing_since = absl::Now();
  entry.last_use = ++use_clock_;
  if (module != nullptr) {
    ++stats_.files_loaded;
    generation_.fetch_add(1, std::memory_order_acq_rel);
  } else {
    ++stats_.missing;
  }
  EvictLocked();
  return module;
}

std::shared_ptr<const Symbolizer::Module> Symbolizer::ReadFile(const std::string& build_id,
                                                               const std::string& path,
                                                               std::string source) {
  absl::StatusOr<std::unique_ptr<elf::ElfFile>> elf = elf::ElfFile::Open(path);
  if (!elf.ok()) {
    LogWarn("debug file {} for build ID {} is unusable: {}", path, build_id,
                 elf.status().ToString());
    return nullptr;
  }
  if ((*elf)->BuildIdHex() != build_id) {
    LogWarn("debug file {} has build ID {}, not {}: ignored", path, (*elf)->BuildIdHex(),
                 build_id);
    return nullptr;
  }
  absl::StatusOr<std::vector<elf::FunctionSymbol>> symbols = (*elf)->ReadFunctionSymbols();
  if (!symbols.ok()) {
    LogWarn("debug file {}: {}", path, symbols.status().ToString());
    return nullptr;
  }
  auto module = std::make_shared<Module>();
  if (elf::LooksLikeGo(**elf)) {
    absl::StatusOr<std::unique_ptr<elf::GoPclntab>> go = elf::GoPclntab::Find(**elf);
    if (go.ok()) {
      elf::AddGoFunctionSymbols(**go, &*symbols);
      module->go = *std::move(go);
    } else {
      LogWarn("debug file {}: unreadable Go symbol table: {}", path, go.status().ToString());
    }
  }
  module->info = {build_id, path, std::move(source), symbols->size(),
                  (*elf)->FindSection(".debug_info") != nullptr};
  module->symbols = elf::SymbolTable::FromFunctions(*std::move(symbols), {}, {});
  if (module->info.has_dwarf) {
    absl::StatusOr<std::unique_ptr<SourceLines>> lines = SourceLines::Open(path);
    if (lines.ok()) {
      module->lines = *std::move(lines);
    } else {
      LogWarn("debug file {}: no source lines: {}", path, lines.status().ToString());
    }
  }
  if (module->go != nullptr) module->go_elf = *std::move(elf);
  LogInfo("debug info for build ID {}: {} ({} functions, from {})", build_id, path,
               module->info.functions, module->info.source);
  return module;
}

std::optional<std::string> Symbolizer::FetchFromDebuginfod(const std::string& build_id) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.debuginfod_fetches;
  }
  // libdebuginfod reads DEBUGINFOD_URLS (and its cache path and timeout) from the
  // environment; strata-server sets them from its flags before any thread starts.
  debuginfod_client* client = debuginfod_begin();
  if (client == nullptr) return std::nullopt;
  absl::Cleanup end = [client] { debuginfod_end(client); };
  char* path = nullptr;
  const int fd = debuginfod_find_debuginfo(
      client, reinterpret_cast<const unsigned char*>(build_id.c_str()), 0, &path);
  if (fd < 0) {
    LogDebug("debuginfod has no debug info for {}: {}", build_id, std::strerror(-fd));
    return std::nullopt;
  }
  close(fd);
  std::string out(path);
  free(path);
  absl::MutexLock lock(&mu_);
  ++stats_.debuginfod_found;
  return out;
}

void Symbolizer::Invalidate(std::string_view build_id_hex) {
  {
    absl::MutexLock lock(&mu_);
    entries_.erase(std::string(build_id_hex));
  }
  generation_.fetch_add(1, std::memory_order_acq_rel);
}

void Symbolizer::EvictLocked() {
  while (entries_.size() > options_.max_modules) {
    auto oldest = entries_.begin();
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->second.last_use < oldest->second.last_use) oldest = it;
    }
    entries_.erase(oldest);
  }
}

std::vector<LoadedDebugInfo> Symbolizer::Loaded() const {
  std::vector<LoadedDebugInfo> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [build_id, entry] : entries_) {
    if (entry.module != nullptr) out.push_back(entry.module->info);
  }
  std::sort(out.begin(), out.end(), [](const LoadedDebugInfo& a, const LoadedDebugInfo& b) {
    return a.build_id < b.build_id;
  });
  return out;
}

std::vector<std::string> Symbolizer::Missing() const {
  std::vector<std::string> out;
  absl::MutexLock lock(&mu_);
  for (const auto& [build_id, entry] : entries_) {
    if (entry.module == nullptr) out.push_back(build_id);
  }
  std::sort(out.begin(), out.end());
  return out;
}

SymbolizerStats Symbolizer::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace strata::server::symbolize
