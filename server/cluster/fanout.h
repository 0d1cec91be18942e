// Queries in a cluster. Every node serves the Cluster gRPC service (ClusterService): its own
// samples per host for a filter, its own profile over a set of hosts, its services, agents,
// label sets, phase changes and unwinding counters, and the ring as it sees it. Only other
// nodes (role node) may call it, apart from Status. FanoutSource is the query service's ProfileSource on a cluster node: a
// profile query asks every live node for its samples per host, takes each host from the node
// holding the most of them (replicas of a host hold the same batches, so the largest is the
// complete one when another missed some, and summing replicas would count them twice), asks
// each node for the profile of the hosts it was given, and merges. Nodes that did not answer
// are named in the answer; nodes known to be down are named too once as many are down as
// there are replicas (below that, every host's samples have a replica up).
//
// Agents, label sets and phase changes are merged from every node; unwinding counters are
// taken per agent from the node holding the most of them (replicas store the same batches').
//
// Both borrow the membership, store, registry and channels; ClusterService owns a
// ProfileReader.
#ifndef STRATA_SERVER_CLUSTER_FANOUT_H_
#define STRATA_SERVER_CLUSTER_FANOUT_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/auth/authorizer.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "server/query/profile.h"
#include "server/query/profile_source.h"
#include "server/registry/agent_registry.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/cluster.grpc.pb.h"
#include "strata/v1/debuginfo.grpc.pb.h"

namespace strata::server::cluster {

class ClusterService final : public v1::Cluster::Service {
 public:
  ClusterService(Membership* membership, store::Store* store,
                 registry::AgentRegistry* registry, const aggregate::LiveSamples* live,
                 symbolize::Symbolizer* symbolizer, auth::Authorizer* authorizer,
                 uint32_t replication_factor, const ReplicationMetrics* metrics);

  grpc::Status Status(grpc::ServerContext*, const v1::ClusterStatusRequest*,
                      v1::ClusterStatusResponse*) override;
  grpc::Status HostTotals(grpc::ServerContext*, const v1::LocalProfileRequest*,
                          v1::HostTotalsResponse*) override;
  grpc::Status LocalProfile(grpc::ServerContext*, const v1::LocalProfileRequest*,
                            v1::LocalProfileResponse*) override;
  grpc::Status LocalServices(grpc::ServerContext*, const v1::ListServicesRequest*,
                             v1::ListServicesResponse*) override;
  grpc::Status LocalAgents(grpc::ServerContext*, const v1::ListAgentsRequest*,
                           v1::ListAgentsResponse*) override;
  grpc::Status LocalLabelSets(grpc::ServerContext*, const v1::ListLabelsRequest*,
                              v1::LocalLabelSetsResponse*) override;
  grpc::Status LocalPhases(grpc::ServerContext*, const v1::PhasesRequest*,
                           v1::PhasesResponse*) override;
  grpc::Status LocalUnwindCounts(grpc::ServerContext*, const v1::LocalProfileRequest*,
                                 v1::LocalUnwindCountsResponse*) override;
  grpc::Status LocalTopLines(grpc::ServerContext*, const v1::LocalProfileRequest*,
                             v1::TopResponse*) override;
  grpc::Status LocalLeafAddresses(grpc::ServerContext*, const v1::LocalProfileRequest*,
                                  v1::LocalLeafAddressesResponse*) override;

