// server/capture: ad hoc captures, the only server module that speaks capture.proto. It
// reaches agents through the registry and learns of stored capture samples from ingest's
// observers (wired in server/app/server_app.cc), so it depends on neither ingest nor query.
//
// Ad hoc captures (proto/strata/v1/capture.proto): the gRPC Capture service and the state of
// running captures.
//
// A capture is driven by the Run call that started it: the handler sends StartCapture to the
// target's agents (through server/registry's AgentRegistry::Send, i.e. their ingest streams),
// then follows the capture with what ingest reports (OnSamplesStored, OnStatus
// for the agents' CaptureStatus) and streams progress to the caller. When the caller goes
// away (Ctrl-C in the CLI) or Cancel is called, StopCapture goes to every agent of the
// capture. Metadata (store::CaptureInfo) is written when the capture starts and when it ends;
// samples are written by ingest (captures column family).
//
// One capture per agent at a time: a second capture that needs a busy agent is refused with
// ALREADY_EXISTS naming the running one (two high-rate sessions on one host would share one
// CPU budget and double the perturbation of the target).
//
// Retention: Sweep() deletes captures whose end is older than the retention through
// Options::deleter (strata-server passes Store's DeleteCapture); without a deleter they are
// only hidden from List and Get.
//
// Thread safety: all methods may be called from any thread. The service borrows the store and
// the registry, which must outlive it.
#ifndef STRATA_SERVER_CAPTURE_CAPTURE_SERVICE_H_
#define STRATA_SERVER_CAPTURE_CAPTURE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/auth/grpc_auth.h"
#include "server/registry/agent_registry.h"
#include "server/store/store.h"
#include "strata/v1/capture.grpc.pb.h"

namespace strata::server::capture {

class CaptureService final : public v1::Capture::Service {
 public:
  struct Options {
    // Extra time after the duration for agents to ship their last batch and report the end.
    absl::Duration grace = absl::Seconds(5);
    // How often Run writes progress.
    absl::Duration progress_interval = absl::Milliseconds(250);
    // Captures that ended longer ago are dropped by Sweep(); zero keeps them forever.
    absl::Duration retention = absl::Hours(24 * 7);
    absl::Duration sweep_interval = absl::Hours(1);
    // Deletes a capture's metadata and samples; unset: expired captures are only hidden.
    std::function<absl::Status(const std::string& capture_id)> deleter;
    // Caps on what a caller may ask of the agents (their CPU cost is the operator's call,
    // not the client's): requests above them are refused with INVALID_ARGUMENT.
    uint32_t max_frequency_hz = 1000;
    absl::Duration max_duration = absl::Hours(1);
    // Run and Cancel need role operator, List and Get reader; null allows every call.
    auth::Authorizer* authorizer = nullptr;
    // In a cluster: runs a capture whose target has no agent connected here on the node
    // that holds the agent's stream, relaying its progress (server/cluster). Unset: NotFound.
    std::function<grpc::Status(grpc::ServerContext* context, const v1::RunCaptureRequest& request,
                               grpc::ServerWriter<v1::CaptureProgress>* writer)>
        run_elsewhere;
    // In a cluster, where captures are stored on the node that ran them: the other nodes'
    // captures (nodes that did not answer go to `unreachable`), and one capture not stored
    // here (NotFound when no node has it).
    std::function<std::vector<v1::CaptureRecord>(grpc::ServerContext* context,
                                                 std::vector<std::string>* unreachable)>
        list_elsewhere;
    std::function<grpc::Status(grpc::ServerContext* context, const v1::GetCaptureRequest& request,
                               v1::CaptureRecord* record)>
        get_elsewhere;
    // In a cluster: cancels a capture running on another node (the one holding its agents'
    // streams); whether one did.
    std::function<bool(grpc::ServerContext* context, const v1::CancelCaptureRequest& request)>
        cancel_elsewhere;
  };

  CaptureService(store::Store* store, registry::AgentRegistry* registry, Options options);
  ~CaptureService() override;

  // What ingest reports (strata-server wires them to IngestService's observers): `samples`
  // of capture `capture_id` from `agent_id` were stored; an agent's CaptureStatus.
  void OnSamplesStored(const std::string& agent_id, const std::string& capture_id,
                       uint64_t samples);
  void OnStatus(const std::string& agent_id, const v1::CaptureStatus& status);

  // Marks captures a previous server process left running as failed, runs a sweep, and then
  // sweeps every `sweep_interval` on a background thread until destruction.
  void Start();
  // Drops (or hides) captures that ended before now - retention. Returns how many.
  absl::StatusOr<int> Sweep(int64_t now_ms);
  // Requests refused for asking more than the server's caps.
  uint64_t limit_refusals() const { return limit_refusals_.load(); }

  grpc::Status Run(grpc::ServerContext* context, const v1::RunCaptureRequest* request,
                   grpc::ServerWriter<v1::CaptureProgress>* writer) override;
  grpc::Status Cancel(grpc::ServerContext* context, const v1::CancelCaptureRequest* request,
                      v1::CancelCaptureResponse* response) override;
  grpc::Status List(grpc::ServerContext* context, const v1::ListCapturesRequest* request,
                    v1::ListCapturesResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const v1::GetCaptureRequest* request,
                   v1::CaptureRecord* response) override;

 private:
  struct AgentState {
    std::string host;
    uint64_t stored_samples = 0;    // from applied batches
    uint64_t reported_samples = 0;  // from the agent's last status
    uint32_t effective_frequency_hz = 0;
    bool reporting = false;
    bool finished = false;
    std::string error;
    absl::Time finished_at;
  };
  struct Running {
    store::CaptureInfo info;
    uint32_t duration_ms = 0;
    absl::Time started;
    std::map<std::string, AgentState> agents;
    std::string cancel_reason;  // non-empty: stop now
  };

  // Chooses agents, registers the capture and sends StartCapture. Errors are the RPC's.
  absl::StatusOr<std::shared_ptr<Running>> Begin(const v1::RunCaptureRequest& request);
  void StopAgents(const Running& running, const std::string& why);
  void Finish(const std::shared_ptr<Running>& running, const std::string& error);
  v1::CaptureProgress ProgressOf(const Running& running) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  bool Expired(const store::CaptureInfo& info, int64_t now_ms) const;

  store::Store* const store_;
  registry::AgentRegistry* const registry_;
  const Options options_;
  std::atomic<uint64_t> limit_refusals_{0};

  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<Running>> running_ ABSL_GUARDED_BY(mu_);
  // Bumped on every change a Run loop may wait for.
  uint64_t changes_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread sweeper_;
};

// Parses "7d", "12h", "30m", "45s", "500ms" (also a bare number of seconds); for flags.
absl::StatusOr<absl::Duration> ParseRetention(const std::string& text);

}  // namespace strata::server::capture

#endif  // STRATA_SERVER_CAPTURE_CAPTURE_SERVICE_H_
