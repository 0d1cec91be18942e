#include "common/base/file_stamp.h"

#include <sys/stat.h>

#include <cerrno>

namespace strata::base {

FileStamp StampOf(const std::string& path) {
  FileStamp stamp;
  if (path.empty()) return stamp;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    stamp.error = errno;
    return stamp;
  }
  stamp.dev = st.st_dev;
  stamp.ino = st.st_ino;
  stamp.size = st.st_size;
  stamp.mtime_ns = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
  return stamp;
}

}  // namespace strata::base
