#include "agent/core/poller.h"

#include <errno.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"

namespace strata::agent {
namespace {

absl::Status ErrnoError(const char* call) {
  return absl::InternalError(absl::StrCat(call, ": ", strerror(errno)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Poller>> Poller::Create(PollerOptions options) {
  if (!options.clock) options.clock = [] { return absl::Now(); };
  auto poller = std::unique_ptr<Poller>(new Poller(std::move(options)));
  if (absl::Status st = poller->Init(); !st.ok()) return st;
  return poller;
}

Poller::Poller(PollerOptions options) : options_(std::move(options)) {}

absl::Status Poller::Init() {
  poll_fd_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!poll_fd_.valid()) return ErrnoError("epoll_create1");
  wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_fd_.valid()) return ErrnoError("eventfd");
  std::vector<int> fds = options_.ready_fds;
  fds.push_back(wake_fd_.get());
  for (int fd : fds) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(poll_fd_.get(), EPOLL_CTL_ADD, fd, &ev) != 0) return ErrnoError("epoll_ctl");
  }
  ArmChanges();
  return absl::OkStatus();
}

absl::StatusOr<Wakeup> Poller::Wait(absl::Duration timeout) {
  const std::vector<int>& changes = options_.change_fds;
  absl::Duration wait = timeout;
  if (!changes_armed_ && !changes.empty()) {
    const absl::Time now = options_.clock();
    const absl::Time rearm = last_change_ + options_.change_gap;
    if (now >= rearm) {
      ArmChanges();
    } else {
      wait = std::min(wait, rearm - now);
    }
  }
  epoll_event events[Wakeup::kMaxEvents];
  const int n = EpollWait(std::clamp(wait, absl::ZeroDuration(), absl::Milliseconds(INT32_MAX)),
                          events);
  Wakeup woke;
  if (n < 0 && errno != EINTR) return ErrnoError("epoll_wait");
  for (int i = 0; i < n; ++i) {
    const int fd = events[i].data.fd;
    if (fd == wake_fd_.get()) {
      uint64_t count;
      (void)!read(fd, &count, sizeof(count));
    } else if (std::find(changes.begin(), changes.end(), fd) != changes.end()) {
      changes_armed_ = false;  // EPOLLONESHOT: re-armed after change_gap
      woke.changed = true;
    } else {
      woke.ready[woke.ready_count++] = fd;
    }
  }
  if (woke.changed) last_change_ = options_.clock();
  return woke;
}

int Poller::EpollWait(absl::Duration wait, epoll_event* events) {
  if (precise_) {
    const timespec timeout = absl::ToTimespec(wait);
    const int n = epoll_pwait2(poll_fd_.get(), events, Wakeup::kMaxEvents, &timeout, nullptr);
    if (n >= 0 || errno != ENOSYS) return n;
    precise_ = false;  // kernels before 5.11, emulators without the call
  }
  const int timeout_ms = static_cast<int>(
      absl::ToInt64Milliseconds(absl::Ceil(wait, absl::Milliseconds(1))));
  return epoll_wait(poll_fd_.get(), events, Wakeup::kMaxEvents, timeout_ms);
}

void Poller::Wake() const {
  const uint64_t one = 1;
  // A full counter (EAGAIN) already wakes the loop.
  (void)!write(wake_fd_.get(), &one, sizeof(one));
}

void Poller::StopWatching(int fd) {
  std::vector<int>& changes = options_.change_fds;
  auto it = std::find(changes.begin(), changes.end(), fd);
  if (it == changes.end()) return;
  changes.erase(it);
  // Fails harmlessly when the owner closed it already (closing removed it).
  (void)epoll_ctl(poll_fd_.get(), EPOLL_CTL_DEL, fd, nullptr);
}

void Poller::ArmChanges() {
  for (int fd : options_.change_fds) {
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLONESHOT;
    ev.data.fd = fd;
    if (epoll_ctl(poll_fd_.get(), changes_added_ ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) {
      LogWarn("watching process changes: epoll_ctl: {}", strerror(errno));
    }
  }
  changes_added_ = true;
  changes_armed_ = true;
}

}  // namespace strata::agent
