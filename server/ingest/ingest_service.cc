#include "server/ingest/ingest_service.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <thread>
#include <utility>

#include <grpcpp/impl/codegen/proto_utils.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/clock.h"
#include "common/base/escape.h"
#include "common/base/log.h"
#include "common/encoding/graph_delta_edges.h"

namespace strata::server::ingest {
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

// Agents' connects, disconnects and ended streams: a fleet refused while the store cannot
// write reconnects every few seconds, hundreds of lines a second on the disk that is full.
// True when this one may be logged; *note then says how many were not.
bool StreamChurnLogged(std::string* note) {
  static LogBudget budget(20, 10'000'000'000);
  uint64_t left_out = 0;
  const int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                             std::chrono::steady_clock::now().time_since_epoch())
                             .count();
  if (!budget.Take(now_ns, &left_out)) return false;
  note->clear();
  if (left_out > 0) {
    absl::StrAppend(note, " (", left_out,
                    " agent connects, disconnects and ended streams not logged before this)");
  }
  return true;
}

}  // namespace

registry::AgentDescriptor DescriptorOf(const AgentIdentity& identity) {
  return {identity.agent_id, identity.host, identity.arch, identity.version, identity.owner};
}

// One agent stream. Lives from Connect() until gRPC calls OnDone(). Messages are handled on
// the worker pool, one at a time: the next read starts only when Handle() is done with the
// last one. Writes (replies from Handle, control messages from other threads through the
// registry) go through an outbox with one write in flight; Finish comes after the outbox
// is empty. While the outbox holds kMaxQueuedReplies, the next message is read only once it
// has drained to half that: a client that sends without reading its replies is held to the
// pace at which it reads them, not buffered without bound.
//
// The stream carries raw bytes, parsed and serialized here: a message that does not parse
// ends the stream with INVALID_ARGUMENT saying so (gRPC's typed stream would only fail the
// read, which looks like the agent closing its side and ends with OK).
class IngestService::Stream final
    : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  static constexpr size_t kMaxQueuedReplies = 64;

  explicit Stream(IngestService* service) : service_(service), link_(std::make_shared<Link>()) {
    link_->stream = this;
  }

  // Refuses the stream before reading anything.
  void Refuse(const absl::Status& status, uint32_t retry_after_ms) {
    Queue(ErrorMessage(status, 0, /*fatal=*/true, retry_after_ms));
    EndAfterWrites(ToGrpc(status));
  }
  void Begin(const grpc::CallbackServerContext* context, auth::Principal principal, bool counted,
             bool replica, std::string replica_owner) {
    context_ = context;
    if (service_->options_.authorizer != nullptr) {
      auth_reloads_ = service_->options_.authorizer->reloads();
    }
    principal_ = std::move(principal);
    replica_ = replica;
    replica_owner_ = std::move(replica_owner);
    counted_principal_ = counted;
    admitted_ = true;
    ++service_->metrics_->connected;
    StartRead(&in_bytes_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the agent closed its side, or the stream broke
      EndAfterWrites(grpc::Status::OK);
      return;
    }
    const absl::Time read_at = absl::Now();
    ++service_->metrics_->queued;
    // Replica streams have workers of their own: an agent stream's worker waits for other
    // nodes' replicas, and theirs for ours; one pool for both would deadlock two nodes whose
    // workers all wait on each other.
    WorkerPool* pool = replica_ ? service_->replica_pool_.get() : service_->pool_.get();
    pool->Post([this, read_at] {
      --service_->metrics_->queued;
      service_->metrics_->queue_wait.Observe(absl::Now() - read_at);
      ++messages_read_;
      absl::Status end = Parse();
      if (end.ok()) end = Handle(in_);
      // The next read reuses the message; a graph delta's thousands of nodes would stay
      // allocated in it for as long as the agent is connected.
      if (in_.has_graph_delta()) v1::AgentMessage().Swap(&in_);
      AccountMemory();
      if (!end.ok()) {
        EndAfterWrites(ToGrpc(end));
        return;
      }
      {
        absl::MutexLock lock(&mu_);
        if (outbox_.size() >= kMaxQueuedReplies) {
          read_deferred_ = true;  // OnWriteDone reads on
          ++service_->metrics_->reads_held;
          return;
        }
      }
      StartRead(&in_bytes_);
    });
  }

  void OnWriteDone(bool ok) override {
    bool read = false;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) outbox_.clear();  // the agent is gone: nothing more can be written
      // After a failed write the read fails too, and ends the stream; one that ends anyway
      // reads no more (Finish may come first).
      if (read_deferred_ && outbox_.size() <= kMaxQueuedReplies / 2 && !end_requested_) {
        read_deferred_ = false;
        read = true;
      }
    }
    Pump();
    if (read) StartRead(&in_bytes_);
  }

  void OnDone() override {
    {
      absl::MutexLock lock(&link_->mu);
      link_->stream = nullptr;
    }
    if (session_ != nullptr && !replica_) {
      service_->registry_->Detach(session_->identity().agent_id, attachment_);
      if (std::string note; StreamChurnLogged(&note)) {
        LogInfo("agent {} disconnected{}", log_name_, note);
      }
    }
    // Before the stream stops counting as connected: whoever waits for that finds the graph
    // released.
    if (held_graph_.has_value()) service_->ReleaseGraph(*held_graph_);
    if (admitted_) --service_->metrics_->connected;
    if (counted_principal_) service_->ReleasePrincipalStream(principal_);
    service_->metrics_->session_bytes -= static_cast<int64_t>(accounted_bytes_);
    delete this;
  }

 private:
  // What the registry's Sender holds: the stream until OnDone().
  struct Link {
    absl::Mutex mu;
    Stream* stream ABSL_GUARDED_BY(mu) = nullptr;
  };

  // Queues a message; false once the stream is ending.
  bool Queue(v1::ServerMessage m) {
    {
      absl::MutexLock lock(&mu_);
      if (end_requested_) return false;
      outbox_.push_back(std::move(m));
    }
    Pump();
    return true;
  }

  void EndAfterWrites(grpc::Status status) {
    {
      absl::MutexLock lock(&mu_);
      if (end_requested_) return;
      end_requested_ = true;
      end_status_ = std::move(status);
    }
    Pump();
  }

  // Starts the next write, or Finish once everything queued is written. gRPC calls are made
  // outside the lock: a reaction may run inline.
  void Pump() {
    bool write = false, finish = false;
    {
      absl::MutexLock lock(&mu_);
      if (writing_) return;
      if (!outbox_.empty()) {
        bool own_buffer = false;
        current_bytes_.Clear();  // gRPC serializes only into an empty buffer
        // Cannot fail for a message built here (its size is bounded by the limits).
        (void)grpc::SerializationTraits<v1::ServerMessage>::Serialize(
            outbox_.front(), &current_bytes_, &own_buffer);
        outbox_.pop_front();
        writing_ = write = true;
      } else if (end_requested_ && !finish_called_) {
        finish_called_ = finish = true;
      }
    }
    if (write) StartWrite(&current_bytes_);
    if (finish) Finish(end_status_);
  }

  // Updates the sessions' memory estimate with this one's, and drops this session's graph
  // while all of them are over the budget.
  void AccountMemory() {
    if (session_ == nullptr) return;
    IngestMetrics* metrics = service_->metrics_;
    auto account = [&] {
      const size_t now = session_->MemoryBytes();
      metrics->session_bytes += static_cast<int64_t>(now) - static_cast<int64_t>(accounted_bytes_);
      accounted_bytes_ = now;
    };
    account();
    if (metrics->session_bytes.load() >
        static_cast<int64_t>(service_->options_.session_memory_bytes)) {
      session_->Unload();
      ++metrics->sessions_unloaded;
      account();
    }
  }

  // Parses in_bytes_ into in_.
  absl::Status Parse();
  // Handles one message; a non-OK status ends the stream with it.
  // Unpacks a graph delta's packed edges in place.
  absl::Status Handle(v1::AgentMessage& message);
  absl::Status HandleHello(const v1::AgentMessage& message);
  // Binds the agent to its principal: a certificate writes only as its own host, and an agent
  // ID stays with the principal that first wrote as it (the stored record says which; in a
  // cluster, the placement's claim too). `recorded_here`: the stored record names the owner.
  absl::Status CheckIdentity(AgentIdentity* identity, bool* recorded_here);
  absl::Status HandleBatch(const v1::SampleBatch& batch);
  absl::Status EndWith(const absl::Status& st, uint64_t sequence);
  void Reject(const absl::Status& st, uint64_t sequence) {
    ++service_->metrics_->rejected_messages;
    Queue(ErrorMessage(st, sequence));
  }
  // Tells the agent (or the replicating node) how much of its graph and batches are here.
  void Welcome() {
    v1::ServerMessage m;
    m.mutable_welcome()->set_known_nodes(session_->num_nodes());
    m.mutable_welcome()->set_known_edges(session_->num_edges());
    m.mutable_welcome()->set_last_applied_sequence(session_->last_applied_sequence());
    m.mutable_welcome()->set_max_graph_nodes(service_->options_.limits.max_graph_nodes);
    m.mutable_welcome()->set_max_graph_edges(service_->options_.limits.max_graph_edges);
    Queue(std::move(m));
  }
  void Resync(const absl::Status& why) {
    ++service_->metrics_->resyncs;
    v1::ServerMessage m;
    m.mutable_resync()->set_from_node(session_->num_nodes());
    m.mutable_resync()->set_from_edge(session_->num_edges());
    m.mutable_resync()->set_reason(std::string(why.message()));
    Queue(std::move(m));
  }

  IngestService* const service_;
  const std::shared_ptr<Link> link_;
  bool admitted_ = false;
  auth::Principal principal_;
  bool counted_principal_ = false;  // holds a slot in principal_streams_
  const grpc::CallbackServerContext* context_ = nullptr;  // the call's, for its credentials
  uint64_t auth_reloads_ = 0;  // Authorizer::reloads() when they were last checked
  grpc::ByteBuffer in_bytes_;  // read
  v1::AgentMessage in_;        // ... and parsed
  uint64_t messages_read_ = 0;
  std::unique_ptr<AgentSession> session_;  // after Hello
  std::optional<GraphRef> held_graph_;      // from Hello until the stream is done
  // A replica of a stream another cluster node took: no placement, no replication, not an
  // agent connected here.
  bool replica_ = false;
  std::string replica_owner_;  // a replica stream's agent owner (kReplicaOwnerMetadata)
  std::unique_ptr<StreamReplica> replica_of_;  // an accepted stream's mirror to the owners
  std::string log_name_;                   // the agent ID, escaped for logs
  uint64_t attachment_ = 0;                // in the registry, for Detach
  size_t accounted_bytes_ = 0;             // this session's part of session_bytes

  absl::Mutex mu_;
  std::deque<v1::ServerMessage> outbox_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_bytes_;  // being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool end_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_called_ ABSL_GUARDED_BY(mu_) = false;
  bool read_deferred_ ABSL_GUARDED_BY(mu_) = false;  // the next read waits for the outbox
  grpc::Status end_status_;
};

