// Calls a cluster node makes to the other live nodes on a client's behalf: a capture runs on
// the node holding its agent's stream and is stored there, so runs, lists and gets of
// captures are routed to the others; a debug file uploaded to one node is copied to the
// others, and DebugInfoSync brings nodes that missed an upload up to date; the checking
// node's release records are copied to the others. Each such call is marked routed, so that
// the node called answers from itself alone and routes nothing further.
//
// The functions borrow the membership and channels; DebugInfoSync owns its thread.
#ifndef STRATA_SERVER_CLUSTER_ROUTING_H_
#define STRATA_SERVER_CLUSTER_ROUTING_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/cluster/membership.h"
#include "server/cluster/replication.h"
#include "strata/v1/capture.grpc.pb.h"
#include "strata/v1/debuginfo.grpc.pb.h"
#include "strata/v1/regress.grpc.pb.h"

namespace strata::server::cluster {

// Runs a capture on the node whose agent stream serves its target: asks the other live nodes
// in turn (the first that does not answer NotFound runs it) and relays the progress. A call
// that was already routed is not routed again. For CaptureService::Options::run_elsewhere.
grpc::Status RunCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context,
                                 const v1::RunCaptureRequest& request,
                                 grpc::ServerWriter<v1::CaptureProgress>* writer);

// The captures stored on the other live nodes (each node keeps those it ran), and one of
// them by ID, for CaptureService::Options::list_elsewhere and get_elsewhere. A call that was
// already routed is answered by its node alone.
std::vector<v1::CaptureRecord> ListCapturesElsewhere(Membership* membership,
                                                     NodeChannels* channels,
                                                     grpc::ServerContext* context,
                                                     absl::Duration timeout,
                                                     std::vector<std::string>* unreachable);
// The release and phase verdicts kept by the other live nodes (the node that checked when
// each was computed keeps it), for RegressionsOptions::list_elsewhere. A call that was
// already routed is answered by its node alone.
std::vector<v1::ReleaseVerdict> ListRegressionsElsewhere(
    Membership* membership, NodeChannels* channels, grpc::ServerContext* context,
    absl::Duration timeout, const v1::ListRegressionsRequest& request,
    std::vector<std::string>* unreachable);
grpc::Status GetCaptureElsewhere(Membership* membership, NodeChannels* channels,
                                 grpc::ServerContext* context, absl::Duration timeout,
                                 const v1::GetCaptureRequest& request, v1::CaptureRecord* record);
// Cancels a capture running on another live node (the one that runs it, for its agents'
// streams), for CaptureService::Options::cancel_elsewhere: whether a node cancelled it. A call
// that was already routed is answered by its node alone.
bool CancelCaptureElsewhere(Membership* membership, NodeChannels* channels,
                            grpc::ServerContext* context, absl::Duration timeout,
                            const v1::CancelCaptureRequest& request);

// Copies a debug file uploaded here to the other live nodes (DebugInfoService's
// copy_elsewhere), as uploads of their own; returns the nodes it could not be copied to. A
// copy is not copied again.
std::vector<std::string> CopyDebugInfoElsewhere(Membership* membership, NodeChannels* channels,
                                                grpc::ServerContext* context,
                                                const std::string& path,
                                                const std::string& file_name,
                                                const std::string& build_id);

// Has the live node `node_id` keep copies of release records (Cluster.KeepReleaseRecords),
// within `timeout`, for RegressionsOptions::copy_to; NotFound when it is not in the ring.
absl::Status CopyReleasesTo(Membership* membership, NodeChannels* channels,
                            absl::Duration timeout, const std::string& node_id,
                            const std::vector<v1::ReleaseVerdict>& releases);
// The IDs of the live nodes but this one, for RegressionsOptions::other_nodes.
std::vector<std::string> OtherNodes(const Membership& membership);
// The release records the other live nodes hold (Cluster.LocalReleaseRecords), for
// RegressionsOptions::records_elsewhere; the nodes that did not answer within `timeout` are
// named in `unreachable`.
std::vector<v1::ReleaseVerdict> ReleaseRecordsElsewhere(Membership* membership,
                                                        NodeChannels* channels,
                                                        absl::Duration timeout,
                                                        std::vector<std::string>* unreachable);

// A debug file stored on this node, for DebugInfoSync.
struct LocalDebugFile {
  std::string build_id;   // lowercase hex
  std::string file_name;  // as uploaded
  std::string path;       // where this node keeps it
};

// Keeps every live node's uploaded debug files the same: a node that was down while a file
// was uploaded, or joined later, gets it. Each round lists every live node's uploads
// (DebugInfo.List); for each file some live node lacks, the holder with the smallest node ID
// sends it (DebugInfo.Upload, marked routed so that it is not copied further). Rounds run
// every `interval` and soon after each ring change. Borrows the membership and channels.
class DebugInfoSync {
 public:
  using LocalFiles = std::function<std::vector<LocalDebugFile>()>;
  DebugInfoSync(Membership* membership, NodeChannels* channels, LocalFiles local_files,
                absl::Duration interval);
  ~DebugInfoSync();  // stops the rounds
  DebugInfoSync(const DebugInfoSync&) = delete;
  DebugInfoSync& operator=(const DebugInfoSync&) = delete;

  uint64_t files_sent() const { return sent_.load(std::memory_order_relaxed); }
  uint64_t failures() const { return failures_.load(std::memory_order_relaxed); }

 private:
  // One round: files sent, and the failures ("n3 (addr): reason").
  struct Round {
    uint64_t sent = 0;
    std::vector<std::string> failures;
  };
  Round RunOnce();
  void Loop();

  Membership* const membership_;
  NodeChannels* const channels_;
  const LocalFiles local_files_;
  const absl::Duration interval_;
  std::atomic<uint64_t> sent_{0}, failures_{0};
  // Shared with the membership's observer, which outlives this object.
  struct Wakeup {
    absl::Mutex mu;
    bool stop ABSL_GUARDED_BY(mu) = false;
    bool ring_changed ABSL_GUARDED_BY(mu) = false;
    grpc::ClientContext* call ABSL_GUARDED_BY(mu) = nullptr;  // cancelled on destruction
  };
  // Registers the round's call in flight; false once stopping.
  bool Begin(grpc::ClientContext* call);
  void End();
  const std::shared_ptr<Wakeup> wakeup_ = std::make_shared<Wakeup>();
  std::thread thread_;
};

}  // namespace strata::server::cluster

#endif  // STRATA_SERVER_CLUSTER_ROUTING_H_
