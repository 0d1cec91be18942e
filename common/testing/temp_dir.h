// Test helper: a uniquely named directory under the system temp dir, removed with its
// contents when the object goes out of scope.
#ifndef STRATA_COMMON_TESTING_TEMP_DIR_H_
#define STRATA_COMMON_TESTING_TEMP_DIR_H_

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <string>

namespace strata::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "strata_test") {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            (prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  std::string path() const { return path_.string(); }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::testing

#endif  // STRATA_COMMON_TESTING_TEMP_DIR_H_
