// Perf maps: the symbol files JIT runtimes write for profilers (Node/V8 --perf-basic-prof, JVM
// perf-map agents, .NET DOTNET_PerfMapEnabled=1) at /tmp/perf-PID.map, one code object per
// line:
//
//   START SIZE NAME        START and SIZE hex, with or without 0x; NAME to the end of the line
//
// The runtime appends while it runs, and code memory is reused: for an address, the latest
// line covering it wins. PerfMap is the parsed table (pure, fed with text); PerfMapFile reads
// one process's file incrementally: only the bytes appended since the last read, from the
// start again when the file was replaced or truncated. ProcessAddressSpace owns one per
// process with JIT code and names JIT frames from it.
//
// Memory is bounded: at most kMaxEntries (1M) ranges and kMaxNameBytes (64 MiB) of names per
// map, about 100 MiB at worst. Names of overridden entries are compacted away when the names
// reach their cap; a map that still outgrows either cap is dropped and refilled from the
// lines that follow (newer code is likelier to be running than older), counted in resets().
//
// Not thread-safe.
#ifndef STRATA_AGENT_SYMBOLS_PERF_MAP_H_
#define STRATA_AGENT_SYMBOLS_PERF_MAP_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/container/btree_map.h"
#include "absl/status/status.h"

namespace strata::agent::symbols {

struct PerfMapLine {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string_view name;  // trailing blanks and '\r' removed; never empty
};

// Parses one line without its newline. False for anything that is not an entry (blank or
// malformed lines, zero size, a range past the end of the address space).
bool ParsePerfMapLine(std::string_view line, PerfMapLine* out);

class PerfMap {
 public:
  static constexpr size_t kMaxEntries = size_t{1} << 20;
  static constexpr size_t kMaxNameBytes = size_t{64} << 20;

  struct Symbol {
    uint64_t start = 0;  // of the code object (a range cut by a later one keeps its start)
    uint64_t end = 0;
    std::string_view name;  // valid until the map is next changed
  };

  // Adds the complete lines of `text` (the file's bytes following those added before) and
  // returns how many bytes they take, up to and including the last newline: the caller
  // passes the rest again with what follows it.
  size_t AddText(std::string_view text);
  // Adds one entry; later entries override earlier ones where they overlap.
  void Add(uint64_t start, uint64_t size, std::string_view name);
  // The latest entry covering `addr`.
  bool Lookup(uint64_t addr, Symbol* out) const;
  void Clear();

  size_t size() const { return ranges_.size(); }
  uint64_t resets() const { return resets_; }

 private:
  struct Range {
    uint64_t end;
    uint64_t function_start;  // the entry's start, kept when a later entry cuts the range
    uint32_t name_offset;     // in names_
    uint32_t name_size;
  };
  void Compact();

  // Non-overlapping ranges by start; their names in one arena (no allocation per entry).
  absl::btree_map<uint64_t, Range> ranges_;
  std::string names_;
  uint64_t resets_ = 0;
};

// One process's perf map file, read where the agent can reach it (`open_path`, e.g.
// /proc/PID/root/tmp/perf-NSPID.map for a process in a container) and known by the path the
// process wrote it to (`map_path`, which names its JIT module: base::JitModuleName).
// A file that grew is read on from where the last read stopped, unless the bytes before that
// point changed: then it was written anew in place (as HotSpot writes each map it is asked
// for), and it is read again from the start.
class PerfMapFile {
 public:
  PerfMapFile(std::string open_path, std::string map_path)
      : open_path_(std::move(open_path)), map_path_(std::move(map_path)) {}

  // Reads what was appended since the last call when the file changed (size, mtime, inode),
  // everything again when it was replaced or shrank; at most kMaxBytesPerUpdate a call (the
  // rest on the next calls). NotFound when there is no file (yet), FailedPrecondition when it
  // is not a regular file; the entries read before stay.
  absl::Status Update();
  static constexpr uint64_t kMaxBytesPerUpdate = 64 << 20;

  const PerfMap& map() const { return map_; }
  const std::string& open_path() const { return open_path_; }
  const std::string& map_path() const { return map_path_; }
  bool exists() const { return inode_ != 0; }
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  std::string open_path_;
  std::string map_path_;
  PerfMap map_;
  // The file as last read: identity, size and mtime, and how much of it was consumed (up
  // to the last complete line).
  uint64_t device_ = 0;
  uint64_t inode_ = 0;
  uint64_t size_ = 0;
  int64_t mtime_ns_ = -1;
  uint64_t consumed_ = 0;
  bool skipping_line_ = false;  // inside a line too long to be an entry
  // The last bytes consumed (up to kTailBytes), to tell an append from a rewrite.
  static constexpr size_t kTailBytes = 64;
  std::string tail_;
  bool TailUnchanged(int fd) const;
  void RememberTail(int fd);
  bool read_cut_short_ = false;  // the last call stopped at kMaxBytesPerUpdate
  uint64_t bytes_read_ = 0;
};

// Where the perf map of process `pid` is written: /tmp/perf-N.map with N its pid in its own
// PID namespace (NSpid in /proc/PID/status), and where the agent reads it (through
// /proc/PID/root, so that /tmp is the process's).
struct PerfMapPaths {
  std::string open_path;
  std::string map_path;
};
PerfMapPaths PerfMapPathsOf(pid_t pid);

}  // namespace strata::agent::symbols

#endif  // STRATA_AGENT_SYMBOLS_PERF_MAP_H_
