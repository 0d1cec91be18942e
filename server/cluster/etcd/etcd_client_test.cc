// EtcdClient against a real etcd (EtcdTestServer); the tests skip when etcd is not installed.
// Waits are on conditions with generous timeouts, for a loaded 2-core machine.
#include "server/cluster/etcd/etcd_client.h"

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/testing/free_port.h"
#include "etcd/etcdserverpb/rpc.grpc.pb.h"
#include "server/cluster/etcd/etcd_test_server.h"

namespace strata::server::cluster {
namespace {

constexpr absl::Duration kWaitTimeout = absl::Seconds(15);

// Polls `condition` until it holds or `timeout` passes; whether it held.
bool WaitFor(const std::function<bool()>& condition, absl::Duration timeout = kWaitTimeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return true;
}

// What a watch delivered, for the test thread to wait on.
class WatchRecorder {
 public:
  std::function<void(const EtcdEvent&)> OnEvent() {
    return [this](const EtcdEvent& event) {
      absl::MutexLock lock(&mu_);
      events_.push_back(event);
    };
  }
  std::function<void(absl::Status)> OnEnd() {
    return [this](absl::Status status) {
      absl::MutexLock lock(&mu_);
      ++ends_;
      end_ = std::move(status);
    };
  }

  bool WaitForEvents(size_t n) {
    absl::MutexLock lock(&mu_);
    want_ = n;
    return mu_.AwaitWithTimeout(absl::Condition(this, &WatchRecorder::HasWanted), kWaitTimeout);
  }
  bool WaitForEnd() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(
                                    +[](int* ends) { return *ends > 0; }, &ends_),
                                kWaitTimeout);
  }

  std::vector<EtcdEvent> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  int ends() {
    absl::MutexLock lock(&mu_);
    return ends_;
  }
  absl::Status end() {
    absl::MutexLock lock(&mu_);
    return end_;
  }

 private:
  bool HasWanted() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return events_.size() >= want_; }

  absl::Mutex mu_;
  std::vector<EtcdEvent> events_ ABSL_GUARDED_BY(mu_);
  int ends_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status end_ ABSL_GUARDED_BY(mu_);
  size_t want_ ABSL_GUARDED_BY(mu_) = 0;
};

std::vector<std::string> Keys(const EtcdClient::RangeResult& result) {
  std::vector<std::string> keys;
  for (const EtcdKeyValue& kv : result.kvs) keys.push_back(kv.key);
  return keys;
}

