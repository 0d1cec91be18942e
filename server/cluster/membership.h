// Membership of a Strata cluster, kept in etcd. A node puts its ClusterMember record under
// `<prefix>/nodes/<id>` with a lease it refreshes every third of the lease's TTL, and watches
// the prefix: the ring (ring.h) is the set of members whose keys exist, so a node whose lease
// expires (killed, partitioned, stopped) leaves the ring and its keys move to the next nodes.
// The membership is cached: while etcd is away the last ring stays in force, and the node
// still counts as a member until its own lease would have run out (lease_held()).
//
// Membership owns its etcd client and two threads (lease refresh, watch). ring() hands out
// immutable snapshots; observers are called on the watch thread after every change.
#ifndef STRATA_SERVER_CLUSTER_MEMBERSHIP_H_
#define STRATA_SERVER_CLUSTER_MEMBERSHIP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/cluster/etcd/etcd_client.h"
#include "server/cluster/ring.h"

namespace strata::server::cluster {

struct MembershipOptions {
  std::string etcd_endpoints;  // comma-separated http://HOST:PORT (https:// with TLS)
  rpc::ClientSecurity etcd_security;  // TLS to etcd, and the client certificate
  std::string prefix = "/strata";
  std::string node_id;
  std::string advertise;  // host:port other nodes and agents reach this node's gRPC at
  uint32_t tokens = kDefaultTokens;
  absl::Duration lease_ttl = absl::Seconds(10);
};

struct MembershipStats {
  uint64_t ring_changes = 0;
  uint64_t lease_renewals = 0;
  uint64_t lease_regrants = 0;  // the lease expired and was granted anew
  uint64_t etcd_errors = 0;
  uint64_t watch_restarts = 0;
};

class Membership {
 public:
  using Observer = std::function<void(const std::shared_ptr<const Ring>&)>;

  // Registers this node and reads the members. Unavailable when etcd cannot be reached,
  // AlreadyExists when a live member already uses this node ID with another address.
  static absl::StatusOr<std::unique_ptr<Membership>> Join(MembershipOptions options);
  // Leaves: revokes the lease, so the others move this node's keys at once instead of after
  // the TTL. A server calls it as it starts shutting down, so its agents' new owners do not
  // wait for it; the destructor leaves if it has not.
  void Leave();
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  std::shared_ptr<const Ring> ring() const;
  // True while this node's last lease refresh is younger than the TTL: past that the others
  // may already have moved its keys, so it must not acknowledge anything as an owner.
  bool lease_held() const;
  // Nodes that joined this cluster at some time (each keeps a record without a lease under
  // PREFIX/members/) whose lease is gone now: down, or removed for good until forgotten.
  std::vector<RingMember> departed() const;
  int64_t revision() const;
  MembershipStats stats() const;
  const MembershipOptions& options() const { return options_; }
  // The cluster's etcd, for other records under the prefix (agent ID claims).
  EtcdClient* etcd() const { return etcd_.get(); }
  // Called (on the watch thread) with every new ring.
  void AddObserver(Observer observer);

  // Removes a node for good: deletes its record, so no node lists it as down any more.
  // FailedPrecondition while it holds a lease (stop it first), NotFound for an unknown ID.
  static absl::Status Forget(EtcdClient& etcd, const std::string& prefix,
                             const std::string& node_id);

 private:
  explicit Membership(MembershipOptions options, std::unique_ptr<EtcdClient> etcd);

  std::string KeyOf(const std::string& id) const;
  absl::Status Register();
  // Reads every member, replaces the ring; then watches from the revision read.
  absl::Status Resync();
  void Apply(const EtcdEvent& event);
  void Publish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LeaseLoop();
  void WatchLoop();

  const MembershipOptions options_;
  const std::unique_ptr<EtcdClient> etcd_;
  std::atomic<int64_t> lease_{0};
  std::atomic<int64_t> lease_refreshed_ns_{0};  // steady clock, of the last good refresh

  mutable absl::Mutex mu_;
  std::map<std::string, RingMember> members_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, RingMember> known_ ABSL_GUARDED_BY(mu_);  // PREFIX/members/
  std::shared_ptr<const Ring> ring_ ABSL_GUARDED_BY(mu_);
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<Observer> observers_ ABSL_GUARDED_BY(mu_);
  MembershipStats stats_ ABSL_GUARDED_BY(mu_);
  bool watch_ended_ ABSL_GUARDED_BY(mu_) = false;

  absl::Notification stop_;
  std::thread lease_thread_;
  std::thread watch_thread_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_MEMBERSHIP_H_
