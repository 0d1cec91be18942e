#include "agent/core/shipper.h"

#include <grpcpp/grpcpp.h>
#include <pthread.h>

#include <algorithm>
#include <climits>
#include <deque>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/host_port.h"
#include "common/base/log.h"
#include "common/base/split.h"
#include "common/encoding/graph_delta_edges.h"
#include "common/rpc/grpc_timers.h"

namespace strata::agent {
namespace {

constexpr size_t kMaxBytesPerRound = 4 << 20;
// Channels kept for addresses outside the configured list (redirect targets): a cluster's
// membership changes over the agent's life, and each channel holds a connection's state.
constexpr size_t kMaxRedirectChannels = 8;

// Batches that come at most this far apart (intervals of 2 s and less) are shipped without
// waiting on the stream in between (Shipper::Session): the server's messages are read when
// the next batch goes, at most this late.
constexpr absl::Duration kMaxPassiveWait = absl::Milliseconds(2500);

std::string_view TrimSpaces(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The earlier of `deadline` and the next tick of gRPC's timers, where this thread runs them.
absl::Time NextGrpcTick(absl::Time deadline) {
  if (!rpc::GrpcTimersRunOnCaller()) return deadline;
  return std::min(deadline, absl::Now() + rpc::kGrpcTimerTick);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseServerList(std::string_view list) {
  std::vector<std::string> out;
  for (std::string_view piece : base::Split(list, ',')) {
    piece = TrimSpaces(piece);
    if (piece.empty()) {
      return absl::InvalidArgumentError(
          list.empty() ? std::string("no server address")
                       : absl::StrCat("an empty address in '", std::string(list),
                                      "' (addresses are host:port, separated by commas)"));
    }
    if (absl::Status port = base::CheckAddressPort(piece); !port.ok()) return port;
    out.emplace_back(piece);
  }
  return out;
}

Shipper::Shipper(ShipperOptions options, ContextGraph* graph, spool::Spool* spool)
    : options_(std::move(options)),
      graph_(graph),
      spool_(spool),
      spooled_nodes_(graph->num_nodes()),
      spooled_edges_(graph->num_edges()) {}

Shipper::~Shipper() { Stop(); }

void Shipper::SetControlHandler(ControlHandler handler) {
  absl::MutexLock lock(&mu_);
  control_handler_ = std::move(handler);
}

void Shipper::Start() {
  thread_ = std::thread([this] { Run(); });
  pthread_setname_np(thread_.native_handle(), "strata-shipper");  // as top -H shows it
}

void Shipper::Enqueue(v1::SampleBatch batch) {
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  enqueue_gap_ = now - last_enqueue_;
  last_enqueue_ = now;
  // The graph first: a batch in the spool must be decodable after a restart.
  absl::Status st;
  while (spool_->graph_durable() &&
         (spooled_edges_ < batch.epoch() || spooled_nodes_ < graph_->num_nodes())) {
    v1::GraphDelta d = graph_->DeltaFrom(spooled_nodes_, spooled_edges_);
    if (d.nodes_size() == 0 && d.edges_size() == 0) break;
    st = spool_->AppendGraph(d);
    if (!st.ok()) {
      AbandonSpoolGraph(st);
      break;
    }
    spooled_nodes_ = d.first_node() + d.nodes_size();
    spooled_edges_ = d.first_edge() + d.edges_size();
  }
  // Kept in memory when the disk refuses it. (Written after the graph was abandoned, it is
  // dropped at a restart, and counted there.)
  absl::Status appended = spool_->Append(batch);
  const uint64_t sequence = batch.sequence();
  if (appended.ok()) {
    unsent_.push_back(std::move(batch));
    if (unsent_.size() > kMaxUnsentInMemory) unsent_.pop_front();
  }
  // Counting a batch's samples decodes it: only for the debug log.
  if (!spool_->empty() && LogEnabled(LogLevel::kDebug)) {
    const size_t last = spool_->size() - 1;
    LogDebug("spooled batch {} ({} samples)", spool_->entry(last).sequence,
             spool_->CountSamples(last));
  }
  if (st.ok()) st = appended;
  if (!st.ok() && stats_.spool_errors++ % 60 == 0) {  // a full disk would log every batch
    LogWarn("spool {}: {} (batch {} kept in memory; {} such errors)", spool_->path(),
                 std::string(st.message()), sequence, stats_.spool_errors);
  }
  // A connected session syncs once it has read the acknowledgements that came (which may
  // leave nothing to sync): it is woken now, and may not have read them yet.
  if (session_cq_ == nullptr) SyncSpoolIfDue();
  const uint64_t dropped = spool_->stats().batches_dropped;
  if (dropped > stats_.spool.batches_dropped) {
    LogWarn("spool {} full: dropped the oldest batches ({} in all, {} samples)",
                 spool_->path().empty() ? "in memory" : spool_->path(), dropped,
                 spool_->stats().samples_dropped);
  }
  stats_.spool = spool_->stats();
  WakeSessionLocked();
}

void Shipper::AbandonSpoolGraph(const absl::Status& error) {
  // Shipping goes on with the graph sent from memory (TakeRound), which the spool can then no
  // longer resume after a restart.
  LogWarn("spool {}: {}: the call graph goes on from memory; a restart starts a new one, "
          "dropping the batches spooled until then", spool_->path(), std::string(error.message()));
  spool_->AbandonGraph();
}

void Shipper::SyncSpoolIfDue() {
  absl::Status st = spool_->SyncIfDue(absl::Now());
  if (!st.ok() && stats_.spool_errors++ % 60 == 0) {
    LogWarn("spool {}: {} (unacknowledged batches written but not synced; {} such errors)",
            spool_->path(), std::string(st.message()), stats_.spool_errors);
  }
}

bool Shipper::HasWorkForSession() const {
  return stopping_ || flush_waiters_ > 0 || !statuses_.empty() ||
         !targets_sent_ ||
         (!server_ahead_ && !spool_->empty() &&
          spool_->entry(spool_->size() - 1).sequence >= next_send_);
}

std::optional<absl::Time> Shipper::PassiveWaitEnd() const {
  if (flush_waiters_ > 0 || enqueue_gap_ > kMaxPassiveWait) return std::nullopt;
  const absl::Time end = last_enqueue_ + kMaxPassiveWait;
  if (end <= absl::Now()) return std::nullopt;
  return end;
}

bool Shipper::AwaitSyncingSpool(const absl::Condition& condition, absl::Time deadline) {
  for (;;) {
    if (mu_.AwaitWithDeadline(condition, std::min(deadline, spool_->sync_due()))) return true;
    SyncSpoolIfDue();
    if (absl::Now() >= deadline) return false;
  }
}

void Shipper::SendStatus(v1::CaptureStatus status) {
  absl::MutexLock lock(&mu_);
  statuses_.push_back(std::move(status));
  WakeSessionLocked();
}

void Shipper::SetTargets(std::vector<v1::Target> targets) {
  absl::MutexLock lock(&mu_);
  auto same = [](const std::vector<v1::Target>& a, const std::vector<v1::Target>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].id() != b[i].id() || a[i].pid() != b[i].pid()) return false;
    }
    return true;
  };
  if (same(targets, targets_)) return;
  targets_ = std::move(targets);
  targets_sent_ = false;
  WakeSessionLocked();
}

bool Shipper::Flush(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  flushing_ = true;  // a reconnect waiting out its backoff goes now
  ++flush_waiters_;  // the session reads acknowledgements as they come
  auto drained = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return spool_->empty() || server_ahead_;
  };
  const bool flushed = mu_.AwaitWithTimeout(absl::Condition(&drained), timeout) && !server_ahead_;
  --flush_waiters_;
  return flushed;
}

