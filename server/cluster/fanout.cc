#include "server/cluster/fanout.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/base/saturating.h"
#include "server/query/query_service.h"
#include "server/query/series.h"

namespace strata::server::cluster {
namespace {

// What a fan-out asks the nodes for `query`: its filter, and the hosts it is narrowed to.
v1::LocalProfileRequest RequestFor(const query::ProfileQuery& query) {
  v1::LocalProfileRequest request;
  *request.mutable_filter() = query::ToProfileFilter(query);
  if (query.hosts) request.mutable_hosts()->Add(query.hosts->begin(), query.hosts->end());
  request.set_requests(query.requests);
  return request;
}

// Nodes' profiles of their hosts, merged into one.
class ProfileMerger {
 public:
  explicit ProfileMerger(bool call_sites) : call_sites_wanted_(call_sites) {}

  absl::Status Add(const v1::LocalProfileResponse& part) {
    base::SaturatingAddTo(profile_.total, part.total());
    base::SaturatingAddTo(profile_.requests, part.requests());
    std::vector<uint32_t> remap;
    for (const v1::LocalFunction& f : part.functions()) {
      auto [it, inserted] = function_index_.try_emplace(
          std::tuple{f.id(), f.name(), f.file(), f.line(), f.inlined()},
          static_cast<uint32_t>(profile_.functions.size()));
      if (inserted) {
        query::ResolvedFunction fn;
        fn.id = f.id();
        fn.name = f.name();
        fn.module = f.module();
        fn.file = f.file();
        fn.line = f.line();
        fn.inlined = f.inlined();
        fn.build_id = f.build_id();
        profile_.functions.push_back(std::move(fn));
      }
      remap.push_back(it->second);
    }
    for (const v1::LocalStack& s : part.stacks()) {
      query::FrameIndices frames;
      frames.reserve(s.frames_size());
      for (uint32_t f : s.frames()) {
        if (f >= remap.size()) return absl::DataLossError("a node sent a malformed profile");
        frames.push_back(remap[f]);
      }
      if (call_sites_wanted_) {
        call_sites_.try_emplace(s.stack_id(), s.call_sites().begin(), s.call_sites().end());
      }
      AddStack(s, std::move(frames));
    }
    hosts_.insert(hosts_.end(), part.hosts().begin(), part.hosts().end());
    return absl::OkStatus();
  }

  // The profile, with each host's samples from `host_samples`.
  query::Profile Finish(std::map<std::string, uint64_t>& host_samples) && {
    std::sort(profile_.stacks.begin(), profile_.stacks.end(),
              [](const query::ResolvedStack& a, const query::ResolvedStack& b) {
                return a.count != b.count ? a.count > b.count : a.stack_id < b.stack_id;
              });
    if (call_sites_wanted_) {
      profile_.call_sites.reserve(profile_.stacks.size());
      for (const query::ResolvedStack& s : profile_.stacks) {
        profile_.call_sites.push_back(call_sites_[s.stack_id]);
      }
    }
    std::sort(hosts_.begin(), hosts_.end());
    hosts_.erase(std::unique(hosts_.begin(), hosts_.end()), hosts_.end());
    profile_.hosts = std::move(hosts_);
    for (const std::string& h : profile_.hosts) profile_.host_samples.push_back(host_samples[h]);
    return std::move(profile_);
  }

 private:
  void AddStack(const v1::LocalStack& s, query::FrameIndices frames) {
    absl::InlinedVector<size_t, 1>& same_id = stack_index_[s.stack_id()];
    auto same = std::find_if(same_id.begin(), same_id.end(), [&](size_t k) {
      return profile_.stacks[k].frames == frames && profile_.stacks[k].truncated == s.truncated();
    });
    if (same != same_id.end()) {
      base::SaturatingAddTo(profile_.stacks[*same].count, s.count());
    } else {
      same_id.push_back(profile_.stacks.size());
      profile_.stacks.push_back({s.stack_id(), s.count(), s.truncated(), std::move(frames)});
    }
  }

