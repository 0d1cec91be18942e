#include "server/cluster/membership.h"

#include <chrono>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/base/escape.h"
#include "common/base/log.h"
#include "strata/v1/cluster.pb.h"

namespace strata::server::cluster {
namespace {

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::optional<RingMember> ParseMember(const EtcdKeyValue& kv) {
  v1::ClusterMember m;
  if (!m.ParseFromString(kv.value) || m.id().empty() || m.address().empty()) return std::nullopt;
  return RingMember{m.id(), m.address(), m.tokens()};
}

// Live nodes are PREFIX/nodes/ID (under the node's lease); every node that ever joined is
// PREFIX/members/ID (no lease), until forgotten.
std::string NodesPrefix(const std::string& prefix) { return absl::StrCat(prefix, "/nodes/"); }
std::string MembersPrefix(const std::string& prefix) { return absl::StrCat(prefix, "/members/"); }

bool HasKey(const EtcdClient::RangeResult& range, const std::string& key) {
  for (const EtcdKeyValue& kv : range.kvs) {
    if (kv.key == key) return true;
  }
  return false;
}

}  // namespace

Membership::Membership(MembershipOptions options, std::unique_ptr<EtcdClient> etcd)
    : options_(std::move(options)), etcd_(std::move(etcd)),
      ring_(std::make_shared<const Ring>()) {}

absl::StatusOr<std::unique_ptr<Membership>> Membership::Join(MembershipOptions options) {
  if (options.node_id.empty() || options.advertise.empty()) {
    return absl::InvalidArgumentError("a cluster node needs --node-id and --advertise");
  }
  if (options.lease_ttl < absl::Seconds(2)) {
    return absl::InvalidArgumentError("the cluster lease TTL must be at least 2 s");
  }
  if (options.tokens == 0) return absl::InvalidArgumentError("a node needs at least one token");
  auto etcd = EtcdClient::Create(options.etcd_endpoints, {.security = options.etcd_security});
  if (!etcd.ok()) return etcd.status();
  std::unique_ptr<Membership> m(new Membership(std::move(options), *std::move(etcd)));
  if (absl::Status s = m->Register(); !s.ok()) return s;
  if (absl::Status s = m->Resync(); !s.ok()) return s;
  m->lease_thread_ = std::thread([p = m.get()] { p->LeaseLoop(); });
  m->watch_thread_ = std::thread([p = m.get()] { p->WatchLoop(); });
  return m;
}

Membership::~Membership() { Leave(); }

void Membership::Leave() {
  if (!stop_.HasBeenNotified()) stop_.Notify();
  if (lease_thread_.joinable()) lease_thread_.join();
  if (watch_thread_.joinable()) watch_thread_.join();
  if (const int64_t lease = lease_.exchange(0); lease != 0) {
    if (absl::Status s = etcd_->RevokeLease(lease); !s.ok() && !absl::IsNotFound(s)) {
      LogWarn("cluster: leaving: {} (the others see this node go after its lease TTL)",
                   s.ToString());
    }
  }
}

std::string Membership::KeyOf(const std::string& id) const {
  return NodesPrefix(options_.prefix) + id;
}

absl::Status Membership::Forget(EtcdClient& etcd, const std::string& prefix,
                                const std::string& node_id) {
  const std::string live = NodesPrefix(prefix) + node_id;
  auto nodes = etcd.GetPrefix(live);
  if (!nodes.ok()) return nodes.status();
  if (HasKey(*nodes, live)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "node ", node_id, " is live (it holds its lease): stop it before forgetting it"));
  }
  const std::string record = MembersPrefix(prefix) + node_id;
  auto members = etcd.GetPrefix(record);
  if (!members.ok()) return members.status();
  if (!HasKey(*members, record)) {
    return absl::NotFoundError(absl::StrCat("no node ", node_id, " in the cluster at ", prefix));
  }
  return etcd.Delete(record);
}

absl::Status Membership::Register() {
  auto existing = etcd_->GetPrefix(KeyOf(options_.node_id));
  if (!existing.ok()) {
    return absl::UnavailableError(absl::StrCat("cluster: cannot reach etcd at ",
                                               options_.etcd_endpoints, ": ",
                                               existing.status().message()));
  }
  for (const EtcdKeyValue& kv : existing->kvs) {
    if (kv.key != KeyOf(options_.node_id)) continue;
    std::optional<RingMember> m = ParseMember(kv);
    if (m && m->address != options_.advertise) {
      return absl::AlreadyExistsError(absl::StrCat(
          "cluster: node ID ", options_.node_id, " is already live at ", m->address,
          " (another strata-server with the same --node-id?)"));
    }
  }
  auto lease = etcd_->GrantLease(options_.lease_ttl);
  if (!lease.ok()) return lease.status();
  v1::ClusterMember record;
  record.set_id(options_.node_id);
  record.set_address(options_.advertise);
  record.set_tokens(options_.tokens);
  record.set_started_ms(absl::ToUnixMillis(absl::Now()));
  if (absl::Status s =
          etcd_->Put(MembersPrefix(options_.prefix) + options_.node_id, record.SerializeAsString());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = etcd_->Put(KeyOf(options_.node_id), record.SerializeAsString(), *lease);
      !s.ok()) {
    return s;
  }
  lease_ = *lease;
  lease_refreshed_ns_ = SteadyNowNs();
  return absl::OkStatus();
}

