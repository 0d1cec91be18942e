// Debug files uploaded to the server (`strata debuginfo upload`), kept by GNU build ID in a
// directory of their own under the data directory: <dir>/<build-id>.debug, plus a small
// <build-id>.meta text file (file name, upload time). Files are validated before they are
// stored and appear atomically (written to <dir>/tmp, then renamed), so a crash mid-upload
// leaves no partial file behind.
//
// Thread-safe: the directory is the state; a mutex orders writers.
#ifndef STRATA_SERVER_SYMBOLIZE_DEBUGINFO_STORE_H_
#define STRATA_SERVER_SYMBOLIZE_DEBUGINFO_STORE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace strata::server::symbolize {

struct DebugFileInfo {
  std::string build_id;  // lowercase hex
  std::string file_name;  // as the uploader named it
  uint64_t size_bytes = 0;
  int64_t uploaded_ms = 0;
  uint64_t functions = 0;  // function symbols
  bool has_dwarf = false;
};

// What a candidate debug file holds. InvalidArgument: not ELF64, no build ID, or neither
// function symbols nor DWARF.
absl::StatusOr<DebugFileInfo> InspectDebugFile(const std::string& path);

class DebugInfoStore {
 public:
  // Creates `dir` (and dir/tmp) if missing and removes leftovers of interrupted uploads.
  static absl::StatusOr<std::unique_ptr<DebugInfoStore>> Open(std::string dir,
                                                              uint64_t max_file_bytes);

  // A new temporary file under dir/tmp for an upload in progress; Commit or Discard it.
  absl::StatusOr<std::string> NewTemporary();
  // Validates the temporary file and stores it under its build ID (replacing an earlier
  // upload of it). InvalidArgument as InspectDebugFile, or when `expected_build_id` is
  // non-empty and differs. The temporary file is gone afterwards either way.
  struct Stored {
    DebugFileInfo info;
    bool replaced = false;
  };
  absl::StatusOr<Stored> Commit(const std::string& temporary, std::string_view file_name,
                                std::string_view expected_build_id, int64_t now_ms);
  void Discard(const std::string& temporary);

  // Path of the uploaded file for `build_id_hex`, if any.
  std::optional<std::string> PathOf(std::string_view build_id_hex) const;
  // Every uploaded file, by build ID.
  std::vector<DebugFileInfo> List() const;

  uint64_t max_file_bytes() const { return max_file_bytes_; }
  const std::string& dir() const { return dir_; }

 private:
  DebugInfoStore(std::string dir, uint64_t max_file_bytes)
      : dir_(std::move(dir)), max_file_bytes_(max_file_bytes) {}

  const std::string dir_;
  const uint64_t max_file_bytes_;
  mutable absl::Mutex mu_;
  uint64_t next_temporary_ ABSL_GUARDED_BY(mu_) = 0;
};

// Whether `s` is a plausible GNU build ID in lowercase hex (2..128 digits, even length).
bool IsBuildIdHex(std::string_view s);

// Copies the uploaded debug files of directory `from` (a DebugInfoStore's) into `to`, created
// if missing: `strata-server backup` into <backup>/debuginfo, `restore` back. Files are named
// by build ID, so a file already in `to` with the same size and metadata is not copied again.
// Each pair appears atomically and in the store's order (metadata, then the file), synced.
// A missing `from` copies nothing. Returns how many files were copied.
absl::StatusOr<size_t> CopyDebugFiles(const std::string& from, const std::string& to);

}  // namespace strata::server::symbolize

#endif  // STRATA_SERVER_SYMBOLIZE_DEBUGINFO_STORE_H_
