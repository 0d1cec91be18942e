// Fuzz target: the server's ingest path for one agent stream, fed whole AgentMessages: the
// dispatch of server/ingest/ingest_service.cc (IngestService::Stream::Handle/HandleHello/
// HandleBatch) over the real AgentSession, shape checks (limits.h), AgentRegistry, a
// WindowAggregator as the batch committer (as strata-server wires it) and a real RocksDB
// Store in a temporary directory.
//
// Input: AgentMessages, each preceded by its length as a varint (protobuf's delimited
// format). The first must be a valid Hello, as on a real stream. After it, a message with no
// kind set stands for a reconnect (the harness drops the session and opens it again for the
// same identity, so the persisted graph is reloaded); a message that would end the stream
// ends the input.
//
// The Store and aggregator live across inputs (opening RocksDB per input would dominate);
// each input's agent incarnation gets a graph ID of its own, so inputs do not see each
// other's graphs or sequence numbers. The store is replaced every few hundred inputs.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/encoding/packed_contexts.h"
#include "fuzz/fuzz_util.h"
#include "google/protobuf/stubs/logging.h"
#include "server/aggregate/window_aggregator.h"
#include "server/ingest/agent_session.h"
#include "server/ingest/ingest_service.h"
#include "server/ingest/limits.h"
#include "server/store/store.h"
#include "spdlog/spdlog.h"
#include "strata/v1/ingest.pb.h"

namespace {

namespace server = strata::server;
namespace v1 = strata::v1;

constexpr uint64_t kInputsPerStore = 512;

struct Backend {
  std::string dir;
  std::unique_ptr<strata::server::store::Store> store;
  std::unique_ptr<server::aggregate::WindowAggregator> aggregator;
  uint64_t inputs = 0;
  uint64_t generation = 0;

  void Reset() {
    aggregator.reset();
    store.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
    dir = strata::fuzz::ScratchDir() + "/store-" + std::to_string(generation++);
    auto s = strata::server::store::Store::Open(dir, {});
    STRATA_FUZZ_CHECK(s.ok(), "Store::Open: %s", s.status().ToString().c_str());
    store = std::move(*s);
    server::aggregate::AggregatorOptions options;
    // Small tables and budget, so capacity flushes, growth and budget refusals happen.
    options.max_entries = 1024;
    options.initial_entries = 16;
    options.memory_budget_bytes = 256 << 10;
    auto a = server::aggregate::WindowAggregator::Create(store.get(), options);
    STRATA_FUZZ_CHECK(a.ok(), "WindowAggregator::Create: %s", a.status().ToString().c_str());
    aggregator = std::move(*a);
    inputs = 0;
  }
};

Backend& GetBackend() {
  static Backend* backend = [] {
    spdlog::set_level(spdlog::level::off);
    auto* b = new Backend;
    b->Reset();
    return b;
  }();
  if (backend->inputs++ >= kInputsPerStore) backend->Reset();
  return *backend;
}

// One stream's state, as IngestService::Stream keeps it.
class Stream {
 public:
  Stream(Backend* backend, server::registry::AgentRegistry* registry,
         const server::ingest::IngestLimits& limits, uint64_t graph_salt)
      : backend_(backend), registry_(registry), limits_(limits), graph_salt_(graph_salt) {}
  ~Stream() {
    if (session_ != nullptr) registry_->Detach(session_->identity().agent_id, attachment_);
  }

  // false: the stream ends (as when Handle returns an error).
  bool Handle(const v1::AgentMessage& message) {
    if (session_ == nullptr) return HandleHello(message);
    switch (message.kind_case()) {
      case v1::AgentMessage::kGraphDelta: {
        absl::Status st = session_->ApplyGraphDelta(message.graph_delta());
        if (absl::IsFailedPrecondition(st)) return true;  // Resync
        return st.ok();
      }
      case v1::AgentMessage::kSampleBatch:
        return HandleBatch(message.sample_batch());
      case v1::AgentMessage::kHeartbeat:
        if (server::ingest::CheckHeartbeat(message.heartbeat(), limits_).ok()) {
          if (message.heartbeat().targets_size() > 0) {
            registry_->SetTargets(session_->identity().agent_id, message.heartbeat().targets());
          }
        }
        return true;
      case v1::AgentMessage::kCaptureStatus:
        (void)server::ingest::CheckCaptureStatus(message.capture_status(), limits_);
        return true;
      case v1::AgentMessage::KIND_NOT_SET:
        return Reconnect();
      case v1::AgentMessage::kHello:
      default:
        return true;  // rejected, the stream goes on
    }
  }

