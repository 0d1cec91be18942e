// Security with the real binaries on loopback and certificates made by the test: agents ship
// over mutual TLS, people query with bearer tokens; wrong CAs, expired certificates, plaintext
// and old TLS are refused; each role does only what it may; an agent cannot write as another;
// the tokens file and the server certificate change while the server runs, with nothing lost;
// the web UI works over HTTPS with a token; a server reachable from the network will not start
// without TLS and authentication.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/rpc/client_security.h"
#include "common/testing/temp_dir.h"
#include "common/testing/wait_for.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "strata/v1/ingest.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/e2e/http_client.h"

namespace strata::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr char kHost[] = "e2e-host";
constexpr char kService[] = "demo_service";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Replaces `path` atomically, as configuration tools do.
void WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, path);
}

CommandResult Shell(const std::string& command, double timeout_s = 60) {
  return RunCommand({"/bin/sh", "-c", command}, timeout_s);
}

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pki_ = dir_.File("pki");
    const std::string gen = std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh";
    CommandResult certs = RunCommand({gen, "--out", pki_, "--agent", kHost, "--agent",
                                      "other-host", "--client", "laptop", "--expired",
                                      kHost});
    ASSERT_EQ(certs.exit_code, 0) << certs.output;
    // A CA of someone else's, with a certificate for the same host name.
    CommandResult rogue = RunCommand({gen, "--out", dir_.File("rogue"), "--agent", kHost});
    ASSERT_EQ(rogue.exit_code, 0) << rogue.output;
    for (const char* name : {"alice", "ops", "fleet"}) {
      std::ofstream(dir_.File(absl::StrCat(name, ".token")))
          << name << "-" << getpid() << "-secret\n";
    }
    auth_file_ = dir_.File("auth");
    WriteFile(auth_file_, absl::StrCat(TokenLine("alice", "reader"), TokenLine("ops", "operator"),
                                       TokenLine("fleet", "agent")));
  }

  std::string Pki(const std::string& name) const { return pki_ + "/" + name; }

  // The tokens-file line of a token, made with the server's own tool.
  std::string TokenLine(const std::string& name, const std::string& role) {
    CommandResult r =
        Shell(absl::StrCat(BinPath("strata-server"), " hash-token --name ", name, " --role ",
                           role, " < ", dir_.File(name + ".token")));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    return r.output;
  }

  std::vector<std::string> TlsFlags() const {
    return {"--tls-cert", Pki("server.pem"), "--tls-key", Pki("server.key"), "--tls-client-ca",
            Pki("ca.pem"), "--auth-file", auth_file_};
  }

  void StartServer(std::vector<std::string> extra = {}) {
    std::vector<std::string> args = TlsFlags();
    args.insert(args.end(), {"--http", "127.0.0.1:0"});
    args.insert(args.end(), extra.begin(), extra.end());
    server_ = std::make_unique<ServerProcess>(dir_.File("data"), dir_.File("server.log"), args);
    ASSERT_NE(server_->port(), 0) << server_->process().Output();
    http_port_ = server_->http_port();
    ASSERT_GT(http_port_, 0) << server_->process().Output();
  }

  // The strata CLI against the server over TLS, with a token file (or none).
  CommandResult Cli(std::vector<std::string> args, const std::string& token = "",
                    std::vector<std::string> tls = {}) {
    std::vector<std::string> argv{BinPath("strata"), "--server", server_->address(), "--tls-ca",
                                  Pki("ca.pem")};
    if (!token.empty()) argv.insert(argv.end(), {"--token-file", dir_.File(token + ".token")});
    argv.insert(argv.end(), tls.begin(), tls.end());
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv, 60);
  }

  // An agent on demo_service, shipping every second, with the certificate of `cert_host`.
  std::unique_ptr<ChildProcess> StartAgent(const std::string& name, const std::string& cert_host,
                                           std::vector<std::string> extra = {},
                                           const std::string& pki = "") {
    const std::string dir = pki.empty() ? pki_ : pki;
    std::vector<std::string> argv{BinPath("strata-agent"),
                                  "--server",
                                  server_->address(),
                                  "--tls-ca",
                                  Pki("ca.pem"),
                                  "--tls-cert",
                                  absl::StrCat(dir, "/agents/", cert_host, ".pem"),
                                  "--tls-key",
                                  absl::StrCat(dir, "/agents/", cert_host, ".key"),
                                  "--pid",
                                  std::to_string(demo_->pid()),
                                  "--interval",
                                  "1",
                                  "--spool-dir",
                                  "none",
                                  "--log-level",
                                  "debug"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return std::make_unique<ChildProcess>(argv, dir_.File(name + ".log"));
  }

  // demo_service, once it serves: before that it calibrates, and an agent attached then
  // ships samples without serve_forever in them.
  void StartDemo() {
    demo_ = std::make_unique<ChildProcess>(std::vector<std::string>{BinPath("demo_service")},
                                           dir_.File("demo.log"));
    ASSERT_TRUE(demo_->WaitForOutput("ready", 60)) << demo_->Output();
  }

  // Total samples of the demo service as a reader sees them.
  uint64_t ReaderTotal() {
    CommandResult r = Cli({"--json", "services"}, "alice");
    if (r.exit_code != 0) return 0;
    const std::string key = "\"total_samples\": \"";
    const size_t at = r.output.find(key);
    uint64_t total = 0;
    if (at == std::string::npos) return 0;
    const size_t from = at + key.size();
    (void)absl::SimpleAtoi(r.output.substr(from, r.output.find('"', from) - from), &total);
    return total;
  }

  // The HTTP status of an HTTPS GET with curl, verifying the server against the CA.
  int HttpsStatus(const std::string& path, const std::string& extra = "") {
    CommandResult r = Shell(absl::StrCat("curl -s -o /dev/null -w '%{http_code}' --cacert ",
                                         Pki("ca.pem"), " ", extra, " https://localhost:",
                                         http_port_, path));
    int code = 0;
    (void)absl::SimpleAtoi(r.output, &code);
    return code;
  }

  std::string BearerHeader(const std::string& name) {
    std::string token = ReadFile(dir_.File(name + ".token"));
    token.pop_back();  // newline
    return absl::StrCat("-H 'Authorization: Bearer ", token, "'");
  }

  testing::TempDir dir_{"strata_security"};
  std::string pki_, auth_file_;
  std::unique_ptr<ServerProcess> server_;
  int http_port_ = 0;
  std::unique_ptr<ChildProcess> demo_;
};