  const bool call_sites_wanted_;
  query::Profile profile_;
  // Functions by ID (content hashes, the same on every node) and, in a profile with source
  // lines, by line too: one function's lines share its ID.
  absl::flat_hash_map<std::tuple<uint64_t, std::string, std::string, uint32_t, bool>, uint32_t>
      function_index_;
  // Stack IDs are content hashes too, the same on every node for the same frames; a stack
  // split over its leaf's lines keeps its ID in each part, so stacks merge by ID and frames
  // (the frames are compared, so a collision cannot merge two different stacks either).
  absl::flat_hash_map<uint64_t, absl::InlinedVector<size_t, 1>> stack_index_;
  std::vector<std::string> hosts_;
  // Call sites are part of a stack's identity: the same on every node for one stack ID.
  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> call_sites_;
};

}  // namespace

std::string RenderClusterMetrics(ClusterService& service, const DebugInfoSync* debuginfo_sync) {
  const v1::ClusterStatusResponse status = service.RunStatus();
  const MembershipStats m = service.membership().stats();
  const ReplicationMetrics& r = service.metrics();
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, auto value) {
    absl::StrAppend(&out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n", name,
                    " ", value, "\n");
  };
  uint32_t live = 0, down = 0;
  double ownership = 0;
  for (const v1::ClusterNodeStatus& n : status.nodes()) {
    (n.state() == "live" ? live : down) += 1;
    if (n.id() == status.self_id()) ownership = n.ownership();
  }
  absl::StrAppend(&out, "# HELP strata_cluster_nodes Nodes this node knows, by state.\n",
                  "# TYPE strata_cluster_nodes gauge\n", "strata_cluster_nodes{state=\"live\"} ",
                  live, "\nstrata_cluster_nodes{state=\"down\"} ", down, "\n");
  metric("strata_cluster_lease_held", "gauge",
         "1 while this node's etcd lease is fresh (it acknowledges batches only then).",
         status.lease_held() ? 1 : 0);
  metric("strata_cluster_ownership_ratio", "gauge",
         "Share of the ring's hash space this node is the first owner of.", ownership);
  metric("strata_cluster_replication_factor", "gauge", "Owners of each host.",
         status.replication_factor());
  metric("strata_cluster_ring_changes_total", "counter", "Ring changes seen.", m.ring_changes);
  metric("strata_cluster_etcd_errors_total", "counter", "Failed lease refreshes.",
         m.etcd_errors);
  metric("strata_cluster_lease_regrants_total", "counter",
         "Times this node's lease expired and was granted anew.", m.lease_regrants);
  metric("strata_cluster_watch_restarts_total", "counter", "Membership watches restarted.",
         m.watch_restarts);
  metric("strata_cluster_replicated_streams", "gauge",
         "Agent streams taken here whose host has other owners.", r.replicated_streams.load());
  metric("strata_cluster_batches_replicated_total", "counter",
         "Batch copies confirmed by another owner (forwarded batches).",
         r.batches_replicated.load());
  metric("strata_cluster_bytes_replicated_total", "counter",
         "Bytes of the batches forwarded to other owners.", r.bytes_replicated.load());
  metric("strata_cluster_graph_catch_ups_total", "counter",
         "Agent graphs sent to an owner that lacked them (new owner after a ring change).",
         r.graph_catch_ups.load());
  metric("strata_cluster_replica_failures_total", "counter",
         "Batches an owner did not confirm: left unacknowledged for the agent to resend.",
         r.replica_failures.load());
  metric("strata_cluster_replica_skipped_total", "counter",
         "Batches refused at once: an owner had just failed to confirm one within the replica "
         "timeout.",
         r.replica_skipped.load());
  metric("strata_cluster_agent_ids_refused_total", "counter",
         "Agent streams refused: another principal wrote as the agent ID first, on some node.",
         r.agent_ids.refused.load());
  metric("strata_cluster_agent_ids_unconfirmed_total", "counter",
         "Agent streams taken on this node's record of the agent's owner alone, etcd not "
         "answering.",
         r.agent_ids.unconfirmed.load());
  if (debuginfo_sync != nullptr) {
    metric("strata_cluster_debuginfo_sent_total", "counter",
           "Uploaded debug files sent to a live node that lacked them.",
           debuginfo_sync->files_sent());
    metric("strata_cluster_debuginfo_sync_failures_total", "counter",
           "Nodes not listed or files not sent by the debug info sync (retried next round).",
           debuginfo_sync->failures());
  }
  return out;
}

