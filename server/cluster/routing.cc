#include "server/cluster/routing.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/base/log.h"
#include "strata/v1/cluster.grpc.pb.h"

namespace strata::server::cluster {

namespace {
constexpr char kRoutedMetadata[] = "x-strata-routed-by";

// A call this node makes to another on a client's behalf: marked routed (the other node
// answers from itself alone), with this node's credentials.
void PrepareRouted(Membership* membership, NodeChannels* channels, grpc::ClientContext* client,
                   std::optional<absl::Duration> timeout) {
  client->AddMetadata(kRoutedMetadata, membership->options().node_id);
  if (timeout) client->set_deadline(absl::ToChronoTime(absl::Now() + *timeout));
  channels->Authorize(client);
}

bool IsRouted(const grpc::ServerContext* context) {
  return context != nullptr && context->client_metadata().count(kRoutedMetadata) > 0;
}

// Calls the nodes of `ring` but this one in turn, each in a new routed call of `Service`
// (with `timeout` as its deadline): `call(node, stub, client)` until it returns false.
template <typename Service, typename Call>
void CallOthers(Membership* membership, NodeChannels* channels, const Ring& ring,
                std::optional<absl::Duration> timeout, Call call) {
  for (const RingMember& m : ring.members()) {
    if (m.id == membership->options().node_id) continue;
    auto stub = Service::NewStub(channels->Get(m.address));
    grpc::ClientContext client;
    PrepareRouted(membership, channels, &client, timeout);
    if (!call(m, *stub, &client)) return;
  }
}
}  // namespace

grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer) {
  if (IsRouted(context)) return grpc::Status(grpc::StatusCode::NOT_FOUND, "routed once already");
  grpc::Status last(grpc::StatusCode::NOT_FOUND, "no other node");
  // This node checked the caller (role operator); the node that runs the capture checks
  // this node's credentials (role node).
  CallOthers<v1::Capture>(
      membership, channels, *membership->ring(), std::nullopt,
      [&](const RingMember&, v1::Capture::Stub& stub, grpc::ClientContext* client) {
        auto reader = stub.Run(client, request);
        v1::CaptureProgress progress;
        bool relayed = false;
        while (reader->Read(&progress)) {
          relayed = true;
          if (!writer->Write(progress)) {
            client->TryCancel();
            break;
          }
        }
        last = reader->Finish();
        return !relayed && last.error_code() == grpc::StatusCode::NOT_FOUND;
      });
  return last;
}

namespace {

// What the other live nodes list: `ask(stub, client, &response)` on each, in a routed call;
// the elements of `items(response)` kept, the nodes whose call failed named in `unreachable`.
// A call that was already routed is answered by its node alone: nothing from the others.
template <typename Service, typename Response, typename Ask, typename Items>
auto ListFromOthers(Membership* membership, NodeChannels* channels,
                    grpc::ServerContext* context, absl::Duration timeout,
                    std::vector<std::string>* unreachable, Ask ask, Items items) {
  using Item = typename std::remove_pointer_t<
      std::invoke_result_t<Items, Response&>>::value_type;
  std::vector<Item> out;
  if (IsRouted(context)) return out;
  CallOthers<Service>(
      membership, channels, *membership->ring(), timeout,
      [&](const RingMember& m, typename Service::Stub& stub, grpc::ClientContext* client) {
        Response r;
        grpc::Status s = ask(stub, client, &r);
        if (!s.ok()) {
          unreachable->push_back(absl::StrCat(NodeName(m), ": ", s.error_message()));
          return true;
        }
        for (Item& item : *items(r)) out.push_back(std::move(item));
        return true;
      });
  return out;
}

}  // namespace

std::vector<v1::CaptureRecord> ListCapturesElsewhere(Membership* membership,
                                                     NodeChannels* channels,
                                                     grpc::ServerContext* context,
                                                     absl::Duration timeout,
                                                     std::vector<std::string>* unreachable) {
  return ListFromOthers<v1::Capture, v1::ListCapturesResponse>(
      membership, channels, context, timeout, unreachable,
      [](v1::Capture::Stub& stub, grpc::ClientContext* client, v1::ListCapturesResponse* r) {
        return stub.List(client, v1::ListCapturesRequest(), r);
      },
      [](v1::ListCapturesResponse& r) { return r.mutable_captures(); });
}

std::vector<v1::ReleaseVerdict> ListRegressionsElsewhere(
    Membership* membership, NodeChannels* channels, grpc::ServerContext* context,
    absl::Duration timeout, const v1::ListRegressionsRequest& request,
    std::vector<std::string>* unreachable) {
  return ListFromOthers<v1::Regressions, v1::ListRegressionsResponse>(
      membership, channels, context, timeout, unreachable,
      [&request](v1::Regressions::Stub& stub, grpc::ClientContext* client,
                 v1::ListRegressionsResponse* r) { return stub.ListRegressions(client, request, r); },
      [](v1::ListRegressionsResponse& r) { return r.mutable_verdicts(); });
}

