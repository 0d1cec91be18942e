// agent/app: what strata-agent is made of, and how it is configured. AgentOptions holds one
// options struct per component; agent_flags.h fills it from the command line and config file
// (the only place flags are defined and checked) and agent_app.h builds and wires the
// components from it.
//
// Where a component has an options struct of its own, it is used here as it is; the fields
// that come from other components (the identity the spool resumes, loaded credentials, what
// the spool recovered) are left empty and filled by AgentApp.
#ifndef STRATA_AGENT_APP_AGENT_OPTIONS_H_
#define STRATA_AGENT_APP_AGENT_OPTIONS_H_

#include <string>
#include <vector>

#include "absl/time/time.h"
#include "agent/core/capture_controller.h"
#include "agent/core/profiler.h"
#include "agent/core/shipper.h"
#include "agent/requests/requests_metric.h"
#include "agent/spool/spool.h"
#include "common/rpc/client_security.h"

namespace strata::agent::app {

inline constexpr char kDefaultSpoolDir[] = "/var/lib/strata-agent/spool";

// The durable spool of batches not yet acknowledged, and who the agent is.
struct AgentSpoolOptions {
  spool::SpoolOptions spool;  // dir empty: in memory only
  // The directory is the default one: where it cannot be opened (not running as the
  // service), keep the spool in memory instead of failing.
  bool memory_fallback = false;
  std::string agent_id;  // empty: GeneratedAgentId(), or the identity a spool left behind
};

struct AgentOptions {
  std::string log_level = "info";
  ProfilerOptions profiler;  // which processes, how they are sampled and unwound
  // The ingest stream: servers, host, labels, rate. Identity, arch, version, credentials and
  // the spool's recovery counts are filled by AgentApp.
  ShipperOptions shipper;
  rpc::ClientSecurityOptions security;  // loaded by AgentApp into shipper.security
  AgentSpoolOptions spool;
  CaptureControllerOptions captures;  // the CPU budget of ad hoc captures
  absl::Duration interval = absl::Seconds(10);       // between batches
  absl::Duration flush_timeout = absl::Seconds(5);   // at shutdown, for the last acks
  // Throughput counters scraped every interval (SampleBatch.requests).
  std::vector<requests::MetricSource> requests_metrics;
};

}  // namespace strata::agent::app

#endif  // STRATA_AGENT_APP_AGENT_OPTIONS_H_