TEST_F(SecurityTest, AgentShipsOverMutualTlsAndReaderQueries) {
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--host", kHost});
  ASSERT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() > 0; },
                                       std::chrono::seconds(90)))
      << agent->Output() << server_->process().Output();
  CommandResult hot = Cli({"hot-paths", "--service", kService, "--since", "1h"}, "alice");
  EXPECT_EQ(hot.exit_code, 0) << hot.output;
  EXPECT_THAT(hot.output, HasSubstr("serve_forever"));
  CommandResult agents = Cli({"agents"}, "ops");
  EXPECT_THAT(agents.output, HasSubstr(kHost));

  // An agent's certificate ships, but cannot read.
  CommandResult as_agent = Cli({"services"}, "",
                               {"--tls-cert", Pki(absl::StrCat("agents/", kHost, ".pem")),
                                "--tls-key", Pki(absl::StrCat("agents/", kHost, ".key"))});
  EXPECT_NE(as_agent.exit_code, 0);
  EXPECT_THAT(as_agent.output,
              HasSubstr("certificate e2e-host has role agent; queries needs role reader"));
  // Neither can an agent token, nor nobody.
  EXPECT_THAT(Cli({"services"}, "fleet").output, HasSubstr("needs role reader"));
  EXPECT_THAT(Cli({"services"}).output, HasSubstr("no credentials"));

  // A reader cannot start a capture; an operator can.
  CommandResult reader_capture =
      Cli({"capture", "--service", kService, "--duration", "2s"}, "alice");
  EXPECT_NE(reader_capture.exit_code, 0);
  EXPECT_THAT(reader_capture.output,
              HasSubstr("token alice has role reader; starting captures needs role operator"));
  // The server caps what a capture may ask of the agents.
  CommandResult greedy =
      Cli({"capture", "--service", kService, "--duration", "2s", "--frequency", "5000"}, "ops");
  EXPECT_NE(greedy.exit_code, 0);
  EXPECT_THAT(greedy.output, HasSubstr("--max-capture-hz"));
  CommandResult capture =
      Cli({"capture", "--service", kService, "--duration", "2s", "--frequency", "199"}, "ops");
  EXPECT_EQ(capture.exit_code, 0) << capture.output << agent->Output();
}

