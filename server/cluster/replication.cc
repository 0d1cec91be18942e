#include "server/cluster/replication.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/base/escape.h"
#include "common/base/log.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::server::cluster {
namespace {

// Nodes or edges per catch-up message: well under the default message limit even with long
// names, and under the server's per-delta checks.
constexpr size_t kCatchUpChunk = 20'000;

using ReplicaStream = grpc::ClientReaderWriter<v1::AgentMessage, v1::ServerMessage>;

}  // namespace

std::shared_ptr<grpc::Channel> NodeChannels::Get(const std::string& address) {
  absl::MutexLock lock(&mu_);
  auto it = channels_.find(address);
  if (it != channels_.end()) return it->second;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  // Reconnect soon after a node comes back: the default backoff grows to two minutes.
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  auto channel = security_.CreateChannel(address, args);
  channels_.emplace(address, channel);
  return channel;
}

CallDeadlines::CallDeadlines() : thread_([this] { Run(); }) {}

CallDeadlines::~CallDeadlines() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

uint64_t CallDeadlines::Arm(grpc::ClientContext* context, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  const uint64_t token = next_++;
  armed_.emplace(token, std::make_pair(deadline, context));
  return token;
}

void CallDeadlines::Disarm(uint64_t token) {
  absl::MutexLock lock(&mu_);
  armed_.erase(token);
}

void CallDeadlines::Run() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    const absl::Time now = absl::Now();
    for (auto it = armed_.begin(); it != armed_.end();) {
      if (it->second.first <= now) {
        it->second.second->TryCancel();
        it = armed_.erase(it);
      } else {
        ++it;
      }
    }
    // A tenth of a second of slack on a deadline of seconds is fine, and keeps this simple.
    mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Milliseconds(100));
  }
}

v1::Redirect RedirectTo(const Ring& ring, const std::string& host, uint32_t replication_factor,
                        std::string reason) {
  v1::Redirect r;
  for (const RingMember* m : ring.Owners(host, replication_factor)) r.add_servers(m->address);
  r.set_reason(std::move(reason));
  return r;
}

// The mirror of one accepted stream: a replica stream to each other owner of the host.
class AgentReplica final : public ingest::StreamReplica {
 public:
  AgentReplica(ClusterPlacement* placement, const v1::Hello& hello, std::string owner)
      : placement_(placement), hello_(hello), owner_(std::move(owner)) {
    hello_.clear_token();
  }
  ~AgentReplica() override {
    for (auto& [id, owner] : owners_) Close(owner);
    if (counted_) --placement_->metrics_->replicated_streams;
  }

  void OnGraphDelta(const v1::GraphDelta& delta) override {
    for (auto& [id, owner] : owners_) {
      if (owner.stream == nullptr) continue;
      if (absl::Status s = Forward(owner, delta); !s.ok()) Close(owner);
    }
  }