void Shipper::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    WakeSessionLocked();
  }
  if (thread_.joinable()) thread_.join();
}

ShipperStats Shipper::stats() const {
  absl::MutexLock lock(&mu_);
  ShipperStats stats = stats_;
  stats.spool = spool_->stats();
  return stats;
}

bool Shipper::GraphPastServerLimits() const {
  absl::MutexLock lock(&mu_);
  return PastServerLimitsLocked();
}

bool Shipper::PastServerLimitsLocked() const {
  const uint32_t max_nodes = stats_.server_max_graph_nodes;
  const uint64_t max_edges = stats_.server_max_graph_edges;
  return (max_nodes > 0 && graph_->num_nodes() > max_nodes) ||
         (max_edges > 0 && graph_->num_edges() > max_edges);
}

bool Shipper::ServerAhead() const {
  absl::MutexLock lock(&mu_);
  return server_ahead_;
}

bool Shipper::NewGraphDue() const {
  absl::MutexLock lock(&mu_);
  if (server_ahead_ || PastServerLimitsLocked()) return true;
  // Caught up: at most the last two batches unacknowledged (with batches a second or less
  // apart, an acknowledgement is read only when the next batch goes). The agent's flush on
  // its way out takes them; one that fails leaves them in the spool, and the next start
  // resumes this graph until it is caught up again.
  if (!stats_.connected || spool_->size() > 2) return false;
  const uint32_t max_nodes = stats_.server_max_graph_nodes;
  const uint64_t max_edges = stats_.server_max_graph_edges;
  return (max_nodes > 0 && graph_->num_nodes() > max_nodes / 2) ||
         (max_edges > 0 && graph_->num_edges() > max_edges / 2);
}

