#include "server/store/data_dir.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/store/db.h"

namespace strata::server::store {
namespace {

constexpr char kMarkerFile[] = "STRATA";
// Version 2 adds label set IDs to cell keys (codec.h); version 3 merge operands to the meta
// column (hourly leaf-address sums), which a server without their merge operator could not
// compact; version 4 stack records with call sites (codec.h), which an older server would
// take for corrupt. An older store reads unchanged and is marked with the current version
// when opened, so an older server refuses it instead of misreading it or failing later.
constexpr char kMarker[] = "strata-store 4\n";
constexpr char kMarkerV3[] = "strata-store 3\n";
constexpr char kMarkerV2[] = "strata-store 2\n";
constexpr char kMarkerV1[] = "strata-store 1\n";

}  // namespace

absl::Status CreateDirectories(const std::string& dir, absl::string_view what) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the ", what, " ", dir, ": ", ec.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckDataDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return absl::OkStatus();
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(dir, " is not a directory"));
  }
  const std::string marker = dir + "/" + kMarkerFile;
  if (fs::exists(marker, ec)) {
    std::ifstream in(marker);
    std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (contents != kMarker && contents != kMarkerV3 && contents != kMarkerV2 &&
        contents != kMarkerV1) {
      return absl::FailedPreconditionError(absl::StrCat(
          marker, " says '", absl::CHexEscape(contents.substr(0, 64)),
          "', not '", absl::CHexEscape(kMarker), "': a store of another version or a damaged file"));
    }
    // Without CURRENT, RocksDB would start a new, empty database over the store's files.
    std::string newest_manifest;
    for (const auto& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename();
      if (name.rfind("MANIFEST-", 0) == 0 && name > newest_manifest) newest_manifest = name;
    }
    if (!newest_manifest.empty() && !fs::exists(dir + "/CURRENT", ec)) {
      return absl::FailedPreconditionError(absl::StrCat(
          dir, "/CURRENT is missing from a Strata store (it names the store's MANIFEST file): "
          "not opened, so that no empty store starts over its data. If ", newest_manifest,
          " is the store's, restore it with: echo ", newest_manifest, " > ", dir, "/CURRENT"));
    }
    return absl::OkStatus();
  }
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir, ec)) names.push_back(e.path().filename());
  if (names.empty()) return absl::OkStatus();
  if (fs::exists(dir + "/CURRENT", ec)) {
    // A RocksDB database: a Strata store from before the marker has Strata's column families.
    std::vector<std::string> families;
    rocksdb::Status st = rocksdb::DB::ListColumnFamilies(rocksdb::DBOptions(), dir, &families);
    if (!st.ok()) return FromRocks(st);
    for (const char* name : kColumnNames) {
      if (std::find(families.begin(), families.end(), name) == families.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            dir, " holds a RocksDB database that is not a Strata store (column families: ",
            absl::StrJoin(families, ", "), ")"));
      }
    }
    return absl::OkStatus();
  }
  std::sort(names.begin(), names.end());
  names.resize(std::min<size_t>(names.size(), 3));
  return absl::FailedPreconditionError(absl::StrCat(
      dir, " is not empty and is not a Strata data directory (it holds ",
      absl::StrJoin(names, ", "), "...): give an empty or new directory"));
}

void MarkDataDirectory(const std::string& dir) {
  std::ifstream in(dir + "/" + kMarkerFile);
  std::string contents((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (contents != kMarker) {
    std::ofstream out(dir + "/" + kMarkerFile, std::ios::trunc);
    out << kMarker;
  }
}

}  // namespace strata::server::store
