#include "server/cluster/agent_id_claims.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/base/escape.h"
#include "common/base/log.h"

namespace strata::server::cluster {

absl::Status AgentIdClaims::Claim(const std::string& agent_id, const std::string& owner,
                                  bool recorded_here) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = owners_.find(agent_id); it != owners_.end() && it->second == owner) {
      return absl::OkStatus();
    }
    if (absl::Now() - etcd_failed_at_ < back_off_) {
      if (recorded_here) {
        ++stats_->unconfirmed;
        return absl::OkStatus();
      }
      return absl::UnavailableError(
          "cannot confirm the agent ID's owner (etcd unreachable); retry later");
    }
  }
  absl::StatusOr<std::string> claimed = etcd_->PutIfAbsent(
      absl::StrCat(prefix_, "/agent-ids/", agent_id), owner);
  absl::MutexLock lock(&mu_);
  if (!claimed.ok()) {
    etcd_failed_at_ = absl::Now();
    LogWarn("agent {}: cannot confirm its owner in etcd: {}", base::EscapeForLog(agent_id),
            claimed.status().ToString());
    if (recorded_here) {
      ++stats_->unconfirmed;
      return absl::OkStatus();
    }
    return absl::UnavailableError(
        "cannot confirm the agent ID's owner (etcd unreachable); retry later");
  }
  if (*claimed != owner) {
    ++stats_->refused;
    return absl::PermissionDeniedError(absl::StrCat(
        "agent ID ", base::EscapeForLog(agent_id), " belongs to ", base::EscapeForLog(*claimed),
        " (on another node of the cluster); ", owner, " may not write as it"));
  }
  if (owners_.size() >= kMaxCached) owners_.clear();
  owners_[agent_id] = owner;
  return absl::OkStatus();
}

}  // namespace strata::server::cluster