TEST(EtcdPrefixTest, RangeEndIncrementsTheLastByteBelow0xff) {
  EXPECT_EQ(EtcdPrefixRangeEnd("a/"), "a0");
  EXPECT_EQ(EtcdPrefixRangeEnd("abc"), "abd");
  EXPECT_EQ(EtcdPrefixRangeEnd("a\xff"), "b");
  EXPECT_EQ(EtcdPrefixRangeEnd(std::string("a\xff\xff", 3)), "b");
  EXPECT_EQ(EtcdPrefixRangeEnd("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdPrefixRangeEnd(""), std::string(1, '\0'));
}

TEST(EtcdCreateTest, MalformedEndpointsAreInvalidArguments) {
  for (const char* endpoints :
       {"", "http://", "localhost", "http://127.0.0.1", "https://127.0.0.1:2379",
        "unix:///run/etcd.sock", "127.0.0.1:notaport", "127.0.0.1:70000", "127.0.0.1:-1",
        "127.0.0.1:2379,,127.0.0.1:2380", "http://127.0.0.1:2379/v3/kv", ":2379", "::1:2379",
        "http://user@127.0.0.1:2379"}) {
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(endpoints);
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << endpoints << "\": " << client.status();
  }
  for (const char* endpoints : {"http://127.0.0.1:2379", "127.0.0.1:2379", "HTTP://host:1/",
                                "[::1]:2379", " http://a:1 , b:2 "}) {
    EXPECT_TRUE(EtcdClient::Create(endpoints).ok()) << endpoints;
  }
  EtcdClient::Options options;
  options.call_timeout = absl::ZeroDuration();
  EXPECT_EQ(EtcdClient::Create("127.0.0.1:2379", options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// A fresh etcd per test (each test is its own process under ctest anyway).
class EtcdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!EtcdTestServer::Available()) {
      GTEST_SKIP() << EtcdTestServer::kEtcdBinary
                   << " is not installed (Debian package etcd-server); skipping";
    }
    absl::StatusOr<std::unique_ptr<EtcdTestServer>> server = EtcdTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(server_->endpoint());
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = std::move(*client);
  }

  void TearDown() override {
    if (HasFailure() && server_ != nullptr) {
      std::cerr << "etcd log tail:\n" << server_->LogTail() << "\n";
    }
  }

  bool KeyExists(const std::string& key) {
    absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix(key);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return false;
    for (const EtcdKeyValue& kv : result->kvs) {
      if (kv.key == key) return true;
    }
    return false;
  }

  std::unique_ptr<EtcdTestServer> server_;
  std::unique_ptr<EtcdClient> client_;
};

class EtcdKvTest : public EtcdTest {};
class EtcdLeaseTest : public EtcdTest {};
class EtcdWatchTest : public EtcdTest {};
class EtcdOutageTest : public EtcdTest {};

TEST_F(EtcdKvTest, PutGetPrefixDelete) {
  ASSERT_TRUE(client_->Put("a/1", "one").ok());
  ASSERT_TRUE(client_->Put("a/2", "two").ok());
  ASSERT_TRUE(client_->Put("a0", "not under a/").ok());
  ASSERT_TRUE(client_->Put("b", "other").ok());

  absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix("a/");
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(Keys(*result), (std::vector<std::string>{"a/1", "a/2"}));
  EXPECT_EQ(result->kvs[0].value, "one");
  EXPECT_EQ(result->kvs[1].value, "two");
  EXPECT_EQ(result->kvs[0].lease, 0);
  EXPECT_GT(result->kvs[0].mod_revision, 0);
  EXPECT_LT(result->kvs[0].mod_revision, result->kvs[1].mod_revision);
  EXPECT_GE(result->revision, result->kvs[1].mod_revision);

  ASSERT_TRUE(client_->Put("a/1", "uno").ok());
  result = client_->GetPrefix("a/");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->kvs[0].value, "uno");

  ASSERT_TRUE(client_->Delete("a/1").ok());
  EXPECT_TRUE(client_->Delete("a/never-there").ok());
  result = client_->GetPrefix("a/");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Keys(*result), (std::vector<std::string>{"a/2"}));

  result = client_->GetPrefix("");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Keys(*result), (std::vector<std::string>{"a/2", "a0", "b"}));
  result = client_->GetPrefix("zzz");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->kvs.empty());
}

TEST_F(EtcdKvTest, BinaryKeysAndPrefixesEndingIn0xff) {
  const std::string key("k\xff\xff\0x", 5);
  ASSERT_TRUE(client_->Put(key, std::string("\0\1", 2)).ok());
  ASSERT_TRUE(client_->Put("l", "after the prefix").ok());
  absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix("k\xff");
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(Keys(*result), (std::vector<std::string>{key}));
  EXPECT_EQ(result->kvs[0].value, std::string("\0\1", 2));
}

TEST_F(EtcdKvTest, PutIfAbsentKeepsTheFirstValueOfManyRacingClients) {
  absl::StatusOr<std::string> first = client_->PutIfAbsent("claim/x", "mine");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, "mine");
  absl::StatusOr<std::string> again = client_->PutIfAbsent("claim/x", "mine");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, "mine");
  absl::StatusOr<std::string> other = client_->PutIfAbsent("claim/x", "theirs");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(*other, "mine");

  // Four threads race for each of 20 keys: all of them see the one value that was put.
  std::vector<std::vector<std::string>> seen(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t, &seen] {
      for (int i = 0; i < 20; ++i) {
        absl::StatusOr<std::string> v =
            client_->PutIfAbsent(absl::StrCat("claim/race/", i), absl::StrCat("thread ", t));
        EXPECT_TRUE(v.ok()) << v.status();
        seen[t].push_back(v.ok() ? *v : "");
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::StatusOr<EtcdClient::RangeResult> stored = client_->GetPrefix("claim/race/");
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->kvs.size(), 20u);
  for (const EtcdKeyValue& kv : stored->kvs) {
    const int i = std::stoi(kv.key.substr(std::string("claim/race/").size()));
    for (int t = 0; t < 4; ++t) EXPECT_EQ(seen[t][i], kv.value) << kv.key;
  }
}

TEST_F(EtcdKvTest, ConcurrentCallsFromManyThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this, t] {
      for (int i = 0; i < 25; ++i) {
        EXPECT_TRUE(client_->Put(absl::StrCat("c/", t, "/", i), "v").ok());
        EXPECT_TRUE(client_->GetPrefix(absl::StrCat("c/", t, "/")).ok());
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix("c/");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->kvs.size(), 100u);
}

