#include "tools/loadgen/fleet.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <queue>
#include <random>
#include <thread>
#include <utility>

#include <grpcpp/grpcpp.h>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/reconnector.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::loadgen {
namespace {

class Agent;

// Things the gRPC callback threads hand to the driver thread.
struct Events {
  absl::Mutex mu;
  std::vector<std::pair<Agent*, class Connection*>> closed ABSL_GUARDED_BY(mu);
};

// One stream of one agent. Reads are always outstanding until the server ends the stream;
// writes go out one at a time from an outbox. gRPC calls are made outside the lock (a
// reaction may run inline).
class Connection final : public grpc::ClientBidiReactor<v1::AgentMessage, v1::ServerMessage> {
 public:
  Connection(Agent* agent, Events* events) : agent_(agent), events_(events) {}

  void Start(v1::Ingest::Stub* stub, const rpc::ClientSecurity& security,
             v1::AgentMessage hello) {
    security.Authorize(&context_);
    stub->async()->Connect(&context_, this);
    StartRead(&in_);
    Send(std::move(hello));
    StartCall();
  }
  void Send(v1::AgentMessage m) {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      outbox_.push_back(std::move(m));
      if (writing_) return;
      writing_ = true;
      current_ = std::move(outbox_.front());
      outbox_.pop_front();
    }
    StartWrite(&current_);
  }
  void Cancel() { context_.TryCancel(); }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) outbox_.clear();
      if (outbox_.empty()) return;
      writing_ = true;
      current_ = std::move(outbox_.front());
      outbox_.pop_front();
    }
    StartWrite(&current_);
  }
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
      outbox_.clear();
    }
    absl::MutexLock lock(&events_->mu);
    events_->closed.push_back({agent_, this});
  }

 private:
  Agent* const agent_;
  Events* const events_;
  grpc::ClientContext context_;
  v1::ServerMessage in_;
  absl::Mutex mu_;
  std::deque<v1::AgentMessage> outbox_ ABSL_GUARDED_BY(mu_);
  v1::AgentMessage current_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// A simulated agent: identity, spool and counters. The driver thread and the stream's
// callbacks share it under its mutex.
class Agent {
 public:
  Agent(const FleetOptions& options, uint32_t index, const Program* program, uint64_t graph_id,
        std::function<double()> jitter)
      : options_(options),
        index_(index),
        program_(program),
        graph_id_(graph_id),
        reconnect_({.servers = options.servers,
                    .first = index,
                    .max_backoff = options.max_backoff,
                    .jitter = std::move(jitter)}) {
    agent_id_ = absl::StrCat(options.prefix, "-agent-", index);
    host_ = absl::StrCat(options.prefix, "-host-", index);
    const uint32_t services = std::max<uint32_t>(1, options.services);
    service_ = absl::StrCat(options.prefix, "-svc-", index % services);
    for (const auto& [key, values] : options.labels) {
      if (!values.empty()) labels_[key] = values[(index / services) % values.size()];
    }
  }

  const std::string& service() const { return service_; }
  uint32_t index() const { return index_; }

  // Where the next stream goes: an owner the last Redirect named, else the next address of
  // the list.
  std::string NextAddress() {
    absl::MutexLock lock(&mu_);
    return reconnect_.Connect();
  }

  // A new stream (the driver calls this when the agent has none).
  void Connect(v1::Ingest::Stub* stub, Events* events) {
    v1::AgentMessage hello;
    v1::Hello* h = hello.mutable_hello();
    h->set_agent_id(agent_id_);
    h->set_host(host_);
    h->set_arch("x86_64");
    h->set_version("strata-loadgen");
    h->set_graph_id(graph_id_);
    h->set_frequency_hz(options_.frequency_hz);
    h->mutable_labels()->insert(labels_.begin(), labels_.end());
    auto* c = new Connection(this, events);
    {
      absl::MutexLock lock(&mu_);
      bytes_sent_ += hello.ByteSizeLong();
      conn_ = c;
      welcomed_ = false;
      redirect_pending_ = false;
    }
    c->Start(stub, options_.security, std::move(hello));
  }