absl::Status IngestService::Stream::Parse() {
  if (grpc::SerializationTraits<v1::AgentMessage>::Deserialize(&in_bytes_, &in_).ok()) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("message ", messages_read_,
                                                 " of the stream is not a strata.v1.AgentMessage "
                                                 "(it does not parse)"));
}

absl::Status IngestService::Stream::Handle(v1::AgentMessage& message) {
  if (session_ == nullptr) return HandleHello(message);
  switch (message.kind_case()) {
    case v1::AgentMessage::kGraphDelta: {
      // Unpacked here, so that the session, its replicas and the store see one form.
      absl::Status st = encoding::UnpackDeltaEdges(message.mutable_graph_delta(),
                                                   service_->options_.limits.max_delta_edges);
      if (st.ok()) st = session_->ApplyGraphDelta(message.graph_delta());
      if (st.ok() && replica_of_ != nullptr) replica_of_->OnGraphDelta(message.graph_delta());
      // A large delta (a new agent's whole graph) leaves tens of MB of freed parse and
      // write-batch buffers in malloc's arenas; give them back rather than let every
      // worker's arena keep its peak.
      if (message.graph_delta().nodes_size() + message.graph_delta().edges_size() > (1 << 16)) {
        malloc_trim(0);
      }
      if (absl::IsFailedPrecondition(st)) {
        Resync(st);
      } else if (!st.ok()) {
        // The agent's view of the graph is now ahead of the server's: every later batch
        // would fail. It starts over after a reconnect.
        return EndWith(st, 0);
      }
      return absl::OkStatus();
    }
    case v1::AgentMessage::kSampleBatch:
      return HandleBatch(message.sample_batch());
    case v1::AgentMessage::kHeartbeat:
      if (absl::Status st = CheckHeartbeat(message.heartbeat(), service_->options_.limits);
          !st.ok()) {
        Reject(st, 0);
      } else {
        if (message.heartbeat().targets_size() > 0 || message.heartbeat().targets_listed()) {
          service_->registry_->SetTargets(session_->identity().agent_id,
                                          message.heartbeat().targets());
        }
        if (message.heartbeat().has_health()) {
          service_->registry_->SetHealth(session_->identity().agent_id,
                                         message.heartbeat().health());
        }
      }
      return absl::OkStatus();
    case v1::AgentMessage::kCaptureStatus:
      if (absl::Status st =
              CheckCaptureStatus(message.capture_status(), service_->options_.limits);
          !st.ok()) {
        Reject(st, 0);
        return absl::OkStatus();
      }
      for (const auto& observer : service_->capture_status_observers_) {
        observer(session_->identity().agent_id, message.capture_status());
      }
      return absl::OkStatus();
    case v1::AgentMessage::kHello:
    default:
      Reject(absl::InvalidArgumentError("unexpected message on an established ingest stream"),
             0);
      return absl::OkStatus();
  }
}