void Shipper::Run() {
  if (options_.servers.empty()) {
    LogError("no strata-server address: batches stay in the spool");
    return;
  }
  // The shipper backs off itself (jittered, honoring the server's retry_after); gRPC's own
  // reconnect backoff, up to 120 s by default, would keep a channel failing fast long after
  // the server is back.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 250);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  // Also the time one connection attempt may take (TCP and TLS handshakes): long enough for
  // a slow host (an emulated CPU, an overloaded one) to finish a TLS handshake, short enough
  // that an attempt into a dead link is given up soon.
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 10'000);
  // Timers gRPC would keep pending for the stream's whole life: each adds wake-ups of gRPC's
  // timer thread, which refills its timer shards about once a second while any is pending.
  // The bandwidth probe only sizes what the agent receives (acks: bytes); a client's
  // keepalive is off by default, but as a 24-day timer re-armed on every read unless it is
  // INT_MAX, which gRPC reads as "never".
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, INT_MAX);
  // A channel per address, made when first used: a reconnect to an address keeps its
  // connection state (and gRPC's reconnect backoff) rather than starting a new channel.
  const std::vector<std::string>& servers = options_.servers;
  std::map<std::string, std::unique_ptr<v1::Ingest::Stub>> stubs;
  auto stub_for = [&](const std::string& address) {
    auto it = stubs.find(address);
    if (it != stubs.end()) return it->second.get();
    const bool configured = std::find(servers.begin(), servers.end(), address) != servers.end();
    if (!configured && stubs.size() >= servers.size() + kMaxRedirectChannels) {
      // Only sessions use stubs, and none runs now.
      for (auto i = stubs.begin(); i != stubs.end();) {
        const bool keep = std::find(servers.begin(), servers.end(), i->first) != servers.end();
        i = keep ? std::next(i) : stubs.erase(i);
      }
    }
    auto stub = v1::Ingest::NewStub(options_.security.CreateChannel(address, args));
    return stubs.emplace(address, std::move(stub)).first->second.get();
  };
  rpc::Reconnector reconnect({.servers = servers, .max_backoff = options_.max_backoff});
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      retry_after_ = absl::ZeroDuration();
      redirect_.reset();
    }
    const std::string address = reconnect.Connect();
    const uint64_t connects_before = stats().connects;
    Session(stub_for(address), address);
    absl::MutexLock lock(&mu_);
    if (stats_.connects != connects_before) reconnect.Welcomed();
    reconnect.RetryAfter(retry_after_);
    if (redirect_.has_value()) {
      ++stats_.redirects;
      reconnect.Redirected({redirect_->servers().begin(), redirect_->servers().end()});
      LogInfo("strata-server at {} redirects the agent to {}: {}", address,
                   reconnect.owners().empty() ? std::string("no server")
                                              : absl::StrJoin(reconnect.owners(), ", "),
                   redirect_->reason());
    }
    const absl::Duration wait = reconnect.Closed();
    if (reconnect.state() == rpc::Reconnector::State::kIdle) continue;  // to the owner, now
    if (redirect_.has_value() && !reconnect.owners().empty()) {
      LogWarn("{} redirects without a Welcome: backing off before following the next",
                   reconnect.redirects_in_a_row());
    }
    auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || flushing_; };
    // Where this thread runs gRPC's timers it ticks them while it waits: gRPC's own reconnect
    // backoff and the backup poller that completes a connection made meanwhile keep pace.
    const absl::Time retry_at = absl::Now() + wait;
    while (!AwaitSyncingSpool(absl::Condition(&stop), NextGrpcTick(retry_at))) {
      if (absl::Now() >= retry_at) break;
      mu_.Unlock();
      rpc::TickGrpcTimers();
      mu_.Lock();
    }
    if (stopping_) return;
    if (flushing_) {
      // Once, then the backoff again: a server that is still away is not hammered.
      flushing_ = false;
      reconnect.SkipBackoff();
    }
  }
}

