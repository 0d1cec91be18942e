// server/query: the read side. It reads the store, the aggregator's live counts
// (aggregate::LiveSamples) and the agent registry, and is the only server module that builds
// query API messages (query.proto), naming the stacks of stored phase events too. The
// services own nothing but their resolution caches (ProfileReader).
//
// gRPC Query service (proto/strata/v1/query.proto): services, agents, top functions and hot
// paths over the store plus the live aggregation tables (hot paths of the open window come
// from the sorted tables), with the filters of ProfileQuery. Stateless apart from borrowed
// pointers; thread-safe.
#ifndef STRATA_SERVER_QUERY_QUERY_SERVICE_H_
#define STRATA_SERVER_QUERY_QUERY_SERVICE_H_

#include <atomic>
#include <functional>

#include "absl/status/statusor.h"
#include "common/rpc/grpc_status.h"
#include "server/auth/grpc_auth.h"
#include "server/aggregate/live_samples.h"
#include "server/query/profile.h"
#include "server/query/profile_source.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"
#include "strata/v1/query.grpc.pb.h"

namespace strata::server::query {

// Converts a proto filter to a ProfileQuery; `now_ms` fills an open end. `asked_again`: the
// filter is another server's ToProfileFilter, whose range was checked there and may have come
// out empty (no window starts in it).
absl::StatusOr<ProfileQuery> ToProfileQuery(const v1::ProfileFilter& filter, int64_t now_ms,
                                            bool asked_again = false);
// The filter of a query (its range made explicit), for asking another server the same.
v1::ProfileFilter ToProfileFilter(const ProfileQuery& query);
using rpc::ToGrpcStatus;

// This server's own answers, from its registry and store only: a single server's, and a
// cluster node's part of a fan-out (server/cluster).
v1::ListAgentsResponse ListAgentsOf(registry::AgentRegistry* registry);
// Phase changes of `query`'s service and range, their stacks named from `store`.
absl::StatusOr<v1::PhasesResponse> PhasesOf(store::Store* store, const ProfileQuery& query);

class QueryService final : public v1::Query::Service {
 public:
  // `live` (optional): the aggregation tables' counts not yet written to the store.
  // `authorizer` (optional; null allows every call): every gRPC call needs role reader and
  // is counted against the caller's query rate. `symbolizer` (optional) names frames of
  // stripped modules from debug files (ProfileReader). The Run* entry points do not check: their
  // callers (the HTTP mirror) authorize first.
  QueryService(store::Store* store, registry::AgentRegistry* registry,
               const aggregate::LiveSamples* live = nullptr,
               auth::Authorizer* authorizer = nullptr,
               symbolize::Symbolizer* symbolizer = nullptr);

  grpc::Status ListServices(grpc::ServerContext*, const v1::ListServicesRequest*,
                            v1::ListServicesResponse*) override;
  grpc::Status ListAgents(grpc::ServerContext*, const v1::ListAgentsRequest*,
                          v1::ListAgentsResponse*) override;
  grpc::Status Top(grpc::ServerContext*, const v1::TopRequest*, v1::TopResponse*) override;
  grpc::Status HotPaths(grpc::ServerContext*, const v1::HotPathsRequest*,
                        v1::HotPathsResponse*) override;
  grpc::Status Phases(grpc::ServerContext*, const v1::PhasesRequest*,
                      v1::PhasesResponse*) override;
  grpc::Status FlameGraph(grpc::ServerContext*, const v1::FlameGraphRequest*,
                          v1::FlameGraphResponse*) override;
  grpc::Status Diff(grpc::ServerContext*, const v1::DiffRequest*, v1::DiffResponse*) override;
  grpc::Status Compare(grpc::ServerContext*, const v1::CompareRequest*,
                       v1::CompareResponse*) override;
  grpc::Status Export(grpc::ServerContext*, const v1::ExportRequest*,
                      v1::ExportResponse*) override;
  grpc::Status ListLabels(grpc::ServerContext*, const v1::ListLabelsRequest*,
                          v1::ListLabelsResponse*) override;
  grpc::Status Series(grpc::ServerContext*, const v1::SeriesRequest*,
                      v1::SeriesResponse*) override;
  grpc::Status Quality(grpc::ServerContext*, const v1::QualityRequest*,
                       v1::QualityResponse*) override;

