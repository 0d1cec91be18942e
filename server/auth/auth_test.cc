#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/client_security.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/auth/auth_file.h"
#include "server/auth/authorizer.h"
#include "server/auth/tls_credentials.h"

namespace strata::server::auth {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Line(const std::string& name, const std::string& role, const std::string& token) {
  return absl::StrCat("token ", name, " ", role, " ", FormatTokenHash(HashToken(token)), "\n");
}

TEST(AuthFileTest, HashIsSha256) {
  // sha256("abc"), FIPS 180-2 appendix B.1.
  EXPECT_EQ(FormatTokenHash(HashToken("abc")),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST(AuthFileTest, ParsesTokensAndCertificates) {
  const std::string text = absl::StrCat("# fleet\n", Line("alice", "reader", "t-alice"),
                                        "  ", Line("ops", "operator", "t-ops"),
                                        "cert host-1 agent   # a host\n\ncert laptop operator\n");
  auto table = ParseAuthFile(text, "auth");
  ASSERT_TRUE(table.ok()) << table.status();
  ASSERT_EQ(table->tokens.size(), 2u);
  EXPECT_EQ(table->certificates.at("laptop"), Role::kOperator);
  const AuthTable::Token* t = table->FindToken("t-ops");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->name, "ops");
  EXPECT_EQ(t->role, Role::kOperator);
  EXPECT_EQ(table->FindToken("t-nobody"), nullptr);
  EXPECT_EQ(table->FindToken(""), nullptr);
}

TEST(AuthFileTest, ErrorsNameFileAndLine) {
  struct Case {
    std::string text;
    std::string error;
  } cases[] = {
      {"\n\nuser alice reader x\n", "auth.conf:3: unknown entry 'user'"},
      {"token alice admin sha256:00\n", "auth.conf:1: unknown role 'admin'"},
      {"token alice reader s3cret\n", "auth.conf:1: the token must be given as sha256"},
      {"cert h1\n", "auth.conf:1: expected 'cert IDENTITY ROLE'"},
      {"cert h1 agent\ncert h1 reader\n", "auth.conf:2: certificate 'h1' is listed twice"},
      {Line("a", "reader", "x") + Line("a", "agent", "y"), "auth.conf:2: token 'a' is listed"},
  };
  for (const Case& c : cases) {
    auto table = ParseAuthFile(c.text, "auth.conf");
    ASSERT_FALSE(table.ok()) << c.text;
    EXPECT_THAT(std::string(table.status().message()), HasSubstr(c.error));
    // A token pasted in clear is never echoed.
    EXPECT_THAT(std::string(table.status().message()), ::testing::Not(HasSubstr("s3cret")));
  }
}

class AuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("strata-auth-", getpid());
    fs::create_directories(dir_);
    path_ = (dir_ / "auth").string();
    Write(Line("alice", "reader", "t-alice") + Line("ops", "operator", "t-ops") +
          Line("fleet", "agent", "t-fleet") + "cert laptop operator\n");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Replaces the file atomically, as an operator's tools (or a config manager) would.
  void Write(const std::string& text) {
    const std::string tmp = path_ + ".tmp";
    std::ofstream(tmp) << text;
    fs::rename(tmp, path_);
  }

  std::unique_ptr<Authorizer> Make(AuthorizerOptions options) {
    options.auth_file = path_;
    auto a = Authorizer::Create(options);
    EXPECT_TRUE(a.ok()) << a.status();
    return std::move(*a);
  }

  static Credentials Bearer(std::string token) { return {"Bearer " + token, ""}; }

  fs::path dir_;
  std::string path_;
};

TEST_F(AuthorizerTest, OpenWithoutTokensOrCertificates) {
  auto a = Authorizer::Create({});
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE((*a)->enabled());
  for (Role need : {Role::kAgent, Role::kReader, Role::kOperator}) {
    auto p = (*a)->Authorize({}, need, "anything");
    ASSERT_TRUE(p.ok()) << RoleName(need);
    EXPECT_EQ(p->kind, Principal::Kind::kAnonymous);
  }
}

// Another node of a cluster may do what every other role may; no other role may do what only
// nodes do.
TEST(RoleTest, NodeGrantsEveryRoleAndNoOtherRoleGrantsNode) {
  for (Role need : {Role::kAgent, Role::kReader, Role::kOperator, Role::kNode}) {
    EXPECT_TRUE(Grants(Role::kNode, need)) << RoleName(need);
  }
  for (Role have : {Role::kAgent, Role::kReader, Role::kOperator}) {
    EXPECT_FALSE(Grants(have, Role::kNode)) << RoleName(have);
  }
  EXPECT_EQ(ParseRole("node"), Role::kNode);
  EXPECT_STREQ(RoleName(Role::kNode), "node");
}

TEST_F(AuthorizerTest, TokensAndRoles) {
  auto a = Make({});
  auto alice = a->Authorize(Bearer("t-alice"), Role::kReader, "queries");
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->name, "alice");
  // HTTP Basic with the token as the password (browsers).
  const std::string basic = "Basic " + absl::Base64Escape("anyone:t-ops");
  EXPECT_TRUE(a->Authorize({basic, ""}, Role::kOperator, "starting captures").ok());
  EXPECT_TRUE(a->Authorize(Bearer("t-ops"), Role::kReader, "queries").ok());