absl::Status IngestService::Stream::HandleHello(const v1::AgentMessage& message) {
  IngestMetrics* metrics = service_->metrics_;
  const Options& options = service_->options_;
  if (!message.has_hello()) {
    ++metrics->rejected_messages;
    return absl::InvalidArgumentError("the first message of an ingest stream must be Hello");
  }
  const v1::Hello& hello = message.hello();
  if (absl::Status st = CheckHello(hello, options.limits); !st.ok()) {
    ++metrics->rejected_messages;
    return st;
  }
  AgentIdentity identity{hello.agent_id(), hello.host(), hello.arch(), hello.version(),
                         hello.graph_id(), /*owner=*/"", /*labels=*/{}};
  for (const auto& [key, value] : hello.labels()) {
    // Hello.labels predate label syntax: what does not follow it is left out, not refused.
    if (labels::ValidateLabel(key, value).ok()) {
      identity.labels.emplace_back(key, value);
    } else {
      LogWarn("agent {}: label '{}' left out: not KEY=VALUE label syntax",
                   base::EscapeForLog(hello.agent_id()), base::EscapeForLog(key, 64));
    }
  }
  labels::Normalize(&identity.labels);
  bool recorded_here = false;
  if (absl::Status st = CheckIdentity(&identity, &recorded_here); !st.ok()) {
    ++metrics->identity_refused;
    LogWarn("{} refused: {}", principal_.Describe(), std::string(st.message()));
    return st;
  }
  if (options.placement != nullptr && !replica_) {
    auto placed = options.placement->Place(identity);
    if (!placed.ok()) return EndWith(placed.status(), 0);
    if (placed->has_value()) {
      ++metrics->redirects;
      v1::ServerMessage m;
      *m.mutable_redirect() = std::move(**placed);
      Queue(std::move(m));
      return absl::FailedPreconditionError("redirected to the host's owners");
    }
    if (!identity.owner.empty()) {
      absl::Status claimed = options.placement->ClaimAgentId(identity, recorded_here);
      if (!claimed.ok()) {
        if (absl::IsPermissionDenied(claimed)) {
          ++metrics->identity_refused;
          LogWarn("{} refused: {}", principal_.Describe(), std::string(claimed.message()));
        }
        return claimed;
      }
    }
  }
  held_graph_ = GraphRef{identity.agent_id, identity.graph_id};
  service_->HoldGraph(*held_graph_);
  auto session = AgentSession::Open(service_->store_, identity, options.committer, options.limits);
  if (!session.ok()) {
    LogError("agent {}: cannot open session: {}", base::EscapeForLog(hello.agent_id()),
                  session.status().ToString());
    return absl::InternalError("cannot load agent state");
  }
  session_ = std::move(*session);
  log_name_ = base::EscapeForLog(identity.agent_id);
  ++metrics->streams;
  if (replica_) {
    ++metrics->replica_streams;
    Welcome();
    return absl::OkStatus();
  }
  if (options.placement != nullptr) replica_of_ = options.placement->Replicate(hello, identity.owner);
  std::shared_ptr<Link> link = link_;
  std::string other_host;
  absl::StatusOr<uint64_t> attachment = service_->registry_->Attach(
      DescriptorOf(identity), hello.frequency_hz(),
      [link](const v1::ServerMessage& m) {
        absl::MutexLock lock(&link->mu);
        return link->stream != nullptr && link->stream->Queue(m);
      },
      &other_host);
  if (!attachment.ok()) {
    session_.reset();
    ++metrics->identity_refused;
    return attachment.status();
  }
  attachment_ = *attachment;
  if (!other_host.empty()) {
    LogWarn("agent {} connected from host {} while connected from host {}: two agents with one "
            "agent ID (give each its own --agent-id) show as one in `strata agents`, and "
            "captures reach only the last to connect", log_name_,
            base::EscapeForLog(identity.host), base::EscapeForLog(other_host));
  }
  if (std::string note; StreamChurnLogged(&note)) {
    LogInfo("agent {} connected (host {}, arch {}, graph {:x}: {} nodes, {} edges known){}",
            log_name_, base::EscapeForLog(identity.host), base::EscapeForLog(identity.arch),
            identity.graph_id, session_->num_nodes(), session_->num_edges(), note);
  }
  Welcome();
  return absl::OkStatus();
}

