// gRPC OTLP profiles service (ProfilesService/Export, v1development) on the server's listener,
// with the TLS, roles and limits of agent ingest: the caller needs the agent role, a client
// certificate writes only as the host it names, messages are bounded by --max-message-bytes
// and their content by the agent limits (server/ingest/limits.h). The request is converted
// (otlp_convert.h) before anything is stored, so a refused request stores nothing.
//
// Storing: the request's functions, stacks and label sets are interned in one store commit,
// then its counts are committed through the server's commit::BatchCommitter, one commit per
// (host, 10 s window) like an agent batch.
//
// Retries: OTLP senders resend a request whose answer they did not get; OTLP promises no
// exactly-once. A request identical in content (deterministic serialization) to one applied
// at most Options::dedup_window ago, among the last Options::dedup_entries commits, is
// acknowledged without being stored again, per (host, window) commit, so a retry after a
// partial failure stores only what was missing. A retry after that, or after a server
// restart, is stored again: each such retry counts its samples once more.
//
// In a cluster (Options::placement), a request's hosts are stored by their owners on the
// ring, as agents' streams are: the node that receives it stores the hosts it owns and
// forwards the request to each other owner, naming the hosts that node is to store (a replica
// call: role node, applied without placement), and answers OK only once every owner stored
// them. A failed forward answers UNAVAILABLE; the sender's retry is recognized, per node, for
// what each already stored.
#ifndef STRATA_SERVER_OTLP_OTLP_SERVICE_H_
#define STRATA_SERVER_OTLP_OTLP_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.grpc.pb.h"
#include "server/auth/authorizer.h"
#include "server/commit/batch_committer.h"
#include "server/ingest/limits.h"
#include "server/otlp/otlp_convert.h"
#include "server/store/store.h"

namespace strata::server::otlp {

// Metadata of a replica call (binary): the hosts of the request the receiving node stores,
// separated by NUL bytes. The call also carries ingest's kReplicaMetadata (the sending node).
inline constexpr char kReplicaHostsMetadata[] = "x-strata-otlp-hosts-bin";

// Where a cluster stores each host (server/cluster implements it).
class OtlpPlacement {
 public:
  struct Plan {
    std::vector<std::string> here;  // hosts this node owns
    std::map<std::string, std::vector<std::string>> elsewhere;  // other owner's address -> hosts
  };
  virtual ~OtlpPlacement() = default;
  // Unavailable when this node cannot tell (it lost its membership).
  virtual absl::StatusOr<Plan> PlanHosts(const std::vector<std::string>& hosts) = 0;
  // Has the node at `address` store `hosts` of `request` (a replica call); OK once it did.
  virtual absl::Status Forward(const std::string& address,
                               const otlp_v1::ExportProfilesServiceRequest& request,
                               const std::vector<std::string>& hosts) = 0;
};

struct OtlpMetrics {
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> rejected_requests{0};
  std::atomic<uint64_t> duplicate_commits{0};  // (host, window) parts of retried requests
  std::atomic<uint64_t> samples{0};
  std::atomic<uint64_t> forwarded{0};          // requests forwarded to another owner, confirmed
  std::atomic<uint64_t> forward_failures{0};   // ... not confirmed (the sender retries)
};

// Export is taken as a streamed unary call so that a request that does not parse gets a clear
// INVALID_ARGUMENT (gRPC's own handler answers INTERNAL with no message).
class OtlpService final : public otlp_v1::ProfilesService::StreamedUnaryService {
 public:
  struct Options {
    // Who may export profiles (role agent); null: anyone.
    auth::Authorizer* authorizer = nullptr;
    // The aggregation tables; null: counts are merged into the store directly.
    commit::BatchCommitter* committer = nullptr;
    ingest::IngestLimits limits;
    // Retried requests are recognized within these bounds (see above).
    size_t dedup_entries = 1 << 16;
    absl::Duration dedup_window = absl::Minutes(10);
    // A cluster's placement of hosts; null: this server stores every host.
    OtlpPlacement* placement = nullptr;
  };

  // Borrows the store, the committer and the authorizer.
  OtlpService(store::Store* store, Options options);

  grpc::Status StreamedExport(
      grpc::ServerContext* context,
      grpc::ServerUnaryStreamer<otlp_v1::ExportProfilesServiceRequest,
                                otlp_v1::ExportProfilesServiceResponse>* stream) override;

  // Export without the transport: converts and stores `request` as a sender that may write
  // only as `forced_host` (empty: as any host), placing its hosts if there is a placement.
  absl::Status Apply(const otlp_v1::ExportProfilesServiceRequest& request,
                     const std::string& forced_host);
  // A replica call's part: converts `request` and stores only `hosts` of it.
  absl::Status ApplyReplica(const otlp_v1::ExportProfilesServiceRequest& request,
                            const std::vector<std::string>& hosts);

  const OtlpMetrics& metrics() const { return metrics_; }

 private:
  // Stores the cells of `converted` whose host is in `hosts` (all: nullopt).
  absl::Status Store(const otlp_v1::ExportProfilesServiceRequest& request,
                     const ConvertedRequest& converted,
                     const std::optional<std::vector<std::string>>& hosts);
  // Whether commit `key` must be done now (false: done already); UNAVAILABLE while the same
  // commit of an identical request is under way.
  absl::StatusOr<bool> BeginCommit(uint64_t key);
  void EndCommit(uint64_t key, bool committed);

  store::Store* const store_;
  std::unique_ptr<commit::StoreCommitter> own_committer_;
  commit::BatchCommitter* committer_;
  const Options options_;
  OtlpMetrics metrics_;

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, absl::Time> applied_ ABSL_GUARDED_BY(mu_);
  std::deque<std::pair<uint64_t, absl::Time>> applied_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> in_flight_ ABSL_GUARDED_BY(mu_);
};

}  // namespace strata::server::otlp

#endif  // STRATA_SERVER_OTLP_OTLP_SERVICE_H_