  // Transport-free entry points (also used by the HTTP/JSON mirror).
  absl::StatusOr<v1::TopResponse> RunTop(const v1::TopRequest& request);
  absl::StatusOr<v1::HotPathsResponse> RunHotPaths(const v1::HotPathsRequest& request);
  absl::StatusOr<v1::ListServicesResponse> RunListServices();
  v1::ListAgentsResponse RunListAgents();
  absl::StatusOr<v1::PhasesResponse> RunPhases(const v1::PhasesRequest& request);
  absl::StatusOr<v1::FlameGraphResponse> RunFlameGraph(const v1::FlameGraphRequest& request);
  // An empty base service means the compared service; an empty base range means the same
  // range for another service, else the equally long range just before the compared one.
  absl::StatusOr<v1::DiffResponse> RunDiff(const v1::DiffRequest& request);
  // Two groups (selectors and ranges) compared per function and path with intervals and a
  // verdict (compare_profiles.h): each group's samples loaded per host through Load.
  absl::StatusOr<v1::CompareResponse> RunCompare(const v1::CompareRequest& request);
  absl::StatusOr<v1::ExportResponse> RunExport(const v1::ExportRequest& request);
  // Label keys of a service and their values; empty for an unknown service.
  absl::StatusOr<v1::ListLabelsResponse> RunListLabels(const v1::ListLabelsRequest& request);
  // The distinct label sets of `service`'s samples (reserved labels included), from every
  // node in a cluster; nodes that did not answer go to `unreachable`.
  absl::StatusOr<std::vector<labels::LabelSet>> LabelSetsOf(const std::string& service,
                                                          std::vector<std::string>* unreachable);
  // Stack quality of a service's continuous profile over the range (quality.h) with its
  // agents' unwinding counters.
  absl::StatusOr<v1::QualityResponse> RunQuality(const v1::QualityRequest& request);
  // Samples per interval (series.h), the largest series first.
  absl::StatusOr<v1::SeriesResponse> RunSeries(const v1::SeriesRequest& request);

  // Reads [now_ms - range_ms, now_ms) of every service of this server's store with samples
  // in it, the most recently active first, as a query would: fills the store's hour and
  // minute blocks and this service's resolved stacks, so that the first query after
  // start-up costs what later ones do. Stops when `stop` is set, or once the store's hour
  // blocks fill half their budget (the rest is the queries'). Returns the services read.
  size_t WarmUp(int64_t now_ms, int64_t range_ms, const std::atomic<bool>& stop);

  // In a cluster, profiles and services come from every node (set before serving).
  void SetProfileSource(ProfileSource* source) { source_ = source; }

 private:
  absl::StatusOr<auth::Principal> AuthorizeQuery(const grpc::ServerContextBase* context);
  absl::StatusOr<Profile> LoadProfile(const v1::ProfileFilter& filter);
  // From the ProfileSource if there is one, else from this server's store; at source-line
  // granularity with query.lines (ExpandLines here, on each node of a ProfileSource).
  absl::StatusOr<Profile> Load(const ProfileQuery& query);
  // A query of a service's whole history (from 0) from its first stored window to the end of
  // its last, so that an export's start and duration and a series' intervals are its data's,
  // not 1970's. Unknown services are left as they are.
  absl::Status BoundToStoredRange(ProfileQuery* query);
  // Self samples per source line: from the leaf addresses (TopLines), or with
  // `language_self` from the stacks (TopLinesOfStacks).
  absl::StatusOr<v1::TopResponse> Lines(ProfileQuery query, bool language_self, uint32_t limit);
  // Export in OTLP (otlp_export.h): one profile per host.
  absl::StatusOr<v1::ExportResponse> RunOtlpExport(const ProfileQuery& query);
  // Architectures of the hosts that contributed to `profile`.
  std::vector<std::string> ArchsOf(const Profile& profile);

  store::Store* store_;
  registry::AgentRegistry* registry_;
  const aggregate::LiveSamples* live_;
  auth::Authorizer* const authorizer_;
  symbolize::Symbolizer* const symbolizer_;  // null: no server-side names nor lines
  ProfileReader reader_;
  ProfileSource* source_ = nullptr;
};

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_QUERY_SERVICE_H_