  // Transport-free forms (this node's part of a fan-out query; the status for the CLI).
  absl::StatusOr<v1::HostTotalsResponse> RunHostTotals(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::LocalProfileResponse> RunLocalProfile(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::ListServicesResponse> RunLocalServices();
  v1::ListAgentsResponse RunLocalAgents();
  absl::StatusOr<v1::LocalLabelSetsResponse> RunLocalLabelSets(const v1::ListLabelsRequest& r);
  absl::StatusOr<v1::PhasesResponse> RunLocalPhases(const v1::PhasesRequest& request);
  absl::StatusOr<v1::LocalUnwindCountsResponse> RunLocalUnwindCounts(
      const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::TopResponse> RunLocalTopLines(const v1::LocalProfileRequest& request);
  absl::StatusOr<v1::LocalLeafAddressesResponse> RunLocalLeafAddresses(
      const v1::LocalProfileRequest& request);
  v1::ClusterStatusResponse RunStatus();
  const Membership& membership() const { return *membership_; }
  const ReplicationMetrics& metrics() const { return *metrics_; }

 private:
  // Answers a call of another node (role node) with `run`'s result.
  template <typename Response, typename Run>
  grpc::Status AsNode(grpc::ServerContext* context, Run run, Response* response);

  Membership* const membership_;
  store::Store* const store_;
  registry::AgentRegistry* const registry_;
  const aggregate::LiveSamples* const live_;
  symbolize::Symbolizer* const symbolizer_;
  auth::Authorizer* const authorizer_;
  const uint32_t replication_factor_;
  const ReplicationMetrics* const metrics_;
  query::ProfileReader reader_;
};

// Runs a capture on the node whose agent stream serves its target: asks the other live nodes
// in turn (the first that does not answer NotFound runs it) and relays the progress. A call
// that was already routed is not routed again. For CaptureService::Options::run_elsewhere.
grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer);

// The captures stored on the other live nodes (each node keeps those it ran), and one of
// them by ID, for CaptureService::Options::list_elsewhere and get_elsewhere. A call that was
// already routed is answered by its node alone.
std::vector<v1::CaptureRecord> ListCapturesElsewhere(Membership* membership,
                                                     NodeChannels* channels,
                                                     grpc::ServerContext* context,
                                                     absl::Duration timeout,
                                                     std::vector<std::string>* unreachable);
grpc::Status GetCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context, absl::Duration timeout,
                                 const v1::GetCaptureRequest& request, v1::CaptureRecord* record);

// Copies a debug file uploaded here to the other live nodes (DebugInfoService's
// copy_elsewhere), as uploads of their own; returns the nodes it could not be copied to. A
// copy is not copied again.
std::vector<std::string> CopyDebugInfoElsewhere(Membership* membership, NodeChannels* channels,
                                                grpc::ServerContext* context,
                                                const std::string& path,
                                                const std::string& file_name,
                                                const std::string& build_id);

// A debug file stored on this node, for DebugInfoSync.
struct LocalDebugFile {
  std::string build_id;   // lowercase hex
  std::string file_name;  // as uploaded
  std::string path;       // where this node keeps it
};

// Keeps every live node's uploaded debug files the same: a node that was down while a file
// was uploaded, or joined later, gets it. Each round lists every live node's uploads
// (DebugInfo.List); for each file some live node lacks, the holder with the smallest node ID
// sends it (DebugInfo.Upload, marked routed so that it is not copied further). Rounds run
// every `interval` and soon after each ring change. Borrows the membership and channels.
class DebugInfoSync {
 public:
  using LocalFiles = std::function<std::vector<LocalDebugFile>()>;
  DebugInfoSync(Membership* membership, NodeChannels* channels, LocalFiles local_files,
                absl::Duration interval);
  ~DebugInfoSync();  // stops the rounds
  DebugInfoSync(const DebugInfoSync&) = delete;
  DebugInfoSync& operator=(const DebugInfoSync&) = delete;

  uint64_t files_sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  // One round: files sent, and the failures ("n3 (addr): reason").
  struct Round {
    uint64_t sent = 0;
    std::vector<std::string> failures;
  };
  Round RunOnce();
  void Loop();