void Shipper::HandleServerMessage(const v1::ServerMessage& m) {
  switch (m.kind_case()) {
    case v1::ServerMessage::kAck: {
      const size_t before = spool_->size();
      spool_->AckThrough(m.ack().sequence());
      stats_.batches_acked += before - spool_->size();
      LogDebug("acknowledged through batch {}", m.ack().sequence());
      break;
    }
    case v1::ServerMessage::kResync:
      LogInfo("server asks to resend the graph from node {} / edge {}: {}",
                   m.resync().from_node(), m.resync().from_edge(), m.resync().reason());
      sent_nodes_ = m.resync().from_node();
      sent_edges_ = m.resync().from_edge();
      break;
    case v1::ServerMessage::kError: {
      const auto& e = m.error();
      const bool retryable = e.code() == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION) ||
                             e.code() == static_cast<int>(grpc::StatusCode::RESOURCE_EXHAUSTED) ||
                             e.code() == static_cast<int>(grpc::StatusCode::UNAVAILABLE);
      if (e.fatal()) {
        // The server ends the stream: everything unacknowledged goes again, in order, after
        // the reconnect (no sooner than it asked).
        retry_after_ = std::max(retry_after_, absl::Milliseconds(e.retry_after_ms()));
        LogWarn("server ends the stream: {} (retry in {} ms)", e.message(),
                     e.retry_after_ms());
        if (retryable) break;
      }
      // FailedPrecondition: the batch referenced graph the server lacked (Resync came with
      // it), or waits for such a batch; ResourceExhausted: the server is short of memory;
      // Unavailable: its store cannot write. All are resent. Anything else is permanent: drop
      // the batch.
      if (e.sequence() != 0 && retryable) {
        next_send_ = std::min(next_send_, e.sequence());
      } else if (e.sequence() != 0) {
        LogError("server rejected batch {}: {}", e.sequence(), e.message());
        const size_t before = spool_->size();
        spool_->Remove(e.sequence());
        stats_.batches_rejected += before - spool_->size();
      }
      if (e.sequence() == 0) LogError("server reported: {}", e.message());
      break;
    }
    case v1::ServerMessage::kRedirect:
      // The server ends the stream after it; Run() follows it.
      redirect_ = m.redirect();
      break;
    default:
      if (control_handler_) control_handler_(m);
      break;
  }
}

v1::AgentMessage Shipper::Heartbeat() {
  v1::AgentMessage m;
  v1::Heartbeat* hb = m.mutable_heartbeat();
  hb->set_time_ms(absl::ToUnixMillis(absl::Now()));
  const spool::SpoolStats spool = spool_->stats();
  v1::AgentHealth* h = hb->mutable_health();
  h->set_spool_batches(spool.batches);
  h->set_spool_bytes(spool.bytes);
  h->set_spool_dropped_batches(spool.batches_dropped);
  h->set_spool_dropped_samples(spool.samples_dropped);
  h->set_spool_write_errors(spool.write_errors);
  h->set_spool_corrupt_records(options_.spool_corrupt_records);
  h->set_spool_orphaned_batches(options_.spool_orphaned_batches);
  h->set_spool_on_disk(!spool_->path().empty());
  h->set_graph_nodes(graph_->num_nodes());
  h->set_graph_edges(graph_->num_edges());
  return m;
}