FanoutSource::FanoutSource(Membership* membership, NodeChannels* channels, ClusterService* local,
                           uint32_t replication_factor, absl::Duration timeout)
    : nodes_(membership, channels, local, replication_factor, timeout) {}

absl::StatusOr<query::Profile> FanoutSource::Load(const query::ProfileQuery& query) {
  v1::LocalProfileRequest request = RequestFor(query);
  request.set_build_ids(query.build_ids);
  request.set_lines(query.lines);
  request.set_call_sites(query.call_sites);
  std::vector<std::string> unreachable;
  auto parts = nodes_.AskByHost(&ClusterService::RunLocalProfile,
                                &v1::Cluster::Stub::LocalProfile, request, &unreachable);
  if (!parts.ok()) return parts.status();
  ProfileMerger merged(query.call_sites);
  for (const auto& [node, part] : parts->parts) {
    absl::Status added = merged.Add(part);
    if (!added.ok()) return added;
  }
  query::Profile profile = std::move(merged).Finish(parts->host_samples);
  profile.unreachable_nodes = std::move(unreachable);
  if (parts->host_samples.empty() && profile.unreachable_nodes.empty() &&
      !query.capture_id.empty() && !parts->capture_known) {
    // As a single server says it (QueryService::Load): a mistyped ID is not an empty capture.
    return absl::NotFoundError(absl::StrCat("unknown capture '", query.capture_id,
                                            "' (strata captures lists them)"));
  }
  if (parts->host_samples.empty() && profile.unreachable_nodes.empty() &&
      query.capture_id.empty()) {
    // As a single server says it: no node knows the service. (A --host that matches none of
    // its hosts, or a range no window starts in, leaves a known service without samples.)
    std::vector<std::string> ignored;
    auto services = Services(&ignored);
    if (!services.ok()) return services.status();
    bool known = false;
    for (const store::ServiceSummary& s : *services) known |= s.service == query.service;
    if (!known) return absl::NotFoundError(absl::StrCat("unknown service '", query.service, "'"));
  }
  return profile;
}

absl::StatusOr<std::vector<store::ServiceSummary>> FanoutSource::Services(
    std::vector<std::string>* unreachable) {
  auto answers = nodes_.AskEveryNode(&ClusterService::RunLocalServices,
                                     &v1::Cluster::Stub::LocalServices,
                                     v1::ListServicesRequest(), unreachable);
  if (!answers.ok()) return answers.status();
  std::map<std::string, store::ServiceSummary> merged;
  for (const auto& [node, answer] : *answers) {
    for (const v1::ServiceInfo& s : answer.services()) {
      auto [it, inserted] = merged.try_emplace(
          s.name(), store::ServiceSummary{s.name(), s.first_ms(), s.last_ms(), s.total_samples()});
      if (inserted) continue;
      it->second.first_window_ms = std::min(it->second.first_window_ms, s.first_ms());
      it->second.last_window_ms = std::max(it->second.last_window_ms, s.last_ms());
      it->second.total_samples = std::max(it->second.total_samples, s.total_samples());
    }
  }
  // Totals: each service's samples per host, each host from its fullest replica, as profiles
  // are counted (a sum over nodes would count replicas twice).
  std::vector<store::ServiceSummary> out;
  for (auto& [name, summary] : merged) {
    v1::LocalProfileRequest totals_request;
    v1::ProfileFilter* filter = totals_request.mutable_filter();
    filter->set_service(name);
    filter->mutable_range()->set_from_ms(summary.first_window_ms);
    filter->mutable_range()->set_to_ms(summary.last_window_ms + 1);
    filter->set_type(v1::PROFILE_WALL);  // every profile type, as ListServices counts
    // A node missing here was named above: the total stays the largest node's then.
    std::vector<std::string> missing;
    auto pick = nodes_.PickHosts(totals_request, &missing);
    if (pick.ok() && missing.empty()) {
      summary.total_samples = 0;
      for (const auto& [host, samples] : pick->host_samples) {
        base::SaturatingAddTo(summary.total_samples, samples);
      }
    }
    out.push_back(std::move(summary));
  }
  return out;
}

