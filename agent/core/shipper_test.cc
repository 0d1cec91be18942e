// The shipper against a real gRPC ingest server on loopback (a scripted stand-in for
// strata-server's Ingest service): batches go out in sequence order and leave the spool when
// acknowledged, refused batches are resent, and batches spooled while the server is away go
// out after it comes back.
#include "agent/core/shipper.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/core/context_graph.h"
#include "agent/spool/spool.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.grpc.pb.h"

namespace strata::agent {
namespace {

// Applies batches in sequence order like strata-server: the next one is applied and
// acknowledged, one already applied is acknowledged again, one past a gap is refused as
// FAILED_PRECONDITION (resend). What it applied survives a restart (the store's record).
class FakeIngest final : public v1::Ingest::Service {
 public:
  grpc::Status Connect(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::AgentMessage>* stream) override {
    v1::AgentMessage hello;
    if (!stream->Read(&hello) || !hello.has_hello()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no hello");
    }
    v1::ServerMessage welcome;
    {
      absl::MutexLock lock(&mu_);
      ++connects_;
      agent_id_ = hello.hello().agent_id();
      welcome.mutable_welcome()->set_last_applied_sequence(applied_.empty() ? 0 : applied_.back());
    }
    if (!stream->Write(welcome)) return grpc::Status::OK;
    v1::AgentMessage m;
    while (stream->Read(&m)) {
      if (!m.has_sample_batch()) continue;
      const uint64_t sequence = m.sample_batch().sequence();
      v1::ServerMessage reply;
      bool end_stream = false;
      {
        absl::MutexLock lock(&mu_);
        received_.push_back(sequence);
        const uint64_t last = applied_.empty() ? 0 : applied_.back();
        v1::IngestError* error = reply.mutable_error();
        error->set_sequence(sequence);
        if (refuse_ != nullptr && refuse_->sequence == sequence && refuse_->times > 0) {
          --refuse_->times;
          error->set_code(static_cast<int>(refuse_->code));
          error->set_message("refused by the test");
          error->set_fatal(refuse_->fatal);
          error->set_retry_after_ms(refuse_->retry_after_ms);
          end_stream = refuse_->fatal;
        } else if (sequence == last + 1 || sequence <= last) {
          if (sequence == last + 1) applied_.push_back(sequence);
          reply.mutable_ack()->set_sequence(sequence);
        } else {
          error->set_code(static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
          error->set_message("waits for an earlier batch");
        }
      }
      if (!stream->Write(reply)) break;
      if (end_stream) return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "refused");
    }
    (void)context;
    return grpc::Status::OK;
  }

  struct Refusal {
    uint64_t sequence;
    grpc::StatusCode code;
    bool fatal;
    uint32_t retry_after_ms;
    int times;
  };
  void Refuse(Refusal refusal) {
    absl::MutexLock lock(&mu_);
    refusal_storage_ = refusal;
    refuse_ = &refusal_storage_;
  }

  std::vector<uint64_t> applied() const {
    absl::MutexLock lock(&mu_);
    return applied_;
  }
  std::vector<uint64_t> received() const {
    absl::MutexLock lock(&mu_);
    return received_;
  }
  int connects() const {
    absl::MutexLock lock(&mu_);
    return connects_;
  }
  std::string agent_id() const {
    absl::MutexLock lock(&mu_);
    return agent_id_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<uint64_t> applied_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> received_ ABSL_GUARDED_BY(mu_);
  int connects_ ABSL_GUARDED_BY(mu_) = 0;
  std::string agent_id_ ABSL_GUARDED_BY(mu_);
  Refusal refusal_storage_ ABSL_GUARDED_BY(mu_){};
  Refusal* refuse_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// A gRPC server for `service` at `address`.
std::unique_ptr<grpc::Server> Serve(FakeIngest* service, const std::string& address) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(service);
  return builder.BuildAndStart();
}

std::vector<uint64_t> Range(uint64_t first, uint64_t last) {
  std::vector<uint64_t> out;
  for (uint64_t s = first; s <= last; ++s) out.push_back(s);
  return out;
}

class ShipperTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spool::SpoolIdentity identity{"shipper-test", "test-host", 0x5eed};
    spool::SpoolRecovery recovery;
    auto opened = spool::Spool::Open(
        spool::SpoolOptions{}, identity,
        [](const spool::SpoolIdentity&, const v1::GraphDelta&) { return absl::OkStatus(); },
        &recovery);
    ASSERT_TRUE(opened.ok()) << opened.status();
    spool_ = std::move(*opened);
  }

  void TearDown() override {
    if (shipper_ != nullptr) shipper_->Stop();
    if (server_ != nullptr) StopServer();
  }

