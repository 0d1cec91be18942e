// agent/procfs (strata::agent::procfs): what the agent reads from /proc. This header's readers
// and parsers, container and pod identity (container.h), service rules (service_matcher.h) and
// the ProcessTracker (process_tracker.h), which agent/core's TargetDiscovery owns.
//
// Reading /proc: process discovery and per-process facts the agent needs to choose, label and
// sample targets (executable, command line, comm, threads, start time, environment, memory
// mappings).
//
// Every reader is a free function that reads the live /proc of this host; the parsers behind
// them are exposed separately so that malformed or synthetic text can be tested without a live
// process. Nothing here caches: ProcessTracker (process_tracker.h) decides what to re-read.
// Processes vanish at any time, so a read of a process that is gone returns NotFoundError; other
// read failures (e.g. permissions) return the matching absl error. Parsers never crash on
// malformed input, they return InvalidArgumentError (or skip the bad line, where documented).

#ifndef STRATA_AGENT_PROCFS_PROCFS_H_
#define STRATA_AGENT_PROCFS_PROCFS_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace strata::agent::procfs {

// One line of /proc/PID/maps.
struct Mapping {
  uint64_t start = 0;   // first address
  uint64_t end = 0;     // one past the last address
  uint64_t offset = 0;  // file offset of `start`
  bool read = false;
  bool write = false;
  bool exec = false;
  bool shared = false;  // 's' (shared) rather than 'p' (private, copy-on-write)
  uint32_t dev_major = 0;
  uint32_t dev_minor = 0;
  uint64_t inode = 0;  // 0 for anonymous and pseudo mappings
  // File path, pseudo name ("[stack]", "[heap]", "[vdso]", "[anon:name]") or empty for
  // anonymous memory. Embedded spaces are kept; the kernel's " (deleted)" suffix is removed
  // and reported in `deleted` instead.
  std::string path;
  bool deleted = false;

  bool Contains(uint64_t address) const { return address >= start && address < end; }
  // True for file-backed mappings (a path that is not a [pseudo] name).
  bool IsFile() const { return !path.empty() && path.front() != '['; }
};

// Parses the text of a maps file. Lines that do not parse are skipped, never fatal: a
// half-written line must not lose the rest of the map. `skipped_lines`, if given, receives how
// many lines were dropped (tests and diagnostics).
std::vector<Mapping> ParseMaps(std::string_view text, size_t* skipped_lines = nullptr);

// One line of a maps file (without its newline); nullopt if it does not parse.
std::optional<Mapping> ParseMapsLine(std::string_view line);

// The mapping that contains `address`, or nullptr. `mappings` must be sorted by start, as
// /proc/PID/maps is.
const Mapping* FindMapping(const std::vector<Mapping>& mappings, uint64_t address);

// Field 22 of /proc/PID/stat (start time in clock ticks after boot). The comm field may contain
// spaces and ')' characters, so the parser anchors on the last ')'.
absl::StatusOr<uint64_t> ParseStatStartTime(std::string_view stat_text);

// The pid a process has in its own pid namespace: the last field of the NSpid line of a
// /proc/PID/status text (a container's process sees itself as, say, 1). Nullopt without a
// well-formed NSpid line (kernels before 4.1).
std::optional<pid_t> ParseNamespacePid(std::string_view status_text);

// Splits NUL-separated text (cmdline, environ) into its strings; a trailing NUL is optional.
std::vector<std::string> SplitNulSeparated(std::string_view text);

// Value of `name` in NUL-separated environ text, or nullopt if absent.
std::optional<std::string> FindEnvironValue(std::string_view environ_text, std::string_view name);

// ---- Live readers (pid may be any process visible in /proc). ----

// All process IDs (numeric entries of /proc), ascending.
absl::StatusOr<std::vector<pid_t>> ListProcesses();
// Thread IDs of `pid` (entries of /proc/PID/task), ascending.
absl::StatusOr<std::vector<pid_t>> ListThreads(pid_t pid);
// Target of /proc/PID/exe; NotFoundError for kernel threads and exited processes. A replaced
// or deleted executable keeps the kernel's " (deleted)" suffix.
absl::StatusOr<std::string> ReadExecutable(pid_t pid);
// argv of `pid`; empty for kernel threads and zombies.
absl::StatusOr<std::vector<std::string>> ReadCommandLine(pid_t pid);
// /proc/PID/comm without the trailing newline.
absl::StatusOr<std::string> ReadComm(pid_t pid);
// Start time of `pid` (see ParseStatStartTime). With the pid it identifies a process across pid
// reuse.
absl::StatusOr<uint64_t> ReadStartTime(pid_t pid);
// /proc/PID/environ (the environment the process was started or exec'd with), NUL-separated.
absl::StatusOr<std::string> ReadEnviron(pid_t pid);
// Value of environment variable `name` in /proc/PID/environ, nullopt if unset.
absl::StatusOr<std::optional<std::string>> ReadEnvironValue(pid_t pid, std::string_view name);
// Parsed /proc/PID/maps.
absl::StatusOr<std::vector<Mapping>> ReadMappings(pid_t pid);
// The pid `pid` has in its own namespace (ParseNamespacePid); `pid` itself where the kernel
// does not say.
absl::StatusOr<pid_t> ReadNamespacePid(pid_t pid);

// Reads a whole /proc file (they report size 0, so this reads until EOF), or its first
// `max_bytes`.
absl::StatusOr<std::string> ReadProcFile(const std::string& path,
                                         size_t max_bytes = SIZE_MAX);

}  // namespace strata::agent::procfs

#endif  // STRATA_AGENT_PROCFS_PROCFS_H_
