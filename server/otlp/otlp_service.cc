#include "server/otlp/otlp_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/base/clock.h"
#include "common/base/log.h"
#include "common/rpc/grpc_status.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "server/auth/grpc_auth.h"
#include "server/commit/profile_type.h"
#include "server/ingest/placement.h"

namespace strata::server::otlp {
namespace {

// The request's content as bytes that are the same for the same content.
std::string DeterministicBytes(const otlp_v1::ExportProfilesServiceRequest& request) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream out(&stream);
    out.SetSerializationDeterministic(true);
    request.SerializeToCodedStream(&out);
  }
  return bytes;
}

}  // namespace

OtlpService::OtlpService(store::Store* store, Options options)
    : store_(store), committer_(options.committer), options_(std::move(options)) {
  if (committer_ == nullptr) {
    own_committer_ = std::make_unique<commit::StoreCommitter>(store);
    committer_ = own_committer_.get();
  }
}

grpc::Status OtlpService::StreamedExport(
    grpc::ServerContext* context,
    grpc::ServerUnaryStreamer<otlp_v1::ExportProfilesServiceRequest,
                              otlp_v1::ExportProfilesServiceResponse>* stream) {
  // A replica call stores hosts another node placed here: only a node (role node) may make
  // one.
  const bool replica = options_.placement != nullptr &&
                       context->client_metadata().count(ingest::kReplicaMetadata) > 0;
  auto principal = auth::AuthorizeCall(options_.authorizer, context,
                                       replica ? auth::Role::kNode : auth::Role::kAgent,
                                       replica ? "forwarding OTLP exports" : "OTLP ingest");
  if (!principal.ok()) {
    ++metrics_.rejected_requests;
    return rpc::ToGrpcStatus(principal.status());
  }
  auto request = std::make_unique<otlp_v1::ExportProfilesServiceRequest>();
  if (!stream->Read(request.get())) {
    ++metrics_.rejected_requests;
    LogWarn("OTLP export from {} refused: the request does not parse", principal->Describe());
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the request does not parse as an OTLP ExportProfilesServiceRequest "
                        "(opentelemetry.proto.collector.profiles.v1development)");
  }
  absl::Status applied;
  if (replica) {
    std::vector<std::string> hosts;
    auto [begin, end] = context->client_metadata().equal_range(kReplicaHostsMetadata);
    for (auto it = begin; it != end; ++it) {
      for (absl::string_view host : absl::StrSplit(
               absl::string_view(it->second.data(), it->second.size()), '\0', absl::SkipEmpty())) {
        hosts.emplace_back(host);
      }
    }
    applied = ApplyReplica(*request, hosts);
  } else {
    const std::string forced_host =
        principal->kind == auth::Principal::Kind::kCertificate ? principal->name : std::string();
    applied = Apply(*request, forced_host);
  }
  if (!applied.ok()) {
    LogWarn("OTLP export from {} refused: {}", principal->Describe(), applied.ToString());
    return rpc::ToGrpcStatus(applied);
  }
  stream->Write(otlp_v1::ExportProfilesServiceResponse());
  return grpc::Status::OK;
}

absl::Status OtlpService::Apply(const otlp_v1::ExportProfilesServiceRequest& request,
                                const std::string& forced_host) {
  ++metrics_.requests;
  auto converted = ConvertRequest(request, options_.limits, forced_host, base::NowMs());
  if (!converted.ok()) {
    ++metrics_.rejected_requests;
    return converted.status();
  }
  if (options_.placement == nullptr) return Store(request, *converted, std::nullopt);
  std::set<std::string> distinct;
  for (const ConvertedCell& cell : converted->cells) distinct.insert(cell.host);
  auto plan = options_.placement->PlanHosts({distinct.begin(), distinct.end()});
  if (!plan.ok()) return plan.status();
  if (!plan->here.empty()) {
    if (absl::Status s = Store(request, *converted, plan->here); !s.ok()) return s;
  }
  for (const auto& [address, hosts] : plan->elsewhere) {
    if (absl::Status s = options_.placement->Forward(address, request, hosts); !s.ok()) {
      ++metrics_.forward_failures;
      return absl::UnavailableError(absl::StrCat("the owner at ", address, " of ", hosts.size(),
                                                 " of the request's hosts did not confirm it (",
                                                 s.message(), "); retry"));
    }
    ++metrics_.forwarded;
  }
  return absl::OkStatus();
}

absl::Status OtlpService::ApplyReplica(const otlp_v1::ExportProfilesServiceRequest& request,
                                       const std::vector<std::string>& hosts) {
  ++metrics_.requests;
  auto converted = ConvertRequest(request, options_.limits, /*forced_host=*/"", base::NowMs());
  if (!converted.ok()) {
    ++metrics_.rejected_requests;
    return converted.status();
  }
  return Store(request, *converted, hosts);
}

namespace {
// The agent ID of leaf lines received by OTLP in the store's keys.
constexpr std::string_view kLeafLinesSender = "otlp";
}  // namespace