absl::Status IngestService::Stream::CheckIdentity(AgentIdentity* identity,
                                                  bool* recorded_here) {
  // A replica stream's node checked the agent; the agent keeps the owner it has there.
  if (replica_) {
    identity->owner = replica_owner_;
    return absl::OkStatus();
  }
  if (principal_.kind == auth::Principal::Kind::kAnonymous) return absl::OkStatus();
  if (principal_.kind == auth::Principal::Kind::kCertificate && identity->host != principal_.name) {
    return absl::PermissionDeniedError(absl::StrCat(
        principal_.Describe(), " may write only as host ", base::EscapeForLog(principal_.name),
        ", not as host ", base::EscapeForLog(identity->host), " (strata-agent --host)"));
  }
  identity->owner = principal_.Describe();
  auto stored = service_->store_->meta().GetAgent(identity->agent_id);
  if (stored.ok() && !stored->owner.empty() && stored->owner != identity->owner) {
    return absl::PermissionDeniedError(absl::StrCat(
        "agent ID ", base::EscapeForLog(identity->agent_id), " belongs to ", stored->owner, "; ",
        identity->owner, " may not write as it"));
  }
  if (!stored.ok() && !absl::IsNotFound(stored.status())) {
    LogError("reading agent {}: {}", base::EscapeForLog(identity->agent_id),
                  stored.status().ToString());
    return absl::UnavailableError("cannot read the agent's record; retry later");
  }
  *recorded_here = stored.ok() && stored->owner == identity->owner;
  return absl::OkStatus();
}