  auto denied = a->Authorize(Bearer("t-alice"), Role::kOperator, "starting captures");
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status()));
  EXPECT_THAT(std::string(denied.status().message()),
              HasSubstr("token alice has role reader; starting captures needs role operator"));
  EXPECT_TRUE(absl::IsPermissionDenied(
      a->Authorize(Bearer("t-fleet"), Role::kReader, "queries").status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      a->Authorize(Bearer("t-alice"), Role::kAgent, "ingest").status()));

  auto unknown = a->Authorize(Bearer("t-guess"), Role::kReader, "queries");
  EXPECT_TRUE(absl::IsUnauthenticated(unknown.status()));
  EXPECT_THAT(std::string(unknown.status().message()), ::testing::Not(HasSubstr("t-guess")));
  auto none = a->Authorize({}, Role::kReader, "queries");
  EXPECT_TRUE(absl::IsUnauthenticated(none.status()));
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("--token-file"));
  EXPECT_TRUE(absl::IsUnauthenticated(
      a->Authorize({"Digest x", ""}, Role::kReader, "queries").status()));

  const AuthStats s = a->stats();
  EXPECT_EQ(s.permission_denied, 3u);
  EXPECT_EQ(s.unauthenticated, 3u);
}

TEST_F(AuthorizerTest, Certificates) {
  auto a = Make({.client_certificates = true});
  auto host = a->Authorize({"", "host-1"}, Role::kAgent, "ingest");
  ASSERT_TRUE(host.ok());
  EXPECT_EQ(host->kind, Principal::Kind::kCertificate);
  EXPECT_EQ(host->name, "host-1");
  EXPECT_TRUE(absl::IsPermissionDenied(
      a->Authorize({"", "host-1"}, Role::kReader, "queries").status()));
  // Listed certificates take their role from the file.
  EXPECT_TRUE(a->Authorize({"", "laptop"}, Role::kOperator, "starting captures").ok());
  // A token, when given, is the principal.
  EXPECT_EQ(a->Authorize({"Bearer t-alice", "host-1"}, Role::kReader, "queries")->name, "alice");

  auto listed_only = Make({.client_certificates = true, .certificate_role = std::nullopt});
  EXPECT_TRUE(absl::IsUnauthenticated(
      listed_only->Authorize({"", "host-1"}, Role::kAgent, "ingest").status()));
  EXPECT_TRUE(listed_only->Authorize({"", "laptop"}, Role::kReader, "queries").ok());
}

