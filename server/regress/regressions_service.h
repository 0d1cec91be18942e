// The Regressions service: runs the release watcher (release_watcher.h) on a thread of its
// own every `check_interval`, keeps its verdicts in the store, answers ListRegressions (gRPC,
// and the HTTP mirror through RunList), exports the regressed functions to Prometheus and
// POSTs each verdict that changed to an optional webhook.
//
// In a cluster one node checks; after each check it sends the other nodes the release
// records they have not confirmed yet (copy_to), and they keep them (Keep), so every node
// holds every verdict. A node that becomes the checking one first keeps the other nodes'
// records (records_elsewhere), in case it missed copies, and its watcher continues from what
// it holds.
//
// Borrows the store and the authorizer; the comparison, the services and their label sets
// come through ReleaseWatcherInputs (the query service's, so a cluster's nodes are all read).
#ifndef STRATA_SERVER_REGRESS_REGRESSIONS_SERVICE_H_
#define STRATA_SERVER_REGRESS_REGRESSIONS_SERVICE_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "server/auth/authorizer.h"
#include "server/regress/release_watcher.h"
#include "server/regress/webhook.h"
#include "server/store/store.h"
#include "strata/v1/regress.grpc.pb.h"

namespace strata::server::regress {

struct RegressionsOptions {
  ReleaseWatcherOptions watcher;
  absl::Duration check_interval = absl::Seconds(60);
  std::string webhook_url;  // empty: none
  std::string webhook_ca_file;  // PEM CAs an https webhook's certificate is checked against
                                // (empty: the system's)
  absl::Duration webhook_timeout = absl::Seconds(5);
  // Whether this server checks now (a cluster's nodes leave it to one of them); null: always.
  std::function<bool()> should_check;
  // The verdicts the other nodes of a cluster keep (each node keeps those it computed while
  // it was the checking one), with the nodes that did not answer; null: none. `context` is
  // the caller's call (null from HTTP).
  std::function<std::vector<v1::ReleaseVerdict>(grpc::ServerContext* context,
                                                const v1::ListRegressionsRequest& request,
                                                std::vector<std::string>* unreachable)>
      list_elsewhere;
  // The other live nodes of a cluster (their IDs), a call that has one of them keep copies
  // of release records (Keep there), and their release records (Releases there) with the
  // nodes that did not answer; null: none.
  std::function<std::vector<std::string>()> other_nodes;
  std::function<absl::Status(const std::string& node,
                             const std::vector<v1::ReleaseVerdict>& releases)>
      copy_to;
  std::function<std::vector<v1::ReleaseVerdict>(std::vector<std::string>* unreachable)>
      records_elsewhere;
};

// The webhook's body for one verdict: {"service", "label", "baseline", "candidate", "state",
// "final", "functions": [...], ...}, the verdict's JSON (proto3 JSON names).
std::string VerdictJson(const v1::ReleaseVerdict& verdict);

class RegressionsService final : public v1::Regressions::Service {
 public:
  // Reads the stored releases; InvalidArgument for a webhook URL that does not parse.
  static absl::StatusOr<std::unique_ptr<RegressionsService>> Create(
      RegressionsOptions options, ReleaseWatcherInputs inputs, store::Store* store,
      auth::Authorizer* authorizer);
  ~RegressionsService() override;  // Stop()

  void Start();  // the checking thread
  void Stop();   // ends it after the check in progress

  // One check now, on the caller's thread (tests, and the first check after start).
  absl::Status CheckNow();

  grpc::Status ListRegressions(grpc::ServerContext* context,
                               const v1::ListRegressionsRequest* request,
                               v1::ListRegressionsResponse* response) override;
  // This node's verdicts and the other nodes' (list_elsewhere), one per release or phase
  // change (the most recently computed), newest first.
  absl::StatusOr<v1::ListRegressionsResponse> RunList(const v1::ListRegressionsRequest& request,
                                                      grpc::ServerContext* context = nullptr);

  // Another node's release records, each kept where it is newer than this node's state of
  // its release (ReleaseWatcher::Keep), in the store too; how many were.
  absl::StatusOr<size_t> Keep(const std::vector<v1::ReleaseVerdict>& releases);
  // This node's release records, its own and copies (ReleaseWatcher::Releases).
  std::vector<v1::ReleaseVerdict> Releases() const { return watcher_->Releases(); }

  // Prometheus text: strata_regression_detected{service,function,candidate,kind} 1 for the
  // functions of each service's newest REGRESSED verdict; checks, comparisons and webhook posts
  // counted.
  std::string RenderMetrics() const;

 private:
  RegressionsService(RegressionsOptions options, std::unique_ptr<ReleaseWatcher> watcher,
                     std::optional<WebhookUrl> webhook, auth::Authorizer* authorizer);

  const RegressionsOptions options_;
  // Sends each other node the release records it has not confirmed yet (copy_to).
  void CopyElsewhere() ABSL_EXCLUSIVE_LOCKS_REQUIRED(check_mu_);
  // Keeps the other nodes' release records (records_elsewhere): those of the node that
  // checked before this one. False when a node did not answer.
  bool CatchUp();

  const std::unique_ptr<ReleaseWatcher> watcher_;
  const std::optional<WebhookUrl> webhook_;
  auth::Authorizer* const authorizer_;
  std::atomic<uint64_t> checks_{0}, check_failures_{0}, changes_{0};
  std::atomic<uint64_t> webhook_posts_{0}, webhook_failures_{0};
  std::atomic<uint64_t> copies_sent_{0}, copy_failures_{0}, copies_kept_{0};
  absl::Mutex check_mu_;  // one check at a time
  // By node ID: a hash of each release record (by ReleaseId) the node confirmed keeping.
  std::map<std::string, std::map<std::string, size_t>> copied_ ABSL_GUARDED_BY(check_mu_);
  absl::Notification stop_;
  std::thread thread_;
};

}  // namespace strata::server::regress

#endif  // STRATA_SERVER_REGRESS_REGRESSIONS_SERVICE_H_