std::vector<v1::ReleaseVerdict> ReleaseRecordsElsewhere(Membership* membership,
                                                        NodeChannels* channels,
                                                        absl::Duration timeout,
                                                        std::vector<std::string>* unreachable) {
  return ListFromOthers<v1::Cluster, v1::ReleaseRecords>(
      membership, channels, nullptr, timeout, unreachable,
      [](v1::Cluster::Stub& stub, grpc::ClientContext* client, v1::ReleaseRecords* r) {
        return stub.LocalReleaseRecords(client, v1::LocalReleaseRecordsRequest(), r);
      },
      [](v1::ReleaseRecords& r) { return r.mutable_releases(); });
}

grpc::Status GetCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context, absl::Duration timeout,
                                 const v1::GetCaptureRequest& request, v1::CaptureRecord* record) {
  grpc::Status last(grpc::StatusCode::NOT_FOUND, "no other node");
  if (IsRouted(context)) return last;
  CallOthers<v1::Capture>(
      membership, channels, *membership->ring(), timeout,
      [&](const RingMember&, v1::Capture::Stub& stub, grpc::ClientContext* client) {
        last = stub.Get(client, request, record);
        return last.error_code() == grpc::StatusCode::NOT_FOUND;
      });
  return last;
}

bool CancelCaptureElsewhere(Membership* membership, NodeChannels* channels,
                            grpc::ServerContext* context, absl::Duration timeout,
                            const v1::CancelCaptureRequest& request) {
  if (IsRouted(context)) return false;
  bool cancelled = false;
  CallOthers<v1::Capture>(
      membership, channels, *membership->ring(), timeout,
      [&](const RingMember&, v1::Capture::Stub& stub, grpc::ClientContext* client) {
        v1::CancelCaptureResponse response;
        cancelled = stub.Cancel(client, request, &response).ok() && response.cancelled();
        return !cancelled;  // on to the next node
      });
  return cancelled;
}

absl::Status CopyReleasesTo(Membership* membership, NodeChannels* channels,
                            absl::Duration timeout, const std::string& node_id,
                            const std::vector<v1::ReleaseVerdict>& releases) {
  const std::shared_ptr<const Ring> ring = membership->ring();
  const auto& members = ring->members();
  auto to = std::find_if(members.begin(), members.end(),
                         [&](const RingMember& m) { return m.id == node_id; });
  if (to == members.end()) return absl::NotFoundError(absl::StrCat(node_id, " is not live"));
  v1::ReleaseRecords request;
  request.mutable_releases()->Add(releases.begin(), releases.end());
  v1::KeepReleaseRecordsResponse response;
  grpc::ClientContext client;
  PrepareRouted(membership, channels, &client, timeout);
  const grpc::Status s =
      v1::Cluster::NewStub(channels->Get(to->address))->KeepReleaseRecords(&client, request,
                                                                            &response);
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(NodeName(*to), ": ", s.error_message()));
}

std::vector<std::string> OtherNodes(const Membership& membership) {
  std::vector<std::string> out;
  for (const RingMember& m : membership.ring()->members()) {
    if (m.id != membership.options().node_id) out.push_back(m.id);
  }
  return out;
}

namespace {

// Sends the debug file at `path` to `to` as an upload marked routed (not copied further), in
// the call `client`.
grpc::Status SendDebugFile(Membership* membership, NodeChannels* channels, const RingMember& to,
                           const std::string& path, const std::string& file_name,
                           const std::string& build_id, grpc::ClientContext* client) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return grpc::Status(grpc::StatusCode::INTERNAL, absl::StrCat("cannot read ", path));
  auto stub = v1::DebugInfo::NewStub(channels->Get(to.address));
  PrepareRouted(membership, channels, client, absl::Minutes(10));
  v1::UploadDebugInfoResponse response;
  auto writer = stub->Upload(client, &response);
  v1::DebugInfoChunk chunk;
  chunk.set_file_name(file_name);
  chunk.set_expected_build_id(build_id);
  std::string buffer(1 << 20, '\0');
  while (in.read(buffer.data(), static_cast<std::streamsize>(buffer.size())) || in.gcount() > 0) {
    chunk.set_data(buffer.data(), static_cast<size_t>(in.gcount()));
    if (!writer->Write(chunk)) break;  // the node ended the call: Finish says why
    chunk.Clear();
  }
  writer->WritesDone();
  return writer->Finish();
}

}  // namespace