bool WaitFor(const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

TEST_F(AuthorizerTest, ReloadsTheFileWhenItChanges) {
  auto a = Make({.reload_interval = absl::Milliseconds(20)});
  ASSERT_TRUE(a->Authorize(Bearer("t-alice"), Role::kReader, "queries").ok());
  Write(Line("bob", "reader", "t-bob"));
  ASSERT_TRUE(WaitFor([&] { return a->stats().reloads == 1; }));
  EXPECT_TRUE(a->Authorize(Bearer("t-bob"), Role::kReader, "queries").ok());
  EXPECT_TRUE(absl::IsUnauthenticated(
      a->Authorize(Bearer("t-alice"), Role::kReader, "queries").status()));

  // A broken file is refused once and the previous table stays in force.
  Write("token carol reader not-a-hash\n");
  ASSERT_TRUE(WaitFor([&] { return a->stats().reload_errors == 1; }));
  EXPECT_TRUE(a->Authorize(Bearer("t-bob"), Role::kReader, "queries").ok());
  EXPECT_EQ(a->stats().reloads, 1u);
}

TEST_F(AuthorizerTest, MissingOrBrokenFileFailsAtStart) {
  auto missing = Authorizer::Create({.auth_file = (dir_ / "nope").string()});
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  Write("cert x nobody\n");
  auto broken = Authorizer::Create({.auth_file = path_});
  EXPECT_THAT(std::string(broken.status().message()), HasSubstr(path_ + ":1:"));
}

TEST_F(AuthorizerTest, QueryRatePerPrincipal) {
  auto a = Make({.query_rate = 0.001, .query_burst = 3});
  Principal alice{Principal::Kind::kToken, "alice", Role::kReader};
  Principal ops{Principal::Kind::kToken, "ops", Role::kOperator};
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(a->AdmitQuery(alice).ok());
  absl::Status over = a->AdmitQuery(alice);
  EXPECT_TRUE(absl::IsResourceExhausted(over));
  EXPECT_THAT(std::string(over.message()), HasSubstr("--query-rate"));
  // Another principal has its own budget.
  EXPECT_TRUE(a->AdmitQuery(ops).ok());
  EXPECT_EQ(a->stats().rate_limited, 1u);
}

TEST(TlsCredentialsTest, LoopbackAddresses) {
  for (const char* local : {"127.0.0.1:7070", "127.1.2.3:0", "localhost:7070", "[::1]:7070",
                            "unix:/run/strata.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(local)) << local;
  }
  for (const char* remote : {"0.0.0.0:7070", ":7070", "[::]:7070", "10.0.0.5:7070",
                             "strata.example.net:7070", "128.0.0.1:7070"}) {
    EXPECT_FALSE(IsLoopbackAddress(remote)) << remote;
  }
}

TEST(TlsCredentialsTest, MissingFilesAreNamed) {
  const fs::path dir = fs::temp_directory_path() / absl::StrCat("strata_tls_", getpid());
  auto tls = ServerTls::Create(
      {.cert_file = "/nonexistent/server.pem", .key_file = "/nonexistent/server.key"},
      (dir / "staging").string());
  EXPECT_THAT(std::string(tls.status().message()), HasSubstr("/nonexistent/server.pem"));
  EXPECT_TRUE(absl::IsInvalidArgument(CheckServerTlsFiles({.cert_file = "a.pem"})));
  EXPECT_FALSE(fs::exists(dir));
}

class ServerTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / absl::StrCat("strata_server_tls_", getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    for (const char* name : {"a", "b"}) {
      const std::string command = absl::StrCat(
          "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 "
          "-subj /CN=", name, " -keyout ", (dir_ / name).string(), ".key -out ",
          (dir_ / name).string(), ".pem 2>/dev/null");
      ASSERT_EQ(std::system(command.c_str()), 0) << command;
    }
    // The watcher's own looks an hour apart: the test's looks are the only ones.
    files_ = {.cert_file = (dir_ / "server.pem").string(),
              .key_file = (dir_ / "server.key").string(),
              .refresh_seconds = 3600};
    Put("a.pem", files_.cert_file);
    Put("a.key", files_.key_file);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Replaces `to` with a copy of `from` in one rename, as an operator's tools would.
  void Put(const std::string& from, const std::string& to) {
    fs::copy_file(dir_ / from, to + ".new", fs::copy_options::overwrite_existing);
    fs::rename(to + ".new", to);
  }
  std::string Read(const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
  std::string Staged(const char* name) { return Read(dir_ / "staging" / "current" / name); }

  fs::path dir_;
  ServerTlsFiles files_;
};

// gRPC reads the staged copies; a certificate renewed before its key is not staged, so new
// connections keep getting the previous pair instead of failing their handshakes.
TEST_F(ServerTlsTest, OnlyACertificateWithItsKeyIsStaged) {
  auto tls = ServerTls::Create(files_, (dir_ / "staging").string());
  ASSERT_TRUE(tls.ok()) << tls.status();
  ASSERT_NE((*tls)->credentials(), nullptr);
  EXPECT_EQ(Staged("cert.pem"), Read(dir_ / "a.pem"));
  EXPECT_EQ(Staged("key.pem"), Read(dir_ / "a.key"));
  EXPECT_EQ(fs::status(dir_ / "staging").permissions(), fs::perms::owner_all);
  EXPECT_EQ(fs::status(dir_ / "staging" / "current" / "key.pem").permissions(),
            fs::perms::owner_read | fs::perms::owner_write);
  const auto first_mtime = fs::last_write_time(dir_ / "staging" / "current" / "key.pem");
  EXPECT_FALSE((*tls)->StageIfChanged());  // nothing changed

  Put("b.pem", files_.cert_file);  // the new certificate first
  EXPECT_FALSE((*tls)->StageIfChanged());
  EXPECT_EQ((*tls)->refused(), 1u);
  EXPECT_EQ(Staged("cert.pem"), Read(dir_ / "a.pem"));
  EXPECT_FALSE((*tls)->StageIfChanged());  // refused once, not at every look
  EXPECT_EQ((*tls)->refused(), 1u);

  Put("b.key", files_.key_file);  // then its key
  EXPECT_TRUE((*tls)->StageIfChanged());
  EXPECT_EQ((*tls)->staged(), 1u);
  EXPECT_EQ(Staged("cert.pem"), Read(dir_ / "b.pem"));
  EXPECT_EQ(Staged("key.pem"), Read(dir_ / "b.key"));
  // A second later at least, so that gRPC's whole-second check sees the switch.
  EXPECT_GE(fs::last_write_time(dir_ / "staging" / "current" / "key.pem") - first_mtime,
            std::chrono::seconds(1));

  // Files that cannot be read at all are refused the same way.
  fs::remove(files_.key_file);
  EXPECT_FALSE((*tls)->StageIfChanged());
  EXPECT_EQ((*tls)->refused(), 2u);
  EXPECT_EQ(Staged("key.pem"), Read(dir_ / "b.key"));
  tls->reset();
  EXPECT_FALSE(fs::exists(dir_ / "staging"));
}

// An expired certificate fails every handshake with the same "certificate verify failed" as
// one of another CA: the programs warn of it when they take it, and of one expiring soon.
TEST_F(ServerTlsTest, CertificateValidityIsWarnedOf) {
  const std::string cert = (dir_ / "a.pem").string();  // valid for one day from now
  const absl::Time now = absl::Now();
  EXPECT_THAT(strata::rpc::CertificateValidityWarning(cert, now), HasSubstr("expires on "));
  EXPECT_THAT(strata::rpc::CertificateValidityWarning(cert, now), HasSubstr(", in 0 days"));
  EXPECT_EQ(strata::rpc::CertificateValidityWarning(cert, now, absl::ZeroDuration()), "");
  EXPECT_THAT(strata::rpc::CertificateValidityWarning(cert, now + absl::Hours(48)),
              HasSubstr(cert + " expired on "));
  EXPECT_THAT(strata::rpc::CertificateValidityWarning(cert, now - absl::Hours(1)),
              HasSubstr(cert + " is not valid before "));
  EXPECT_EQ(strata::rpc::CertificateValidityWarning("/nonexistent.pem", now), "");

  // A client whose certificate the server refused hears only "Socket closed": it is told
  // what to check.
  auto client = strata::rpc::ClientSecurity::Load(
      {.ca_file = cert, .cert_file = cert, .key_file = (dir_ / "a.key").string()});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_THAT(client->ConnectionErrorHint("ipv4:127.0.0.1:7070: Socket closed"),
              HasSubstr(cert + " signed by the CA of its --tls-client-ca"));
  EXPECT_EQ(client->ConnectionErrorHint("Connection refused"), "");
  auto server_only = strata::rpc::ClientSecurity::Load({.ca_file = cert});
  ASSERT_TRUE(server_only.ok()) << server_only.status();
  EXPECT_EQ(server_only->ConnectionErrorHint("Socket closed"), "");
}

}  // namespace
}  // namespace strata::server::auth
