#include "server/cluster/etcd/etcd_test_server.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/testing/free_port.h"
#include "server/cluster/etcd/etcd_client.h"

extern char** environ;

namespace strata::server::cluster {
namespace {

constexpr char kMemberName[] = "strata-test";

absl::StatusOr<std::string> MakeTempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "strata_etcd_XXXXXX").string();
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", strerror(errno)));
  }
  return pattern;
}

std::string Url(const std::string& address, int port, bool tls = false) {
  return absl::StrCat(tls ? "https://" : "http://", address, ":", port);
}

}  // namespace

bool EtcdTestServer::Available() { return access(kEtcdBinary, X_OK) == 0; }

absl::StatusOr<std::unique_ptr<EtcdTestServer>> EtcdTestServer::Start(
    absl::Duration start_timeout, const std::string& address, const EtcdTestTls& tls) {
  if (!Available()) {
    return absl::NotFoundError(
        absl::StrCat(kEtcdBinary, " is not installed (Debian package etcd-server)"));
  }
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    absl::StatusOr<std::string> dir = MakeTempDir();
    if (!dir.ok()) return dir.status();
    // Free when handed out; etcd binds them soon after, and another process that was faster
    // makes the loop try other ports.
    const int client_port = strata::testing::FreeLoopbackPort();
    const int peer_port = strata::testing::FreeLoopbackPort();
    if (client_port == 0 || peer_port == 0) {
      std::error_code ec;
      std::filesystem::remove_all(*dir, ec);
      return absl::InternalError("no free loopback port");
    }
    std::unique_ptr<EtcdTestServer> server(
        new EtcdTestServer(*dir, address, client_port, peer_port, start_timeout, tls));
    last = server->Launch();
    if (last.ok()) last = server->WaitUntilServing();
    if (last.ok()) return server;
    // Another process took a port before etcd's bind: try other ports.
    if (!absl::StrContains(server->LogTail(), "address already in use")) break;
  }
  return last;
}

EtcdTestServer::EtcdTestServer(std::string dir, std::string address, int client_port,
                               int peer_port, absl::Duration start_timeout, EtcdTestTls tls)
    : dir_(std::move(dir)),
      address_(std::move(address)),
      peer_port_(peer_port),
      start_timeout_(start_timeout),
      tls_(std::move(tls)),
      endpoint_(Url(address_, client_port, !tls_.cert_file.empty())) {}

EtcdTestServer::~EtcdTestServer() {
  Kill();
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

absl::Status EtcdTestServer::Launch() {
  const std::string peer_url = Url(address_, peer_port_);
  const std::pair<const char*, std::string> flags[] = {
      {"--name", kMemberName},
      {"--data-dir", dir_ + "/data"},
      {"--listen-client-urls", endpoint_},
      {"--advertise-client-urls", endpoint_},
      {"--listen-peer-urls", peer_url},
      {"--initial-advertise-peer-urls", peer_url},
      {"--initial-cluster", absl::StrCat(kMemberName, "=", peer_url)},
      {"--logger", "zap"},
      {"--log-outputs", "stderr"},
  };
  std::vector<std::string> args = {kEtcdBinary};
  for (const auto& [flag, value] : flags) {
    args.push_back(flag);
    args.push_back(value);
  }
  if (!tls_.cert_file.empty()) {
    args.insert(args.end(), {"--cert-file", tls_.cert_file, "--key-file", tls_.key_file});
  }
  if (!tls_.ca_file.empty()) {
    args.insert(args.end(), {"--trusted-ca-file", tls_.ca_file, "--client-cert-auth"});
  }
  // ETCD_* variables are etcd's flags too: keep the caller's out of the test server.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!absl::StartsWith(*e, "ETCD_")) env.emplace_back(*e);
  }
  std::vector<char*> argv, envp;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  for (std::string& var : env) envp.push_back(var.data());
  envp.push_back(nullptr);
  const std::string log = dir_ + "/etcd.log";
  const pid_t parent = getpid();

  // Only async-signal-safe calls between fork and exec: the test process has threads.
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1);
    const int out = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    const int in = open("/dev/null", O_RDONLY);
    if (out < 0 || in < 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(out, 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  pid_ = pid;
  return absl::OkStatus();
}

absl::Status EtcdTestServer::WaitUntilServing() {
  EtcdClient::Options options;
  if (!tls_.cert_file.empty()) {
    absl::StatusOr<rpc::ClientSecurity> security =
        rpc::ClientSecurity::Load({.ca_file = tls_.ca_file,
                                   .cert_file = tls_.client_cert_file,
                                   .key_file = tls_.client_key_file});
    if (!security.ok()) return security.status();
    options.security = *std::move(security);
  }
  options.call_timeout = absl::Seconds(1);
  options.max_reconnect_backoff = absl::Milliseconds(100);
  absl::StatusOr<std::unique_ptr<EtcdClient>> client = EtcdClient::Create(endpoint_, options);
  if (!client.ok()) return client.status();
  const absl::Time deadline = absl::Now() + start_timeout_;
  absl::Status last;
  while (true) {
    int wait_status = 0;
    if (waitpid(pid_, &wait_status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::InternalError(absl::StrCat("etcd exited (status ", wait_status,
                                              ") before serving; its log ends with:\n", LogTail()));
    }
    last = (*client)->GetPrefix("strata-etcd-test-server/").status();
    if (last.ok()) return absl::OkStatus();
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  Kill();
  return absl::DeadlineExceededError(
      absl::StrCat("etcd not serving after ", absl::FormatDuration(start_timeout_), " (",
                   last.ToString(), "); its log ends with:\n", LogTail()));
}

void EtcdTestServer::Kill() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  int wait_status;
  while (waitpid(pid_, &wait_status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

absl::Status EtcdTestServer::Restart() {
  Kill();
  absl::Status status = Launch();
  if (status.ok()) status = WaitUntilServing();
  return status;
}

std::string EtcdTestServer::LogTail(int lines) const {
  std::ifstream in(dir_ + "/etcd.log");
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(std::move(line));
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

}  // namespace strata::server::cluster
