// A small client of etcd's v3 API (3.4) over the project's gRPC: keys (put, put if absent,
// delete, read a prefix), leases (grant, refresh, revoke) and prefix watches, which is what
// the server needs to register itself in a cluster, follow the other members and claim
// agent IDs.
//
// Ownership: the caller owns the EtcdClient and every Watch it returns; a Watch may outlive
// its client (it holds what it needs). The caller owns its leases too: nothing here refreshes
// them in the background; call KeepAliveOnce more often than the TTL.
//
// Every call has a deadline (EtcdClientOptions::call_timeout). It tries the endpoints in turn,
// starting with the last one that answered; when none is reachable it waits for one to
// (re)connect until the deadline, then fails Unavailable. Errors are etcd's gRPC statuses with
// the same code (NotFound for a missing lease, Unavailable, DeadlineExceeded...), the method
// and endpoint named in the message. Endpoints are all http:// (plain text) or all https://
// (TLS, verified against EtcdClientOptions::security's CA; with its client certificate when
// etcd runs with --client-cert-auth). Thread-safe.
#ifndef STRATA_SERVER_CLUSTER_ETCD_ETCD_CLIENT_H_
#define STRATA_SERVER_CLUSTER_ETCD_ETCD_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/rpc/client_security.h"

namespace strata::server::cluster {

namespace etcd_internal {
struct Endpoint;
}  // namespace etcd_internal

struct EtcdKeyValue {
  std::string key;
  std::string value;
  // The revision of the key's last change (for a delete event: of the delete).
  int64_t mod_revision = 0;
  // 0: no lease.
  int64_t lease = 0;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKeyValue kv;
};

// The end of the key range holding every key that starts with `prefix`: the prefix with its
// last byte below 0xff incremented and the rest dropped; "\0" (no upper bound) when there is
// none, e.g. for "" or "\xff".
std::string EtcdPrefixRangeEnd(std::string_view prefix);

struct EtcdClientOptions {
  // The deadline of each unary call, and of a watch's creation.
  absl::Duration call_timeout = absl::Seconds(2);
  // The longest wait between attempts to reconnect to an endpoint that went away, so that
  // calls work again soon after etcd comes back.
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // TLS for https:// endpoints: the CA of etcd's certificate, and the client certificate to
  // present. Plain text (the default) for http:// endpoints. Tokens are not sent: etcd's own
  // authentication takes the client certificate's CN as its user name.
  rpc::ClientSecurity security;
};

class EtcdClient {
 public:
  using Options = EtcdClientOptions;

  // `endpoints`: comma-separated "http://host:port", "https://host:port" or "host:port";
  // https:// needs TLS in options.security, http:// needs its absence (InvalidArgument, as
  // for a malformed endpoint). Does not connect: an endpoint that is down is an error of the
  // calls, not of Create.
  static absl::StatusOr<std::unique_ptr<EtcdClient>> Create(const std::string& endpoints,
                                                            EtcdClientOptions options = {});
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // A new lease of `ttl` (whole seconds, rounded up; etcd may grant more); its ID.
  absl::StatusOr<int64_t> GrantLease(absl::Duration ttl);
  // Refreshes the lease once: one request and one response on a LeaseKeepAlive stream.
  // NotFound when etcd says the lease is gone (it answers TTL 0 rather than an error).
  absl::Status KeepAliveOnce(int64_t lease);
  // Ends the lease and deletes its keys. NotFound when there is no such lease.
  absl::Status RevokeLease(int64_t lease);

  // `lease` 0: the key does not expire.
  absl::Status Put(const std::string& key, const std::string& value, int64_t lease = 0);
  // OK whether or not the key existed.
  absl::Status Delete(const std::string& key);
  // Puts `value` (without a lease) unless the key exists, in one transaction; the key's value
  // afterwards: `value` if it was put or already held it, else the value another client put.
  absl::StatusOr<std::string> PutIfAbsent(const std::string& key, const std::string& value);

  struct RangeResult {
    std::vector<EtcdKeyValue> kvs;  // sorted by key
    // The store's revision the read saw: watch from revision + 1 to miss nothing after it.
    int64_t revision = 0;
  };
  // Every key starting with `prefix`, in one response.
  absl::StatusOr<RangeResult> GetPrefix(const std::string& prefix);

  // A running watch; destroying it cancels the stream and joins its thread (promptly: it does
  // not wait for etcd). Must not be destroyed from its own callbacks.
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  // Watches the keys starting with `prefix` from `start_revision` (0: from now; the watch is
  // in place when this returns, so later changes are seen). on_event is called on the watch's
  // own thread for every event, in revision order. The watch ends when its stream does:
  // on_end is called once, on that thread, with the reason: Unavailable (etcd went away),
  // OutOfRange (start_revision was compacted; the message names the compacted revision),
  // another code when etcd cancels it. After that no callback runs; the caller starts a new
  // watch if it wants one. on_end is not called once the Watch's destruction has begun.
  // Errors: the watch could not be created (no endpoint answered within call_timeout, or
  // etcd refused it).
  absl::StatusOr<std::unique_ptr<Watch>> WatchPrefix(const std::string& prefix,
                                                     int64_t start_revision,
                                                     std::function<void(const EtcdEvent&)> on_event,
                                                     std::function<void(absl::Status)> on_end);

 private:
  EtcdClient(std::vector<std::shared_ptr<etcd_internal::Endpoint>> endpoints,
             EtcdClientOptions options);

  const std::vector<std::shared_ptr<etcd_internal::Endpoint>> endpoints_;
  const EtcdClientOptions options_;
  // The endpoint that answered last: the first to try.
  std::atomic<size_t> preferred_{0};
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_ETCD_ETCD_CLIENT_H_
