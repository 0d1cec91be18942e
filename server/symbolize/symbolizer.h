// server/symbolize: names, at query time, the frames agents could not name (stripped modules:
// "libc.so.6+0x88ef0"), from debug files found by GNU build ID. Agents ship the build ID and
// the function's offset of every frame, so nothing is rewritten when debug information
// arrives late: the next query names old frames too.
//
// Debug files are looked up in this order, once per build ID:
//   1. uploads (`strata debuginfo upload`, DebugInfoStore under the data directory);
//   2. local debug directories (default /usr/lib/debug: <dir>/.build-id/ab/cdef....debug, what
//      Debian's -dbg and -dbgsym packages install);
//   3. debuginfod servers (elfutils' libdebuginfod; its own cache directory).
// Only the function symbols of a file are kept (a sorted table per build ID); the mapping is
// released after reading -- except for a Go binary, whose .gopclntab (names, inlined calls and
// lines, common/elf/go_pclntab.h) is read in place: it is a source like DWARF, used where no
// DWARF covers an address, so an uploaded stripped Go binary gives inline frames and lines. A build ID found nowhere is retried after `retry_after`, or at
// once after an upload of it (Invalidate).
//
// Thread-safe. A lookup of a known build ID takes one short lock; finding and reading a new
// file happens outside it, one file at a time.
#ifndef STRATA_SERVER_SYMBOLIZE_SYMBOLIZER_H_
#define STRATA_SERVER_SYMBOLIZE_SYMBOLIZER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/symbolize/debuginfo_store.h"
#include "server/symbolize/source_lines.h"

namespace strata::server::symbolize {

struct SymbolizerOptions {
  // Directories laid out like /usr/lib/debug (a .build-id tree); searched in order.
  std::vector<std::string> debug_dirs = {"/usr/lib/debug"};
  // Space-separated debuginfod URLs; empty: no debuginfod.
  std::string debuginfod_urls;
  // Where libdebuginfod keeps what it fetched; empty: its default ($XDG_CACHE_HOME).
  std::string debuginfod_cache;
  // A build ID found nowhere is looked up again after this long.
  absl::Duration retry_after = absl::Minutes(10);
  // Debug files held in memory (their symbol tables); the least recently used go first.
  size_t max_modules = 4096;
};

// A debug file the symbolizer holds.
struct LoadedDebugInfo {
  std::string build_id;
  std::string path;
  std::string source;  // "upload", "debuginfod" or the local debug directory
  uint64_t functions = 0;
  bool has_dwarf = false;
};

struct SymbolizerStats {
  uint64_t lookups = 0;          // FunctionName and SourceFrames calls
  uint64_t named = 0;            // ... that returned a name
  uint64_t files_loaded = 0;     // debug files read, any source
  uint64_t debuginfod_fetches = 0;  // build IDs asked of debuginfod
  uint64_t debuginfod_found = 0;
  uint64_t missing = 0;          // lookups of a build ID found nowhere
  uint64_t load_ns = 0;          // time spent finding and reading debug files
};

class Symbolizer {
 public:
  // `uploads` (optional) is borrowed and must outlive the symbolizer.
  Symbolizer(SymbolizerOptions options, const DebugInfoStore* uploads);
  ~Symbolizer();
  Symbolizer(const Symbolizer&) = delete;
  Symbolizer& operator=(const Symbolizer&) = delete;

  // The name of the function containing `offset` (an ELF virtual address, as agents send a
  // function's start) in the module with GNU build ID `build_id_hex`; nullopt when no debug
  // file of it is known or no symbol covers the offset.
  std::optional<std::string> FunctionName(std::string_view build_id_hex, uint64_t offset);

  // The source frames at `address` of the module (innermost first: inlined functions, then
  // the function they were inlined into; SourceLines::Frames), from the DWARF of its debug
  // file; empty when no debug file with DWARF is known or none covers the address.
  std::vector<SourceFrame> SourceFrames(std::string_view build_id_hex, uint64_t address);

  // Forgets what is known of `build_id_hex` (an upload of it arrived) and bumps generation().
  void Invalidate(std::string_view build_id_hex);
  // Changes whenever a build ID may name more than before (a file was loaded or an upload
  // arrived): readers that cached unnamed frames try them again.
  uint64_t generation() const { return generation_.load(std::memory_order_acquire); }

  std::vector<LoadedDebugInfo> Loaded() const;
  std::vector<std::string> Missing() const;
  SymbolizerStats stats() const;

 private:
  struct Module;
  struct Entry {
    std::shared_ptr<const Module> module;  // null: not found
    absl::Time missing_since;
    uint64_t last_use = 0;
  };
  // The module of `build_id` (loaded on first use); null when no debug file is known.
  std::shared_ptr<const Module> ModuleOf(std::string_view build_id_hex);
  // Finds and reads the debug file of `build_id`; null when there is none.
  std::shared_ptr<const Module> Load(const std::string& build_id);
  std::shared_ptr<const Module> ReadFile(const std::string& build_id, const std::string& path,
                                         std::string source);
  std::optional<std::string> FetchFromDebuginfod(const std::string& build_id);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SymbolizerOptions options_;
  const DebugInfoStore* uploads_;
  std::atomic<uint64_t> generation_{1};

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t use_clock_ ABSL_GUARDED_BY(mu_) = 0;
  SymbolizerStats stats_ ABSL_GUARDED_BY(mu_);
  absl::Mutex load_mu_;  // one file read (or fetch) at a time
};

}  // namespace strata::server::symbolize

#endif  // STRATA_SERVER_SYMBOLIZE_SYMBOLIZER_H_
