// agent/core/poller: the one place the agent's main loop sleeps. An epoll over
//
//   ready descriptors   the stack sources' wait descriptors (perf rings, ...): level-triggered,
//                       they wake the loop while samples wait;
//   change descriptors  readable on process or thread changes (process events) and new
//                       in-process rings: watched for one wake-up at a time (EPOLLONESHOT) and
//                       re-armed no sooner than change_gap after they last woke the loop, so a
//                       host forking hundreds of unrelated processes a second does not turn
//                       into as many agent wake-ups;
//   a wake eventfd      written by Wake(), from any thread or a signal handler.
//
// Wait() says what woke it; the owner (the Profiler) maps ready descriptors back to its
// sources and rescans targets on changes. The Poller owns its epoll and eventfd, not the
// descriptors it watches. Single-threaded but for Wake().
#ifndef STRATA_AGENT_CORE_POLLER_H_
#define STRATA_AGENT_CORE_POLLER_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/base/unique_fd.h"

struct epoll_event;

namespace strata::agent {

struct PollerOptions {
  std::vector<int> ready_fds;
  std::vector<int> change_fds;
  absl::Duration change_gap = absl::Milliseconds(100);
  // What Wait() takes as the time (the change gap). Null: absl::Now. Tests pass their own.
  std::function<absl::Time()> clock;
};

// What ended one Wait(). Plain data: a wake-up allocates nothing.
struct Wakeup {
  static constexpr int kMaxEvents = 4;  // per epoll_wait; the rest stay ready for the next
  bool changed = false;  // a change descriptor was readable (now disarmed until re-armed)
  int ready_count = 0;   // readable ready descriptors, in ready[0, ready_count)
  int ready[kMaxEvents] = {};
};

class Poller {
 public:
  static absl::StatusOr<std::unique_ptr<Poller>> Create(PollerOptions options);

  // Waits up to `timeout` (less while the change descriptors wait to be re-armed) for a
  // ready or change descriptor or Wake(). An interrupted wait returns an empty Wakeup.
  // Timeouts are kept to the microsecond where the kernel has epoll_pwait2 (5.11+), else
  // rounded up to the millisecond.
  absl::StatusOr<Wakeup> Wait(absl::Duration timeout);
  // Ends the current (or next) Wait early. Any thread; async-signal-safe.
  void Wake() const;
  // The descriptor Wake() writes to, for a signal handler that cannot reach the Poller.
  int wake_fd() const { return wake_fd_.get(); }
  // No longer watches `fd` among the change descriptors (its owner gave up on it).
  void StopWatching(int fd);
  bool changes_armed() const { return changes_armed_; }

 private:
  explicit Poller(PollerOptions options);
  absl::Status Init();
  // Watches the change descriptors for one wake-up.
  void ArmChanges();
  // epoll_pwait2 where there is one, else epoll_wait; `wait` at most INT32_MAX ms.
  int EpollWait(absl::Duration wait, epoll_event* events);

  PollerOptions options_;
  base::UniqueFd poll_fd_;
  base::UniqueFd wake_fd_;  // an eventfd
  bool changes_added_ = false;
  bool changes_armed_ = false;
  bool precise_ = true;  // epoll_pwait2 not found missing yet
  absl::Time last_change_ = absl::InfinitePast();  // when changes last woke a Wait
};

}  // namespace strata::agent

#endif  // STRATA_AGENT_CORE_POLLER_H_