absl::Status IngestService::Stream::HandleBatch(const v1::SampleBatch& batch) {
  IngestMetrics* metrics = service_->metrics_;
  if (auth::Authorizer* authorizer = service_->options_.authorizer;
      authorizer != nullptr && authorizer->reloads() != auth_reloads_) {
    // The tokens file changed since the stream's credentials were checked: a token removed
    // (or a role lowered) stops the streams opened with it, not only new ones.
    auth_reloads_ = authorizer->reloads();
    auto still = replica_ ? auth::AuthorizeCall(authorizer, context_, auth::Role::kNode,
                                                "sending replica streams")
                          : auth::AuthorizeCall(authorizer, context_, auth::Role::kAgent,
                                                "ingest");
    if (!still.ok()) return EndWith(still.status(), batch.sequence());
  }
  const absl::Time start = absl::Now();
  auto applied = session_->ApplyBatch(batch);
  metrics->batch_apply.Observe(absl::Now() - start);
  const AgentIdentity& identity = session_->identity();
  if (!applied.ok()) {
    const absl::Status& st = applied.status();
    // Out of memory for tables, or the store cannot write (disk full): nothing of the batch
    // was applied; the agent comes back after a while and resends it, in order.
    if (absl::IsResourceExhausted(st) || absl::IsUnavailable(st)) {
      return EndWith(st, batch.sequence());
    }
    // Only a batch beyond the graph needs the graph again; one waiting for an earlier
    // batch just comes again after it.
    if (absl::IsFailedPrecondition(st) && batch.epoch() > session_->num_edges()) Resync(st);
    if (!absl::IsFailedPrecondition(st)) {
      LogWarn("agent {}: rejected batch {}: {}", log_name_, batch.sequence(),
                   st.ToString());
    }
    Reject(st, batch.sequence());
    return absl::OkStatus();
  }
  if (applied->duplicate) {
    ++metrics->duplicate_batches;
  } else {
    ++metrics->batches;
    uint64_t samples = 0;
    for (const auto& c : applied->contexts) samples += c.count;
    metrics->samples += samples;
    metrics->contexts += applied->contexts.size();
    if (!replica_) service_->registry_->RecordBatch(identity.agent_id, batch);
    for (const auto& observer : service_->observers_) observer(*applied);
  }
  if (replica_of_ != nullptr) {
    // Stored here; acknowledged only once every live owner of the host has it too. Resent,
    // the batch is a duplicate here and goes to the owners that lack it.
    v1::Redirect redirect;
    absl::Status replicated = replica_of_->OnBatch(batch, *session_, &redirect);
    if (!replicated.ok()) {
      if (redirect.servers_size() > 0) {
        ++metrics->redirects;
        LogInfo("agent {}: moving to {}: {}", log_name_, redirect.servers(0),
                     redirect.reason());
        v1::ServerMessage m;
        *m.mutable_redirect() = std::move(redirect);
        Queue(std::move(m));
        return replicated;
      }
      ++metrics->replication_failures;
      return EndWith(replicated, batch.sequence());
    }
  }
  if (!replica_) ++metrics->acks;
  v1::ServerMessage ack;
  ack.mutable_ack()->set_sequence(batch.sequence());
  Queue(std::move(ack));
  return absl::OkStatus();
}

