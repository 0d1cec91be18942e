// The fleet as OTLP senders: each simulated agent exports its interval's samples as one
// ExportProfilesServiceRequest (ProfilesService/Export, unary, the server's own listener),
// as a host running the OpenTelemetry eBPF profiler and a Collector would. Agent identities,
// services, labels, intervals and ramp-up are the Strata fleet's (fleet.h), so the two
// protocols are measured on the same samples.
//
// Each agent sends its requests in order, one at a time. A failed call is retried with the
// same request after a jittered exponential backoff (OTLP exporters' behaviour; the server
// recognises a retry of a request it already stored). INVALID_ARGUMENT, PERMISSION_DENIED and
// UNAUTHENTICATED refuse a request for good. Agent i sends to servers[i mod n].
#ifndef STRATA_TOOLS_LOADGEN_OTLP_FLEET_H_
#define STRATA_TOOLS_LOADGEN_OTLP_FLEET_H_

#include <memory>
#include <vector>

#include "tools/loadgen/fleet.h"
#include "tools/loadgen/program.h"

namespace strata::loadgen {

// Runs to completion (blocking). The programs must be built with ProgramOptions::otlp.
// FleetReport's connects and redirects stay 0; reconnects counts retried calls.
FleetReport RunOtlpFleet(const FleetOptions& options,
                         const std::vector<std::unique_ptr<Program>>& programs);

}  // namespace strata::loadgen

#endif  // STRATA_TOOLS_LOADGEN_OTLP_FLEET_H_
