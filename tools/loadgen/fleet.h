// A fleet of simulated agents over real gRPC (the callback API: a stream costs no thread of
// its own). Each agent has its own identity, host, service and graph ID and speaks the full
// ingest protocol: Hello, the graph deltas its server lacks, one batch per interval with
// sequence numbers, a spool of unacknowledged batches resent in order after a reconnect,
// jittered exponential backoff (at least the server's retry delay), and reconnect storms on
// demand. Run() drives the fleet for a duration, waits for every batch to be acknowledged and
// reports what was delivered, per service, for an exact comparison with the server's totals.
//
// With several server addresses (a cluster's nodes) agent i starts on servers[i % n] and moves
// to the next address whenever its stream fails or ends. Backoff and redirects follow
// rpc::Reconnector (common/rpc/reconnector.h), as the agent's shipper does.
#ifndef STRATA_TOOLS_LOADGEN_FLEET_H_
#define STRATA_TOOLS_LOADGEN_FLEET_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/rpc/client_security.h"
#include "tools/loadgen/program.h"

namespace strata::loadgen {

struct FleetOptions {
  std::vector<std::string> servers;  // host:port of each node: at least one
  rpc::ClientSecurity security;  // TLS and the agents' token
  uint32_t agents = 100;
  uint32_t services = 10;
  std::string prefix = "lg";  // of agent IDs, hosts and services (unique per run)
  absl::Duration interval = absl::Seconds(10);
  absl::Duration duration = absl::Seconds(60);
  absl::Duration ramp_up = absl::Seconds(10);
  // Times (from the start) at which every agent drops its stream and reconnects.
  std::vector<absl::Duration> storms;
  absl::Duration max_backoff = absl::Seconds(30);
  absl::Duration drain_timeout = absl::Seconds(60);
  uint32_t frequency_hz = 99;
  uint32_t agents_per_connection = 16;  // agents sharing one HTTP/2 connection (per address)
  // Fleet labels of every agent (Hello.labels), by key: one value for all, or several dealt
  // to the agents of each service in turn (its first agent the first value, its second the
  // second, ...), e.g. version=a|b for two releases of every service side by side.
  std::map<std::string, std::vector<std::string>> labels;
  uint64_t seed = 1;
  // Requests each agent's batch reports for its service (SampleBatch.requests, as scraped by
  // strata-agent --requests-metric); 0: none.
  uint64_t requests_per_batch = 0;
};

struct FleetReport {
  absl::Duration sending;  // from the first agent's start to the end of sending
  uint64_t batches_sent = 0;       // distinct batches made
  uint64_t batches_delivered = 0;  // acknowledged, or applied as a Welcome said
  uint64_t samples_delivered = 0;
  uint64_t contexts_delivered = 0;
  uint64_t batches_unacknowledged = 0;  // still spooled when the drain timed out
  uint64_t batches_rejected = 0;        // refused for good (a failure)
  uint64_t connects = 0;                // Welcomes received
  uint64_t reconnects = 0;              // streams that ended before the run did, not redirected
  uint64_t redirects = 0;               // Redirects received (each ends its stream)
  uint64_t refusals = 0;                // RESOURCE_EXHAUSTED from the server
  std::vector<double> ack_latency_ms;   // write to Ack, per batch, sorted
  // Serialized protobuf bytes of every message sent (before gRPC's framing and any
  // compression): hellos, graph deltas and batches, resent ones included.
  uint64_t bytes_sent = 0;
  std::map<std::string, uint64_t> samples_by_service;
};

// Runs the fleet to completion (blocking). `programs` are shared round-robin by the agents.
FleetReport RunFleet(const FleetOptions& options,
                     const std::vector<std::unique_ptr<Program>>& programs);

}  // namespace strata::loadgen

#endif  // STRATA_TOOLS_LOADGEN_FLEET_H_