// Ends the stream with `st`: the agent reconnects (with backoff) and starts over from what
// the server has, so nothing after the refused message is taken out of order.
absl::Status IngestService::Stream::EndWith(const absl::Status& st, uint64_t sequence) {
  IngestMetrics* metrics = service_->metrics_;
  ++metrics->rejected_messages;
  uint32_t retry_after_ms = 0;
  if (absl::IsResourceExhausted(st)) {
    ++metrics->resource_exhausted;
    retry_after_ms = service_->options_.retry_after_ms;
  } else if (absl::IsUnavailable(st)) {
    retry_after_ms = service_->options_.retry_after_ms;
  }
  if (std::string note; StreamChurnLogged(&note)) {
    LogWarn("agent {}: ending stream: {}{}", log_name_, st.ToString(), note);
  }
  Queue(ErrorMessage(st, sequence, /*fatal=*/true, retry_after_ms));
  return st;
}

IngestService::IngestService(store::Store* store, registry::AgentRegistry* registry,
                             IngestMetrics* metrics, Options options)
    : store_(store), registry_(registry), metrics_(metrics), options_(std::move(options)) {
  const size_t threads = options_.worker_threads != 0
                             ? options_.worker_threads
                             : std::max<size_t>(2, std::thread::hardware_concurrency());
  if (options_.placement != nullptr) {
    // Agent streams' workers spend most of a batch waiting for the other owners: more of
    // them keep the cores busy.
    pool_ = std::make_unique<WorkerPool>(options_.worker_threads != 0 ? threads : 4 * threads);
    replica_pool_ = std::make_unique<WorkerPool>(threads);
  } else {
    pool_ = std::make_unique<WorkerPool>(threads);
  }
  if (options_.graph_retention > absl::ZeroDuration()) {
    graph_sweeper_ = std::thread([this] { SweepGraphsPeriodically(); });
  }
}

IngestService::~IngestService() {
  if (graph_sweeper_.joinable()) {
    {
      absl::MutexLock lock(&sweeper_mu_);
      sweeper_stopping_ = true;
    }
    graph_sweeper_.join();
  }
}

void IngestService::HoldGraph(const GraphRef& graph) {
  absl::MutexLock lock(&graphs_mu_);
  ++held_graphs_[graph];
}

void IngestService::ReleaseGraph(const GraphRef& graph) {
  absl::MutexLock lock(&graphs_mu_);
  auto it = held_graphs_.find(graph);
  if (it != held_graphs_.end() && --it->second == 0) held_graphs_.erase(it);
}