TEST_F(EtcdKvTest, TriesTheNextEndpointWhenOneIsDown) {
  // A port nothing listens on: its connections are refused.
  const int dead_port = strata::testing::FreeLoopbackPort();
  absl::StatusOr<std::unique_ptr<EtcdClient>> client =
      EtcdClient::Create(absl::StrCat("http://127.0.0.1:", dead_port, ",", server_->endpoint()));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_TRUE((*client)->Put("failover", "yes").ok());
  absl::StatusOr<EtcdClient::RangeResult> result = (*client)->GetPrefix("failover");
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(Keys(*result), (std::vector<std::string>{"failover"}));
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      (*client)->WatchPrefix("failover", 0, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
}

TEST_F(EtcdLeaseTest, KeyDisappearsWhenTheLeaseExpires) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("leased/k", "v", *lease).ok());
  absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix("leased/");
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(result->kvs.size(), 1u);
  EXPECT_EQ(result->kvs[0].lease, *lease);

  EXPECT_TRUE(WaitFor([&] { return !KeyExists("leased/k"); }));
  const absl::Status status = client_->KeepAliveOnce(*lease);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
}

TEST_F(EtcdLeaseTest, KeepAliveKeepsTheKey) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(2));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("leased/k", "v", *lease).ok());
  // Well past the TTL, refreshing several times per TTL.
  const absl::Time until = absl::Now() + absl::Seconds(5);
  while (absl::Now() < until) {
    ASSERT_TRUE(client_->KeepAliveOnce(*lease).ok());
    ASSERT_TRUE(KeyExists("leased/k"));
    absl::SleepFor(absl::Milliseconds(250));
  }
  EXPECT_TRUE(WaitFor([&] { return !KeyExists("leased/k"); }));
}

TEST_F(EtcdLeaseTest, RevokeDeletesTheKeysAtOnce) {
  absl::StatusOr<int64_t> lease = client_->GrantLease(absl::Seconds(60));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(client_->Put("leased/k", "v", *lease).ok());
  ASSERT_TRUE(client_->RevokeLease(*lease).ok());
  EXPECT_FALSE(KeyExists("leased/k"));
  EXPECT_EQ(client_->RevokeLease(*lease).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->KeepAliveOnce(*lease).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client_->KeepAliveOnce(12345).code(), absl::StatusCode::kNotFound);
  // A key cannot be put with a lease etcd does not have.
  EXPECT_EQ(client_->Put("leased/k", "v", *lease).code(), absl::StatusCode::kNotFound);
}

TEST_F(EtcdWatchTest, SeesPutsAndDeletesInOrder) {
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      client_->WatchPrefix("w/", 0, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->Put("w/a", "1").ok());
  ASSERT_TRUE(client_->Put("elsewhere", "x").ok());
  ASSERT_TRUE(client_->Put("w/b", "2").ok());
  ASSERT_TRUE(client_->Delete("w/a").ok());
  ASSERT_TRUE(recorder.WaitForEvents(3));

  const std::vector<EtcdEvent> events = recorder.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[0].kv.key, "w/a");
  EXPECT_EQ(events[0].kv.value, "1");
  EXPECT_EQ(events[1].type, EtcdEvent::Type::kPut);
  EXPECT_EQ(events[1].kv.key, "w/b");
  EXPECT_EQ(events[1].kv.value, "2");
  EXPECT_EQ(events[2].type, EtcdEvent::Type::kDelete);
  EXPECT_EQ(events[2].kv.key, "w/a");
  EXPECT_TRUE(events[2].kv.value.empty());
  EXPECT_LT(events[0].kv.mod_revision, events[1].kv.mod_revision);
  EXPECT_LT(events[1].kv.mod_revision, events[2].kv.mod_revision);

  // Destroying the watch stops it without calling on_end.
  const absl::Time start = absl::Now();
  watch->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(recorder.ends(), 0);
}

