// What identifies one version of a file on disk, for watchers that re-read a file when it
// changes (the tokens file, TLS certificates and keys): a rename gives a new inode, an edit
// in place a new size or mtime. A file that cannot be stat'ed has its errno instead, so that
// it appearing (or changing from one error to another) is a change too.
#ifndef STRATA_COMMON_BASE_FILE_STAMP_H_
#define STRATA_COMMON_BASE_FILE_STAMP_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace strata::base {

struct FileStamp {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  int64_t mtime_ns = 0;
  int error = 0;
  bool operator==(const FileStamp&) const = default;
};

// The stamp of `path` now (all zero for an empty path).
FileStamp StampOf(const std::string& path);

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_FILE_STAMP_H_