// A routine restart of the server: the agent reconnects over TLS on its own, and every
// sample it took arrives. (It never did: gRPC's own reconnect was driven by a poll every 5 s,
// and a TLS handshake needs a few of them, more than the connect deadline allows.)
TEST_F(SecurityTest, AnAgentReconnectsOverTlsWhenTheServerRestarts) {
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--host", kHost});
  ASSERT_TRUE(agent->WaitForOutput("connected to strata-server", 60)) << agent->Output();
  auto count = [&](const std::string& what) {
    const std::string out = agent->Output();
    size_t n = 0;
    for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
    return n;
  };
  const std::string address = server_->address();
  ASSERT_EQ(server_->process().Stop(SIGTERM, 30), 0) << server_->process().Output();
  // Away long enough for the channel to fail: gRPC then reconnects on its own, between the
  // agent's attempts.
  ASSERT_TRUE(strata::testing::WaitFor([&] { return count("cannot connect") >= 2; },
                                       std::chrono::seconds(30)))
      << agent->Output();
  StartServer({"--listen", address});
  ASSERT_TRUE(strata::testing::WaitFor([&] { return count("connected to strata-server") >= 2; },
                                       std::chrono::seconds(30)))
      << agent->Output();
  ASSERT_EQ(agent->Stop(SIGTERM, 30), 0) << agent->Output();
  const uint64_t sent = AgentSampleCount(agent->Output());
  EXPECT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() == sent; },
                                       std::chrono::seconds(30)))
      << ReaderTotal() << " of " << sent;
}