absl::StatusOr<IngestService::GraphSweep> IngestService::SweepGraphs(int64_t now_ms) {
  GraphSweep sweep;
  const int64_t retention_ms = absl::ToInt64Milliseconds(options_.graph_retention);
  if (retention_ms <= 0) return sweep;
  absl::StatusOr<std::vector<store::StoredGraph>> graphs = store_->meta().ListGraphs();
  if (!graphs.ok()) return graphs.status();
  sweep.graphs = graphs->size();
  store::WriteBatch marks;
  for (const store::StoredGraph& graph : *graphs) {
    if (graph.last_used_ms == 0) {
      // Stored before marks were kept, or no batch of it was ever applied: its time starts
      // now.
      marks.MarkGraphUsed(graph.agent_id, graph.graph_id, now_ms);
      ++sweep.marked;
      continue;
    }
    if (graph.last_used_ms >= now_ms - retention_ms) continue;
    // Held while the delete commits: a stream opening this graph waits, then loads nothing.
    absl::MutexLock lock(&graphs_mu_);
    if (held_graphs_.contains(GraphRef{graph.agent_id, graph.graph_id})) continue;
    store::WriteBatch del;
    del.DeleteGraph(graph.agent_id, graph.graph_id);
    if (absl::Status st = store_->Commit(&del); !st.ok()) return st;
    ++sweep.deleted;
    ++metrics_->graphs_deleted;
  }
  if (sweep.marked > 0) {
    if (absl::Status st = store_->Commit(&marks); !st.ok()) return st;
  }
  return sweep;
}

void IngestService::SweepGraphsPeriodically() {
  absl::MutexLock lock(&sweeper_mu_);
  while (!sweeper_mu_.AwaitWithTimeout(absl::Condition(&sweeper_stopping_),
                                       options_.graph_sweep_interval)) {
    sweeper_mu_.Unlock();
    absl::StatusOr<GraphSweep> sweep = SweepGraphs(base::NowMs());
    if (!sweep.ok()) {
      LogWarn("call graph sweep: {}", sweep.status().ToString());
    } else if (sweep->deleted > 0) {
      LogInfo("deleted {} of {} agent call graphs, unused for more than {}", sweep->deleted,
              sweep->graphs, absl::FormatDuration(options_.graph_retention));
    }
    sweeper_mu_.Lock();
  }
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* IngestService::Connect(
    grpc::CallbackServerContext* context) {
  auto* stream = new Stream(this);
  // A replica stream stores batches another node placed and acknowledged for: only another
  // node of the cluster (role node) may send one. It is not an agent, and the sending node's
  // principal holds one per agent stream it mirrors: neither agent limit applies.
  const bool replica = options_.placement != nullptr &&
                       context->client_metadata().count(kReplicaMetadata) > 0;
  auto principal = replica ? auth::AuthorizeCall(options_.authorizer, context, auth::Role::kNode,
                                                 "sending replica streams")
                           : auth::AuthorizeCall(options_.authorizer, context, auth::Role::kAgent,
                                                 "ingest");
  if (!principal.ok()) {
    stream->Refuse(principal.status(), 0);
    return stream;
  }
  if (!replica && metrics_->connected.load() >= static_cast<int64_t>(options_.max_agents)) {
    ++metrics_->streams_refused;
    stream->Refuse(absl::ResourceExhaustedError(absl::StrCat(
                       "the server holds its maximum of ", options_.max_agents,
                       " agent streams (strata-server --max-agents); retry later")),
                   options_.retry_after_ms);
    return stream;
  }
  const bool counted = !replica && principal->kind != auth::Principal::Kind::kAnonymous;
  if (counted && !TakePrincipalStream(*principal)) {
    ++metrics_->principal_streams_refused;
    stream->Refuse(absl::ResourceExhaustedError(absl::StrCat(
                       principal->Describe(), " holds its maximum of ",
                       options_.max_streams_per_principal,
                       " agent streams (strata-server --max-streams-per-principal)")),
                   options_.retry_after_ms);
    return stream;
  }
  std::string replica_owner;
  if (replica) {
    auto owner = context->client_metadata().find(kReplicaOwnerMetadata);
    if (owner != context->client_metadata().end()) {
      replica_owner.assign(owner->second.data(), owner->second.size());
    }
  }
  stream->Begin(context, std::move(*principal), counted, replica, std::move(replica_owner));
  return stream;
}

bool IngestService::TakePrincipalStream(const auth::Principal& principal) {
  absl::MutexLock lock(&principals_mu_);
  uint32_t& n = principal_streams_[principal.Describe()];
  if (n >= options_.max_streams_per_principal) {
    if (n == 0) principal_streams_.erase(principal.Describe());
    return false;
  }
  ++n;
  return true;
}

void IngestService::ReleasePrincipalStream(const auth::Principal& principal) {
  absl::MutexLock lock(&principals_mu_);
  auto it = principal_streams_.find(principal.Describe());
  if (it != principal_streams_.end() && --it->second == 0) principal_streams_.erase(it);
}

}  // namespace strata::server::ingest