v1::ListAgentsResponse FanoutSource::Agents() {
  std::vector<std::string> unreachable;
  auto answers = nodes_.AskEveryNode(&ClusterService::RunLocalAgents,
                                     &v1::Cluster::Stub::LocalAgents,
                                     v1::ListAgentsRequest(), &unreachable);
  if (!answers.ok()) return v1::ListAgentsResponse();  // a ListAgentsRequest is never wrong
  // An agent is connected on the node holding its stream and known (gone) where it was
  // before: the connected record wins, else the one with the latest batch.
  std::map<std::string, v1::AgentInfo> merged;
  for (auto& [node, answer] : *answers) {
    for (v1::AgentInfo& a : *answer.mutable_agents()) {
      auto [it, inserted] = merged.try_emplace(a.agent_id(), a);
      if (inserted) continue;
      const v1::AgentInfo& have = it->second;
      if ((a.connected() && !have.connected()) ||
          (a.connected() == have.connected() && a.last_batch_ms() > have.last_batch_ms())) {
        it->second = std::move(a);
      }
    }
  }
  v1::ListAgentsResponse out;
  for (auto& [id, a] : merged) *out.add_agents() = std::move(a);
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<std::vector<labels::LabelSet>> FanoutSource::LabelSets(
    const std::string& service, std::vector<std::string>* unreachable) {
  v1::ListLabelsRequest request;
  request.set_service(service);
  auto answers = nodes_.AskEveryNode(&ClusterService::RunLocalLabelSets,
                                     &v1::Cluster::Stub::LocalLabelSets, request, unreachable);
  if (!answers.ok()) return answers.status();
  std::set<labels::LabelSet> sets;
  for (const auto& [node, answer] : *answers) {
    for (const v1::LocalLabelSet& s : answer.sets()) {
      labels::LabelSet set(s.labels().begin(), s.labels().end());
      std::sort(set.begin(), set.end());
      sets.insert(std::move(set));
    }
  }
  return std::vector<labels::LabelSet>(sets.begin(), sets.end());
}

absl::StatusOr<v1::PhasesResponse> FanoutSource::Phases(const query::ProfileQuery& query) {
  v1::PhasesRequest request;
  *request.mutable_filter() = query::ToProfileFilter(query);
  std::vector<std::string> unreachable;
  auto answers = nodes_.AskEveryNode(&ClusterService::RunLocalPhases,
                                     &v1::Cluster::Stub::LocalPhases, request, &unreachable);
  if (!answers.ok()) return answers.status();
  // Nodes holding the same hosts (two nodes at RF 2 hold all of them) observe the same
  // change, at their own times: it is listed once.
  std::set<std::string> seen;
  v1::PhasesResponse out;
  for (auto& [node, answer] : *answers) {
    for (v1::PhaseChange& change : *answer.mutable_changes()) {
      v1::PhaseChange what = change;
      what.clear_detected_ms();
      std::string key;
      (void)what.SerializeToString(&key);
      if (!seen.insert(std::move(key)).second) continue;
      change.set_node(node);
      *out.add_changes() = std::move(change);
    }
  }
  std::stable_sort(out.mutable_changes()->begin(), out.mutable_changes()->end(),
                   [](const v1::PhaseChange& a, const v1::PhaseChange& b) {
                     return a.window_start_ms() != b.window_start_ms()
                                ? a.window_start_ms() < b.window_start_ms()
                                : a.detected_ms() < b.detected_ms();
                   });
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<store::UnwindCounts> FanoutSource::UnwindCounts(
    const query::ProfileQuery& query, std::vector<std::string>* unreachable) {
  auto answers = nodes_.AskEveryNode(&ClusterService::RunLocalUnwindCounts,
                                     &v1::Cluster::Stub::LocalUnwindCounts,
                                     RequestFor(query), unreachable);
  if (!answers.ok()) return answers.status();
  // Each agent from the node holding the most of its stacks: a replica that missed batches
  // holds fewer, and a sum over replicas would count the rest twice.
  std::map<std::string, const v1::UnwindCounters*> best;
  for (const auto& [node, answer] : *answers) {
    for (const auto& [agent, counts] : answer.agents()) {
      auto [it, inserted] = best.try_emplace(agent, &counts);
      if (!inserted && counts.stacks() > it->second->stacks()) it->second = &counts;
    }
  }
  store::UnwindCounts sum;
  for (const auto& [agent, c] : best) {
    sum.Add({c->stacks(), c->truncated(), c->verify_failures(), c->jit_frames_cfi(),
             c->jit_frames_fp(), c->lost(), c->python_frames(), c->python_stale()});
  }
  return sum;
}

absl::StatusOr<v1::TopResponse> FanoutSource::TopLines(const query::ProfileQuery& query,
                                                       uint32_t limit) {
  std::vector<std::string> unreachable;
  auto parts = nodes_.AskByHost(&ClusterService::RunLocalTopLines,
                                &v1::Cluster::Stub::LocalTopLines, RequestFor(query), &unreachable);
  if (!parts.ok()) return parts.status();
  v1::TopResponse out;
  // Lines by their frames (function, module, file, line, inlined each), self summed.
  std::map<std::string, v1::LineStat> lines;
  for (auto& [node, part] : parts->parts) {
    out.set_total_samples(base::SaturatingAdd(out.total_samples(), part.total_samples()));
    out.set_unresolved_samples(
        base::SaturatingAdd(out.unresolved_samples(), part.unresolved_samples()));
    for (v1::LineStat& line : *part.mutable_lines()) {
      std::string key;
      for (const v1::Frame& f : line.frames()) {
        absl::StrAppend(&key, f.function(), "\n", f.module(), "\n", f.file(), "\n", f.line(),
                        "\n", f.inlined(), "\n");
      }
      auto [it, inserted] = lines.try_emplace(std::move(key), std::move(line));
      if (!inserted) it->second.set_self(base::SaturatingAdd(it->second.self(), line.self()));
    }
  }
  std::vector<const v1::LineStat*> sorted;
  for (const auto& [key, line] : lines) sorted.push_back(&line);
  std::stable_sort(sorted.begin(), sorted.end(), [](const v1::LineStat* a, const v1::LineStat* b) {
    return a->self() > b->self();
  });
  for (size_t i = 0; i < sorted.size() && i < limit; ++i) *out.add_lines() = *sorted[i];
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<v1::SeriesResponse> FanoutSource::Series(const query::ProfileQuery& query,
                                                       int64_t step_ms,
                                                       const std::string& group_by) {
  v1::LocalProfileRequest request = RequestFor(query);
  request.set_series_step_ms(step_ms);
  request.set_series_group_by(group_by);
  std::vector<std::string> unreachable;
  auto parts = nodes_.AskByHost(&ClusterService::RunLocalSeries,
                                &v1::Cluster::Stub::LocalSeries, request, &unreachable);
  if (!parts.ok()) return parts.status();
  v1::SeriesResponse out;
  out.set_from_ms(query::SeriesIntervalStart(query.from_ms, step_ms));
  out.set_step_ms(step_ms);
  for (const auto& [node, part] : parts->parts) query::AddSeries(part, &out);
  for (auto& n : unreachable) out.add_unreachable_nodes(std::move(n));
  return out;
}

absl::StatusOr<query::LeafAddressCounts> FanoutSource::LeafAddresses(
    const query::ProfileQuery& query, query::FunctionLookup* functions,
    std::vector<std::string>* unreachable) {
  auto parts = nodes_.AskByHost(&ClusterService::RunLocalLeafAddresses,
                                &v1::Cluster::Stub::LocalLeafAddresses,
                                RequestFor(query), unreachable);
  if (!parts.ok()) return parts.status();
  query::LeafAddressCounts sum;
  for (const auto& [node, part] : parts->parts) {
    for (const v1::LocalFunctionRecord& f : part.functions()) {
      functions->Add(f.id(), {f.name(), f.module(), f.build_id(), f.start_offset()});
    }
    for (const v1::LocalLeafAddress& a : part.addresses()) {
      base::SaturatingAddTo(sum[{a.function_id(), a.offset()}], a.samples());
    }
  }
  return sum;
}

}  // namespace strata::server::cluster