  absl::Status OnBatch(const v1::SampleBatch& batch, const ingest::AgentSession& session,
                       v1::Redirect* redirect) override {
    Membership* membership = placement_->membership_;
    if (!membership->lease_held()) {
      return absl::UnavailableError(
          "this node lost its cluster membership (etcd unreachable); the batch is stored here "
          "but not acknowledged until it can be replicated");
    }
    const std::shared_ptr<const Ring> ring = membership->ring();
    const uint32_t rf = placement_->options_.replication_factor;
    const std::string& self = membership->options().node_id;
    std::vector<const RingMember*> owners = ring->Owners(hello_.host(), rf);
    if (std::none_of(owners.begin(), owners.end(),
                     [&](const RingMember* m) { return m->id == self; })) {
      *redirect = RedirectTo(*ring, hello_.host(), rf, "the ring moved: this node no longer "
                                                       "owns the host");
      return absl::FailedPreconditionError("the host's owners changed");
    }
    // Streams to nodes that are no longer owners end; new owners get one.
    for (auto it = owners_.begin(); it != owners_.end();) {
      const bool still = std::any_of(owners.begin(), owners.end(),
                                     [&](const RingMember* m) { return m->id == it->first; });
      if (!still) {
        Close(it->second);
        it = owners_.erase(it);
      } else {
        ++it;
      }
    }
    if (!counted_ && owners.size() > 1) {
      counted_ = true;
      ++placement_->metrics_->replicated_streams;
    }
    // One copy of the batch for every owner; built only once an owner lacks it.
    std::optional<v1::AgentMessage> message;
    for (const RingMember* m : owners) {
      if (m->id == self) continue;
      Owner& owner = owners_[m->id];
      if (owner.address != m->address) {
        Close(owner);
        owner.address = m->address;
      }
      if (placement_->Unresponsive(m->id)) {
        ++placement_->metrics_->replica_skipped;
        Close(owner);
        return absl::UnavailableError(absl::StrCat(
            "owner ", m->id, " (", m->address, ") did not confirm a batch within the replica "
            "timeout; batch ", batch.sequence(), " is not acknowledged until it or the ring "
            "recovers"));
      }
      absl::Status s = Replicate(owner, batch, session, &message);
      if (!s.ok()) {
        ++placement_->metrics_->replica_failures;
        placement_->MarkUnresponsive(m->id);
        Close(owner);
        return absl::UnavailableError(absl::StrCat("owner ", m->id, " (", m->address,
                                                   ") did not confirm batch ", batch.sequence(),
                                                   ": ", s.message()));
      }
    }
    return absl::OkStatus();
  }

 private:
  struct Owner {
    std::string address;
    std::unique_ptr<grpc::ClientContext> context;
    std::unique_ptr<ReplicaStream> stream;
    uint32_t known_nodes = 0;
    uint64_t known_edges = 0;
    uint64_t last_applied = 0;
  };

  void Close(Owner& owner) {
    if (owner.stream == nullptr) return;
    owner.context->TryCancel();
    (void)owner.stream->Finish();
    owner.stream.reset();
    owner.context.reset();
  }

  // Reads the owner's next message, or fails once the replica timeout passes.
  absl::StatusOr<v1::ServerMessage> Read(Owner& owner) {
    const uint64_t token = placement_->deadlines_.Arm(
        owner.context.get(), absl::Now() + placement_->options_.replica_timeout);
    v1::ServerMessage m;
    const bool ok = owner.stream->Read(&m);
    placement_->deadlines_.Disarm(token);
    if (!ok) return absl::UnavailableError("the replica stream ended or timed out");
    return m;
  }

  bool Write(Owner& owner, const v1::AgentMessage& m) {
    const uint64_t token = placement_->deadlines_.Arm(
        owner.context.get(), absl::Now() + placement_->options_.replica_timeout);
    const bool ok = owner.stream->Write(m);
    placement_->deadlines_.Disarm(token);
    return ok;
  }

  absl::Status Open(Owner& owner) {
    owner.context = std::make_unique<grpc::ClientContext>();
    owner.context->AddMetadata(ingest::kReplicaMetadata,
                               placement_->membership_->options().node_id);
    owner.context->set_wait_for_ready(false);
    placement_->channels_->Authorize(owner.context.get());
    if (!owner_.empty()) owner.context->AddMetadata(ingest::kReplicaOwnerMetadata, owner_);
    auto stub = v1::Ingest::NewStub(placement_->channels_->Get(owner.address));
    owner.stream = stub->Connect(owner.context.get());
    v1::AgentMessage hello;
    *hello.mutable_hello() = hello_;
    if (!Write(owner, hello)) return absl::UnavailableError("cannot reach the node");
    auto welcome = Read(owner);
    if (!welcome.ok()) return welcome.status();
    if (!welcome->has_welcome()) {
      return absl::UnavailableError(
          welcome->has_error() ? welcome->error().message() : "no Welcome from the node");
    }
    owner.known_nodes = welcome->welcome().known_nodes();
    owner.known_edges = welcome->welcome().known_edges();
    owner.last_applied = welcome->welcome().last_applied_sequence();
    return absl::OkStatus();
  }