 private:
  bool HandleHello(const v1::AgentMessage& message) {
    if (!message.has_hello()) return false;
    const v1::Hello& hello = message.hello();
    if (!server::ingest::CheckHello(hello, limits_).ok()) return false;
    identity_ = {hello.agent_id(), hello.host(), hello.arch(), hello.version(),
                 hello.graph_id() ^ graph_salt_};
    if (!Open()) return false;
    absl::StatusOr<uint64_t> attachment =
        registry_->Attach(server::ingest::DescriptorOf(identity_), hello.frequency_hz(),
                          [](const v1::ServerMessage&) { return false; });
    if (!attachment.ok()) return false;
    attachment_ = *attachment;
    return true;
  }

  bool Open() {
    auto session = server::ingest::AgentSession::Open(backend_->store.get(), identity_,
                                              backend_->aggregator.get(), limits_);
    if (!session.ok()) return false;
    session_ = std::move(*session);
    return true;
  }

  bool Reconnect() {
    const uint32_t nodes = session_->num_nodes();
    const uint64_t edges = session_->num_edges();
    const uint64_t applied = session_->last_applied_sequence();
    session_.reset();
    if (!Open()) return false;
    // What the session accepted is in the store: a reconnect sees all of it.
    STRATA_FUZZ_CHECK(session_->num_nodes() == nodes && session_->num_edges() == edges &&
                          session_->last_applied_sequence() == applied,
                      "reconnect lost state: %u/%u nodes, %llu/%llu edges, seq %llu/%llu",
                      session_->num_nodes(), nodes,
                      static_cast<unsigned long long>(session_->num_edges()),
                      static_cast<unsigned long long>(edges),
                      static_cast<unsigned long long>(session_->last_applied_sequence()),
                      static_cast<unsigned long long>(applied));
    return true;
  }

  bool HandleBatch(const v1::SampleBatch& batch) {
    auto applied = session_->ApplyBatch(batch);
    if (!applied.ok()) {
      const absl::Status& st = applied.status();
      return !(absl::IsResourceExhausted(st) || absl::IsUnavailable(st));
    }
    if (!applied->duplicate) {
      STRATA_FUZZ_CHECK(session_->last_applied_sequence() == batch.sequence(),
                        "applied batch %llu, session says %llu",
                        static_cast<unsigned long long>(batch.sequence()),
                        static_cast<unsigned long long>(session_->last_applied_sequence()));
      registry_->RecordBatch(session_->identity().agent_id, batch);
    }
    return true;
  }

  Backend* backend_;
  server::registry::AgentRegistry* registry_;
  const server::ingest::IngestLimits& limits_;
  const uint64_t graph_salt_;
  server::ingest::AgentIdentity identity_;
  std::unique_ptr<server::ingest::AgentSession> session_;
  uint64_t attachment_ = 0;  // in the registry
};

}  // namespace

// Protobuf logs every string field that is not UTF-8; fuzz inputs are full of them.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static uint64_t run = 0;
  Backend& backend = GetBackend();
  const server::ingest::IngestLimits limits;
  server::registry::AgentRegistry registry(16);
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  {
    Stream stream(&backend, &registry, limits, ++run * 0x9e3779b97f4a7c15ull);
    size_t pos = 0;
    while (pos < bytes.size()) {
      uint64_t length = 0;
      if (!strata::encoding::ReadVarint(bytes, &pos, &length)) break;
      length = std::min<uint64_t>(length, bytes.size() - pos);
      v1::AgentMessage message;
      const bool parsed = message.ParseFromArray(bytes.data() + pos, static_cast<int>(length));
      pos += length;
      if (!parsed || !stream.Handle(message)) break;  // the transport or the server ends it
    }
    (void)registry.List();
  }
  (void)backend.aggregator->FlushAll();
  return 0;
}