namespace {

// Tags of a session's completion queue. The stream has at most one read, one write and one
// wake-up in flight, and the handshake one operation at a time.
void* const kStarted = reinterpret_cast<void*>(1);
void* const kWritten = reinterpret_cast<void*>(2);
void* const kReadDone = reinterpret_cast<void*>(3);
void* const kFinished = reinterpret_cast<void*>(4);
void* const kWoken = reinterpret_cast<void*>(5);

// The outcome of the one operation in flight, `tag`. Ticks gRPC's timers while it waits: a
// connection being made ends at its deadline.
bool AwaitOne(grpc::CompletionQueue& cq, void* tag) {
  void* got = nullptr;
  bool ok = false;
  for (;;) {
    switch (cq.AsyncNext(&got, &ok, absl::ToChronoTime(NextGrpcTick(absl::InfiniteFuture())))) {
      case grpc::CompletionQueue::GOT_EVENT:
        return ok && got == tag;
      case grpc::CompletionQueue::SHUTDOWN:
        return false;
      case grpc::CompletionQueue::TIMEOUT:
        rpc::TickGrpcTimers();
        break;
    }
  }
}

}  // namespace

void Shipper::WakeSessionLocked() {
  // A session asleep on mu_ wakes when the lock is released with work for it.
  if (session_alarm_ == nullptr || wake_pending_ || session_asleep_) return;
  wake_pending_ = true;
  // A deadline already past: the alarm fires at once, from this thread, with no timer.
  session_alarm_->Set(session_cq_, gpr_inf_past(GPR_CLOCK_MONOTONIC), kWoken);
}

void Shipper::TakeRound(std::deque<v1::AgentMessage>* out) {
  if (!targets_sent_) {
    v1::AgentMessage m = Heartbeat();
    for (const auto& t : targets_) *m.mutable_heartbeat()->add_targets() = t;
    m.mutable_heartbeat()->set_targets_listed(true);
    out->push_back(std::move(m));
    targets_sent_ = true;
  }
  while (!statuses_.empty()) {
    v1::AgentMessage m;
    *m.mutable_capture_status() = std::move(statuses_.front());
    statuses_.pop_front();
    out->push_back(std::move(m));
  }
  if (server_ahead_) return;
  // A bounded part of the spool per round: after a long outage it is far larger than the
  // agent's memory should be.
  size_t out_bytes = 0;
  for (size_t i = 0; i < spool_->size() && out_bytes < kMaxBytesPerRound; ++i) {
    const spool::Spool::Entry& entry = spool_->entry(i);
    if (entry.sequence < next_send_) continue;
    // A batch enqueued since the last round is still in memory (older ones in unsent_ were
    // sent, or dropped from a full spool).
    while (!unsent_.empty() && unsent_.front().sequence() < entry.sequence) unsent_.pop_front();
    absl::StatusOr<v1::SampleBatch> batch;
    if (!unsent_.empty() && unsent_.front().sequence() == entry.sequence) {
      batch = std::move(unsent_.front());
      unsent_.pop_front();
    } else {
      batch = spool_->Read(i);
    }
    if (!batch.ok()) {
      // Unreadable (the disk changed under us): it can never be sent.
      LogError("spool: batch {} lost: {}", entry.sequence, batch.status().ToString());
      spool_->Remove(entry.sequence);
      --i;
      continue;
    }
    // The graph the batch needs, in messages of bounded size. No further than the spool
    // recorded and synced it: a restart (after a power loss too) resumes the spool's graph,
    // and the server must not know nodes or edges there that the resumed graph would number
    // otherwise.
    const bool unsent = sent_nodes_ < spooled_nodes_ || sent_edges_ < spooled_edges_;
    if (unsent && spool_->graph_durable()) {
      if (absl::Status synced = spool_->SyncGraph(); !synced.ok()) AbandonSpoolGraph(synced);
    }
    const bool durable = spool_->graph_durable();
    const uint32_t node_end = durable ? spooled_nodes_ : graph_->num_nodes();
    const uint64_t edge_end = durable ? spooled_edges_ : graph_->num_edges();
    while ((sent_edges_ < batch->epoch() || sent_nodes_ < node_end) &&
           (sent_nodes_ < node_end || sent_edges_ < edge_end)) {
      // (DeltaFrom starts at the first function node at the earliest.)
      const uint32_t first_node = std::max(sent_nodes_, encoding::kFirstFunctionNode);
      const uint32_t max_nodes =
          std::min(ContextGraph::kMaxDeltaNodes, node_end - std::min(first_node, node_end));
      const uint32_t max_edges = static_cast<uint32_t>(std::min<uint64_t>(
          ContextGraph::kMaxDeltaEdges, edge_end - std::min(sent_edges_, edge_end)));
      v1::AgentMessage delta;
      *delta.mutable_graph_delta() =
          graph_->DeltaFrom(sent_nodes_, sent_edges_, max_nodes, max_edges);
      const v1::GraphDelta& d = delta.graph_delta();
      sent_nodes_ = d.first_node() + d.nodes_size();
      sent_edges_ = d.first_edge() + d.edges_size();
      if (d.nodes_size() == 0 && d.edges_size() == 0) break;
      encoding::PackDeltaEdges(delta.mutable_graph_delta());
      out->push_back(std::move(delta));
    }
    v1::AgentMessage m;
    *m.mutable_sample_batch() = std::move(*batch);
    out_bytes += m.ByteSizeLong();
    out->push_back(std::move(m));
    next_send_ = entry.sequence + 1;
  }
}

