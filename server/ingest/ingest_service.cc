#include "server/ingest/ingest_service.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace strata::server {
namespace {

v1::ServerMessage ErrorMessage(const absl::Status& status, uint64_t sequence,
                               bool fatal = false, uint32_t retry_after_ms = 0) {
  v1::ServerMessage m;
  auto* e = m.mutable_error();
  e->set_code(static_cast<int32_t>(status.code()));
  e->set_message(std::string(status.message()));
  e->set_sequence(sequence);
  e->set_fatal(fatal);
  e->set_retry_after_ms(retry_after_ms);
  return m;
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

}  // namespace

void AgentRegistry::Attach(const AgentIdentity& identity, uint32_t frequency_hz,
                           Sender sender) {
  absl::MutexLock lock(&mu_);
  Entry& e = agents_[identity.agent_id];
  if (!e.connected && e.detached_at != 0) disconnected_.erase(e.detached_at);
  e.identity = identity;
  e.frequency_hz = frequency_hz;
  e.connected = true;
  e.sender = std::make_shared<Sender>(std::move(sender));
}

void AgentRegistry::Detach(const std::string& agent_id) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
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
  for (const v1::Target& t : batch.targets()) it->second.targets[t.pid()] = t;
}

void AgentRegistry::SetTargets(const std::string& agent_id,
                               const google::protobuf::RepeatedPtrField<v1::Target>& targets) {
  absl::MutexLock lock(&mu_);
  auto it = agents_.find(agent_id);
  if (it == agents_.end()) return;
  it->second.targets.clear();
  for (const v1::Target& t : targets) it->second.targets[t.pid()] = t;
}