  // One interval's batch: spooled, and sent if the stream is up.
  void Tick(absl::Time now) {
    absl::MutexLock lock(&mu_);
    const Payload& p = program_->payload(next_sequence_ + index_);
    Pending pending{++next_sequence_, &p, absl::InfiniteFuture()};
    ++batches_sent_;
    spool_.push_back(pending);
    if (conn_ != nullptr && welcomed_ && !redirect_pending_) SendLocked(spool_.back(), now);
  }

  void OnMessage(Connection* c, const v1::ServerMessage& m) {
    const absl::Time now = absl::Now();
    absl::MutexLock lock(&mu_);
    if (c != conn_) return;
    switch (m.kind_case()) {
      case v1::ServerMessage::kWelcome: {
        welcomed_ = true;
        reconnect_.Welcomed();
        ++connects_;
        const v1::Welcome& w = m.welcome();
        while (!spool_.empty() && spool_.front().sequence <= w.last_applied_sequence()) {
          Deliver(spool_.front(), now, /*acked=*/false);
          spool_.pop_front();
        }
        for (v1::GraphDelta& d : program_->DeltasFrom(w.known_nodes(), w.known_edges())) {
          v1::AgentMessage out;
          *out.mutable_graph_delta() = std::move(d);
          bytes_sent_ += out.ByteSizeLong();
          conn_->Send(std::move(out));
        }
        for (Pending& p : spool_) SendLocked(p, now);
        break;
      }
      case v1::ServerMessage::kAck:
        while (!spool_.empty() && spool_.front().sequence <= m.ack().sequence()) {
          Deliver(spool_.front(), now, /*acked=*/true);
          spool_.pop_front();
        }
        break;
      case v1::ServerMessage::kResync:
        conn_->Cancel();  // start over: the Welcome says what the server has
        break;
      case v1::ServerMessage::kError: {
        const v1::IngestError& e = m.error();
        if (e.code() == static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED) ||
            e.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE)) {
          ++refusals_;
          reconnect_.RetryAfter(absl::Milliseconds(e.retry_after_ms()));
        } else if (e.code() == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION)) {
          conn_->Cancel();
        } else if (e.sequence() != 0) {
          for (auto it = spool_.begin(); it != spool_.end(); ++it) {
            if (it->sequence != e.sequence()) continue;
            spool_.erase(it);
            ++rejected_;
            break;
          }
        } else {
          ++rejected_;
        }
        break;
      }
      case v1::ServerMessage::kRedirect:
        // The server ends the stream; nothing more goes to it.
        ++redirects_;
        redirect_pending_ = true;
        reconnect_.Redirected({m.redirect().servers().begin(), m.redirect().servers().end()});
        conn_->Cancel();
        break;
      default:
        break;  // capture control: not simulated
    }
  }

  // The stream ended. Returns how long to wait before the next one.
  absl::Duration OnClosed() {
    absl::MutexLock lock(&mu_);
    if (!redirect_pending_) ++closed_;
    conn_ = nullptr;
    welcomed_ = false;
    redirect_pending_ = false;
    return reconnect_.Closed();
  }

  void Cancel() {
    absl::MutexLock lock(&mu_);
    if (conn_ != nullptr) conn_->Cancel();
  }
  bool has_connection() {
    absl::MutexLock lock(&mu_);
    return conn_ != nullptr;
  }
  size_t spooled() {
    absl::MutexLock lock(&mu_);
    return spool_.size();
  }

  void AddTo(FleetReport* r) {
    absl::MutexLock lock(&mu_);
    r->batches_sent += batches_sent_;
    r->batches_delivered += delivered_batches_;
    r->samples_delivered += delivered_samples_;
    r->contexts_delivered += delivered_contexts_;
    r->batches_unacknowledged += spool_.size();
    r->batches_rejected += rejected_;
    r->connects += connects_;
    r->refusals += refusals_;
    r->redirects += redirects_;
    r->bytes_sent += bytes_sent_;
    r->samples_by_service[service_] += delivered_samples_;
    r->ack_latency_ms.insert(r->ack_latency_ms.end(), latencies_ms_.begin(), latencies_ms_.end());
  }
  uint64_t closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  struct Pending {
    uint64_t sequence;
    const Payload* payload;
    absl::Time first_sent;
  };

  void SendLocked(Pending& p, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::AgentMessage out;
    v1::SampleBatch* b = out.mutable_sample_batch();
    b->set_sequence(p.sequence);
    b->set_epoch(program_->epoch());
    const int64_t end_ms = absl::ToUnixMillis(now);
    b->set_end_ms(end_ms);
    b->set_start_ms(end_ms - absl::ToInt64Milliseconds(options_.interval));
    v1::Target* t = b->add_targets();
    t->set_id(1);
    t->set_service(service_);
    t->set_pid(1000 + index_);
    t->set_executable("/opt/loadgen/bin/service");
    b->set_packed_contexts(p.payload->packed_contexts);
    if (options_.requests_per_batch > 0) {
      (*b->mutable_requests())[service_] = options_.requests_per_batch;
    }
    if (p.first_sent == absl::InfiniteFuture()) p.first_sent = now;
    bytes_sent_ += out.ByteSizeLong();
    conn_->Send(std::move(out));
  }

  void Deliver(const Pending& p, absl::Time now, bool acked) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++delivered_batches_;
    delivered_samples_ += p.payload->samples;
    delivered_contexts_ += p.payload->contexts;
    if (acked && p.first_sent != absl::InfiniteFuture()) {
      latencies_ms_.push_back(absl::ToDoubleMilliseconds(now - p.first_sent));
    }
  }

  const FleetOptions& options_;
  const uint32_t index_;
  std::map<std::string, std::string> labels_;  // this agent's Hello.labels
  const Program* const program_;
  const uint64_t graph_id_;
  std::string agent_id_, host_, service_;

  absl::Mutex mu_;
  Connection* conn_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  bool redirect_pending_ ABSL_GUARDED_BY(mu_) = false;  // the stream ends with a Redirect
  rpc::Reconnector reconnect_ ABSL_GUARDED_BY(mu_);  // where and when the next stream goes
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Pending> spool_ ABSL_GUARDED_BY(mu_);
  uint64_t batches_sent_ = 0, delivered_batches_ = 0, delivered_samples_ = 0,
           delivered_contexts_ = 0, rejected_ = 0, connects_ = 0, refusals_ = 0, closed_ = 0,
           redirects_ = 0, bytes_sent_ = 0;
  std::vector<float> latencies_ms_;
};