TEST_F(SecurityTest, WrongCaExpiredCertificatePlaintextAndOldTlsAreRefused) {
  StartServer();
  auto call = [&](rpc::ClientSecurityOptions options) {
    auto security = rpc::ClientSecurity::Load(options);
    EXPECT_TRUE(security.ok()) << security.status();
    auto stub = v1::Query::NewStub(security->CreateChannel(server_->address()));
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    security->Authorize(&ctx);
    v1::ListAgentsResponse response;
    return stub->ListAgents(&ctx, {}, &response);
  };
  const std::string laptop_cert = Pki("clients/laptop.pem"), laptop_key = Pki("clients/laptop.key");
  // Unlisted certificates are agents; the laptop's is listed as an operator, so a query with
  // it (and no token) proves a verified client certificate is a principal.
  WriteFile(auth_file_, ReadFile(auth_file_) + "cert laptop operator\n");
  ASSERT_TRUE(strata::testing::WaitFor(
      [&] { return call({.ca_file = Pki("ca.pem"), .cert_file = laptop_cert, .key_file = laptop_key}).ok(); },
      std::chrono::seconds(30)));

  const std::string rogue = dir_.File("rogue");
  grpc::Status wrong_ca = call({.ca_file = Pki("ca.pem"),
                                .cert_file = rogue + "/agents/e2e-host.pem",
                                .key_file = rogue + "/agents/e2e-host.key"});
  EXPECT_EQ(wrong_ca.error_code(), grpc::StatusCode::UNAVAILABLE) << wrong_ca.error_message();
  grpc::Status expired = call({.ca_file = Pki("ca.pem"),
                               .cert_file = Pki("expired/e2e-host.pem"),
                               .key_file = Pki("expired/e2e-host.key")});
  EXPECT_EQ(expired.error_code(), grpc::StatusCode::UNAVAILABLE) << expired.error_message();
  // The client checks the server too: a server certificate from another CA is refused.
  grpc::Status wrong_server = call({.ca_file = rogue + "/ca.pem"});
  EXPECT_EQ(wrong_server.error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::Status plaintext = call({});
  EXPECT_EQ(plaintext.error_code(), grpc::StatusCode::UNAVAILABLE);

  // TLS 1.1 and plaintext HTTP are refused on both listeners.
  for (int port : {server_->port(), http_port_}) {
    CommandResult old_tls = Shell(absl::StrCat(
        "openssl s_client -connect 127.0.0.1:", port,
        " -tls1_1 -cipher 'DEFAULT:@SECLEVEL=0' -CAfile ", Pki("ca.pem"), " </dev/null 2>&1"));
    // The client offers TLS 1.1 with every cipher it has; the server ends the handshake.
    EXPECT_THAT(old_tls.output, HasSubstr("Cipher is (NONE)")) << old_tls.output;
    CommandResult tls12 = Shell(absl::StrCat("openssl s_client -connect 127.0.0.1:", port,
                                             " -tls1_2 -CAfile ", Pki("ca.pem"),
                                             " -verify_return_error </dev/null 2>&1"));
    EXPECT_THAT(tls12.output, HasSubstr("Protocol  : TLSv1.2")) << tls12.output;
    EXPECT_THAT(tls12.output, HasSubstr("Verify return code: 0 (ok)"));
  }
  EXPECT_EQ(strata::testing::HttpGet(http_port_, "/healthz").first, 0);
  // /healthz stays open over HTTPS; the rest needs a reader.
  EXPECT_EQ(HttpsStatus("/healthz"), 200);
  EXPECT_EQ(HttpsStatus("/api/v1/services"), 401);
  EXPECT_EQ(HttpsStatus("/metrics"), 401);
  EXPECT_EQ(HttpsStatus("/api/v1/services", BearerHeader("fleet")), 403);
  EXPECT_EQ(HttpsStatus("/api/v1/services", BearerHeader("alice")), 200);
  // Grafana's calls (server/grafana) are guarded the same way.
  const std::string connect = "-X POST -H 'Content-Type: application/json' -d '{}' ";
  const std::string profile_types = "/querier.v1.QuerierService/ProfileTypes";
  EXPECT_EQ(HttpsStatus(profile_types, connect), 401);
  EXPECT_EQ(HttpsStatus(profile_types, connect + BearerHeader("fleet")), 403);
  EXPECT_EQ(HttpsStatus(profile_types, connect + BearerHeader("alice")), 200);
  CommandResult metrics = Shell(absl::StrCat("curl -s --cacert ", Pki("ca.pem"), " ",
                                             BearerHeader("alice"), " https://localhost:",
                                             http_port_, "/metrics"));
  EXPECT_THAT(metrics.output, HasSubstr("strata_auth_unauthenticated_total"));
  EXPECT_THAT(metrics.output, Not(HasSubstr("strata_auth_unauthenticated_total 0\n")));
  EXPECT_THAT(metrics.output, HasSubstr("strata_http_tls_handshake_failures_total"));
  EXPECT_THAT(metrics.output, Not(HasSubstr("strata_http_tls_handshake_failures_total 0\n")));
  // Tokens never reach the log.
  EXPECT_THAT(server_->process().Output(),
              Not(HasSubstr(ReadFile(dir_.File("alice.token")).substr(0, 10))));
}

TEST_F(SecurityTest, AnAgentCannotWriteAsAnother) {
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--host", kHost, "--agent-id", "agent-a"});
  ASSERT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() > 0; },
                                       std::chrono::seconds(90)))
      << agent->Output();
  // Another host's certificate claiming this host.
  auto liar = StartAgent("liar", "other-host", {"--host", kHost, "--agent-id", "agent-b"});
  EXPECT_TRUE(liar->WaitForOutput(
      "certificate other-host may write only as host other-host, not as host e2e-host", 60))
      << liar->Output();
  // Its own host, but the other agent's ID (its graph and sequence numbers).
  auto thief = StartAgent("thief", "other-host", {"--host", "other-host", "--agent-id", "agent-a"});
  EXPECT_TRUE(thief->WaitForOutput(
      "agent ID agent-a belongs to certificate e2e-host; certificate other-host may not write "
      "as it", 60))
      << thief->Output();
  // A certificate of the same name from another CA never gets as far.
  auto rogue = StartAgent("rogue", kHost, {"--host", kHost, "--agent-id", "agent-a"},
                          dir_.File("rogue"));
  EXPECT_TRUE(rogue->WaitForOutput("cannot connect", 60)) << rogue->Output();
  EXPECT_THAT(rogue->Output(), Not(HasSubstr("connected to")));
  CommandResult agents = Cli({"agents"}, "alice");
  EXPECT_THAT(agents.output, HasSubstr("agent-a"));
  EXPECT_THAT(agents.output, Not(HasSubstr("agent-b")));
}