std::vector<std::string> CopyDebugInfoElsewhere(Membership* membership, NodeChannels* channels,
                                                grpc::ServerContext* context,
                                                const std::string& path,
                                                const std::string& file_name,
                                                const std::string& build_id) {
  std::vector<std::string> unreachable;
  if (IsRouted(context)) return unreachable;
  const std::shared_ptr<const Ring> ring = membership->ring();
  for (const RingMember& m : ring->members()) {
    if (m.id == membership->options().node_id) continue;
    grpc::ClientContext client;
    grpc::Status s = SendDebugFile(membership, channels, m, path, file_name, build_id, &client);
    if (!s.ok()) unreachable.push_back(absl::StrCat(NodeName(m), ": ", s.error_message()));
  }
  return unreachable;
}

DebugInfoSync::DebugInfoSync(Membership* membership, NodeChannels* channels,
                             LocalFiles local_files, absl::Duration interval)
    : membership_(membership), channels_(channels), local_files_(std::move(local_files)),
      interval_(interval) {
  membership_->AddObserver([wakeup = wakeup_](const std::shared_ptr<const Ring>&) {
    absl::MutexLock lock(&wakeup->mu);
    wakeup->ring_changed = true;
  });
  thread_ = std::thread([this] { Loop(); });
}

DebugInfoSync::~DebugInfoSync() {
  {
    absl::MutexLock lock(&wakeup_->mu);
    wakeup_->stop = true;
    if (wakeup_->call != nullptr) wakeup_->call->TryCancel();
  }
  thread_.join();
}

bool DebugInfoSync::Begin(grpc::ClientContext* call) {
  absl::MutexLock lock(&wakeup_->mu);
  wakeup_->call = call;
  return !wakeup_->stop;
}

void DebugInfoSync::End() {
  absl::MutexLock lock(&wakeup_->mu);
  wakeup_->call = nullptr;
}

void DebugInfoSync::Loop() {
  // A node that just joined may not serve yet: a ring change starts a round a little later.
  constexpr absl::Duration kAfterRingChange = absl::Seconds(2);
  Wakeup& w = *wakeup_;
  absl::Time next = absl::Now() + kAfterRingChange;
  while (true) {
    {
      absl::MutexLock lock(&w.mu);
      w.mu.AwaitWithDeadline(absl::Condition(
                                 +[](Wakeup* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                   return w->stop || w->ring_changed;
                                 },
                                 &w),
                             next);
      if (w.stop) return;
      if (w.ring_changed) {
        w.ring_changed = false;
        next = std::min(next, absl::Now() + kAfterRingChange);
        continue;
      }
      if (absl::Now() < next) continue;
    }
    Round round = RunOnce();
    for (const std::string& f : round.failures) {
      LogWarn("cluster: debug info sync: {}", f);
    }
    next = absl::Now() + interval_;
  }
}

DebugInfoSync::Round DebugInfoSync::RunOnce() {
  Round round;
  const std::string& self = membership_->options().node_id;
  const std::shared_ptr<const Ring> ring = membership_->ring();
  // Who holds which build ID, among the live nodes that answered.
  std::map<std::string, std::set<std::string>> holders;
  std::set<std::string> answered{self};
  std::map<std::string, LocalDebugFile> mine;
  for (LocalDebugFile& f : local_files_()) {
    holders[f.build_id].insert(self);
    mine.emplace(f.build_id, std::move(f));
  }
  bool stopping = false;
  CallOthers<v1::DebugInfo>(
      membership_, channels_, *ring, absl::Seconds(10),
      [&](const RingMember& m, v1::DebugInfo::Stub& stub, grpc::ClientContext* client) {
        v1::ListDebugInfoResponse listed;
        if (!Begin(client)) {
          stopping = true;
          return false;
        }
        grpc::Status s = stub.List(client, v1::ListDebugInfoRequest(), &listed);
        End();
        if (!s.ok()) {
          round.failures.push_back(absl::StrCat(NodeName(m), ": listing: ", s.error_message()));
          return true;
        }
        answered.insert(m.id);
        for (const v1::DebugInfoFile& f : listed.uploaded()) holders[f.build_id()].insert(m.id);
        return true;
      });
  if (stopping) return round;
  for (const auto& [build_id, file] : mine) {
    const std::set<std::string>& have = holders[build_id];
    if (*have.begin() != self) continue;  // a holder with a smaller ID sends it
    for (const RingMember& m : ring->members()) {
      if (!answered.contains(m.id) || have.contains(m.id)) continue;
      grpc::ClientContext client;
      if (!Begin(&client)) return round;
      grpc::Status s =
          SendDebugFile(membership_, channels_, m, file.path, file.file_name, build_id, &client);
      End();
      if (s.ok()) {
        ++round.sent;
        LogInfo("cluster: debug file {} ({}) sent to {}, which lacked it", build_id,
                     file.file_name, NodeName(m));
      } else {
        round.failures.push_back(
            absl::StrCat(NodeName(m), ": sending ", build_id, ": ", s.error_message()));
      }
    }
  }
  sent_.fetch_add(round.sent, std::memory_order_relaxed);
  failures_.fetch_add(round.failures.size(), std::memory_order_relaxed);
  return round;
}

}  // namespace strata::server::cluster