  // Sends the part of `delta` the owner lacks; a gap before it is left for CatchUp.
  absl::Status Forward(Owner& owner, const v1::GraphDelta& delta) {
    v1::AgentMessage m;
    v1::GraphDelta* out = m.mutable_graph_delta();
    const uint64_t node_end = delta.first_node() + static_cast<uint64_t>(delta.nodes_size());
    const uint64_t edge_end = delta.first_edge() + static_cast<uint64_t>(delta.edges_size());
    // Nodes missing before this delta: its edges may need them too, so CatchUp sends all.
    if (owner.known_nodes < delta.first_node() && delta.nodes_size() > 0) return absl::OkStatus();
    const bool nodes = owner.known_nodes >= delta.first_node() && owner.known_nodes < node_end;
    const bool edges = owner.known_edges >= delta.first_edge() && owner.known_edges < edge_end;
    if (!nodes && !edges) return absl::OkStatus();
    out->set_first_node(owner.known_nodes);
    out->set_first_edge(owner.known_edges);
    if (nodes) {
      for (uint64_t i = owner.known_nodes - delta.first_node(); i < node_end - delta.first_node(); ++i) {
        *out->add_nodes() = delta.nodes(static_cast<int>(i));
      }
    }
    if (edges) {
      for (uint64_t i = owner.known_edges - delta.first_edge(); i < edge_end - delta.first_edge(); ++i) {
        *out->add_edges() = delta.edges(static_cast<int>(i));
      }
    }
    if (!Write(owner, m)) return absl::UnavailableError("cannot send the graph delta");
    if (nodes) owner.known_nodes = static_cast<uint32_t>(node_end);
    if (edges) owner.known_edges = edge_end;
    return absl::OkStatus();
  }

  // Sends the owner the part of the agent's graph it lacks, from this node's store.
  absl::Status CatchUp(Owner& owner, const ingest::AgentSession& session) {
    if (owner.known_nodes >= session.num_nodes() && owner.known_edges >= session.num_edges()) {
      return absl::OkStatus();
    }
    auto graph = placement_->store_->meta().LoadGraph(hello_.agent_id(), hello_.graph_id());
    if (!graph.ok()) return graph.status();
    ++placement_->metrics_->graph_catch_ups;
    size_t node = 0, edge = owner.known_edges;
    while (node < graph->nodes.size() && graph->nodes[node].id < owner.known_nodes) ++node;
    while (node < graph->nodes.size() || edge < graph->edges.size()) {
      v1::AgentMessage m;
      v1::GraphDelta* d = m.mutable_graph_delta();
      d->set_first_node(owner.known_nodes);
      d->set_first_edge(owner.known_edges);
      for (size_t n = 0; n < kCatchUpChunk && node < graph->nodes.size(); ++n, ++node) {
        const store::GraphNode& g = graph->nodes[node];
        v1::FunctionNode* f = d->add_nodes();
        f->set_id(g.id);
        f->set_name(g.name);
        f->set_module(g.module);
        f->set_build_id(g.build_id);
        f->set_start_offset(g.start_offset);
      }
      // Edges may only reference nodes sent so far.
      const uint32_t nodes_after = owner.known_nodes + static_cast<uint32_t>(d->nodes_size());
      for (size_t n = 0; n < kCatchUpChunk && edge < graph->edges.size(); ++n, ++edge) {
        const store::GraphEdge& e = graph->edges[edge];
        if (e.caller >= nodes_after || e.callee >= nodes_after) break;
        v1::CallEdge* c = d->add_edges();
        c->set_caller(e.caller);
        c->set_call_site(e.call_site);
        c->set_callee(e.callee);
      }
      if (d->nodes_size() == 0 && d->edges_size() == 0) break;
      if (!Write(owner, m)) return absl::UnavailableError("cannot send the graph");
      owner.known_nodes = nodes_after;
      owner.known_edges += static_cast<uint64_t>(d->edges_size());
    }
    return absl::OkStatus();
  }