TEST_F(SecurityTest, TokensFileChangesTakeEffectWithoutRestart) {
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--token-file", dir_.File("fleet.token")});
  ASSERT_TRUE(agent->WaitForOutput("connected to strata-server", 60)) << agent->Output();
  std::ofstream(dir_.File("bob.token")) << "bob-secret-" << getpid() << "\n";
  EXPECT_THAT(Cli({"services"}, "bob").output, HasSubstr("unknown bearer token"));
  WriteFile(auth_file_, TokenLine("bob", "reader") + TokenLine("ops", "operator"));
  ASSERT_TRUE(strata::testing::WaitFor([&] { return Cli({"services"}, "bob").exit_code == 0; },
                                       std::chrono::seconds(30)));
  EXPECT_THAT(Cli({"services"}, "alice").output, HasSubstr("unknown bearer token"));
  // A removed token stops the stream it opened too, at its next batch.
  EXPECT_TRUE(agent->WaitForOutput("unknown bearer token", 30)) << agent->Output();
  // A broken file is refused and the previous one stays in force.
  WriteFile(auth_file_, "token carol reader plaintext-secret\n");
  ASSERT_TRUE(server_->process().WaitForOutput("tokens file not reloaded", 30));
  EXPECT_EQ(Cli({"services"}, "bob").exit_code, 0);
}

TEST_F(SecurityTest, RotatedServerCertificateWhileIngestionGoesOn) {
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--host", kHost});
  ASSERT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() > 0; },
                                       std::chrono::seconds(90)));
  auto serial = [&](int port) {
    return Shell(absl::StrCat("openssl s_client -connect 127.0.0.1:", port,
                              " -servername localhost -CAfile ", Pki("ca.pem"),
                              " </dev/null 2>/dev/null | openssl x509 -noout -serial"))
        .output;
  };
  const std::string before = serial(server_->port());
  ASSERT_THAT(before, HasSubstr("serial="));
  EXPECT_EQ(serial(http_port_), before);
  // A certificate renewed before its key: refused by both listeners, which keep the previous
  // pair (gRPC's own watcher would take it and fail every new handshake).
  const std::string other = dir_.File("other");
  ASSERT_EQ(Shell(absl::StrCat("openssl req -x509 -newkey ec -pkeyopt "
                               "ec_paramgen_curve:prime256v1 -nodes -days 1 -subj /CN=other "
                               "-keyout ", other, ".key -out ", other, ".pem 2>&1 && cp ",
                               other, ".pem ", Pki("server.pem"), ".new && mv ",
                               Pki("server.pem"), ".new ", Pki("server.pem")))
                .exit_code,
            0);
  ASSERT_TRUE(server_->process().WaitForOutput(
      "gRPC: TLS certificate files changed but cannot be used", 30))
      << server_->process().Output();
  EXPECT_EQ(serial(server_->port()), before);
  EXPECT_EQ(Cli({"services"}, "alice").exit_code, 0);
  CommandResult renew = RunCommand({std::string(STRATA_SOURCE_DIR) + "/deploy/gen-certs.sh",
                                    "--out", pki_, "--renew", "--server", "localhost,127.0.0.1"});
  ASSERT_EQ(renew.exit_code, 0) << renew.output;
  ASSERT_TRUE(strata::testing::WaitFor(
      [&] {
        const std::string now = serial(server_->port());
        return now.find("serial=") != std::string::npos && now != before;
      },
      std::chrono::seconds(30)));
  ASSERT_TRUE(strata::testing::WaitFor(
      [&] { return serial(http_port_) != before; }, std::chrono::seconds(30)));
  // A new connection trusts the new certificate (same CA) and ships beside the old one.
  auto late = StartAgent("late", "other-host", {"--host", "other-host"});
  ASSERT_TRUE(late->WaitForOutput("connected to strata-server", 60)) << late->Output();
  // Listed, and with a batch applied (BATCHES): stopped before its first sample, it would
  // have nothing to compare.
  ASSERT_TRUE(strata::testing::WaitFor(
      [&] {
        const std::vector<std::string> lines =
            absl::StrSplit(Cli({"agents"}, "alice").output, '\n');
        for (const std::string& line : lines) {
          const std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
          if (f.size() > 5 && f[1] == "other-host" && f[5] != "0") return true;
        }
        return false;
      },
      std::chrono::seconds(30)));
  // Every sample the agents took reaches the server: stop them and compare.
  ASSERT_EQ(agent->Stop(SIGTERM, 30), 0) << agent->Output();
  ASSERT_EQ(late->Stop(SIGTERM, 30), 0) << late->Output();
  const uint64_t sent = AgentSampleCount(agent->Output()) + AgentSampleCount(late->Output());
  ASSERT_GT(AgentSampleCount(late->Output()), 0u) << late->Output();
  EXPECT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() == sent; },
                                       std::chrono::seconds(30)))
      << ReaderTotal() << " of " << sent;
}

