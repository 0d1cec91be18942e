#include "server/registry/agent_registry.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/escape.h"

namespace strata::server::registry {

absl::StatusOr<uint64_t> AgentRegistry::Attach(const AgentDescriptor& agent,
                                               uint32_t frequency_hz, Sender sender,
                                               std::string* other_host) {
  absl::MutexLock lock(&mu_);
  if (auto known = agents_.find(agent.agent_id);
      known != agents_.end() && !known->second.agent.owner.empty() &&
      known->second.agent.owner != agent.owner) {
    return absl::PermissionDeniedError(absl::StrCat(
        "agent ID ", base::EscapeForLog(agent.agent_id), " belongs to ", known->second.agent.owner,
        "; ", agent.owner.empty() ? "anonymous" : agent.owner, " may not write as it"));
  }
  Entry& e = agents_[agent.agent_id];
  if (e.connected && e.agent.host != agent.host && other_host != nullptr) {
    *other_host = e.agent.host;
  }
  if (!e.connected && e.detached_at != 0) disconnected_.erase(e.detached_at);
  e.agent = agent;
  e.frequency_hz = frequency_hz;
  e.connected = true;
  e.sender = std::make_shared<Sender>(std::move(sender));
  e.attachment = ++attachments_;
  return e.attachment;
}

void AgentRegistry::Detach(const std::string& agent_id, uint64_t attachment) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end() || it->second.attachment != attachment) return;
  it->second.connected = false;
  it->second.sender.reset();
  it->second.detached_at = ++detaches_;
  disconnected_.emplace(it->second.detached_at, agent_id);
  while (disconnected_.size() > max_disconnected_) {
    agents_.erase(disconnected_.begin()->second);
    disconnected_.erase(disconnected_.begin());
  }
}

void AgentRegistry::RecordBatch(const std::string& agent_id, const v1::SampleBatch& batch) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
  it->second.last_batch_ms = batch.end_ms();
  ++it->second.batches;
  if (it->second.targets_from_heartbeats) return;
  for (const v1::Target& t : batch.targets()) it->second.targets[t.pid()] = t.service();
}

void AgentRegistry::SetTargets(const std::string& agent_id,
                               const google::protobuf::RepeatedPtrField<v1::Target>& targets) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
  it->second.targets.clear();
  it->second.targets_from_heartbeats = true;
  for (const v1::Target& t : targets) it->second.targets[t.pid()] = t.service();
}

void AgentRegistry::SetHealth(const std::string& agent_id, const v1::AgentHealth& health) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
  it->second.health = health;
}

std::vector<AgentStatus> AgentRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<AgentStatus> out;
  out.reserve(agents_.size());
  for (const auto& [id, e] : agents_) {
    AgentStatus& a = out.emplace_back();
    a.agent_id = id;
    a.host = e.agent.host;
    a.arch = e.agent.arch;
    a.version = e.agent.version;
    a.connected = e.connected;
    a.last_batch_ms = e.last_batch_ms;
    a.batches = e.batches;
    a.health = e.health;
    a.frequency_hz = e.frequency_hz;
    a.targets.reserve(e.targets.size());
    for (const auto& [pid, service] : e.targets) a.targets.push_back({service, pid});
  }
  return out;
}

std::vector<std::string> AgentRegistry::FindAgents(const std::string& service,
                                                   const std::string& host, uint32_t pid) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : agents_) {
    if (!e.connected) continue;
    if (!host.empty() && e.agent.host != host) continue;
    bool match = service.empty() && pid == 0;
    for (const auto& [tpid, tservice] : e.targets) {
      if ((service.empty() || tservice == service) && (pid == 0 || tpid == pid)) match = true;
    }
    if (match) out.push_back(id);
  }
  return out;
}

uint32_t AgentRegistry::SamplingRate(const std::string& service) const {
  absl::MutexLock lock(&mu_);
  std::map<uint32_t, uint32_t> agents_by_rate;
  for (const auto& [id, e] : agents_) {
    if (e.frequency_hz == 0) continue;
    for (const auto& [pid, s] : e.targets) {
      if (s != service) continue;
      ++agents_by_rate[e.frequency_hz];
      break;
    }
  }
  uint32_t rate = kDefaultFrequencyHz, agents = 0;
  for (const auto& [hz, n] : agents_by_rate) {
    if (n > agents) {
      rate = hz;
      agents = n;
    }
  }
  return rate;
}

bool AgentRegistry::Send(const std::string& agent_id, const v1::ServerMessage& message) {
  std::shared_ptr<Sender> sender;
  {
    absl::MutexLock lock(&mu_);
    auto it = agents_.find(agent_id);
    if (it == agents_.end() || !it->second.sender) return false;
    sender = it->second.sender;
  }
  return (*sender)(message);
}

}  // namespace strata::server::registry
