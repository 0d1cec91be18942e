#include "agent/jvm/jvm_perf_maps.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "agent/jvm/hotspot_attach.h"
#include "common/base/log.h"

namespace strata::agent::jvm {
namespace {

constexpr absl::Duration kUnnamedRetry = absl::Seconds(1);
constexpr char kCommand[] = "Compiler.perfmap";

}  // namespace

JvmPerfMaps::JvmPerfMaps(JvmPerfMapOptions options, CommandRunner runner, Clock clock)
    : options_(std::move(options)),
      runner_(runner ? std::move(runner) : CommandRunner(RunDiagnosticCommand)),
      clock_(clock ? std::move(clock) : Clock(absl::Now)) {
  if (!options_.services.empty()) worker_ = std::thread([this] { Run(); });
}

JvmPerfMaps::~JvmPerfMaps() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (worker_.joinable()) worker_.join();
}

bool JvmPerfMaps::Wants(std::string_view service) const {
  return std::any_of(options_.services.begin(), options_.services.end(),
                     [&](const std::string& s) { return s == "*" || s == service; });
}

void JvmPerfMaps::Tick(pid_t pid, absl::Time now, uint64_t unnamed_jit_pcs) {
  absl::MutexLock lock(&mu_);
  Jvm& jvm = jvms_[pid];
  if (jvm.given_up || jvm.queued) return;
  const bool unnamed = unnamed_jit_pcs > jvm.unnamed_seen;
  // Code the last map did not name: ask again a second after the last answer (code seen
  // sooner is still asked for then: its pcs are named once, so it is seen once).
  if (now < jvm.next_due && !(unnamed && now >= jvm.last_answer + kUnnamedRetry)) return;
  jvm.unnamed_seen = unnamed_jit_pcs;
  jvm.queued = true;
  queue_.push_back(pid);
}

void JvmPerfMaps::Forget(pid_t pid) {
  absl::MutexLock lock(&mu_);
  jvms_.erase(pid);  // a queued request finds no entry and is dropped
}

JvmPerfMaps::Stats JvmPerfMaps::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void JvmPerfMaps::Run() {
  while (true) {
    pid_t pid = 0;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || !queue_.empty();
      };
      mu_.Await(absl::Condition(&ready));
      if (stopping_) return;
      pid = queue_.front();
      queue_.pop_front();
      if (!jvms_.contains(pid)) continue;
      ++stats_.requests;
    }
    absl::StatusOr<std::string> answer = runner_(pid, kCommand, options_.attach_timeout);
    absl::MutexLock lock(&mu_);
    auto it = jvms_.find(pid);
    if (it == jvms_.end()) continue;
    Jvm& jvm = it->second;
    jvm.queued = false;
    const absl::Time now = clock_();
    jvm.last_answer = now;
    if (answer.ok()) {
      if (jvm.maps++ == 0) LogInfo("pid {}: JIT code named from its JVM's perf map", pid);
      ++stats_.maps;
      jvm.next_due = now + jvm.period;
      jvm.period = std::min(jvm.period * 2, options_.max_period);
      continue;
    }
    ++stats_.failures;
    // Gone, or a socket that broke: try again later. Anything else will not change.
    if (absl::IsNotFound(answer.status()) || absl::IsUnavailable(answer.status())) {
      jvm.next_due = now + jvm.period;
      continue;
    }
    jvm.given_up = true;
    ++stats_.given_up;
    LogWarn("pid {}: no JIT names from its JVM: {}", pid, answer.status().ToString());
  }
}

}  // namespace strata::agent::jvm
