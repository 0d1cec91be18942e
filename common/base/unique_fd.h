// A file descriptor owned by one object: closed when the owner goes or resets it.
#ifndef STRATA_COMMON_BASE_UNIQUE_FD_H_
#define STRATA_COMMON_BASE_UNIQUE_FD_H_

#include <unistd.h>

#include <utility>

namespace strata::base {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    reset(std::exchange(other.fd_, -1));
    return *this;
  }
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Closes the descriptor held (if any) and takes `fd`.
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  // Gives the descriptor up without closing it.
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace strata::base

#endif  // STRATA_COMMON_BASE_UNIQUE_FD_H_
