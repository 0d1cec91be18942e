// server/otlp: the OpenTelemetry front door. OTLP profiles (ProfilesService/Export, package
// opentelemetry.proto.collector.profiles.v1development) enter the same pipeline as agent
// batches: their stacks and functions are interned into the store, their counts committed as
// cells through the server's commit::BatchCommitter (ingest -> commit -> aggregate -> store).
//
// This header is the conversion, transport- and store-free so its rules are unit-tested: an
// ExportProfilesServiceRequest becomes Strata samples, or an error that names what is wrong,
// in which case nothing of the request is stored.
//
//   stacks     Stack.location_indices (leaf first) -> frames, outermost first. A location's
//              lines are its inline chain (innermost first): each line is a frame of its own.
//              A location without lines (native code the sender did not symbolize) is the
//              frame "FILE+0xOFFSET" of its mapping, OFFSET the address in the file.
//   kinds      the location attribute profile.frame.type, as Strata's module names
//              (common/base/frame_kind.h): kernel -> "[kernel.kallsyms]" / "[kernel:MOD]",
//              cpython/python -> "[python:FILE]", jvm/hotspot with a file -> "[java:FILE]",
//              jvm/hotspot without, v8js, dotnet, beam -> "[jit:KIND]", native/go/rust (or
//              none) -> the mapping's file; any other kind
//              (php, ruby, perl, ...) is kept by name as "[KIND:FILE]".
//   values     sample type ("samples"|"cpu", "count") counts CPU samples; ("cpu",
//              "nanoseconds") and the off-CPU types ("off_cpu"|"offcpu"|"events",
//              "nanoseconds") are converted to sampling periods: the profile's period when its
//              period type is in nanoseconds, else 1e9/99 ns (the agents' default rate). Other
//              sample types are refused.
//   labels     resource attributes under the profile's and the sample's: service.name -> the
//              service ("unknown_service:EXECUTABLE" without one), host.name -> the host; the
//              others (process.executable.name/path, container.id, k8s.*, ...) are labels,
//              except per-process and per-thread identifiers (process.pid, thread.*, ...),
//              which would make every process a label set of its own.
//   time       each value at its timestamp's 10 s window, or the profile's time_unix_nano,
//              or `now_ms`.
#ifndef STRATA_SERVER_OTLP_OTLP_CONVERT_H_
#define STRATA_SERVER_OTLP_OTLP_CONVERT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/labels/labels.h"
#include "opentelemetry/proto/collector/profiles/v1development/profiles_service.pb.h"
#include "server/ingest/limits.h"
#include "server/store/records.h"
#include "strata/v1/common.pb.h"

namespace strata::server::otlp {

namespace otlp_v1 = ::opentelemetry::proto::collector::profiles::v1development;
namespace profiles_v1 = ::opentelemetry::proto::profiles::v1development;

// The agents' default sampling rate: the period of nanosecond values without one of their own.
inline constexpr int64_t kDefaultPeriodNs = 1'000'000'000 / 99;
// Frames of one stack (deeper ones are an error, as for agents' decoded stacks).
inline constexpr size_t kMaxStackFrames = 4096;
// Frames of all the stacks of one request (each stack table entry its samples name, counted
// once however many entries hold the same stack): a location may stand for thousands of
// (inlined) frames and each stack may repeat it, so the request's bytes alone do not bound
// what they decode to.
inline constexpr size_t kMaxRequestFrames = size_t{1} << 23;

struct ConvertedStack {
  std::vector<uint32_t> functions;  // indexes into ConvertedRequest::functions, outermost first
  bool truncated = false;           // the sender marked the stack as cut short
  // As store::StackFrames::call_sites: empty, or one per frame but the leaf, 0 where not
  // known. Only Python and Java callers' are (their line + 1, from the location's Line).
  std::vector<uint64_t> call_sites;
};

// CPU samples of one (service, host, window) whose leaf function is Python or Java, at a
// line of it: what agents send as their leaf addresses (a line is such a function's address).
struct ConvertedLeafLine {
  std::string service;
  std::string host;
  int64_t window_start_ms = 0;
  uint32_t function = 0;  // index into ConvertedRequest::functions
  uint32_t line = 0;
  uint64_t count = 0;
};

// Counts of one stack in one 10 s window of one (service, host, label set).
struct ConvertedCell {
  std::string service;
  std::string host;
  labels::LabelSet labels;  // normalized; off-CPU samples carry commit::ProfileLabels
  int64_t window_start_ms = 0;
  uint32_t stack = 0;  // index into ConvertedRequest::stacks
  uint64_t count = 0;
};

struct ConvertedRequest {
  std::vector<store::FunctionInfo> functions;  // distinct
  std::vector<ConvertedStack> stacks;          // distinct
  std::vector<ConvertedCell> cells;            // distinct keys, counts > 0
  std::vector<ConvertedLeafLine> leaf_lines;   // distinct keys, counts > 0
  uint64_t samples = 0;                        // sum of the cells' counts
  uint32_t profiles = 0;
};

// `forced_host`: the only host the sender may write as (a client certificate's name); empty:
// any. InvalidArgument naming the field for malformed input (an index outside its table, a
// value count that does not match the timestamps, a string or stack over the limits, an
// attribute that is not a valid label, a reserved "__" key); PermissionDenied for a host other
// than `forced_host`.
absl::StatusOr<ConvertedRequest> ConvertRequest(const otlp_v1::ExportProfilesServiceRequest& request,
                                                const ingest::IngestLimits& limits,
                                                const std::string& forced_host, int64_t now_ms);

// Strata's profile type of an OTLP sample type; InvalidArgument for types it does not store.
absl::StatusOr<v1::ProfileType> ProfileTypeOf(absl::string_view type, absl::string_view unit);

}  // namespace strata::server::otlp

#endif  // STRATA_SERVER_OTLP_OTLP_CONVERT_H_