TEST_F(SecurityTest, WebUiOverHttpsWithToken) {
  if (Shell("command -v chromium >/dev/null").exit_code != 0) {
    GTEST_SKIP() << "chromium is not installed (apt-get install chromium)";
  }
  StartServer();
  StartDemo();
  auto agent = StartAgent("agent", kHost, {"--host", kHost});
  ASSERT_TRUE(strata::testing::WaitFor([&] { return ReaderTotal() > 0; },
                                       std::chrono::seconds(90)));
  // Chromium trusts exactly this server's key (its SPKI hash), as a CA-installed client would.
  CommandResult spki = Shell(absl::StrCat(
      "openssl x509 -in ", Pki("server.pem"), " -pubkey -noout | openssl pkey -pubin -outform der"
      " | openssl dgst -sha256 -binary | base64"));
  ASSERT_EQ(spki.exit_code, 0);
  std::string pin = spki.output;
  while (!pin.empty() && pin.back() == '\n') pin.pop_back();
  std::string token = ReadFile(dir_.File("alice.token"));
  token.pop_back();
  const std::string flags = absl::StrCat(
      HeadlessChromium(dir_.File("chromium")), " --ignore-certificate-errors-spki-list=", pin);
  // The token as the password of HTTP Basic: the browser sends it with every request of the
  // page, as it would after the login prompt.
  CommandResult dom = Shell(absl::StrCat(flags, " --dump-dom 'https://reader:", token,
                                         "@localhost:", http_port_, "/?service=", kService,
                                         "&since_s=3600' 2>/dev/null"),
                            120);
  ASSERT_EQ(dom.exit_code, 0) << dom.output;
  EXPECT_THAT(dom.output, HasSubstr("data-loaded=\"flame\""));
  EXPECT_THAT(dom.output, HasSubstr(">serve_forever<"));
  const fs::path shot = fs::path(STRATA_ARTIFACT_DIR) / "security_web_ui.png";
  CommandResult s = Shell(absl::StrCat(flags, " --screenshot=", shot.string(), " 'https://reader:",
                                       token, "@localhost:", http_port_, "/?service=", kService,
                                       "&since_s=3600' 2>/dev/null"),
                          120);
  EXPECT_EQ(s.exit_code, 0);
  // Without the token: the login challenge, and no data.
  CommandResult challenge = Shell(absl::StrCat("curl -s -D - -o /dev/null --cacert ",
                                               Pki("ca.pem"), " https://localhost:", http_port_,
                                               "/"));
  EXPECT_THAT(challenge.output, HasSubstr(" 401"));
  EXPECT_THAT(challenge.output, HasSubstr("WWW-Authenticate: Basic realm=\"Strata\""));
  CommandResult anonymous = Shell(absl::StrCat(flags, " --dump-dom 'https://localhost:",
                                               http_port_, "/?service=", kService,
                                               "' 2>/dev/null"),
                                  120);
  EXPECT_THAT(anonymous.output, Not(HasSubstr("data-loaded=\"flame\"")));
}