void Shipper::Session(v1::Ingest::Stub* stub, const std::string& address) {
  // One thread and one completion queue for the stream's writes, reads and wake-ups: a batch
  // written and its acknowledgement read cross no other thread.
  grpc::ClientContext context;
  options_.security.Authorize(&context);
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::ClientAsyncReaderWriter<v1::AgentMessage, v1::ServerMessage>> stream =
      stub->PrepareAsyncConnect(&context, &cq);
  // Every operation started is waited for before the queue goes.
  auto finish = [&](grpc::Status* status) {
    stream->Finish(status, kFinished);
    (void)AwaitOne(cq, kFinished);
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
  };
  v1::AgentMessage hello_message;
  v1::Hello* hello = hello_message.mutable_hello();
  hello->set_agent_id(options_.agent_id);
  hello->set_host(options_.host);
  hello->set_arch(options_.arch);
  hello->set_version(options_.version);
  hello->set_graph_id(graph_->graph_id());
  hello->set_frequency_hz(options_.frequency_hz);
  for (const auto& [k, v] : options_.labels) (*hello->mutable_labels())[k] = v;
  v1::ServerMessage welcome;
  stream->StartCall(kStarted);
  bool ok = AwaitOne(cq, kStarted);
  if (ok) {
    stream->Write(hello_message, kWritten);
    ok = AwaitOne(cq, kWritten);
  }
  if (ok) {
    stream->Read(&welcome, kReadDone);
    ok = AwaitOne(cq, kReadDone);
  }
  if (!ok || !welcome.has_welcome()) {
    if (welcome.has_redirect()) {
      // The Redirect is the server's last message: the agent leaves without waiting for the
      // stream's end.
      context.TryCancel();
      absl::MutexLock lock(&mu_);
      redirect_ = welcome.redirect();
    }
    // A server that refuses the stream may end it before the Hello is written; its error
    // message is then still unread, and Finish would wait for ever for a status that gRPC
    // delivers only after every message has been read.
    v1::ServerMessage unread;
    for (;;) {
      stream->Read(&unread, kReadDone);
      if (!AwaitOne(cq, kReadDone)) break;
      if (!welcome.has_error() && unread.has_error()) welcome = std::move(unread);
    }
    if (welcome.has_error() && welcome.error().retry_after_ms() > 0) {
      // Refused for now (the server holds its maximum of agents): come back later.
      absl::MutexLock lock(&mu_);
      retry_after_ = absl::Milliseconds(welcome.error().retry_after_ms());
    }
    grpc::Status status;
    finish(&status);
    if (welcome.has_redirect()) return;  // Run() logs it
    LogWarn("cannot connect to strata-server at {}: {}{}", address,
            status.ok() ? "stream closed" : status.error_message(),
            options_.security.ConnectionErrorHint(status.error_message()));
    return;
  }
  grpc::Alarm alarm;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.connects;
    stats_.connected = true;
    const v1::Welcome& w = welcome.welcome();
    sent_nodes_ = w.known_nodes();
    sent_edges_ = w.known_edges();
    // More than the agent has: its spool was restored from an older copy (see ServerAhead()).
    const uint64_t reserved = spool_->sequences_reserved();
    const bool sequence_ahead =
        reserved > 0 && spool_->graph_durable() && w.last_applied_sequence() > reserved;
    if (!server_ahead_ && (sequence_ahead || w.known_nodes() > graph_->num_nodes() ||
                           w.known_edges() > graph_->num_edges())) {
      server_ahead_ = true;
      LogError("strata-server at {} holds more of this agent's incarnation than the agent ({} "
               "nodes, {} edges, batches to {}; the agent: {}, {}, {}): its spool was restored "
               "from an older copy. Nothing more goes under this call graph; starting a new one",
               address, w.known_nodes(), w.known_edges(), w.last_applied_sequence(),
               graph_->num_nodes(), graph_->num_edges(), reserved);
    }
    stats_.server_max_graph_nodes = w.max_graph_nodes();
    stats_.server_max_graph_edges = w.max_graph_edges();
    // Batches the server applied before a lost Ack are done; the rest go (again). (A server
    // ahead applied others under their numbers: they are dropped, not done.)
    const size_t before = spool_->size();
    if (!server_ahead_) spool_->AckThrough(w.last_applied_sequence());
    stats_.batches_acked += before - spool_->size();
    next_send_ = 0;
    targets_sent_ = false;
    session_cq_ = &cq;
    session_alarm_ = &alarm;
    wake_pending_ = false;
  }
  LogInfo("connected to strata-server at {} (server has {} nodes, {} edges)",
               address, welcome.welcome().known_nodes(), welcome.welcome().known_edges());

  v1::ServerMessage incoming;
  stream->Read(&incoming, kReadDone);
  bool read_pending = true;
  std::deque<v1::AgentMessage> queue;  // the round's messages; the first is being written
  bool write_pending = false;
  bool broken = false;
  absl::Time last_heartbeat = absl::Now();
  // Posts the next read unless one is pending. Not as soon as a message was read: a read posted
  // while nothing waits in the transport and its window is short of what was read announces
  // the window at once, in a write of its own (gRPC's chttp2 flow control); posted after the
  // next write began, or with the next message already received, it finds the window topped
  // up by that write or leaves the update for it. So it is posted after a round's last write
  // (one held for the next by the buffer hint would be flushed by the read's update) and
  // before the thread waits on the stream with no write in flight; a thread asleep on mu_
  // (passive) needs none pending.
  auto post_read = [&] {
    if (read_pending || broken) return;
    stream->Read(&incoming, kReadDone);
    read_pending = true;
  };
  // Handles the completion of `tag`.
  auto handle = [&](void* tag, bool op_ok) {
    if (tag == kReadDone) {
      read_pending = false;
      if (!op_ok) {
        broken = true;
        return;
      }
      bool unacknowledged;
      {
        absl::MutexLock lock(&mu_);
        HandleServerMessage(incoming);
        unacknowledged = !spool_->empty() && spool_->entry(0).sequence < next_send_;
      }
      // The next read is posted by post_read(), not here (see there), but while batches sent
      // wait for their acknowledgements: a round that resent a backlog gets one for each, and
      // reading one a round (passive) would leave the spool that far behind for good.
      if (unacknowledged) post_read();
    } else if (tag == kWritten) {
      write_pending = false;
      if (!op_ok) {
        broken = true;
        return;
      }
      const size_t bytes = queue.front().ByteSizeLong();
      queue.pop_front();
      absl::MutexLock lock(&mu_);
      stats_.bytes_sent += bytes;
    } else if (tag == kWoken) {
      absl::MutexLock lock(&mu_);
      wake_pending_ = false;
    }
  };
  // Handles what has completed, without waiting. Until the queue is empty twice in a row: a
  // call that finds the queue kicked (an operation completed while no thread polled) returns
  // without reading the socket.
  auto read_arrived = [&] {
    void* tag = nullptr;
    bool op_ok = false;
    for (int empty = 0; !broken && empty < 2;) {
      if (cq.AsyncNext(&tag, &op_ok, gpr_time_0(GPR_CLOCK_MONOTONIC)) ==
          grpc::CompletionQueue::GOT_EVENT) {
        handle(tag, op_ok);
        empty = 0;
      } else {
        ++empty;
      }
    }
  };
  for (;;) {
    // Whatever woke this thread: gRPC's timers that fell due meanwhile (none matters to a
    // connected stream: the reads and writes end it when it breaks).
    rpc::TickGrpcTimers();
    absl::Time heartbeat_due;
    absl::Time deadline;
    std::optional<absl::Time> passive_until;
    {
      absl::MutexLock lock(&mu_);
      SyncSpoolIfDue();
      // After a Redirect nothing more goes to this server: the owners get it all. Stop after
      // the spool is acknowledged or the caller gave up waiting (Flush).
      if (broken || stopping_ || redirect_.has_value()) break;
      // The next round once this one is written: at most kMaxBytesPerRound in memory.
      const bool new_round = queue.empty();
      if (new_round) TakeRound(&queue);
      // A heartbeat, with the agent's health, every period whether or not batches flow: it
      // keeps an idle stream alive, and an agent that ships every interval still reports its
      // health. Past half its period it goes with whatever this round writes, so an agent
      // whose interval is about the period wakes for no heartbeat of its own (one due alone
      // waits a tenth of a period more for a batch to go with).
      const absl::Duration since_heartbeat = absl::Now() - last_heartbeat;
      if (new_round && (since_heartbeat > options_.heartbeat ||
                        (!queue.empty() && since_heartbeat > options_.heartbeat / 2))) {
        queue.push_back(Heartbeat());
        last_heartbeat = absl::Now();
      }
      heartbeat_due = last_heartbeat + options_.heartbeat + options_.heartbeat / 10;
      deadline = std::min(heartbeat_due, spool_->sync_due());
      passive_until = PassiveWaitEnd();
    }
    if (!write_pending && !queue.empty()) {
      // The round's messages but its last wait in the transport for the next, so a batch
      // and the graph delta or heartbeat before it leave in one write, not one each. Such a
      // write completes at once (the transport writes on its own past its 64 KiB write
      // buffer); the last is written without the hint and flushes them.
      grpc::WriteOptions options;
      if (queue.size() > 1) options.set_buffer_hint();
      stream->Write(queue.front(), options, kWritten);
      write_pending = true;
      if (!options.get_buffer_hint()) post_read();
    }
    void* tag = nullptr;
    bool op_ok = false;
    if (passive_until.has_value() && queue.empty() && !write_pending) {
      // Batches come often (short intervals): rather than wake for the acknowledgement that
      // follows each one (and announce the read's window in a write of its own), read what
      // has arrived when the next batch goes. A thread waiting on the stream is woken for
      // every message; one waiting on mu_ only for work. The spool's sync waits for that
      // read too: the acknowledgements read may leave nothing to sync.
      read_arrived();
      if (broken || !queue.empty() || write_pending) continue;
      {
        absl::MutexLock lock(&mu_);
        session_asleep_ = true;
        mu_.AwaitWithDeadline(absl::Condition(this, &Shipper::HasWorkForSession),
                              std::min(heartbeat_due, *passive_until));
        session_asleep_ = false;
      }
      read_arrived();
      continue;
    }
    if (!write_pending) post_read();
    const grpc::CompletionQueue::NextStatus next =
        cq.AsyncNext(&tag, &op_ok, absl::ToChronoTime(deadline));
    if (next == grpc::CompletionQueue::TIMEOUT) continue;
    if (next == grpc::CompletionQueue::SHUTDOWN) break;
    handle(tag, op_ok);
  }
  bool alarm_pending;
  {
    // No other thread sets the alarm from here on.
    absl::MutexLock lock(&mu_);
    session_alarm_ = nullptr;
    session_cq_ = nullptr;
    alarm_pending = wake_pending_;
    wake_pending_ = false;
  }
  if (alarm_pending) alarm.Cancel();
  // Ends the stream; the read, write and wake-up in flight come back (failed) first.
  context.TryCancel();
  while (read_pending || write_pending || alarm_pending) {
    void* tag = nullptr;
    bool op_ok = false;
    if (!cq.Next(&tag, &op_ok)) break;
    read_pending &= tag != kReadDone;
    write_pending &= tag != kWritten;
    alarm_pending &= tag != kWoken;
  }
  grpc::Status status;
  finish(&status);
  absl::MutexLock lock(&mu_);
  stats_.connected = false;
  if (!stopping_ && !redirect_.has_value()) {
    // CANCELLED is this side's own TryCancel() above, after a read or write failed.
    LogWarn("connection to strata-server at {} lost: {}", address,
            status.ok() || status.error_code() == grpc::StatusCode::CANCELLED
                ? "the server ended the stream or the connection broke"
                : status.error_message());
  }
}

}  // namespace strata::agent
