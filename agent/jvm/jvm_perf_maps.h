// When to ask each JVM target for a fresh perf map (hotspot_attach.h), and the thread that
// asks. Opt-in per service: attaching starts a listener thread in the JVM and each map costs
// it a walk of its code cache, which an operator chooses to pay.
//
// A JVM compiles most of its code early and keeps compiling what turns hot: it is asked on
// first sight, then at doubling intervals from 1 s up to `max_period`, and sooner (at most once
// a second) while the agent meets JIT pcs the last map did not name. A JVM that cannot be
// attached or refuses the command (a JDK before 17, attach disabled) is logged once and not
// asked again.
//
// Tick() and Forget() are for the agent's main loop and never block: requests run on a thread
// of this class's own, one at a time.
#ifndef STRATA_AGENT_JVM_JVM_PERF_MAPS_H_
#define STRATA_AGENT_JVM_JVM_PERF_MAPS_H_

#include <sys/types.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace strata::agent::jvm {

struct JvmPerfMapOptions {
  // Services whose JVMs are asked; "*" asks every JVM target. Empty: none.
  std::vector<std::string> services;
  absl::Duration max_period = absl::Seconds(60);
  absl::Duration attach_timeout = absl::Seconds(5);
};

class JvmPerfMaps {
 public:
  // What runs a diagnostic command: RunDiagnosticCommand, or a fake in tests.
  using CommandRunner =
      std::function<absl::StatusOr<std::string>(pid_t, std::string_view, absl::Duration)>;

  using Clock = std::function<absl::Time()>;

  // `runner` and `clock` (when answers are stamped): the real ones by default.
  explicit JvmPerfMaps(JvmPerfMapOptions options, CommandRunner runner = nullptr,
                       Clock clock = nullptr);
  ~JvmPerfMaps();  // waits for the request running, drops the queued ones
  JvmPerfMaps(const JvmPerfMaps&) = delete;
  JvmPerfMaps& operator=(const JvmPerfMaps&) = delete;

  bool Wants(std::string_view service) const;
  // A JVM target of a wanted service, at each of the main loop's wake-ups: queues a request
  // when one is due. `unnamed_jit_pcs` is the target's running count (ProcessAddressSpace).
  void Tick(pid_t pid, absl::Time now, uint64_t unnamed_jit_pcs);
  // The process is gone or no longer a target.
  void Forget(pid_t pid);

  struct Stats {
    uint64_t requests = 0;  // commands sent
    uint64_t maps = 0;      // answered with a map written
    uint64_t failures = 0;  // failed (each JVM given up on counts once more in given_up)
    uint64_t given_up = 0;
  };
  Stats stats() const;

 private:
  struct Jvm {
    absl::Time next_due = absl::InfinitePast();
    absl::Time last_answer = absl::InfinitePast();
    absl::Duration period = absl::Seconds(1);  // until the request after next_due
    uint64_t unnamed_seen = 0;
    uint64_t maps = 0;
    bool queued = false;  // or running
    bool given_up = false;
  };

  void Run();

  const JvmPerfMapOptions options_;
  const CommandRunner runner_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<pid_t, Jvm> jvms_ ABSL_GUARDED_BY(mu_);
  std::deque<pid_t> queue_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace strata::agent::jvm

#endif  // STRATA_AGENT_JVM_JVM_PERF_MAPS_H_