  absl::Status Replicate(Owner& owner, const v1::SampleBatch& batch,
                         const ingest::AgentSession& session,
                         std::optional<v1::AgentMessage>* message) {
    if (owner.stream == nullptr) {
      if (absl::Status s = Open(owner); !s.ok()) return s;
    }
    if (batch.sequence() <= owner.last_applied) return absl::OkStatus();
    if (!message->has_value()) *message->emplace().mutable_sample_batch() = batch;
    const v1::AgentMessage& m = **message;
    for (int attempt = 0; attempt < 3; ++attempt) {
      if (absl::Status s = CatchUp(owner, session); !s.ok()) return s;
      if (!Write(owner, m)) return absl::UnavailableError("cannot send the batch");
      bool resync = false;
      while (!resync) {
        auto reply = Read(owner);
        if (!reply.ok()) return reply.status();
        if (reply->has_ack() && reply->ack().sequence() == batch.sequence()) {
          owner.last_applied = batch.sequence();
          ++placement_->metrics_->batches_replicated;
          placement_->metrics_->bytes_replicated += m.GetCachedSize();  // sized by Write
          return absl::OkStatus();
        }
        if (reply->has_resync()) {
          owner.known_nodes = std::min(owner.known_nodes, reply->resync().from_node());
          owner.known_edges = std::min(owner.known_edges, reply->resync().from_edge());
          resync = true;
        } else if (reply->has_error() &&
                   (reply->error().fatal() || reply->error().sequence() == batch.sequence())) {
          // A batch that must wait for the graph is followed by the Resync that sends it.
          if (reply->error().code() == static_cast<int>(absl::StatusCode::kFailedPrecondition) &&
              !reply->error().fatal()) {
            continue;
          }
          return absl::Status(static_cast<absl::StatusCode>(reply->error().code()),
                              reply->error().message());
        }
      }
    }
    return absl::UnavailableError("the owner kept asking for the graph");
  }

  ClusterPlacement* const placement_;
  v1::Hello hello_;
  const std::string owner_;  // the agent's owner, for the other owners' records
  std::map<std::string, Owner> owners_;  // by node ID
  bool counted_ = false;
};

ClusterPlacement::ClusterPlacement(Membership* membership, store::Store* store,
                                   NodeChannels* channels, ReplicationOptions options,
                                   ReplicationMetrics* metrics)
    : membership_(membership), store_(store), channels_(channels), options_(options),
      metrics_(metrics),
      agent_ids_(membership->etcd(), membership->options().prefix, &metrics->agent_ids) {}

bool ClusterPlacement::Unresponsive(const std::string& node_id) {
  absl::MutexLock lock(&unresponsive_mu_);
  auto it = unresponsive_until_.find(node_id);
  if (it == unresponsive_until_.end()) return false;
  if (absl::Now() < it->second) return true;
  unresponsive_until_.erase(it);  // one stream tries it again
  return false;
}

void ClusterPlacement::MarkUnresponsive(const std::string& node_id) {
  absl::MutexLock lock(&unresponsive_mu_);
  unresponsive_until_[node_id] = absl::Now() + options_.replica_timeout;
}

absl::StatusOr<std::optional<v1::Redirect>> ClusterPlacement::Place(
    const ingest::AgentIdentity& agent) {
  if (!membership_->lease_held()) {
    return absl::UnavailableError(
        "this cluster node lost its membership (etcd unreachable); try another node");
  }
  const std::shared_ptr<const Ring> ring = membership_->ring();
  if (ring->IsOwner(agent.host, options_.replication_factor, membership_->options().node_id)) {
    return std::nullopt;
  }
  return RedirectTo(*ring, agent.host, options_.replication_factor,
                    absl::StrCat("host ", base::EscapeForLog(agent.host),
                                 " is owned by other nodes"));
}

std::unique_ptr<ingest::StreamReplica> ClusterPlacement::Replicate(const v1::Hello& hello,
                                                                   const std::string& owner) {
  return std::make_unique<AgentReplica>(this, hello, owner);
}

absl::Status ClusterPlacement::ClaimAgentId(const ingest::AgentIdentity& agent,
                                            bool recorded_here) {
  return agent_ids_.Claim(agent.agent_id, agent.owner, recorded_here);
}

}  // namespace strata::server::cluster