  // The ingest server at address_. A Unix socket of the test's own: a restarted server gets
  // the same address back, which a TCP port freed in between might not be.
  void StartServer() {
    server_ = Serve(&ingest_, address_);
    ASSERT_NE(server_, nullptr);
  }
  void StopServer() {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    server_->Wait();
    server_.reset();
  }

  void StartShipper() {
    ShipperOptions options;
    options.server = address_;
    options.agent_id = "shipper-test";
    options.host = "test-host";
    options.arch = "x86_64";
    options.max_backoff = absl::Seconds(1);
    shipper_ = std::make_unique<Shipper>(std::move(options), &graph_, spool_.get());
    shipper_->Start();
  }

  static v1::SampleBatch Batch(uint64_t sequence) {
    v1::SampleBatch batch;
    batch.set_sequence(sequence);
    batch.set_start_ms(static_cast<int64_t>(sequence) * 1000);
    batch.set_end_ms(static_cast<int64_t>(sequence + 1) * 1000);
    return batch;
  }

  void Enqueue(uint64_t first, uint64_t last) {
    for (uint64_t s = first; s <= last; ++s) shipper_->Enqueue(Batch(s));
  }

  ContextGraph graph_{0x5eed};
  std::unique_ptr<spool::Spool> spool_;
  FakeIngest ingest_;  // keeps what it applied across server restarts, like the store
  const std::string address_ =
      absl::StrCat("unix:", ::testing::TempDir(), "shipper_test_", getpid(), "_",
                   ::testing::UnitTest::GetInstance()->current_test_info()->name(), ".sock");
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Shipper> shipper_;
};

constexpr absl::Duration kFlushTimeout = absl::Seconds(30);

TEST_F(ShipperTest, ShipsBatchesInOrderAndForgetsThemOnceAcknowledged) {
  StartServer();
  StartShipper();
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 5));
  EXPECT_EQ(ingest_.received(), Range(1, 5));
  EXPECT_EQ(ingest_.agent_id(), "shipper-test");
  EXPECT_TRUE(spool_->empty());
  const ShipperStats stats = shipper_->stats();
  EXPECT_EQ(stats.batches_acked, 5u);
  EXPECT_EQ(stats.connects, 1u);
}

TEST_F(ShipperTest, ResendsABatchRefusedAsUnavailable) {
  ingest_.Refuse({.sequence = 2, .code = grpc::StatusCode::UNAVAILABLE, .fatal = false,
                  .retry_after_ms = 0, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 4);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 4));
  const std::vector<uint64_t> received = ingest_.received();
  EXPECT_EQ(std::count(received.begin(), received.end(), 2u), 2)
      << ::testing::PrintToString(received);
  EXPECT_EQ(shipper_->stats().batches_rejected, 0u);
  EXPECT_EQ(shipper_->stats().connects, 1u);  // the stream stayed open
}

TEST_F(ShipperTest, ReconnectsAndResendsAfterTheServerEndsTheStreamForResources) {
  ingest_.Refuse({.sequence = 3, .code = grpc::StatusCode::RESOURCE_EXHAUSTED, .fatal = true,
                  .retry_after_ms = 100, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 5);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 5));
  EXPECT_GE(ingest_.connects(), 2);
  EXPECT_GE(shipper_->stats().connects, 2u);
  EXPECT_EQ(shipper_->stats().batches_rejected, 0u);
}

TEST_F(ShipperTest, DropsABatchTheServerRejectsPermanently) {
  ingest_.Refuse({.sequence = 2, .code = grpc::StatusCode::INVALID_ARGUMENT, .fatal = false,
                  .retry_after_ms = 0, .times = 1});
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 1));
  EXPECT_EQ(shipper_->stats().batches_rejected, 1u);
}

TEST_F(ShipperTest, SpoolsWhileTheServerIsAwayAndDeliversWhenItIsBack) {
  StartShipper();
  Enqueue(1, 3);
  EXPECT_FALSE(shipper_->Flush(absl::Milliseconds(300)));
  EXPECT_EQ(spool_->size(), 3u);
  EXPECT_EQ(shipper_->stats().spool.batches, 3u);
  EXPECT_FALSE(shipper_->stats().connected);

  StartServer();
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 3));
  EXPECT_TRUE(spool_->empty());
}

TEST_F(ShipperTest, ResumesAfterTheServerRestarts) {
  StartServer();
  StartShipper();
  Enqueue(1, 2);
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  StopServer();

  Enqueue(3, 4);
  StartServer();
  ASSERT_TRUE(shipper_->Flush(kFlushTimeout));
  EXPECT_EQ(ingest_.applied(), Range(1, 4));
  EXPECT_EQ(ingest_.connects(), 2);
  EXPECT_GE(shipper_->stats().connects, 2u);
}

}  // namespace
}  // namespace strata::agent
