// pprof export: a Profile encoded as a gzipped perftools.profiles.Profile
// (github.com/google/pprof/proto/profile.proto), which `go tool pprof` and other pprof
// readers open. Written directly in protobuf wire format so the server needs no copy of the
// schema; the field numbers below are those of profile.proto.
//
// Strata stacks are lists of functions, not addresses: every function becomes one Location
// (address 0) with one Line, and every module one Mapping with has_functions set, so pprof
// does not try to symbolize. Where the leaf function's source lines are known (its leaf
// addresses in the range and the module's DWARF, PprofOptions::leaf_lines), a stack's samples
// are split over them in proportion, and each leaf address is a Location of its own whose Line
// entries are its inline chain (innermost first, as profile.proto orders them): what
// `go tool pprof -lines` shows. Callers' frames are Locations of their call sites where the
// stack recorded them and the module's DWARF resolves them (PprofOptions::call_site_lines),
// with the inline chain at the call; elsewhere they stay at function granularity.
#ifndef STRATA_SERVER_QUERY_PPROF_H_
#define STRATA_SERVER_QUERY_PPROF_H_

#include <cstdint>
#include <string>

#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/query/profile.h"
#include "server/symbolize/source_lines.h"
#include "strata/v1/common.pb.h"

namespace strata::server::query {

// Sample types [("samples", "count"), (T, "nanoseconds")] with T "cpu", "off-cpu" or "wall"
// (the profile's type), period_type (T, "nanoseconds") and period 1e9 / rate: a count of n
// sampling periods at `rate_hz` is n * 1e9 / rate_hz nanoseconds of on-CPU, off-CPU or wall
// time. "samples" stays the first type, so readers of the count see what they always did.
// One leaf address of a function and where it is in the source.
struct LeafLine {
  uint64_t address = 0;  // in the module
  std::vector<symbolize::SourceFrame> frames;  // innermost first; non-empty
  uint64_t weight = 0;   // samples at the address
};

// A stack's samples over its leaf's lines in proportion to their weights; rounding
// remainders go to the heaviest lines, so the parts sum to `count`.
std::vector<uint64_t> SplitByLeafLines(uint64_t count, const std::vector<LeafLine>& lines);

// Where callers' calls are in the source (lines.h: CallSiteLinesOf).
struct CallSiteLines {
  // Per profile stack (index into Profile::stacks): its call sites, one per frame but the
  // leaf (return addresses, offsets in the frame's module); empty where not recorded.
  std::vector<std::vector<uint64_t>> sites;
  // Per (profile function index, call site): the source frames of the call, innermost first.
  // Call sites whose module has no DWARF on the server are absent.
  absl::flat_hash_map<std::pair<uint32_t, uint64_t>, std::vector<symbolize::SourceFrame>> lines;
};

struct PprofOptions {
  int64_t from_ms = 0;  // time_nanos of the profile
  int64_t to_ms = 0;    // with from_ms: duration_nanos
  v1::ProfileType type = v1::PROFILE_CPU;
  uint32_t rate_hz = 99;  // sampling rate of the counts; 0 is taken as 99
  // Per profile function index (Profile::functions), its leaf addresses with source lines;
  // optional (borrowed).
  const absl::flat_hash_map<uint32_t, std::vector<LeafLine>>* leaf_lines = nullptr;
  // Callers' call sites with source lines; optional (borrowed).
  const CallSiteLines* call_site_lines = nullptr;
};

// Returns the gzipped encoding; Internal only if zlib fails.
absl::StatusOr<std::string> EncodePprof(const Profile& profile, const PprofOptions& options);

// Uncompressed encoding (tests, and callers that compress themselves).
std::string EncodePprofProto(const Profile& profile, const PprofOptions& options);

// gzip (RFC 1952) of `data`.
absl::StatusOr<std::string> Gzip(std::string_view data);
// The data gzip'd in `gzipped`; InvalidArgument if it is not gzip, is cut short or inflates
// past `max_bytes`.
absl::StatusOr<std::string> Gunzip(std::string_view gzipped, size_t max_bytes);

}  // namespace strata::server::query

#endif  // STRATA_SERVER_QUERY_PPROF_H_