absl::Status OtlpService::Store(const otlp_v1::ExportProfilesServiceRequest& request,
                                const ConvertedRequest& converted,
                                const std::optional<std::vector<std::string>>& hosts) {
  auto stored_here = [&hosts](const std::string& host) {
    return !hosts.has_value() || std::find(hosts->begin(), hosts->end(), host) != hosts->end();
  };
  // Records first, in one commit: content-addressed, so harmless if the counts fail later.
  // Only the stacks of the hosts stored here, and their functions (a cluster's owners each
  // store some of a request's hosts).
  std::vector<bool> stack_used(converted.stacks.size(), false);
  for (const ConvertedCell& cell : converted.cells) {
    if (stored_here(cell.host)) stack_used[cell.stack] = true;
  }
  store::WriteBatch records;
  store::Interner& interner = store_->interner();
  std::vector<std::optional<uint64_t>> function_ids(converted.functions.size());
  auto function_id = [&](uint32_t f) -> absl::StatusOr<uint64_t> {
    if (!function_ids[f]) {
      auto id = interner.InternFunction(converted.functions[f], &records);
      if (!id.ok()) return id.status();
      function_ids[f] = *id;
    }
    return *function_ids[f];
  };
  std::vector<uint64_t> stack_ids(converted.stacks.size(), 0);
  for (size_t i = 0; i < converted.stacks.size(); ++i) {
    if (!stack_used[i]) continue;
    const ConvertedStack& s = converted.stacks[i];
    store::StackFrames frames;
    frames.truncated = s.truncated;
    frames.call_sites = s.call_sites;
    for (uint32_t f : s.functions) {
      auto id = function_id(f);
      if (!id.ok()) return id.status();
      frames.function_ids.push_back(*id);
    }
    auto id = interner.InternStack(frames, &records);
    if (!id.ok()) return id.status();
    stack_ids[i] = *id;
  }
  // Label sets, and the cells of each (host, window).
  std::map<std::pair<std::string, std::string>, uint64_t> label_sets;  // (service, encoded)
  std::map<std::tuple<std::string, int64_t>, std::vector<commit::BatchCommitter::Cell>> groups;
  for (const ConvertedCell& cell : converted.cells) {
    if (!stored_here(cell.host)) continue;
    auto [it, added] = label_sets.try_emplace({cell.service, labels::Encode(cell.labels)}, 0);
    if (added && !cell.labels.empty()) {
      auto id = interner.InternLabelSet(cell.service, cell.labels,
                                        options_.limits.max_label_sets, &records);
      if (absl::IsResourceExhausted(id.status())) {
        // Past --max-label-sets samples are kept under the overflow set, as agents' are.
        id = interner.InternLabelSet(
            cell.service,
            labels::Merge({{"strata_overflow", "label_sets"}},
                          commit::ProfileLabels(commit::InProfile(cell.labels, v1::PROFILE_OFF_CPU)
                                                    ? v1::PROFILE_OFF_CPU
                                                    : v1::PROFILE_CPU)),
            options_.limits.max_label_sets + 2, &records);
      }
      if (!id.ok()) return id.status();
      it->second = *id;
    }
    groups[{cell.host, cell.window_start_ms}].push_back(
        {&cell.service, stack_ids[cell.stack], cell.count, it->second});
  }
  // Leaf lines, by (host, window) and service, as agents' leaf addresses.
  std::map<std::tuple<std::string, int64_t>,
           std::map<std::string, std::vector<store::LeafAddressCount>>>
      leaf_lines;
  for (const ConvertedLeafLine& l : converted.leaf_lines) {
    if (!stored_here(l.host)) continue;
    auto id = function_id(l.function);
    if (!id.ok()) return id.status();
    leaf_lines[{l.host, l.window_start_ms}][l.service].push_back({*id, l.line, l.count});
  }
  if (!records.empty()) {
    if (absl::Status s = store_->Commit(&records); !s.ok()) return s;
  }
  const size_t request_hash = absl::HashOf(DeterministicBytes(request));
  for (const auto& [group, cells] : groups) {
    const auto& [host, window_start_ms] = group;
    const uint64_t key = absl::HashOf(request_hash, host, window_start_ms);
    auto begin = BeginCommit(key);
    if (!begin.ok()) return begin.status();
    if (!*begin) {
      ++metrics_.duplicate_commits;
      continue;
    }
    store::WriteBatch wb;
    // Keyed by the request's commit, so that applying it twice writes the same record.
    if (auto lines = leaf_lines.find(group); lines != leaf_lines.end()) {
      for (const auto& [service, counts] : lines->second) {
        wb.PutLeafAddresses(service, window_start_ms, host, kLeafLinesSender, key, 0, counts);
      }
    }
    absl::Status committed = committer_->CommitBatch(&wb, host, window_start_ms, cells);
    EndCommit(key, committed.ok());
    if (!committed.ok()) return committed;
    for (const auto& c : cells) metrics_.samples += c.count;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> OtlpService::BeginCommit(uint64_t key) {
  const absl::Time now = absl::Now();
  absl::MutexLock lock(&mu_);
  while (!applied_order_.empty() &&
         (applied_order_.size() > options_.dedup_entries ||
          now - applied_order_.front().second > options_.dedup_window)) {
    auto it = applied_.find(applied_order_.front().first);
    if (it != applied_.end() && it->second == applied_order_.front().second) applied_.erase(it);
    applied_order_.pop_front();
  }
  if (auto it = applied_.find(key); it != applied_.end() && now - it->second <= options_.dedup_window) {
    return false;
  }
  if (!in_flight_.insert(key).second) {
    return absl::UnavailableError("an identical request is being stored; retry");
  }
  return true;
}

void OtlpService::EndCommit(uint64_t key, bool committed) {
  absl::MutexLock lock(&mu_);
  in_flight_.erase(key);
  if (!committed) return;
  const absl::Time now = absl::Now();
  applied_[key] = now;
  applied_order_.emplace_back(key, now);
}

}  // namespace strata::server::otlp
