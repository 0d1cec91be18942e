// Test helper: a single-member etcd (/usr/bin/etcd, Debian's etcd-server) run as a child
// process on free ports of loopback (or of another local address, for network partitions), with its data directory and log in a temp dir. Tests use it
// to check the etcd client against the real server, including etcd going away (Kill) and
// coming back with its data (Restart).
//
// The object owns the process and the temp dir: the destructor kills etcd and removes both.
// etcd also gets SIGKILL if the thread that started it exits (PR_SET_PDEATHSIG), so a crashed
// test leaves no etcd behind; start it from the test's main thread. Not thread-safe.
#ifndef STRATA_SERVER_CLUSTER_ETCD_ETCD_TEST_SERVER_H_
#define STRATA_SERVER_CLUSTER_ETCD_ETCD_TEST_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace strata::server::cluster {

// TLS of a test etcd: it serves https:// with `cert_file`/`key_file` (signed by `ca_file`)
// and accepts only clients whose certificate `ca_file` signed (--client-cert-auth). The server's own readiness
// check presents `client_cert_file`/`client_key_file`.
struct EtcdTestTls {
  std::string cert_file, key_file, ca_file;
  std::string client_cert_file, client_key_file;
};

class EtcdTestServer {
 public:
  static constexpr char kEtcdBinary[] = "/usr/bin/etcd";

  // Whether the etcd binary is installed; tests skip without it.
  static bool Available();

  // Starts etcd listening on `address` (an IPv4 address of this machine), over TLS when
  // `tls.cert_file` is set, and waits (up to `start_timeout`) until it serves reads. NotFound
  // without the binary; otherwise an error that includes the tail of etcd's log.
  static absl::StatusOr<std::unique_ptr<EtcdTestServer>> Start(
      absl::Duration start_timeout = absl::Seconds(60), const std::string& address = "127.0.0.1",
      const EtcdTestTls& tls = {});
  ~EtcdTestServer();
  EtcdTestServer(const EtcdTestServer&) = delete;
  EtcdTestServer& operator=(const EtcdTestServer&) = delete;

  // "http://ADDRESS:PORT" ("https://" with TLS), the same across restarts.
  const std::string& endpoint() const { return endpoint_; }
  bool running() const { return pid_ > 0; }

  // SIGKILL and wait: etcd goes away without closing anything properly.
  void Kill();
  // Kills etcd if it runs, then starts it again on the same ports and data directory (keys and
  // leases survive) and waits until it serves reads.
  absl::Status Restart();

  // The last `lines` lines of etcd's log (stdout and stderr of every run).
  std::string LogTail(int lines = 40) const;

 private:
  EtcdTestServer(std::string dir, std::string address, int client_port, int peer_port,
                 absl::Duration start_timeout, EtcdTestTls tls);
  absl::Status Launch();
  absl::Status WaitUntilServing();

  const std::string dir_;
  const std::string address_;
  const int peer_port_;
  const absl::Duration start_timeout_;
  const EtcdTestTls tls_;
  const std::string endpoint_;
  pid_t pid_ = -1;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_ETCD_ETCD_TEST_SERVER_H_