  Membership* const membership_;
  NodeChannels* const channels_;
  const LocalFiles local_files_;
  const absl::Duration interval_;
  std::atomic<uint64_t> sent_{0}, failures_{0};
  // Shared with the membership's observer, which outlives this object.
  struct Wakeup {
    absl::Mutex mu;
    bool stop ABSL_GUARDED_BY(mu) = false;
    bool ring_changed ABSL_GUARDED_BY(mu) = false;
    grpc::ClientContext* call ABSL_GUARDED_BY(mu) = nullptr;  // cancelled on destruction
  };
  // Registers the round's call in flight; false once stopping.
  bool Begin(grpc::ClientContext* call);
  void End();
  const std::shared_ptr<Wakeup> wakeup_ = std::make_shared<Wakeup>();
  std::thread thread_;
};

// Prometheus text of the node's ring state, replication and debug info sync counters, for
// /metrics.
std::string RenderClusterMetrics(ClusterService& service,
                                 const DebugInfoSync* debuginfo_sync = nullptr);

class FanoutSource final : public query::ProfileSource {
 public:
  FanoutSource(Membership* membership, NodeChannels* channels, ClusterService* local,
               uint32_t replication_factor, absl::Duration timeout);

  absl::StatusOr<query::Profile> Load(const query::ProfileQuery& query) override;
  absl::StatusOr<std::vector<store::ServiceSummary>> Services(
      std::vector<std::string>* unreachable) override;
  v1::ListAgentsResponse Agents() override;
  absl::StatusOr<std::vector<labels::LabelSet>> LabelSets(
      const std::string& service, std::vector<std::string>* unreachable) override;
  absl::StatusOr<v1::PhasesResponse> Phases(const query::ProfileQuery& query) override;
  absl::StatusOr<store::UnwindCounts> UnwindCounts(const query::ProfileQuery& query,
                                                   std::vector<std::string>* unreachable) override;
  absl::StatusOr<v1::TopResponse> TopLines(const query::ProfileQuery& query,
                                           uint32_t limit) override;
  absl::StatusOr<query::LeafAddressCounts> LeafAddresses(
      const query::ProfileQuery& query, query::FunctionLookup* functions,
      std::vector<std::string>* unreachable) override;

 private:
  // Phase 1 of a query over samples: every live node's samples per host for `request`; each
  // host goes to the node holding the most of them. The nodes given hosts, each with its
  // request (`request` narrowed to its hosts), and each host's samples.
  struct HostPick {
    std::vector<RingMember> nodes;
    std::vector<v1::LocalProfileRequest> requests;
    std::map<std::string, uint64_t> host_samples;
  };
  absl::StatusOr<HostPick> PickHosts(const v1::LocalProfileRequest& request,
                                     std::vector<std::string>* unreachable);
  // Answers of nodes, each with the node's ID.
  template <typename Response>
  using Answers = std::vector<std::pair<std::string, Response>>;
  // Asks `nodes` at once: `local(i)` on this node, `remote(stub, context, response, i)` on the
  // others. The nodes that did not answer go to `unreachable`; InvalidArgument (the request is
  // wrong: every node would say so) ends the call.
  template <typename Response, typename Local, typename Remote>
  absl::StatusOr<Answers<Response>> Ask(const std::vector<RingMember>& nodes, Local local,
                                        Remote remote, std::vector<std::string>* unreachable);
  // Ask every live node (`local()`, `remote(stub, context, response)`), then NoteDeparted.
  template <typename Response, typename Local, typename Remote>
  absl::StatusOr<Answers<Response>> AskAll(Local local, Remote remote,
                                           std::vector<std::string>* unreachable);
  // Ask the nodes of `pick`, each with its request (`local(request)`, `remote(stub, context,
  // request, response)`), then NoteDeparted.
  template <typename Response, typename Local, typename Remote>
  absl::StatusOr<Answers<Response>> AskPicked(const HostPick& pick, Local local, Remote remote,
                                              std::vector<std::string>* unreachable);
  // Names the down nodes in `unreachable` when, with the nodes already there, as many are
  // away as there are replicas (below that, every host has a replica up).
  void NoteDeparted(std::vector<std::string>* unreachable) const;

  Membership* const membership_;
  NodeChannels* const channels_;
  ClusterService* const local_;
  const uint32_t replication_factor_;
  const absl::Duration timeout_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_FANOUT_H_