TEST_F(SecurityTest, LimitsPerPrincipal) {
  StartServer({"--max-streams-per-principal", "1", "--query-rate", "0.001", "--query-burst",
               "3"});
  // Query rate: three requests, then RESOURCE_EXHAUSTED naming the flag.
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Cli({"services"}, "alice").exit_code, 0);
  CommandResult limited = Cli({"services"}, "alice");
  EXPECT_NE(limited.exit_code, 0);
  EXPECT_THAT(limited.output, HasSubstr("--query-rate"));
  EXPECT_EQ(Cli({"services"}, "ops").exit_code, 0);  // another principal's budget
  // Streams per principal: the agent token's second stream is refused.
  rpc::ClientSecurityOptions options{.ca_file = Pki("ca.pem"),
                                     .token_file = dir_.File("fleet.token")};
  auto security = rpc::ClientSecurity::Load(options);
  ASSERT_TRUE(security.ok());
  auto stub = v1::Ingest::NewStub(security->CreateChannel(server_->address()));
  auto hello = [](const std::string& id) {
    v1::AgentMessage m;
    m.mutable_hello()->set_agent_id(id);
    m.mutable_hello()->set_host("h");
    m.mutable_hello()->set_graph_id(1);
    return m;
  };
  grpc::ClientContext first_ctx, second_ctx;
  security->Authorize(&first_ctx);
  security->Authorize(&second_ctx);
  auto first = stub->Connect(&first_ctx);
  ASSERT_TRUE(first->Write(hello("one")));
  v1::ServerMessage welcome;
  ASSERT_TRUE(first->Read(&welcome));
  EXPECT_TRUE(welcome.has_welcome());
  auto second = stub->Connect(&second_ctx);
  second->Write(hello("two"));
  v1::ServerMessage refused;
  while (second->Read(&refused)) {
  }
  grpc::Status st = second->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(st.error_message(), HasSubstr("--max-streams-per-principal"));
  first->WritesDone();
  while (first->Read(&welcome)) {
  }
  EXPECT_TRUE(first->Finish().ok());
}

TEST_F(SecurityTest, NonLoopbackListenerNeedsTlsAndAuthentication) {
  CommandResult open = RunCommand({BinPath("strata-server"), "--listen", "0.0.0.0:0", "--http",
                                   "", "--data", dir_.File("d1")});
  EXPECT_EQ(open.exit_code, 2);
  EXPECT_THAT(open.output, HasSubstr("refusing to listen on 0.0.0.0:0 without TLS and "
                                     "authentication"));
  CommandResult tls_only = RunCommand({BinPath("strata-server"), "--listen", "0.0.0.0:0",
                                       "--http", "", "--data", dir_.File("d2"), "--tls-cert",
                                       Pki("server.pem"), "--tls-key", Pki("server.key")});
  EXPECT_EQ(tls_only.exit_code, 2);
  EXPECT_THAT(tls_only.output, HasSubstr("without authentication"));
  CommandResult http_open = RunCommand({BinPath("strata-server"), "--listen", "127.0.0.1:0",
                                        "--http", "0.0.0.0:0", "--data", dir_.File("d3")});
  EXPECT_EQ(http_open.exit_code, 2);
  // With everything, or with --insecure, it starts.
  for (std::vector<std::string> args :
       {TlsFlags(), std::vector<std::string>{"--insecure"}}) {
    std::vector<std::string> argv{BinPath("strata-server"), "--listen", "0.0.0.0:0", "--http",
                                  "", "--data", dir_.File(absl::StrCat("d", args.size()))};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess server(argv, dir_.File(absl::StrCat("s", args.size(), ".log")));
    EXPECT_TRUE(server.WaitForOutput("ready on port", 30)) << server.Output();
  }
  // A mismatched key is named at start.
  CommandResult mismatch = RunCommand({BinPath("strata-server"), "--listen", "127.0.0.1:0",
                                       "--http", "", "--data", dir_.File("d5"), "--tls-cert",
                                       Pki("server.pem"), "--tls-key",
                                       Pki("clients/laptop.key")});
  EXPECT_EQ(mismatch.exit_code, 2);
  EXPECT_THAT(mismatch.output, HasSubstr("does not belong to the certificate"));
}

}  // namespace
}  // namespace strata::e2e