TEST_F(EtcdWatchTest, ListThenWatchFromTheNextRevision) {
  ASSERT_TRUE(client_->Put("w/a", "1").ok());
  ASSERT_TRUE(client_->Put("w/b", "2").ok());
  absl::StatusOr<EtcdClient::RangeResult> listed = client_->GetPrefix("w/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->kvs.size(), 2u);

  // From the first put's revision: the history since then.
  WatchRecorder history;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> from_past =
      client_->WatchPrefix("w/", listed->kvs[0].mod_revision, history.OnEvent(), history.OnEnd());
  ASSERT_TRUE(from_past.ok()) << from_past.status();
  // From after the listing: only what follows it.
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      client_->WatchPrefix("w/", listed->revision + 1, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->Put("w/c", "3").ok());

  ASSERT_TRUE(history.WaitForEvents(3));
  std::vector<EtcdEvent> events = history.events();
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].kv.key, "w/a");
  EXPECT_EQ(events[1].kv.key, "w/b");
  EXPECT_EQ(events[2].kv.key, "w/c");
  ASSERT_TRUE(recorder.WaitForEvents(1));
  events = recorder.events();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].kv.key, "w/c");
}

TEST_F(EtcdWatchTest, WatchFromACompactedRevisionEndsWithOutOfRange) {
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(client_->Put("w/a", absl::StrCat(i)).ok());
  absl::StatusOr<EtcdClient::RangeResult> listed = client_->GetPrefix("w/");
  ASSERT_TRUE(listed.ok()) << listed.status();
  // Compaction is not part of the client: the generated stub directly.
  auto stub = etcdserverpb::KV::NewStub(
      grpc::CreateChannel(std::string(absl::StripPrefix(server_->endpoint(), "http://")),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  etcdserverpb::CompactionRequest request;
  request.set_revision(listed->revision);
  request.set_physical(true);
  etcdserverpb::CompactionResponse response;
  const grpc::Status compacted = stub->Compact(&context, request, &response);
  ASSERT_TRUE(compacted.ok()) << compacted.error_message();

  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      client_->WatchPrefix("w/", 1, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(recorder.WaitForEnd());
  EXPECT_EQ(recorder.end().code(), absl::StatusCode::kOutOfRange) << recorder.end();
  EXPECT_TRUE(recorder.events().empty());
  EXPECT_EQ(recorder.ends(), 1);
}

TEST_F(EtcdOutageTest, WatchEndsAndCallsFailWhileDownThenWorkAfterRestart) {
  ASSERT_TRUE(client_->Put("keep/k", "before").ok());
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      client_->WatchPrefix("keep/", 0, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();

  server_->Kill();
  ASSERT_TRUE(recorder.WaitForEnd());
  EXPECT_FALSE(recorder.end().ok());
  EXPECT_EQ(recorder.end().code(), absl::StatusCode::kUnavailable) << recorder.end();
  EXPECT_EQ(recorder.ends(), 1);

  // Calls fail within their deadline (2 s), with some room for a loaded machine.
  absl::Time start = absl::Now();
  const absl::Status put = client_->Put("keep/k", "while down");
  EXPECT_FALSE(put.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(4)) << put;
  start = absl::Now();
  EXPECT_FALSE(client_->GetPrefix("keep/").ok());
  EXPECT_FALSE(client_->GrantLease(absl::Seconds(5)).ok());
  EXPECT_FALSE(client_->KeepAliveOnce(1).ok());
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> down_watch =
      client_->WatchPrefix("keep/", 0, recorder.OnEvent(), recorder.OnEnd());
  EXPECT_FALSE(down_watch.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(4 * 4));

  ASSERT_TRUE(server_->Restart().ok());
  // The same client reconnects (its backoff is at most a second) and sees the data kept.
  EXPECT_TRUE(WaitFor([&] { return client_->Put("keep/after", "restart").ok(); }));
  absl::StatusOr<EtcdClient::RangeResult> result = client_->GetPrefix("keep/");
  ASSERT_TRUE(result.ok()) << result.status();
  ASSERT_EQ(Keys(*result), (std::vector<std::string>{"keep/after", "keep/k"}));
  EXPECT_EQ(result->kvs[1].value, "before");

  WatchRecorder after;
  watch = client_->WatchPrefix("keep/", 0, after.OnEvent(), after.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  ASSERT_TRUE(client_->Delete("keep/k").ok());
  ASSERT_TRUE(after.WaitForEvents(1));
  EXPECT_EQ(after.events()[0].type, EtcdEvent::Type::kDelete);
}

TEST_F(EtcdOutageTest, WatchDestroyedWhileEtcdIsDownStopsPromptly) {
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      client_->WatchPrefix("w/", 0, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  server_->Kill();
  const absl::Time start = absl::Now();
  watch->reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
}

// etcd over TLS with --client-cert-auth, certificates from deploy/gen-certs.sh: a client with
// the CA and a certificate it signed reads, writes, holds leases and watches; one without a
// certificate, with another CA's, trusting another CA, or speaking plain text gets nothing.
TEST(EtcdTlsTest, OnlyClientsWithACertificateOfItsCaReachEtcdOverTls) {
  if (!EtcdTestServer::Available()) {
    GTEST_SKIP() << EtcdTestServer::kEtcdBinary << " is not installed (Debian package etcd-server)";
  }
  std::string dir = (std::filesystem::temp_directory_path() / "strata-etcd-tls-XXXXXX").string();
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  const std::string gen = std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh";
  ASSERT_EQ(std::system((gen + " --out " + dir + "/main --node n1 >/dev/null").c_str()), 0);
  ASSERT_EQ(std::system((gen + " --out " + dir + "/other --ca-name Other --client mallory" +
                         " --node n1 >/dev/null").c_str()), 0);
  auto main = [&](const std::string& file) { return dir + "/main/" + file; };
  auto other = [&](const std::string& file) { return dir + "/other/" + file; };
  absl::StatusOr<std::unique_ptr<EtcdTestServer>> server =
      EtcdTestServer::Start(absl::Seconds(60), "127.0.0.1",
                            {.cert_file = main("server.pem"), .key_file = main("server.key"),
                             .ca_file = main("ca.pem"), .client_cert_file = main("nodes/n1.pem"),
                             .client_key_file = main("nodes/n1.key")});
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(absl::StartsWith((*server)->endpoint(), "https://")) << (*server)->endpoint();

  auto connect = [&](const rpc::ClientSecurityOptions& tls, std::string endpoint,
                     absl::Duration timeout = kWaitTimeout) {
    absl::StatusOr<rpc::ClientSecurity> security = rpc::ClientSecurity::Load(tls);
    EXPECT_TRUE(security.ok()) << security.status();
    EtcdClient::Options options{.call_timeout = timeout};
    if (security.ok()) options.security = *security;
    absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(endpoint, options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  };
  std::unique_ptr<EtcdClient> trusted = connect(
      {.ca_file = main("ca.pem"), .cert_file = main("nodes/n1.pem"),
       .key_file = main("nodes/n1.key")},
      (*server)->endpoint());
  ASSERT_NE(trusted, nullptr);
  WatchRecorder recorder;
  absl::StatusOr<std::unique_ptr<EtcdClient::Watch>> watch =
      trusted->WatchPrefix("tls/", 0, recorder.OnEvent(), recorder.OnEnd());
  ASSERT_TRUE(watch.ok()) << watch.status();
  absl::StatusOr<int64_t> lease = trusted->GrantLease(absl::Seconds(30));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(trusted->Put("tls/a", "1", *lease).ok());
  ASSERT_TRUE(recorder.WaitForEvents(1));
  EXPECT_EQ(recorder.events()[0].kv.value, "1");
  absl::StatusOr<EtcdClient::RangeResult> read = trusted->GetPrefix("tls/");
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->kvs.size(), 1u);

  // The handshake fails for each of these: no read, no write.
  const std::string https = (*server)->endpoint();
  const std::string http = "http://" + std::string(absl::StripPrefix(https, "https://"));
  struct Refused {
    std::string what;
    rpc::ClientSecurityOptions tls;
    std::string endpoint;
  };
  for (const Refused& r : std::vector<Refused>{
           {"no client certificate", {.ca_file = main("ca.pem")}, https},
           {"a certificate of another CA",
            {.ca_file = main("ca.pem"), .cert_file = other("clients/mallory.pem"),
             .key_file = other("clients/mallory.key")},
            https},
           {"trusting another CA",
            {.ca_file = other("ca.pem"), .cert_file = other("nodes/n1.pem"),
             .key_file = other("nodes/n1.key")},
            https},
           {"plain text", {}, http}}) {
    // Refused at every attempt, however long the deadline.
    std::unique_ptr<EtcdClient> client = connect(r.tls, r.endpoint, absl::Milliseconds(500));
    ASSERT_NE(client, nullptr) << r.what;
    EXPECT_FALSE(client->GetPrefix("tls/").ok()) << r.what;
    EXPECT_FALSE(client->Put("tls/b", "2").ok()) << r.what;
  }
  read = trusted->GetPrefix("tls/");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->kvs.size(), 1u);
  // The scheme must match the client's set-up.
  EXPECT_EQ(EtcdClient::Create(http, {.security = *rpc::ClientSecurity::Load(
                                          {.ca_file = main("ca.pem")})})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::Create(https).status().code(), absl::StatusCode::kInvalidArgument);
  watch->reset();
  server->reset();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
}

}  // namespace
}  // namespace strata::server::cluster
