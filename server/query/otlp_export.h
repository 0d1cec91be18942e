// OTLP export: profiles written as an OTLP ExportProfilesServiceRequest (profiles signal,
// v1development), which the OpenTelemetry Collector and other OTLP receivers take, and which
// Strata's own OTLP ingest (server/otlp) reads back as the same stacks and counts.
//
// One ResourceProfiles per host (service.name, host.name), one profile of the query's type:
// CPU as ("samples", "count"), off-CPU as ("off_cpu", "nanoseconds") with every count
// multiplied by the sampling period, both with period type ("cpu", "nanoseconds") and period
// 1e9 / rate. The profiles come with their lines (ExpandLines): each frame is a location whose
// lines are the function and the functions inlined into it, innermost first, each with its
// file and line where known (callers at their call sites, a leaf's samples split over its
// sampled lines); its kind is profile.frame.type (kernel, cpython, native, or the name kept
// from an OTLP sender) and its module is the mapping (or the function's file for interpreted
// code). A truncated stack ends in an
// "abort-marker" location, as the eBPF profiler marks one. Samples carry no timestamps: the
// profile spans the query's range. Label sets are not exported.
#ifndef STRATA_SERVER_QUERY_OTLP_EXPORT_H_
#define STRATA_SERVER_QUERY_OTLP_EXPORT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/query/profile.h"
#include "strata/v1/common.pb.h"

namespace strata::server::query {

struct OtlpExportOptions {
  std::string service;
  int64_t from_ms = 0;
  int64_t to_ms = 0;
  v1::ProfileType type = v1::PROFILE_CPU;  // CPU or off-CPU
  uint32_t rate_hz = 0;                    // 0: the agents' default, 99 Hz
};

// `by_host`: each host's profile. The serialized request; InvalidArgument for the wall type
// (CPU and off-CPU are exported one at a time).
absl::StatusOr<std::string> EncodeOtlp(const std::vector<std::pair<std::string, Profile>>& by_host,
                                       const OtlpExportOptions& options);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_OTLP_EXPORT_H_