void Connection::OnReadDone(bool ok) {
  if (!ok) return;  // the stream is over; OnDone follows
  agent_->OnMessage(this, in_);
  StartRead(&in_);
}

// The channels of each address, made as agents first connect there: one HTTP/2 connection
// per agents_per_connection agents of that address, so a fleet spread over the nodes (or sent
// to a few owners by redirects) shares connections as a single server's would. An agent keeps
// its channel of an address. Used by the driver thread only.
class ChannelPool {
 public:
  explicit ChannelPool(const FleetOptions& options) : options_(options) {
    args_.SetMaxReceiveMessageSize(64 << 20);
  }

  v1::Ingest::Stub* For(const std::string& address, uint32_t agent) {
    Address& a = addresses_[address];
    auto [it, added] = a.slot_of_agent.emplace(agent, a.agents);
    if (added) ++a.agents;
    const size_t slot = it->second / options_.agents_per_connection;
    while (a.stubs.size() <= slot) {
      grpc::ChannelArguments args = args_;
      args.SetInt("strata.loadgen.channel", static_cast<int>(a.stubs.size()));  // distinct
      a.stubs.push_back(v1::Ingest::NewStub(options_.security.CreateChannel(address, args)));
    }
    return a.stubs[slot].get();
  }

 private:
  struct Address {
    std::vector<std::unique_ptr<v1::Ingest::Stub>> stubs;
    absl::flat_hash_map<uint32_t, uint32_t> slot_of_agent;  // agent -> its rank here
    uint32_t agents = 0;
  };
  const FleetOptions& options_;
  grpc::ChannelArguments args_;
  std::map<std::string, Address> addresses_;
};

}  // namespace

