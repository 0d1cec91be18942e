#include "server/app/server_flags.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace strata::server::app {
namespace {

using ::testing::HasSubstr;

// The options a command line gives; CLI11 throws on a value it refuses itself.
absl::StatusOr<ServerOptions> FromCommandLine(const std::string& args) {
  CLI::App cli;
  ServerFlags flags;
  AddServeFlags(cli, flags);
  cli.parse(args);
  return ServerOptionsFromFlags(flags);
}

// The options of a command line that must be accepted (defaults when it is not).
ServerOptions Accepted(const std::string& args) {
  absl::StatusOr<ServerOptions> options = FromCommandLine(args);
  EXPECT_TRUE(options.ok()) << args << ": " << options.status();
  return options.ok() ? *std::move(options) : ServerOptions();
}

// The error a command line gives: its code and message.
void ExpectRefused(const std::string& args, absl::StatusCode code, const std::string& message) {
  absl::StatusOr<ServerOptions> options = FromCommandLine(args);
  ASSERT_FALSE(options.ok()) << args;
  EXPECT_EQ(options.status().code(), code) << args;
  EXPECT_THAT(std::string(options.status().message()), HasSubstr(message)) << args;
}

TEST(ServerFlagsTest, Defaults) {
  const ServerOptions options = Accepted("");
  EXPECT_EQ(options.ingest.listen, "127.0.0.1:7070");
  EXPECT_EQ(options.http.listen, "127.0.0.1:7071");
  EXPECT_EQ(options.storage.data_dir, "./var/strata");
  EXPECT_EQ(options.aggregation.memory_budget_bytes, size_t{512} << 20);
  EXPECT_EQ(options.ingest.service.limits.max_message_bytes, 16u << 20);
  EXPECT_EQ(options.ingest.service.session_memory_bytes, size_t{2} << 30);
  EXPECT_EQ(options.symbolize.max_debuginfo_bytes, uint64_t{2} << 30);
  EXPECT_EQ(options.storage.store.raw_retention_ms, absl::ToInt64Milliseconds(absl::Hours(168)));
  EXPECT_EQ(options.storage.store.hour_retention_ms,
            absl::ToInt64Milliseconds(absl::Hours(365 * 24)));
  EXPECT_EQ(options.storage.store.rollup_interval_ms, 5'000);
  EXPECT_EQ(options.capture.retention, absl::Hours(168));
  EXPECT_EQ(options.capture.max_duration, absl::Hours(1));
  EXPECT_EQ(options.ingest.service.graph_retention, absl::Hours(168));
  EXPECT_EQ(options.security.authorizer.certificate_role, auth::Role::kAgent);
  EXPECT_FALSE(options.security.authenticates());
  EXPECT_FALSE(options.cluster.enabled());
}

TEST(ServerFlagsTest, FlagsReachTheirComponents) {
  const ServerOptions options = Accepted(
      "--table-memory 1GiB --max-message-bytes 4KiB --retention-hour 0 --max-agents 5 "
      "--max-capture-duration 10m --tls-client-role none --sync --ingest-threads 3 "
      "--debug-dirs /a /b --http-max-connections 7 --query-rate 2.5 --graph-retention 0");
  EXPECT_EQ(options.aggregation.memory_budget_bytes, size_t{1} << 30);
  EXPECT_EQ(options.ingest.service.limits.max_message_bytes, 4096u);
  EXPECT_EQ(options.storage.store.hour_retention_ms, 0);
  EXPECT_EQ(options.ingest.service.max_agents, 5u);
  EXPECT_EQ(options.ingest.service.worker_threads, 3u);
  EXPECT_EQ(options.ingest.service.graph_retention, absl::ZeroDuration());
  EXPECT_EQ(options.capture.max_duration, absl::Minutes(10));
  EXPECT_EQ(options.security.authorizer.certificate_role, std::nullopt);
  EXPECT_TRUE(options.storage.store.sync);
  EXPECT_EQ(options.symbolize.symbolizer.debug_dirs, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_EQ(options.http.max_connections, 7);
  EXPECT_EQ(options.security.authorizer.query_rate, 2.5);
}

TEST(ServerFlagsTest, ClusterDefaultsFollowOtherFlags) {
  const ClusterOptions cluster = Accepted(
      "--cluster-etcd https://etcd:2379 --node-id n1 --listen 10.0.0.1:7070 --insecure "
      "--tls-cert s.pem --tls-key s.key --cluster-tls-ca ca.pem --cluster-etcd-ca etcd-ca.pem "
      "--cluster-lease-ttl 20s --replication-factor 3").cluster;
  EXPECT_TRUE(cluster.enabled());
  EXPECT_EQ(cluster.advertise, "10.0.0.1:7070");  // --listen
  EXPECT_EQ(cluster.node_client.cert_file, "s.pem");  // --tls-cert
  EXPECT_EQ(cluster.node_client.key_file, "s.key");
  EXPECT_EQ(cluster.etcd_client.cert_file, "s.pem");  // the node's certificate
  EXPECT_EQ(cluster.lease_ttl, absl::Seconds(20));
  EXPECT_EQ(cluster.replication.replication_factor, 3u);
}

TEST(ServerFlagsTest, BadValuesNameTheirFlag) {
  const auto invalid = absl::StatusCode::kInvalidArgument;
  ExpectRefused("--max-message-bytes 1KiB", invalid, "--max-message-bytes must be in [4KiB, 1GiB]");
  ExpectRefused("--max-message-bytes 2GiB", invalid, "--max-message-bytes must be in [4KiB, 1GiB]");
  ExpectRefused("--cluster-lease-ttl 0", invalid,
                "--cluster-lease-ttl: '0' is not a positive duration");
  ExpectRefused("--max-capture-duration 2h", invalid,
                "--max-capture-duration must be between 1ms and 1h");
  ExpectRefused("--table-memory lots", invalid, "--table-memory: ");
  ExpectRefused("--retention-minute forever", invalid, "--retention-minute: ");
  ExpectRefused("--graph-retention soon", invalid, "--graph-retention: ");
  ExpectRefused("--listen 127.0.0.1:99999", invalid, "--listen: port 99999 of");
  ExpectRefused("--advertise n1:70000", invalid, "--advertise: port 70000 of");
  // gRPC would listen on port 443.
  ExpectRefused("--listen 127.0.0.1", invalid, "--listen: '127.0.0.1' has no port");
  ExpectRefused("--http 127.0.0.1", invalid, "--http: '127.0.0.1' has no port");
  ExpectRefused("--query-rate nan", invalid, "--query-rate and --query-burst must be numbers");
}

TEST(ServerFlagsTest, CliRefusesOutOfRangeNumbers) {
  EXPECT_THROW(FromCommandLine("--max-graph-nodes 0").IgnoreError(), CLI::ValidationError);
  EXPECT_THROW(FromCommandLine("--replication-factor 6").IgnoreError(), CLI::ValidationError);
  EXPECT_THROW(FromCommandLine("--tls-client-role root").IgnoreError(), CLI::ValidationError);
  EXPECT_THROW(FromCommandLine("--log-level loud").IgnoreError(), CLI::ValidationError);
}

TEST(ServerFlagsTest, TlsAndAuthenticationMustFitTogether) {
  const auto invalid = absl::StatusCode::kInvalidArgument;
  const auto exposed = absl::StatusCode::kFailedPrecondition;
  ExpectRefused("--tls-client-ca ca.pem", invalid, "--tls-client-ca needs --tls-cert and --tls-key");
  ExpectRefused("--listen 0.0.0.0:7070", exposed,
                "refusing to listen on 0.0.0.0:7070 without TLS and authentication");
  ExpectRefused("--http 0.0.0.0:7071", exposed,
                "refusing to listen on 0.0.0.0:7071 without TLS and authentication");
  ExpectRefused("--listen 0.0.0.0:7070 --tls-cert s.pem --tls-key s.key", exposed,
                "without authentication:");
  ExpectRefused("--listen 0.0.0.0:7070 --auth-file /dev/null", exposed, "without TLS:");
  Accepted("--listen 0.0.0.0:7070 --insecure");
  const SecurityOptions secured =
      Accepted("--listen 0.0.0.0:7070 --tls-cert s.pem --tls-key s.key --tls-client-ca ca.pem")
          .security;
  EXPECT_TRUE(secured.authorizer.client_certificates);
  EXPECT_TRUE(secured.authenticates());
}

TEST(ServerFlagsTest, ClusterNodesNeedAnIdAndCredentials) {
  const auto invalid = absl::StatusCode::kInvalidArgument;
  ExpectRefused("--cluster-etcd http://etcd:2379", invalid, "--cluster-etcd needs --node-id");
  const std::string node = "--cluster-etcd http://etcd:2379 --node-id n1 ";
  ExpectRefused(node + "--tls-cert s.pem --tls-key s.key", invalid, "give --cluster-tls-ca");
  ExpectRefused(node + "--auth-file /dev/null", invalid,
                "must present credentials of role node to the other nodes");
  Accepted(node + "--auth-file /dev/null --cluster-token-file t");
  ExpectRefused(node + "--cluster-etcd-cert c.pem", invalid,
                "--cluster-etcd-cert needs --cluster-etcd-ca");
}

TEST(ServerFlagsTest, EtcdTlsOfForgetNode) {
  rpc::ClientSecurityOptions etcd, node;
  etcd.cert_file = "c.pem";
  EXPECT_FALSE(ResolveEtcdTls(etcd, node).ok());
  etcd.cert_file.clear();
  etcd.ca_file = "ca.pem";
  node.cert_file = "n.pem";
  node.key_file = "n.key";
  ASSERT_TRUE(ResolveEtcdTls(etcd, node).ok());
  EXPECT_EQ(etcd.cert_file, "n.pem");
  EXPECT_EQ(etcd.key_file, "n.key");
}

}  // namespace
}  // namespace strata::server::app