absl::Status Membership::Resync() {
  auto range = etcd_->GetPrefix(options_.prefix + "/");
  if (!range.ok()) return range.status();
  absl::MutexLock lock(&mu_);
  std::map<std::string, RingMember> members, known;
  const std::string nodes = NodesPrefix(options_.prefix);
  const std::string records = MembersPrefix(options_.prefix);
  for (const EtcdKeyValue& kv : range->kvs) {
    std::optional<RingMember> m = ParseMember(kv);
    if (!m) continue;
    if (kv.key == nodes + m->id) members.emplace(m->id, *m);
    if (kv.key == records + m->id) known.emplace(m->id, *m);
  }
  known_ = std::move(known);
  revision_ = range->revision;
  if (members != members_ || ring_->empty()) {
    members_ = std::move(members);
    Publish();
  }
  return absl::OkStatus();
}

void Membership::Apply(const EtcdEvent& event) {
  const std::string nodes = NodesPrefix(options_.prefix);
  const std::string records = MembersPrefix(options_.prefix);
  absl::MutexLock lock(&mu_);
  revision_ = std::max(revision_, event.kv.mod_revision);
  if (absl::StartsWith(event.kv.key, records)) {
    const std::string id = event.kv.key.substr(records.size());
    if (event.type == EtcdEvent::Type::kDelete) {
      if (known_.erase(id) > 0) LogInfo("cluster: node {} forgotten", base::EscapeForLog(id));
    } else if (std::optional<RingMember> m = ParseMember(event.kv); m && m->id == id) {
      known_[id] = *m;
    }
    return;
  }
  if (!absl::StartsWith(event.kv.key, nodes)) return;
  const std::string id = event.kv.key.substr(nodes.size());
  if (event.type == EtcdEvent::Type::kDelete) {
    auto it = members_.find(id);
    if (it == members_.end()) return;
    LogInfo("cluster: node {} ({}) left the ring", base::EscapeForLog(id), it->second.address);
    members_.erase(it);
  } else {
    std::optional<RingMember> m = ParseMember(event.kv);
    if (!m || m->id != id) return;
    auto it = members_.find(id);
    if (it != members_.end() && it->second == *m) return;
    if (it == members_.end()) {
      LogInfo("cluster: node {} ({}) joined the ring", base::EscapeForLog(id), m->address);
    }
    members_[id] = *m;
  }
  Publish();
}

void Membership::Publish() {
  std::vector<RingMember> members;
  for (const auto& [id, m] : members_) members.push_back(m);
  ring_ = std::make_shared<const Ring>(std::move(members));
  ++stats_.ring_changes;
  for (const Observer& o : observers_) o(ring_);
}

void Membership::LeaseLoop() {
  // A third of the TTL: two refreshes may fail (an etcd restart) before the lease runs out.
  const absl::Duration period = options_.lease_ttl / 3;
  while (!stop_.WaitForNotificationWithTimeout(period)) {
    absl::Status s = etcd_->KeepAliveOnce(lease_.load());
    if (s.ok()) {
      lease_refreshed_ns_ = SteadyNowNs();
      absl::MutexLock lock(&mu_);
      ++stats_.lease_renewals;
      continue;
    }
    {
      absl::MutexLock lock(&mu_);
      ++stats_.etcd_errors;
    }
    if (absl::IsNotFound(s)) {
      // The lease ran out (etcd was away longer than the TTL, or this node was cut off): the
      // others have moved this node's keys; join again.
      LogWarn("cluster: this node's lease expired; registering again");
      if (absl::Status r = Register(); r.ok()) {
        absl::MutexLock lock(&mu_);
        ++stats_.lease_regrants;
      } else {
        LogWarn("cluster: registering again: {}", r.ToString());
      }
    } else {
      LogWarn("cluster: refreshing the lease: {}", s.ToString());
    }
  }
}

void Membership::WatchLoop() {
  while (!stop_.HasBeenNotified()) {
    int64_t from;
    {
      absl::MutexLock lock(&mu_);
      from = revision_ + 1;
      watch_ended_ = false;
    }
    auto watch = etcd_->WatchPrefix(
        options_.prefix + "/", from,
        [this](const EtcdEvent& e) { Apply(e); },
        [this](absl::Status why) {
          LogWarn("cluster: membership watch ended: {}", why.ToString());
          absl::MutexLock lock(&mu_);
          watch_ended_ = true;
        });
    if (watch.ok()) {
      // Until the watch ends or the node stops; the ring stays as it is meanwhile.
      absl::MutexLock lock(&mu_);
      while (!watch_ended_ && !stop_.HasBeenNotified()) {
        mu_.AwaitWithTimeout(absl::Condition(&watch_ended_), absl::Milliseconds(250));
      }
    }
    watch = absl::UnavailableError("restarting");  // joins the ended watch's thread
    if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(500))) break;
    {
      absl::MutexLock lock(&mu_);
      ++stats_.watch_restarts;
    }
    // Changes while no watch ran: read everything again before watching from its revision.
    while (!stop_.HasBeenNotified()) {
      if (absl::Status s = Resync(); s.ok()) break;
      if (stop_.WaitForNotificationWithTimeout(absl::Milliseconds(500))) return;
    }
  }
}

std::shared_ptr<const Ring> Membership::ring() const {
  absl::MutexLock lock(&mu_);
  return ring_;
}

bool Membership::lease_held() const {
  return SteadyNowNs() - lease_refreshed_ns_.load() <
         absl::ToInt64Nanoseconds(options_.lease_ttl);
}

std::vector<RingMember> Membership::departed() const {
  absl::MutexLock lock(&mu_);
  std::vector<RingMember> out;
  for (const auto& [id, m] : known_) {
    if (!members_.contains(id)) out.push_back(m);
  }
  return out;
}

int64_t Membership::revision() const {
  absl::MutexLock lock(&mu_);
  return revision_;
}

MembershipStats Membership::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void Membership::AddObserver(Observer observer) {
  absl::MutexLock lock(&mu_);
  observers_.push_back(std::move(observer));
}

}  // namespace strata::server::cluster
