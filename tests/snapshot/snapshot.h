// Unwinding snapshots: real perf samples (registers + copied stack bytes) of a running
// process, with the process's file-backed mappings and their modules' build IDs, recorded to
// a file and replayed later by unwinders (tests/snapshot/snapshot_unwind_test.cc).
//
// File format (host byte order): "STRSNAP1", then records, each a type byte:
//   'M' mapping set, valid for the samples that follow it: u32 count, per mapping
//       u64 start, end, offset, inode; u8 exec; u16 path length, path; u16 length, build ID hex
//   'S' sample: u32 tid, u64 time_ns, pc, sp, fp, ra, u32 stack size, stack bytes
// Reading never trusts the file: truncated or inconsistent records give an error.
#ifndef STRATA_TESTS_SNAPSHOT_SNAPSHOT_H_
#define STRATA_TESTS_SNAPSHOT_SNAPSHOT_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/symbols/process_address_space.h"

namespace strata::snapshot {

struct Mapping {
  agent::symbols::MappingInfo info;
  std::string build_id_hex;  // empty when the file has none or could not be read
};

struct Sample {
  uint32_t tid = 0;
  uint64_t time_ns = 0;
  uint64_t pc = 0, sp = 0, fp = 0, ra = 0;
  std::vector<uint8_t> stack;  // copied from sp upwards
  size_t mapping_set = 0;      // index into Snapshot::mapping_sets
};

struct Snapshot {
  std::vector<std::vector<Mapping>> mapping_sets;
  std::vector<Sample> samples;
};

struct RecordOptions {
  double seconds = 1.5;
  uint32_t frequency_hz = 499;
  uint32_t stack_bytes = 16 * 1024;
};

struct RecordStats {
  size_t samples = 0;
  size_t mapping_sets = 0;
  size_t threads = 0;
  uint64_t lost = 0;
};

// Samples every thread of `pid` (threads created later too) for options.seconds or until the
// process exits, and writes the snapshot file `path`.
absl::StatusOr<RecordStats> Record(pid_t pid, const RecordOptions& options,
                                   const std::string& path);

absl::StatusOr<Snapshot> Load(const std::string& path);

}  // namespace strata::snapshot

#endif  // STRATA_TESTS_SNAPSHOT_SNAPSHOT_H_