std::vector<v1::AgentInfo> AgentRegistry::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::AgentInfo> out;
  for (const auto& [id, e] : agents_) {
    v1::AgentInfo info;
    info.set_agent_id(id);
    info.set_host(e.identity.host);
    info.set_arch(e.identity.arch);
    info.set_version(e.identity.version);
    info.set_connected(e.connected);
    info.set_last_batch_ms(e.last_batch_ms);
    info.set_batches(e.batches);
    for (const auto& [pid, t] : e.targets) {
      info.add_targets(absl::StrCat(t.service(), "/", pid));
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<std::string> AgentRegistry::FindAgents(const std::string& service,
                                                   const std::string& host, uint32_t pid) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [id, e] : agents_) {
    if (!e.connected) continue;
    if (!host.empty() && e.identity.host != host) continue;
    bool match = service.empty() && pid == 0;
    for (const auto& [tpid, t] : e.targets) {
      if ((service.empty() || t.service() == service) && (pid == 0 || tpid == pid)) {
        match = true;
      }
    }
    if (match) out.push_back(id);
  }
  return out;
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

IngestService::IngestService(store::Store* store, AgentRegistry* registry,
                             IngestMetrics* metrics, Options options)
    : store_(store), registry_(registry), metrics_(metrics), options_(std::move(options)) {}

grpc::Status IngestService::Connect(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) {
  v1::AgentMessage message;
  if (!stream->Read(&message)) return grpc::Status::OK;
  if (!message.has_hello()) {
    ++metrics_->rejected_messages;
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the first message of an ingest stream must be Hello");
  }
  const v1::Hello& hello = message.hello();
  if (!options_.token.empty() && hello.token() != options_.token) {
    ++metrics_->rejected_messages;
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "invalid agent token");
  }
  if (absl::Status st = CheckHello(hello, options_.limits); !st.ok()) {
    ++metrics_->rejected_messages;
    return ToGrpc(st);
  }
  AgentIdentity identity{hello.agent_id(), hello.host(), hello.arch(), hello.version(),
                         hello.graph_id()};
  auto session_or = AgentSession::Open(store_, identity, options_.committer, options_.limits);
  if (!session_or.ok()) {
    spdlog::error("agent {}: cannot open session: {}", hello.agent_id(),
                  session_or.status().ToString());
    return grpc::Status(grpc::StatusCode::INTERNAL, "cannot load agent state");
  }
  std::unique_ptr<AgentSession> session = std::move(*session_or);
  ++metrics_->streams;

  // gRPC allows one outstanding Write per stream: control messages from other threads and
  // replies from this one are serialized here.
  auto write_mu = std::make_shared<absl::Mutex>();
  auto write = [stream, write_mu](const v1::ServerMessage& m) {
    absl::MutexLock lock(write_mu.get());
    return stream->Write(m);
  };
  registry_->Attach(identity, hello.frequency_hz(), write);
  spdlog::info("agent {} connected (host {}, arch {}, graph {:x}: {} nodes, {} edges known)",
               identity.agent_id, identity.host, identity.arch, identity.graph_id,
               session->num_nodes(), session->num_edges());

  v1::ServerMessage welcome;
  welcome.mutable_welcome()->set_known_nodes(session->num_nodes());
  welcome.mutable_welcome()->set_known_edges(session->num_edges());
  welcome.mutable_welcome()->set_last_applied_sequence(session->last_applied_sequence());
  write(welcome);

  auto resync = [&](const absl::Status& why) {
    ++metrics_->resyncs;
    v1::ServerMessage m;
    m.mutable_resync()->set_from_node(session->num_nodes());
    m.mutable_resync()->set_from_edge(session->num_edges());
    m.mutable_resync()->set_reason(std::string(why.message()));
    write(m);
  };

  // Ends the stream with `st`: the agent reconnects (with backoff) and starts over from what
  // the server has, so nothing after the refused message is taken out of order.
  grpc::Status ended;
  auto end_stream = [&](const absl::Status& st, uint64_t sequence) {
    ++metrics_->rejected_messages;
    uint32_t retry_after_ms = 0;
    if (absl::IsResourceExhausted(st)) {
      ++metrics_->resource_exhausted;
      retry_after_ms = options_.retry_after_ms;
    }
    spdlog::warn("agent {}: ending stream: {}", identity.agent_id, st.ToString());
    write(ErrorMessage(st, sequence, /*fatal=*/true, retry_after_ms));
    ended = ToGrpc(st);
  };
  auto reject = [&](const absl::Status& st, uint64_t sequence) {
    ++metrics_->rejected_messages;
    write(ErrorMessage(st, sequence));
  };

  while (ended.ok() && stream->Read(&message)) {
    switch (message.kind_case()) {
      case v1::AgentMessage::kGraphDelta: {
        absl::Status st = session->ApplyGraphDelta(message.graph_delta());
        if (absl::IsFailedPrecondition(st)) {
          resync(st);
        } else if (!st.ok()) {
          // The agent's view of the graph is now ahead of the server's: every later batch
          // would fail. It starts over after a reconnect.
          end_stream(st, 0);
        }
        break;
      }
      case v1::AgentMessage::kSampleBatch: {
        const v1::SampleBatch& batch = message.sample_batch();
        auto applied = session->ApplyBatch(batch);
        if (!applied.ok()) {
          const absl::Status& st = applied.status();
          if (absl::IsResourceExhausted(st)) {
            end_stream(st, batch.sequence());
            break;
          }
          // Only a batch beyond the graph needs the graph again; one waiting for an earlier
          // batch just comes again after it.
          if (absl::IsFailedPrecondition(st) && batch.epoch() > session->num_edges()) resync(st);
          if (!absl::IsFailedPrecondition(st)) {
            spdlog::warn("agent {}: rejected batch {}: {}", identity.agent_id, batch.sequence(),
                         st.ToString());
          }
          reject(st, batch.sequence());
          break;
        }
        if (applied->duplicate) {
          ++metrics_->duplicate_batches;
        } else {
          ++metrics_->batches;
          uint64_t samples = 0;
          for (const auto& c : applied->contexts) samples += c.count;
          metrics_->samples += samples;
          metrics_->contexts += applied->contexts.size();
          registry_->RecordBatch(identity.agent_id, batch);
          for (const auto& observer : observers_) observer(*applied);
        }
        v1::ServerMessage ack;
        ack.mutable_ack()->set_sequence(batch.sequence());
        write(ack);
        break;
      }
      case v1::AgentMessage::kHeartbeat:
        if (absl::Status st = CheckHeartbeat(message.heartbeat(), options_.limits); !st.ok()) {
          reject(st, 0);
        } else if (message.heartbeat().targets_size() > 0) {
          registry_->SetTargets(identity.agent_id, message.heartbeat().targets());
        }
        break;
      case v1::AgentMessage::kCaptureStatus:
        if (absl::Status st = CheckCaptureStatus(message.capture_status(), options_.limits);
            !st.ok()) {
          reject(st, 0);
          break;
        }
        for (const auto& observer : capture_status_observers_) {
          observer(identity.agent_id, message.capture_status());
        }
        break;
      case v1::AgentMessage::kHello:
      default:
        reject(absl::InvalidArgumentError("unexpected message on an established ingest stream"),
               0);
        break;
    }
  }
  registry_->Detach(identity.agent_id);
  spdlog::info("agent {} disconnected", identity.agent_id);
  return ended;
}

}  // namespace strata::server