FleetReport RunFleet(const FleetOptions& options,
                     const std::vector<std::unique_ptr<Program>>& programs) {
  if (options.servers.empty()) return FleetReport{};  // nowhere to send (main refuses it)
  // One HTTP/2 connection per channel, shared by agents_per_connection agents: real agents
  // have a connection each; sharing keeps the load generator's sockets and threads in check
  // while the server still sees thousands of streams over hundreds of connections.
  ChannelPool channels(options);

  std::mt19937_64 seeds(options.seed);
  // The backoffs' jitter, drawn on the driver thread (OnClosed) from one seeded generator.
  std::minstd_rand rng(static_cast<uint32_t>(options.seed));
  auto jitter = [&rng] {
    return static_cast<double>(rng() - rng.min()) / (rng.max() - rng.min() + 1.0);
  };
  std::vector<std::unique_ptr<Agent>> agents;
  for (uint32_t i = 0; i < options.agents; ++i) {
    agents.push_back(std::make_unique<Agent>(options, i, programs[i % programs.size()].get(),
                                             seeds() | 1, jitter));
  }
  Events events;

  // The driver: a heap of (time, agent, what).
  enum class Kind { kConnect, kTick };
  struct Item {
    absl::Time at;
    uint32_t agent;
    Kind kind;
    bool operator>(const Item& o) const { return at > o.at; }
  };
  std::priority_queue<Item, std::vector<Item>, std::greater<>> heap;
  const absl::Time start = absl::Now();
  const absl::Time stop_sending = start + options.duration;
  for (uint32_t i = 0; i < options.agents; ++i) {
    const absl::Time at = start + options.ramp_up * (static_cast<double>(i) / options.agents);
    heap.push({at, i, Kind::kConnect});
    heap.push({at + options.interval, i, Kind::kTick});
  }
  std::vector<absl::Duration> storms = options.storms;
  std::sort(storms.begin(), storms.end());
  size_t next_storm = 0;
  FleetReport report;

  auto handle_closed = [&](bool reconnect) {
    std::vector<std::pair<Agent*, Connection*>> closed;
    {
      absl::MutexLock lock(&events.mu);
      closed.swap(events.closed);
    }
    for (auto& [agent, conn] : closed) {
      const absl::Duration wait = agent->OnClosed();
      delete conn;
      if (reconnect) heap.push({absl::Now() + wait, agent->index(), Kind::kConnect});
    }
  };

  // Sending, then draining: ticks stop at stop_sending; connects go on until everything is
  // acknowledged or the drain times out.
  const absl::Time drain_deadline = stop_sending + options.drain_timeout;
  for (;;) {
    const absl::Time now = absl::Now();
    handle_closed(/*reconnect=*/true);
    if (next_storm < storms.size() && now >= start + storms[next_storm]) {
      for (auto& a : agents) a->Cancel();
      ++next_storm;
    }
    while (!heap.empty() && heap.top().at <= now) {
      Item item = heap.top();
      heap.pop();
      Agent& agent = *agents[item.agent];
      if (item.kind == Kind::kTick) {
        if (item.at >= stop_sending) continue;
        agent.Tick(now);
        heap.push({item.at + options.interval, item.agent, Kind::kTick});
      } else if (!agent.has_connection()) {
        agent.Connect(channels.For(agent.NextAddress(), agent.index()), &events);
      }
    }
    if (now >= stop_sending) {
      size_t spooled = 0;
      for (auto& a : agents) spooled += a->spooled();
      if (spooled == 0 || now >= drain_deadline) break;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  report.sending = options.duration;

  // Close every stream and wait for them to end.
  for (auto& a : agents) a->Cancel();
  const absl::Time close_deadline = absl::Now() + absl::Seconds(30);
  for (;;) {
    handle_closed(/*reconnect=*/false);
    bool open = false;
    for (auto& a : agents) open |= a->has_connection();
    if (!open || absl::Now() > close_deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  uint64_t closed = 0;
  for (auto& a : agents) {
    a->AddTo(&report);
    closed += a->closed();
  }
  // Every agent's last stream is closed by us; the others ended on their own.
  report.reconnects = closed > options.agents ? closed - options.agents : 0;
  std::sort(report.ack_latency_ms.begin(), report.ack_latency_ms.end());
  return report;
}

}  // namespace strata::loadgen
