// Modules (executables and shared objects) the agent has opened, shared by every process that
// maps them. Each module is opened and compiled once: its ElfFile, SymbolTable and unwind
// RuleSource are built on first use and are immutable afterwards. Keyed by GNU build ID, or by
// (path, inode, mtime) for files without one; a file reached again under another path or
// inode but with a known build ID reuses the existing module, unless that module has .dynsym
// only: then the file is opened, and replaces it if it names more (a stripped copy seen
// first does not leave the unstripped binary of the same build unnamed).
//
// Function names come from the first of: the file's own .symtab; its MiniDebugInfo
// (.gnu_debugdata); a separate debug file in the target's root (by build ID, then by
// .gnu_debuglink; common/elf/debug_file.h). Those symbols are merged with the file's .dynsym,
// FDE ranges and PLT stubs; the debug file is closed right after (only its symbol table is
// read). Go executables name their Go functions from .gopclntab (common/elf/go_pclntab.h), the
// runtime's own table, stripped or not, with the names Go's runtime and pprof use (.symtab
// adds ABI suffixes such as ".abi0" to assembly functions); .symtab still names their C code.
// Unwind rules always come from the mapped file.
//
// The cache owns the modules (shared_ptr: a process address space holds them while mapped).
// Not thread-safe: the agent's symbolization thread owns it.
#ifndef STRATA_AGENT_SYMBOLS_MODULE_CACHE_H_
#define STRATA_AGENT_SYMBOLS_MODULE_CACHE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/elf/elf_file.h"
#include "common/elf/symbol_table.h"
#include "common/unwind/unwinder.h"

namespace strata::agent::symbols {

// Where a module's function names came from.
enum class SymbolsSource : uint8_t {
  kSymtab,         // the file's own .symtab
  kMiniDebugInfo,  // .gnu_debugdata
  kDebugFile,      // a separate debug file
  kGoPclntab,      // a Go executable without .symtab: its .gopclntab
  kDynsymOnly,     // none of those: .dynsym (exported functions) and FDE ranges only
};

struct Module {
  std::string path;          // path as the process sees it (from /proc/PID/maps)
  std::string build_id_hex;  // empty when the file has none
  std::unique_ptr<elf::ElfFile> elf;
  elf::SymbolTable symbols;
  SymbolsSource symbols_from = SymbolsSource::kDynsymOnly;
  // For people: "symtab", "gopclntab", "minidebuginfo", "debug file /usr/lib/debug/.build-id/ab/cd...debug"
  // (the path in the target's file system) or "dynsym only".
  std::string symbols_source;
  absl::Status debug_status;  // why no MiniDebugInfo or debug file was used (kDynsymOnly)
  std::unique_ptr<unwind::RuleSource> rules;  // null when the module has no usable unwind info
  absl::Status rules_status;                  // why `rules` is null
};

class ModuleCache {
 public:
  // Returns the module for the file at `open_path` (where the agent can read it, e.g.
  // /proc/PID/root/usr/lib/...), known to the process as `path` with `inode`.
  absl::StatusOr<std::shared_ptr<const Module>> Get(const std::string& open_path,
                                                     const std::string& path, uint64_t inode);
  // Builds a module from an already opened ELF image (e.g. a [vdso] copied from memory).
  std::shared_ptr<const Module> Adopt(std::unique_ptr<elf::ElfFile> elf, const std::string& path);

  size_t size() const { return by_build_id_.size() + by_file_only_.size(); }
  uint64_t opens() const { return opens_; }  // files parsed so far (cache misses)

  // Modules built so far by where their names came from.
  struct SourceCounts {
    uint64_t symtab = 0, minidebuginfo = 0, debug_file = 0, go_pclntab = 0, dynsym_only = 0;
  };
  const SourceCounts& symbols_sources() const { return sources_; }

 private:
  using FileKey = std::tuple<std::string, uint64_t, int64_t>;  // path, inode, mtime (ns)
  absl::flat_hash_map<std::string, std::shared_ptr<const Module>> by_build_id_;
  absl::flat_hash_map<FileKey, std::shared_ptr<const Module>> by_file_;      // all files
  absl::flat_hash_map<FileKey, std::shared_ptr<const Module>> by_file_only_; // no build ID
  uint64_t opens_ = 0;
  SourceCounts sources_;
  void Count(const Module& module);
};

}  // namespace strata::agent::symbols

#endif  // STRATA_AGENT_SYMBOLS_MODULE_CACHE_H_
